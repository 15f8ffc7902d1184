//! The service level indicators as Prometheus text (`/metrics`' second half), from one reading
//! of `ops::indicators`: each family always written (zeros included, every histogram bucket),
//! so a rule's ratio has both its sides from the first scrape. Labels come from closed sets
//! and the names Git declares; every label value is escaped.

use crate::ops::indicators::Indicators;
use crate::store::tallies as tally;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// A metric family's `# HELP` and `# TYPE` lines.
fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A label value as the text format writes it.
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Seconds, or `+Inf` for never.
fn age(now_ms: i64, at_ms: Option<i64>) -> String {
    at_ms.map_or("+Inf".to_owned(), |at| {
        format!("{}", (now_ms - at).max(0) as f64 / 1000.0)
    })
}

/// Everything [`Indicators`] measures, at `now_ms`.
pub fn render(out: &mut String, i: &Indicators, now_ms: i64) {
    let mut counted: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    for t in &i.tallies {
        counted.insert((t.family.as_str(), t.labels.as_str()), t.value);
    }
    let get = |f: &str, l: &str| counted.get(&(f, l)).copied().unwrap_or(0);
    environments(out, i);
    events(out, i, &get);
    jobs(out, i);
    histogram(
        out,
        "pushleft_commit_to_live_seconds",
        "From the pass that judged a commit to every replica of its release running with its routes published, as agents reported it (rollbacks are not releases).",
        tally::COMMIT_TO_LIVE,
        tally::COMMIT_TO_LIVE_BOUNDS,
        &get,
    );
    histogram(
        out,
        "pushleft_route_publication_seconds",
        "From a hostname's publish job being queued to its agent reporting the routes live.",
        tally::ROUTE_PUBLICATION,
        tally::ROUTE_PUBLICATION_BOUNDS,
        &get,
    );
    freshness(out, i, now_ms);
}

fn environments(out: &mut String, i: &Indicators) {
    family(
        out,
        "pushleft_environment_info",
        "gauge",
        "Each environment's sync (synced, progressing, held, failed) and health (healthy, degraded, missing, none), from what its agents report.",
    );
    for s in &i.environments {
        let _ = writeln!(
            out,
            "pushleft_environment_info{{environment=\"{}\",sync=\"{}\",health=\"{}\"}} 1",
            esc(&s.environment),
            s.sync,
            s.health
        );
    }
}

fn events(out: &mut String, i: &Indicators, get: &dyn Fn(&str, &str) -> i64) {
    family(
        out,
        "pushleft_events_total",
        "counter",
        "Events recorded, by kind (a single job's and a lease's are counted as jobs).",
    );
    for t in i.tallies.iter().filter(|t| t.family == tally::EVENTS) {
        let _ = writeln!(out, "pushleft_events_total{{kind=\"{}\"}} {}", esc(&t.labels), t.value);
    }
    family(
        out,
        "pushleft_deployments_ended_total",
        "counter",
        "Deployments (rollouts, rollbacks, teardowns) that ended, by outcome.",
    );
    let done = get(tally::EVENTS, "deployment-rollout-done") + get(tally::EVENTS, "deployment-teardown-done");
    let _ = writeln!(out, "pushleft_deployments_ended_total{{outcome=\"succeeded\"}} {done}");
    let failed = get(tally::EVENTS, "deployment-failed");
    let _ = writeln!(out, "pushleft_deployments_ended_total{{outcome=\"failed\"}} {failed}");
    family(
        out,
        "pushleft_rollouts_total",
        "counter",
        "Rollouts of a release by outcome: completed, promoted (a canary step by an operator), gate-failed, aborted, auto-rolled-back.",
    );
    for (outcome, n) in [
        ("completed", get(tally::ROLLOUTS, "completed")),
        ("promoted", get(tally::EVENTS, "canary-promoted")),
        ("gate-failed", get(tally::ROLLOUTS, "gate-failed")),
        ("aborted", get(tally::ROLLOUTS, "aborted")),
        ("auto-rolled-back", get(tally::EVENTS, "rollback-automatic")),
    ] {
        let _ = writeln!(out, "pushleft_rollouts_total{{outcome=\"{outcome}\"}} {n}");
    }
}

