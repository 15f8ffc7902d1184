//! What the web view reads, each screen in one call: the overview's page of environments
//! (each with the commit in force, its signer, and a failing job's reason), one
//! environment's detail, and the event timeline newest first. Reads only, built from the same
//! rows and `wire` conversions as the operator API's answers.

use super::{Answer, OpError, Ops, now_ms, wire};
use crate::store::views::{DeploymentFilter, GenerationRow, PlacedReplica};
use operator_proto::Deployment;
use operator_proto::backups::{Backups, BackupsQuery};
use operator_proto::domains::Domain;
use operator_proto::events::Event;
use operator_proto::jobs::Job;
use operator_proto::volumes::Volume;

/// The overview's filter on what an environment is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateFilter {
    Any,
    Failing,
    RollingOut,
    Held,
    Settled,
}

impl StateFilter {
    /// As the overview's `state=` spells it; `None` for an unknown word.
    pub fn parse(s: &str) -> Option<StateFilter> {
        Some(match s {
            "" | "any" => StateFilter::Any,
            "failing" => StateFilter::Failing,
            "rolling-out" => StateFilter::RollingOut,
            "held" => StateFilter::Held,
            "settled" => StateFilter::Settled,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            StateFilter::Any => "any",
            StateFilter::Failing => "failing",
            StateFilter::RollingOut => "rolling-out",
            StateFilter::Held => "held",
            StateFilter::Settled => "settled",
        }
    }

    pub const ALL: [StateFilter; 5] = [
        StateFilter::Any,
        StateFilter::Failing,
        StateFilter::RollingOut,
        StateFilter::Held,
        StateFilter::Settled,
    ];
}

/// One environment as the overview shows it.
pub struct EnvironmentRow {
    pub deployment: Deployment,
    /// The commit that made its generation, and who signed it.
    pub revision: Option<String>,
    pub signer: Option<String>,
    /// A failed generation's failing job: its key and reason.
    pub failure: Option<(String, String)>,
}

/// A page of the overview.
pub struct OverviewPage {
    pub rows: Vec<EnvironmentRow>,
    /// The name to start the next page after.
    pub next: Option<String>,
}

/// One environment in detail.
pub struct EnvironmentDetail {
    pub row: EnvironmentRow,
    pub replicas: Vec<PlacedReplica>,
    pub generations: Vec<GenerationRow>,
    pub jobs: Vec<Job>,
    pub volumes: Vec<Volume>,
    pub backups: Backups,
    pub domains: Vec<Domain>,
    pub events: Vec<Event>,
    /// The current generation's canary measures, one per step measured.
    pub measures: Vec<CanaryMeasure>,
    /// Releases live on every replica, oldest first: (generation, milliseconds from the pass
    /// that made the generation, when its commit was judged, to live).
    pub to_live: Vec<(i64, i64)>,
}

/// One measured step of a canary: the share of the hostnames' requests the new release had,
/// and what every ingress measured of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CanaryMeasure {
    pub step: i64,
    /// The share, in percent (`None` when the step's task names none).
    pub share: Option<u8>,
    pub requests: i64,
    pub errors: i64,
    pub p95_micros: Option<i64>,
}

impl CanaryMeasure {
    /// A measured step's row: the share is the one its measuring task names.
    pub fn of(m: crate::store::rollouts::StepMeasured) -> CanaryMeasure {
        let share = match serde_json::from_str::<state_schema::task::Task>(&m.task) {
            Ok(state_schema::task::Task::MeasureCanary { weight, .. }) => Some(weight),
            _ => None,
        };
        CanaryMeasure {
            step: m.step,
            share,
            requests: m.requests,
            errors: m.errors,
            p95_micros: m.p95_micros,
        }
    }
}

/// What the overview says above its list: one query, not `status`'s counts.
pub struct Summary {
    pub branch: String,
    pub in_force: Option<String>,
    pub leader: bool,
    pub last_pass_ms_ago: i64,
}

/// The most rows one screen lists.
pub const SCREEN_ROWS: u32 = 50;
/// The most events one page of the timeline reads (a filter no index serves pages on).
pub const TIMELINE_WINDOW: i64 = crate::store::events::SCANNED;

impl Ops {
    /// The branch, its commit in force, and this daemon's part.
    pub async fn summary(&self) -> Answer<Summary> {
        use std::sync::atomic::Ordering;
        Ok(Summary {
            branch: self.branch.clone(),
            in_force: self.ledger.revisions().last_accepted(&self.branch).await?,
            leader: self.hub.leader.load(Ordering::Relaxed),
            last_pass_ms_ago: now_ms() - self.hub.last_tick_ms.load(Ordering::Relaxed),
        })
    }

