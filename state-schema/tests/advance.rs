//! How a rollout advances, walked through the one decision (`rollout::advance`) over the
//! real steps of a canary and of rolling batches: each share given, each pause waited out or
//! promoted, each failure taken back when it had moved requests, and the watch at the end.

#[path = "support/spec.rs"]
mod spec_support;

use state_schema::deployment::DeploymentSpec;
use state_schema::generations::{Action, Status, StepJobs};
use state_schema::rollout::advance::{
    Advance, Back, CanaryStanding, GateVerdict, Measured, PromoteRefusal, Rollout, Share, Standing, StepState, Watch,
    abort, advance, canary_standing, held_with, promote, verdict,
};

fn spec(release: &str, rollout: &str) -> DeploymentSpec {
    spec_with(release, rollout, "")
}

/// `spec` with more roles (`extra`: YAML lines under `roles:`).
fn spec_with(release: &str, rollout: &str, extra: &str) -> DeploymentSpec {
    let image = format!("{:0>64}", release);
    spec_support::first_spec(&format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Repository\nmetadata: {{name: t}}\nspec: {{baseDomain: example.com}}\n---\napiVersion: pushleft.dev/v1alpha1\nkind: NodePool\nmetadata: {{name: main}}\nspec:\n  region: eu\n  nodes:\n    - {{name: n1, capacity: {{cpu: \"8\", memory: 16Gi}}}}\n---\napiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: api}}\nspec:\n  image: registry.example.invalid/api@sha256:{image}\n  roles:\n    web: {{kind: web, port: 8080, replicas: 2, rollout: {rollout}}}\n{extra}---\napiVersion: pushleft.dev/v1alpha1\nkind: Environment\nmetadata: {{name: api-production}}\nspec: {{project: api, stage: production, pool: main}}\n"
    ))
}

/// A new generation of `spec` replacing what `retired` runs.
fn rollout<'a>(spec: &'a DeploymentSpec, retired: &'a [DeploymentSpec], generation: u64) -> Rollout<'a> {
    Rollout {
        action: Action::Rollout,
        rollback: false,
        generation,
        spec,
        retired,
    }
}

const CANARY: &str = "{strategy: canary, steps: [{weight: 20, pause: 30s}, {weight: 60}], watchSeconds: 120}";

fn running(step: usize, pending: u64, broken: u64) -> Standing<'static> {
    Standing {
        step,
        state: StepState::Running,
        jobs: StepJobs { pending, broken },
        measured: &[],
    }
}

#[test]
fn a_canary_gives_each_share_waits_out_its_pause_and_waits_for_a_promote_before_its_switch() {
    let old = spec("1", CANARY);
    let new = spec("2", CANARY);
    let retired = std::slice::from_ref(&old);
    let r = rollout(&new, retired, 2);
    let steps = r.steps();
    let canary = state_schema::rollout::advance::canary_steps(&steps);
    assert_eq!(canary.iter().map(|c| c.1).collect::<Vec<_>>(), [20, 60], "{canary:?}");
    let (first, second) = (canary[0].0, canary[1].0);
    let now = 1_000_000;

    // Up to the first share, steps run one after the other.
    assert_eq!(
        advance(&r, &steps, running(0, 1, 0), now),
        Advance::Wait,
        "a job still runs"
    );
    let mut at = 0;
    while at < first {
        match advance(&r, &steps, running(at, 0, 0), now) {
            Advance::Next {
                step,
                state: StepState::Running,
                share: None,
                gate: None,
            } => at = step,
            other => panic!("step {at}: {other:?}"),
        }
    }
    // The first share done: its replicas are watched from here, and the next share waits 30 s.
    let Advance::Next { step, state, share, .. } = advance(&r, &steps, running(first, 0, 0), now) else {
        panic!("a next step");
    };
    assert_eq!((step, state), (second, StepState::Paused { due_ms: now + 30_000 }));
    assert_eq!(
        share,
        Some(Share {
            weight: 20,
            first: true
        })
    );
    assert_eq!(
        canary_standing(20, state),
        Some(CanaryStanding {
            weight: 20,
            waits_for_promote: false,
            next_at_ms: Some(now + 30_000)
        })
    );
    let paused = Standing {
        step: second,
        state,
        jobs: StepJobs::default(),
        measured: &[],
    };
    assert_eq!(
        advance(&r, &steps, paused, now + 29_999),
        Advance::Wait,
        "its pause is not over"
    );
    assert_eq!(
        advance(&r, &steps, paused, now + 30_000),
        Advance::Resume { step: second }
    );

    // The second share done: the switch waits for a promote (the last step has no pause).
    let Advance::Next {
        step: switch,
        state,
        share,
        ..
    } = advance(&r, &steps, running(second, 0, 0), now)
    else {
        panic!("the switch");
    };
    assert_eq!(
        (state, share),
        (
            StepState::AwaitsPromote,
            Some(Share {
                weight: 60,
                first: false
            })
        )
    );
    let waiting = Standing {
        step: switch,
        state,
        jobs: StepJobs::default(),
        measured: &[],
    };
    assert_eq!(
        advance(&r, &steps, waiting, i64::MAX),
        Advance::Wait,
        "no time ends a promote's wait"
    );
    assert!(canary_standing(60, state).is_some_and(|c| c.waits_for_promote && c.next_at_ms.is_none()));
    assert_eq!(promote(Status::InProgress, state, now), Ok(()));
    assert_eq!(
        promote(Status::InProgress, paused.state, now),
        Ok(()),
        "a pause is cut short"
    );
    assert_eq!(
        promote(Status::InProgress, paused.state, now + 30_000),
        Err(PromoteRefusal::NotPaused),
        "a pause that is over (or a promote done) waits only for the next advance"
    );
    assert_eq!(
        promote(Status::InProgress, StepState::Running, now),
        Err(PromoteRefusal::NotPaused)
    );
    assert_eq!(promote(Status::Done, state, now), Err(PromoteRefusal::NotInProgress));

    // A failure from the first share on goes back to the old release; before it, it does not.
    assert_eq!(
        advance(&r, &steps, running(second, 0, 1), now),
        Advance::Fail {
            back: Some(Back::Canary),
            gate: None
        }
    );
    assert_eq!(
        advance(&r, &steps, running(0, 0, 1), now),
        Advance::Fail { back: None, gate: None }
    );

    // The rest runs to the end: the new release is watched from its switch.
    let mut at = switch;
    let done = loop {
        match advance(&r, &steps, running(at, 0, 0), now) {
            Advance::Next {
                step,
                state: StepState::Running,
                share: None,
                gate: None,
            } => at = step,
            other => break other,
        }
    };
    assert_eq!(
        done,
        Advance::Done {
            steps: steps.len(),
            watch: Watch::Window(120)
        }
    );
    // A rollback's generation is not watched; the canary's watch just ends.
    let back = Rollout { rollback: true, ..r };
    let back_steps = back.steps();
    let last = back_steps.len() - 1;
    assert!(matches!(
        advance(&back, &back_steps, running(last, 0, 0), now),
        Advance::Done { watch: Watch::Keep, .. }
    ));
}

#[test]
fn a_first_release_has_no_canary_and_a_rolling_failure_goes_back_from_its_first_move() {
    let first = spec("1", CANARY);
    let r = rollout(&first, &[], 1);
    let steps = r.steps();
    assert!(
        state_schema::rollout::advance::canary_steps(&steps).is_empty(),
        "nothing served before"
    );
    assert!(canary_standing(0, StepState::Running).is_none());

    let old = spec("1", "{strategy: rolling, maxSurge: 0, maxUnavailable: 1}");
    let new = spec("2", "{strategy: rolling, maxSurge: 0, maxUnavailable: 1}");
    let retired = std::slice::from_ref(&old);
    let r = rollout(&new, retired, 2);
    let steps = r.steps();
    let from = state_schema::rollout::advance::rolling_from(&steps).expect("it rolls");
    assert_eq!(
        advance(&r, &steps, running(from, 0, 1), 0),
        Advance::Fail {
            back: Some(Back::Rolling),
            gate: None
        }
    );
    assert_eq!(
        advance(&r, &steps, running(from - 1, 0, 1), 0),
        Advance::Fail { back: None, gate: None }
    );
    assert_eq!(abort(Action::Rollout, Status::InProgress), Ok(()));
    assert_eq!(
        abort(Action::Teardown, Status::InProgress),
        Err(PromoteRefusal::NotInProgress)
    );
    assert_eq!(abort(Action::Rollout, Status::Done), Err(PromoteRefusal::NotInProgress));
}

#[test]
fn a_step_state_is_stored_as_two_columns_and_read_back() {
    for s in [
        StepState::Running,
        StepState::Paused { due_ms: 42 },
        StepState::AwaitsPromote,
    ] {
        assert_eq!(StepState::from_row(s.as_str(), s.due_ms()), Some(s));
    }
    assert_eq!(StepState::from_row("held", 0), None);
}

#[test]
fn a_step_waits_for_its_jobs_fails_on_a_broken_one_and_skips_empty_steps() {
    use state_schema::task::Task;
    let s = spec("1", CANARY);
    let r = Rollout {
        action: Action::Teardown,
        rollback: false,
        generation: 1,
        spec: &s,
        retired: &[],
    };
    let job = (
        Task::EnsureNetwork {
            environment: s.environment.clone(),
            generation: 1,
        },
        s.environment.clone(),
    );
    let steps = vec![vec![job.clone()], Vec::new(), vec![job.clone()], Vec::new()];
    assert_eq!(advance(&r, &steps, running(0, 1, 0), 0), Advance::Wait);
    assert_eq!(
        advance(&r, &steps, running(0, 1, 1), 0),
        Advance::Wait,
        "a pending job is waited for first"
    );
    assert_eq!(
        advance(&r, &steps, running(0, 0, 1), 0),
        Advance::Fail { back: None, gate: None }
    );
    assert_eq!(
        advance(&r, &steps, running(0, 0, 0), 0),
        Advance::Next {
            step: 2,
            state: StepState::Running,
            share: None,
            gate: None
        },
        "the empty step is skipped"
    );
    assert_eq!(
        advance(&r, &steps, running(2, 0, 0), 0),
        Advance::Done {
            steps: 4,
            watch: Watch::Keep
        }
    );
}

const GATED: &str = "{strategy: canary, steps: [{weight: 20, pause: 30s}, {weight: 60}], gates: {maxErrorPercent: 5, maxP95Ms: 200, minRequests: 10}}";

fn measured(requests: u32, errors: u32, p95_ms: u64) -> Measured {
    Measured {
        requests,
        errors,
        p95_micros: (requests > 0).then_some(p95_ms * 1000),
        logged: true,
    }
}

#[test]
fn a_gated_canary_measures_each_share_after_its_pause_and_the_gates_judge_every_ingress_together() {
    let old = spec("1", GATED);
    let new = spec("2", GATED);
    let retired = std::slice::from_ref(&old);
    let r = rollout(&new, retired, 2);
    let steps = r.steps();
    let canary = state_schema::rollout::advance::canary_steps(&steps);
    let (first, second) = (canary[0].0, canary[1].0);
    // The 20% share, then its measures (after its pause), then the 60% share at once.
    let measure = first + 1;
    assert_eq!(second, measure + 1, "{steps:?}");
    assert!(steps[measure].iter().all(|(t, _)| t.gate().is_some()));
    let Advance::Next { step, state, .. } = advance(&r, &steps, running(first, 0, 0), 0) else {
        panic!("the measures");
    };
    assert_eq!(
        (step, state),
        (measure, StepState::Paused { due_ms: 30_000 }),
        "the pause comes before the measure"
    );
    fn at(step: usize, measured: &[Measured]) -> Standing<'_> {
        Standing {
            step,
            state: StepState::Running,
            jobs: StepJobs::default(),
            measured,
        }
    }
    // Two ingresses: 4 errors of 100 (4%) passes; the slower one's p95 is what is judged.
    let Advance::Next {
        step,
        state,
        share,
        gate,
    } = advance(&r, &steps, at(measure, &[measured(60, 1, 40), measured(40, 3, 90)]), 0)
    else {
        panic!("the next share");
    };
    assert_eq!((step, state, share), (second, StepState::Running, None));
    assert_eq!(
        gate.map(|g| g.words()),
        Some("gates passed: 4 of 100 requests 5xx or failed (4.0%), p95 90 ms".to_owned())
    );
    let Advance::Fail { back, gate } =
        advance(&r, &steps, at(measure, &[measured(60, 1, 40), measured(40, 3, 250)]), 0)
    else {
        panic!("failed");
    };
    assert_eq!(back, Some(Back::Canary));
    assert_eq!(
        gate.map(|g| g.words()),
        Some("the new release's 4 of 100 requests 5xx or failed (4.0%), p95 250 ms: over maxP95Ms 200".to_owned())
    );
    assert!(matches!(
        advance(&r, &steps, at(measure, &[measured(9, 9, 900)]), 0),
        Advance::Next {
            gate: Some(GateVerdict::NotJudged { requests: 9, min: 10 }),
            ..
        }
    ));
    let unlogged = Measured {
        logged: false,
        ..measured(50, 50, 900)
    };
    assert!(matches!(
        advance(&r, &steps, at(measure, &[unlogged]), 0),
        Advance::Next {
            gate: Some(GateVerdict::Unlogged),
            ..
        }
    ));
    assert_eq!(
        verdict(
            &new.roles.values().find_map(|r| r.canary_gate).expect("a gate"),
            &[measured(20, 2, 10)]
        )
        .words(),
        "the new release's 2 of 20 requests 5xx or failed (10.0%), p95 10 ms: over maxErrorPercent 5"
    );
}

#[test]
fn a_nodes_replicas_are_queued_held_with_its_set_up_unless_a_release_or_a_wait_comes_between() {
    use state_schema::task::Task;
    let kinds = |step: &[(Task, state_schema::values::Name)]| -> Vec<&'static str> {
        step.iter()
            .map(|(t, _)| match t {
                Task::EnsureEnvironment { .. } => "set-up",
                Task::EnsureApplication { .. } => "replica",
                Task::StopApplication { .. } => "stop",
                Task::PublishIngress { .. } => "publish",
                _ => "other",
            })
            .collect()
    };
    // A first release by switch: the replicas follow each node's set-up.
    let first = spec("1", "{strategy: switch}");
    let r = rollout(&first, &[], 1);
    let steps = r.steps();
    assert_eq!(held_with(&steps, 0), Some(2));
    assert_eq!(
        (kinds(&steps[0]), kinds(&steps[2])),
        (vec!["set-up"], vec!["replica", "replica"])
    );
    assert_eq!(held_with(&steps, 2), None, "the replicas' step is no set-up");
    assert_eq!(held_with(&steps, 99), None);

    // A canary's replicas too: its waits come after them, before each share.
    let old = spec("1", CANARY);
    let new = spec("2", CANARY);
    let r = rollout(&new, std::slice::from_ref(&old), 2);
    assert_eq!(held_with(&r.steps(), 0), Some(2));

    // A release command runs once, before any replica of the new release: a barrier.
    let migrating = spec_with(
        "2",
        "{strategy: switch}",
        "    migrate: {kind: release, command: [migrate]}\n",
    );
    let r = rollout(&migrating, std::slice::from_ref(&old), 2);
    let steps = r.steps();
    assert_eq!(steps[1].len(), 1, "the release step");
    assert_eq!(held_with(&steps, 0), None);
    assert_eq!(held_with(&steps, 1), None, "a release step is no set-up");

    // Rolling batches that take an old replica out first: its routes move before it stops.
    let (old, new) = (
        spec("1", "{strategy: rolling, maxSurge: 0, maxUnavailable: 1}"),
        spec("2", "{strategy: rolling, maxSurge: 0, maxUnavailable: 1}"),
    );
    let r = rollout(&new, std::slice::from_ref(&old), 2);
    let steps = r.steps();
    let next = state_schema::rollout::advance::first_step_from(&steps, 1).expect("a batch");
    assert_eq!(kinds(&steps[next]), ["publish"]);
    assert_eq!(held_with(&steps, 0), None);
    // Surging batches start their new replicas first: those follow each node's set-up.
    let (old, new) = (
        spec("1", "{strategy: rolling, maxSurge: 1, maxUnavailable: 0}"),
        spec("2", "{strategy: rolling, maxSurge: 1, maxUnavailable: 0}"),
    );
    let r = rollout(&new, std::slice::from_ref(&old), 2);
    let steps = r.steps();
    let next = held_with(&steps, 0).expect("held with the set-up");
    assert_eq!(kinds(&steps[next]), ["replica"]);

    // A teardown sets nothing up.
    let t = Rollout {
        action: Action::Teardown,
        ..rollout(&first, &[], 2)
    };
    assert!((0..t.steps().len()).all(|i| held_with(&t.steps(), i).is_none()));
}
