//! Whether an environment is live as Git says, from one deployment row of the operator API:
//! the one decision `pl up`, `pl wait` and `pl status` share, so they never disagree (one once
//! said `done` while another said `differs from Git`).
//!
//! Live means true on the hosts: no rollback holds it away from Git, its rollout is done,
//! every replica Git asks for is placed, every placed one is reported running and healthy by
//! its node's agent, and none of another generation still runs.

use operator_proto::{Action, DeploymentStatus};
use std::collections::BTreeMap;

/// A `/v1/deployments` row (or `GET /v1/environments/{name}`): the operator API's own type,
/// which the daemon serialises.
pub use operator_proto::Deployment;

/// Where an environment stands against Git.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// True on the hosts.
    Live,
    /// Still moving toward Git: what it waits for.
    Progressing(String),
    /// A canary step waits for `pl rollout promote`: nothing moves until an operator acts.
    WaitsForPromote(String),
    /// All that was placed runs, but replicas Git asks for wait for room: not what Git says,
    /// and it will not be until a node has room (or Git asks for less).
    Short(String),
    /// Failed, or held away from Git by a rollback.
    Failed(String),
}

/// The replicas waiting for room, said per role and reason (`web: 13 replica(s) wait:
/// no-capacity`).
pub fn waiting_summary(d: &Deployment) -> String {
    let mut by: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for w in &d.waiting {
        *by.entry((w.role.as_str(), w.reason.as_str())).or_default() += 1;
    }
    by.iter()
        .map(|((role, reason), n)| format!("{role}: {n} wait ({})", reason_words(reason)))
        .collect::<Vec<_>>()
        .join("; ")
}

/// A waiting reason's code in words.
fn reason_words(code: &str) -> String {
    match code {
        "no-capacity" => "no-capacity: no eligible node has the CPU and memory left".to_owned(),
        "no-eligible-node" => "no-eligible-node: no active node of the pool is heard from".to_owned(),
        other => other.to_owned(),
    }
}

/// The judgement.
pub fn judge(d: &Deployment) -> Verdict {
    let env = d.environment.as_str();
    if let Some(h) = d.hold.as_ref().filter(|h| !h.released) {
        return Verdict::Failed(format!(
            "{env} was rolled back by {} from generation {} to generation {}'s release (generation {}): it differs from Git until a commit changes it or `pl rollback --release {env}`",
            h.by, h.from, h.to, h.generation
        ));
    }
    if d.status == DeploymentStatus::Failed {
        return Verdict::Failed(format!("{env} generation {} failed", d.generation));
    }
    if d.action == Action::Teardown {
        return match d.status {
            DeploymentStatus::Done => Verdict::Live,
            s => Verdict::Progressing(format!("{env} teardown {}", s.as_str())),
        };
    }
    if let Some(c) = d.canary.as_ref().filter(|c| c.waits_for_promote) {
        return Verdict::WaitsForPromote(format!(
            "{env} generation {}: its canary has {}% of requests on the new release and waits for `pl rollout promote {env}` (or `pl rollout abort {env}`)",
            d.generation, c.weight
        ));
    }
    let placed = format!("{} of {} replicas running", d.running, d.replicas);
    if d.status != DeploymentStatus::Done {
        return Verdict::Progressing(format!(
            "{env} generation {} {}, {placed}",
            d.generation,
            d.status.as_str()
        ));
    }
    if d.running != d.replicas || d.stale > 0 {
        let stale = match d.stale {
            0 => String::new(),
            n => format!(", {n} of another generation (or moved away) still running"),
        };
        return Verdict::Progressing(format!("{env} generation {}: {placed}{stale}", d.generation));
    }
    if !d.waiting.is_empty() || d.asked() > d.replicas {
        return Verdict::Short(format!(
            "{env} generation {}: {} of {} replicas placed and running; {}",
            d.generation,
            d.replicas,
            d.asked(),
            match waiting_summary(d) {
                s if s.is_empty() => "the rest wait for room".to_owned(),
                s => s,
            }
        ));
    }
    Verdict::Live
}

