//! The service level objectives `pl status` reports over the last day, judged from the
//! ledger's hourly counts (`store::tallies`) and each node's last lease or heartbeat: the same
//! counts `/metrics` serves and `deploy/prometheus/` builds its burn-rate alerts on
//! (docs/operations.md). The judgement is pure.

use crate::store::tallies as tally;
use crate::store::tallies::Tally;
use operator_proto::status::{Slo, SloState};

/// The window `pl status` judges.
pub const WINDOW_MS: i64 = 24 * 3_600_000;
/// Deployments that end succeed.
pub const DEPLOYMENT_SUCCESS: f64 = 0.95;
/// Releases live within 10 minutes of their commit.
pub const COMMIT_TO_LIVE: f64 = 0.95;
pub const COMMIT_TO_LIVE_SECONDS: u64 = 600;
/// Enrolled nodes seen within 60 s.
pub const LEASE_FRESHNESS: f64 = 0.99;
pub const LEASE_FRESH_MS: i64 = 60_000;
/// Routes published within 120 s.
pub const ROUTE_PUBLICATION: f64 = 0.95;
pub const ROUTE_PUBLICATION_SECONDS: u64 = 120;

/// The four objectives from the last day's counts (`day`), and each enrolled node's age since
/// its last lease or heartbeat.
pub fn judge(day: &[Tally], node_ages_ms: &[i64]) -> Vec<Slo> {
    let get = |f: &str, l: &str| {
        day.iter()
            .find(|t| t.family == f && t.labels == l)
            .map_or(0, |t| t.value)
    };
    let succeeded = get(tally::EVENTS, "deployment-rollout-done") + get(tally::EVENTS, "deployment-teardown-done");
    let failed = get(tally::EVENTS, "deployment-failed");
    let within = |family: &str, bounds: &[u64], limit: u64| {
        let all: i64 = day
            .iter()
            .filter(|t| t.family == family && t.labels != tally::SUM_MS)
            .map(|t| t.value)
            .sum();
        let inside: i64 = bounds
            .iter()
            .filter(|b| **b <= limit)
            .map(|b| get(family, &b.to_string()))
            .sum();
        (inside, all)
    };
    let (live_soon, releases) = within(
        tally::COMMIT_TO_LIVE,
        tally::COMMIT_TO_LIVE_BOUNDS,
        COMMIT_TO_LIVE_SECONDS,
    );
    let (routes_soon, routes) = within(
        tally::ROUTE_PUBLICATION,
        tally::ROUTE_PUBLICATION_BOUNDS,
        ROUTE_PUBLICATION_SECONDS,
    );
    let fresh = node_ages_ms.iter().filter(|a| **a <= LEASE_FRESH_MS).count() as i64;
    vec![
        slo(
            "deployment-success",
            "95% of deployments that end succeed",
            DEPLOYMENT_SUCCESS,
            succeeded,
            succeeded + failed,
            "deployments ended",
        ),
        slo(
            "commit-to-live",
            "95% of releases live within 10 min of their commit",
            COMMIT_TO_LIVE,
            live_soon,
            releases,
            "releases live",
        ),
        slo(
            "lease-freshness",
            "99% of enrolled nodes seen within 60 s (now)",
            LEASE_FRESHNESS,
            fresh,
            node_ages_ms.len() as i64,
            "nodes enrolled",
        ),
        slo(
            "route-publication",
            "95% of routes published within 120 s",
            ROUTE_PUBLICATION,
            routes_soon,
            routes,
            "routes published",
        ),
    ]
}

fn slo(name: &str, objective: &str, target: f64, good: i64, all: i64, what: &str) -> Slo {
    let measured = (all > 0).then(|| good as f64 / all as f64);
    let state = match measured {
        None => SloState::MissingData,
        Some(m) if m + 1e-9 >= target => SloState::Met,
        Some(_) => SloState::Burning,
    };
    Slo {
        name: name.to_owned(),
        objective: objective.to_owned(),
        target,
        measured,
        over: format!("{all} {what}"),
        state,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(family: &str, labels: &str, value: i64) -> Tally {
        Tally {
            family: family.into(),
            labels: labels.into(),
            value,
        }
    }

    #[test]
    fn each_objective_is_met_burning_or_missing() {
        let day = [
            t(tally::EVENTS, "deployment-rollout-done", 18),
            t(tally::EVENTS, "deployment-failed", 2),
            // 19 releases within 600 s, one at 1200: 95%, met.
            t(tally::COMMIT_TO_LIVE, "60", 10),
            t(tally::COMMIT_TO_LIVE, "600", 9),
            t(tally::COMMIT_TO_LIVE, "1200", 1),
            t(tally::COMMIT_TO_LIVE, tally::SUM_MS, 9_999_999),
        ];
        let slos = judge(&day, &[1_000, 70_000]);
        let by = |n: &str| slos.iter().find(|s| s.name == n).expect("slo").clone();
        let d = by("deployment-success");
        assert_eq!(
            (d.state, d.measured, d.over.as_str()),
            (SloState::Burning, Some(0.9), "20 deployments ended")
        );
        let c = by("commit-to-live");
        assert_eq!((c.state, c.measured), (SloState::Met, Some(0.95)));
        assert_eq!(
            by("lease-freshness").state,
            SloState::Burning,
            "one of two nodes is stale"
        );
        let r = by("route-publication");
        assert_eq!((r.state, r.measured), (SloState::MissingData, None));
        assert_eq!(judge(&[], &[5_000])[2].state, SloState::Met);
    }
}