fn jobs(out: &mut String, i: &Indicators) {
    family(
        out,
        "pushleft_jobs_ended_total",
        "counter",
        "Job attempts that ended, by task kind, outcome (succeeded, failed, dead, retried) and failure code (none for a success; other for a code the agent protocol does not list).",
    );
    for t in i.tallies.iter().filter(|t| t.family == tally::JOBS) {
        let mut parts = t.labels.split('|');
        let (Some(kind), Some(outcome), Some(code)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let _ = writeln!(
            out,
            "pushleft_jobs_ended_total{{kind=\"{}\",outcome=\"{}\",code=\"{}\"}} {}",
            esc(kind),
            esc(outcome),
            esc(code),
            t.value
        );
    }
}

/// A histogram from its tallied buckets (each the count of its own bucket, cumulated here) and
/// sum.
fn histogram(out: &mut String, name: &str, help: &str, tallied: &str, bounds: &[u64], get: &dyn Fn(&str, &str) -> i64) {
    family(out, name, "histogram", help);
    let mut total = 0;
    for b in bounds {
        total += get(tallied, &b.to_string());
        let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {total}");
    }
    total += get(tallied, "+Inf");
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {total}");
    let _ = writeln!(out, "{name}_sum {}", get(tallied, tally::SUM_MS) as f64 / 1000.0);
    let _ = writeln!(out, "{name}_count {total}");
}

fn freshness(out: &mut String, i: &Indicators, now_ms: i64) {
    family(
        out,
        "pushleft_node_last_seen_age_seconds",
        "gauge",
        "Seconds since each enrolled node last leased or sent a heartbeat.",
    );
    for (node, seen) in &i.nodes {
        let _ = writeln!(
            out,
            "pushleft_node_last_seen_age_seconds{{node=\"{}\"}} {}",
            esc(node),
            age(now_ms, Some(*seen))
        );
    }
    family(
        out,
        "pushleft_mesh_handshake_age_seconds",
        "gauge",
        "Seconds since the last WireGuard handshake of each mesh link not up (at most 1,000), as its node reported it (+Inf: never).",
    );
    for (node, peer, at) in &i.mesh {
        let at_ms = at.and_then(|s| i64::try_from(s).ok()).map(|s| s * 1000);
        let _ = writeln!(
            out,
            "pushleft_mesh_handshake_age_seconds{{node=\"{}\",peer=\"{}\"}} {}",
            esc(node),
            esc(peer),
            age(now_ms, at_ms)
        );
    }
    family(
        out,
        "pushleft_outbox_oldest_pending_age_seconds",
        "gauge",
        "Age of the oldest notification (forge status, webhook) not yet delivered (0: none pending).",
    );
    let _ = writeln!(
        out,
        "pushleft_outbox_oldest_pending_age_seconds {}",
        i.outbox_oldest_ms.map_or("0".to_owned(), |at| age(now_ms, Some(at)))
    );
    family(
        out,
        "pushleft_outbox_dead_letters",
        "gauge",
        "Notifications given up on after their retries (dead letters).",
    );
    let _ = writeln!(out, "pushleft_outbox_dead_letters {}", i.outbox_dead);
    if let Some(ok) = i.snapshot {
        family(
            out,
            "pushleft_snapshot_last_success_age_seconds",
            "gauge",
            "Seconds since the newest scheduled snapshot of the control plane's state succeeded (+Inf: none has); present once one was attempted.",
        );
        let _ = writeln!(out, "pushleft_snapshot_last_success_age_seconds {}", age(now_ms, ok));
    }
    family(
        out,
        "pushleft_restore_last_proven_age_seconds",
        "gauge",
        "Seconds since each backed-up volume's newest drill proved a restore (+Inf: never).",
    );
    for b in &i.backups {
        let _ = writeln!(
            out,
            "pushleft_restore_last_proven_age_seconds{{environment=\"{}\",volume=\"{}\"}} {}",
            esc(&b.environment),
            esc(&b.volume),
            age(now_ms, b.last_verified_at)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::indicators::Standing;
    use crate::store::tallies::Tally;

    fn t(family: &str, labels: &str, value: i64) -> Tally {
        Tally {
            family: family.into(),
            labels: labels.into(),
            value,
        }
    }

    #[test]
    fn histograms_cumulate_their_buckets_and_every_family_is_written() {
        let i = Indicators {
            tallies: vec![
                t(tally::COMMIT_TO_LIVE, "30", 2),
                t(tally::COMMIT_TO_LIVE, "600", 1),
                t(tally::COMMIT_TO_LIVE, "+Inf", 1),
                t(tally::COMMIT_TO_LIVE, tally::SUM_MS, 5_000_500),
                t(tally::JOBS, "app-ensure|failed|health-deadline", 3),
                t(tally::EVENTS, "deployment-failed", 4),
            ],
            environments: vec![Standing {
                environment: "we\"ird".into(),
                sync: "failed",
                health: "degraded",
            }],
            ..Indicators::default()
        };
        let mut out = String::new();
        render(&mut out, &i, 0);
        for want in [
            "pushleft_commit_to_live_seconds_bucket{le=\"15\"} 0",
            "pushleft_commit_to_live_seconds_bucket{le=\"30\"} 2",
            "pushleft_commit_to_live_seconds_bucket{le=\"600\"} 3",
            "pushleft_commit_to_live_seconds_bucket{le=\"3600\"} 3",
            "pushleft_commit_to_live_seconds_bucket{le=\"+Inf\"} 4",
            "pushleft_commit_to_live_seconds_count 4",
            "pushleft_commit_to_live_seconds_sum 5000.5",
            "pushleft_route_publication_seconds_count 0",
            "pushleft_deployments_ended_total{outcome=\"succeeded\"} 0",
            "pushleft_deployments_ended_total{outcome=\"failed\"} 4",
            "pushleft_rollouts_total{outcome=\"gate-failed\"} 0",
            "pushleft_jobs_ended_total{kind=\"app-ensure\",outcome=\"failed\",code=\"health-deadline\"} 3",
            "pushleft_environment_info{environment=\"we\\\"ird\",sync=\"failed\",health=\"degraded\"} 1",
            "pushleft_outbox_oldest_pending_age_seconds 0",
        ] {
            assert!(out.contains(want), "{want} missing from:\n{out}");
        }
    }
}