/// A revision's reasons as `pl validate` prints problems: one a line, `file:line:column:
/// error[code]: message` with its hint below where the daemon found a problem in a file, and
/// `error[code]: message` for a refusal of trust (a signature, a policy rule).
pub fn reasons_text(list: &[operator_proto::revisions::Reason]) -> String {
    if list.is_empty() {
        return "no reason recorded".to_owned();
    }
    list.iter()
        .map(|r| {
            if r.message.contains(&format!("[{}]", r.code)) {
                r.message.clone()
            } else {
                format!("error[{}]: {}", r.code, r.message)
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use operator_proto::{Canary, Hold, Waiting};

    #[test]
    fn reasons_read_as_validate_prints_them() {
        let reason = |code: &str, message: &str| operator_proto::revisions::Reason {
            code: code.into(),
            message: message.into(),
        };
        let reasons = [
            reason(
                "invalid-value",
                "projects/api.yaml:16:7: error[invalid-value]: `replicas` is not a number\n  hint: write a whole number",
            ),
            reason("unsigned", "0123456789ab: the commit is not signed"),
        ];
        assert_eq!(
            reasons_text(&reasons),
            "projects/api.yaml:16:7: error[invalid-value]: `replicas` is not a number\n  hint: write a whole number\nerror[unsigned]: 0123456789ab: the commit is not signed"
        );
        assert!(!reasons_text(&reasons).contains('{'));
    }

    /// A finished rollout's row: `asked` replicas asked for, `placed` placed, `running` running.
    pub(crate) fn done(asked: usize, placed: usize, running: usize) -> Deployment {
        Deployment {
            environment: "web-production".into(),
            branch: "main".into(),
            generation: 11,
            action: Action::Rollout,
            status: DeploymentStatus::Done,
            step: 5,
            updated_at_ms: 0,
            asked: Some(asked),
            replicas: placed,
            running,
            stale: 0,
            previous_generation: 10,
            waiting: Vec::new(),
            hold: None,
            canary: None,
        }
    }

    #[test]
    fn live_only_when_every_replica_asked_for_runs() {
        assert_eq!(judge(&done(3, 3, 3)), Verdict::Live);
        assert!(matches!(judge(&done(3, 3, 2)), Verdict::Progressing(_)));
        let mut stale = done(3, 3, 3);
        stale.stale = 1;
        assert!(matches!(judge(&stale), Verdict::Progressing(w) if w.contains("1 of another generation")));
    }

    /// 20 asked, room for 7: not done, and the reason is named.
    #[test]
    fn replicas_waiting_for_room_are_short_of_git_with_the_reason() {
        let mut d = done(20, 7, 7);
        d.waiting = (7..20)
            .map(|index| Waiting {
                role: "web".into(),
                index,
                reason: "no-capacity".into(),
            })
            .collect();
        let Verdict::Short(why) = judge(&d) else {
            panic!("{:?}", judge(&d))
        };
        assert!(
            why.contains("7 of 20 replicas placed") && why.contains("web: 13 wait (no-capacity"),
            "{why}"
        );
        // Without the list (an older daemon's row), the counts alone still say it.
        d.waiting.clear();
        assert!(matches!(judge(&d), Verdict::Short(w) if w.contains("7 of 20")));
    }

    /// An aborted canary (or any rollback) holds the environment away from Git: a failure,
    /// even though its rollout is done and every replica runs.
    #[test]
    fn a_held_environment_is_not_live() {
        let mut d = done(2, 2, 2);
        d.hold = Some(Hold {
            by: "canary".into(),
            at_ms: 0,
            from: 5,
            to: 4,
            generation: 6,
            git_hash: "h".into(),
            released: false,
        });
        assert!(matches!(judge(&d), Verdict::Failed(w) if w.contains("differs from Git") && w.contains("by canary")));
        if let Some(h) = d.hold.as_mut() {
            h.released = true;
        }
        assert_eq!(judge(&d), Verdict::Live);
    }

    #[test]
    fn a_canary_waiting_for_promote_says_so() {
        let mut d = done(1, 1, 1);
        d.status = DeploymentStatus::InProgress;
        d.canary = Some(Canary {
            weight: 50,
            waits_for_promote: true,
            next_at_ms: None,
        });
        assert!(
            matches!(judge(&d), Verdict::WaitsForPromote(w) if w.contains("50%") && w.contains("pl rollout promote web-production"))
        );
        d.canary = Some(Canary {
            weight: 10,
            waits_for_promote: false,
            next_at_ms: None,
        });
        assert!(matches!(judge(&d), Verdict::Progressing(_)));
    }

    #[test]
    fn failures_and_teardowns() {
        let mut d = done(1, 1, 0);
        d.status = DeploymentStatus::Failed;
        assert!(matches!(judge(&d), Verdict::Failed(_)));
        let t = Deployment {
            action: Action::Teardown,
            status: DeploymentStatus::Done,
            ..done(0, 0, 0)
        };
        assert_eq!(judge(&t), Verdict::Live);
    }
}