    /// A page of environments by name, narrowed by a text in the name and a state.
    pub async fn overview(&self, contains: &str, state: StateFilter, after: Option<&str>) -> Answer<OverviewPage> {
        let filter = DeploymentFilter {
            contains: contains.chars().take(100).collect(),
            status: match state {
                StateFilter::Failing => Some("failed"),
                StateFilter::RollingOut => Some("in-progress"),
                StateFilter::Settled => Some("done"),
                StateFilter::Any | StateFilter::Held => None,
            },
            held: state == StateFilter::Held,
        };
        let rows = self
            .ledger
            .views()
            .deployments_where(after, &filter, SCREEN_ROWS, now_ms())
            .await?;
        let full = rows.len() == SCREEN_ROWS as usize;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            out.push(self.environment_row(r).await?.0);
        }
        let next = full
            .then(|| out.last().map(|r| r.deployment.environment.clone()))
            .flatten();
        Ok(OverviewPage { rows: out, next })
    }

    async fn environment_row(
        &self,
        mut r: crate::store::views::DeploymentRow,
    ) -> Answer<(EnvironmentRow, Vec<PlacedReplica>)> {
        let (revision, signer, placed) = (r.revision_sha.take(), r.signer.take(), std::mem::take(&mut r.placed));
        let deployment = wire::deployment(r)?;
        let failure = if deployment.status == operator_proto::DeploymentStatus::Failed {
            let failed = self
                .ledger
                .views()
                .jobs(Some("failed"), Some(&deployment.environment), None, 1)
                .await?;
            failed
                .into_iter()
                .next()
                .map(|j| (j.key.clone(), j.reason.clone().unwrap_or_default()))
        } else {
            None
        };
        Ok((
            EnvironmentRow {
                deployment,
                revision,
                signer,
                failure,
            },
            placed,
        ))
    }

    /// One environment in detail (`NotFound` when it has no deployment).
    pub async fn environment_detail(&self, name: &str) -> Answer<EnvironmentDetail> {
        let Some(r) = self.ledger.views().deployment(name, now_ms()).await? else {
            return Err(OpError::not_found(
                "environment-not-found",
                format!("no deployment of environment {name}"),
            ));
        };
        let (row, replicas) = self.environment_row(r).await?;
        let generations = self.ledger.views().generations(name, 20).await?;
        let jobs = self.jobs(None, Some(name), None, 20).await?.jobs;
        let volumes = self.volumes_of(name).await?;
        let backups = self
            .backups(BackupsQuery {
                environment: name.to_owned(),
                volume: None,
                limit: Some(10),
            })
            .await?;
        let domains = self.domains_of(Some(name)).await?.domains;
        let events = self
            .ledger
            .events()
            .of_environment(name, 30)
            .await?
            .iter()
            .map(wire::event)
            .collect();
        let lived = self.ledger.events().lived(name, 20).await?;
        let measures = self
            .ledger
            .deployments()
            .generation_measures(name, row.deployment.generation)
            .await?
            .into_iter()
            .map(CanaryMeasure::of)
            .collect();
        let to_live = to_live(&generations, &lived);
        Ok(EnvironmentDetail {
            row,
            replicas,
            generations,
            jobs,
            volumes,
            backups,
            domains,
            events,
            to_live,
            measures,
        })
    }

    /// Events newest first before a cursor, of one kind and subject (an environment or a
    /// node) when named: a page of at most `limit`, each request reading a bounded window of
    /// ids, and where the next page starts when there may be more.
    pub async fn timeline(
        &self,
        before: Option<i64>,
        kind: Option<&str>,
        subject: Option<&str>,
        limit: u32,
    ) -> Answer<Timeline> {
        let (rows, floor) = self.ledger.events().recent(before, kind, subject, limit).await?;
        let events: Vec<Event> = rows.iter().map(wire::event).collect();
        Ok(Timeline {
            older: older_than(&events, limit, floor),
            events,
        })
    }
}

/// A page of the timeline.
pub struct Timeline {
    pub events: Vec<Event>,
    /// The cursor of the next (older) page, when there may be one.
    pub older: Option<i64>,
}

/// Where the next page of the timeline starts: after the last event of a full page, or, when
/// the window read ran out first, below the window (its events were all looked at).
pub fn older_than(events: &[Event], limit: u32, floor: i64) -> Option<i64> {
    if events.len() >= limit as usize {
        events.last().map(|e| e.id)
    } else if floor > 0 {
        Some(floor + 1)
    } else {
        None
    }
}

/// Each release's time from its generation's making to live on every replica, oldest first:
/// the generations made (with when) against the `deployment-rollout-done` times.
pub fn to_live(generations: &[GenerationRow], lived: &[(i64, i64)]) -> Vec<(i64, i64)> {
    let mut out: Vec<(i64, i64)> = lived
        .iter()
        .filter_map(|(g, at)| {
            let made = generations.iter().find(|r| r.generation == *g)?;
            Some((*g, (at - made.created_at_ms).max(0)))
        })
        .collect();
    out.sort_unstable();
    out.dedup_by_key(|(g, _)| *g);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeline_pages_on_past_a_window_with_no_match() {
        let e = |id| Event {
            id,
            at_ms: 0,
            kind: "k".into(),
            subject: "s".into(),
            detail: String::new(),
        };
        // A full page: the next starts after its last event.
        assert_eq!(older_than(&[e(9), e(7)], 2, 0), Some(7));
        // A short page whose window stopped above the first event: the next reads below it.
        assert_eq!(older_than(&[e(150_001)], 2, 50_000), Some(50_001));
        assert_eq!(older_than(&[], 2, 50_000), Some(50_001));
        // The scan reached the first event: nothing older.
        assert_eq!(older_than(&[e(3)], 2, 0), None);
    }

    #[test]
    fn commit_to_live_pairs_each_release_with_its_generation() {
        let g = |generation, created_at_ms| GenerationRow {
            generation,
            action: "rollout".into(),
            created_at_ms,
            sha: None,
            signer: None,
        };
        let generations = [g(3, 10_000), g(2, 5_000), g(1, 1_000)];
        // Newest first, as the events are read; generation 4 is not among those made.
        let lived = [(4, 40_000), (3, 12_500), (1, 1_800)];
        assert_eq!(to_live(&generations, &lived), vec![(1, 800), (3, 2_500)]);
    }
}
