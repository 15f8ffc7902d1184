//! How a generation's rollout advances, step by step: the one decision. Given where its
//! current step stands (its jobs, and whether it waits out a canary's pause or a promote),
//! [`advance`] says what happens next as a closed [`Advance`]; the daemon's
//! `reconcile/advance.rs` writes it, and `pl status` reads a canary's standing
//! ([`CanaryStanding`]) from the same columns the decision sets. A canary's gates are judged
//! here on what every ingress measured of a share ([`verdict`]); whether a promote or an abort
//! is allowed is decided here too ([`promote`], [`abort`]). Pure: no clock is read (the caller
//! passes `now_ms`), nothing is written.

use super::Step;
use crate::deployment::DeploymentSpec;
use crate::generations::{Action, Status, StepJobs};
use crate::model::CanaryGate;
use crate::task::{Task, Wait};

/// Where a step stands before its jobs run: the ledger's `deployments.step_state` (and
/// `step_due` for a pause). A step that waits has no jobs queued yet; they are queued when it
/// runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepState {
    /// Its jobs are queued (or done).
    Running,
    /// It waits out the pause of the canary step before it, until `due_ms`.
    Paused { due_ms: i64 },
    /// It waits for `pl rollout promote`.
    AwaitsPromote,
}

impl StepState {
    /// The column's text.
    pub fn as_str(self) -> &'static str {
        match self {
            StepState::Running => "running",
            StepState::Paused { .. } => "paused",
            StepState::AwaitsPromote => "awaits-promote",
        }
    }

    /// The `step_due` column: when a pause ends, 0 otherwise.
    pub fn due_ms(self) -> i64 {
        match self {
            StepState::Paused { due_ms } => due_ms,
            _ => 0,
        }
    }

    /// From the two columns; `None` for a state this build does not know.
    pub fn from_row(state: &str, due_ms: i64) -> Option<StepState> {
        match state {
            "running" => Some(StepState::Running),
            "paused" => Some(StepState::Paused { due_ms }),
            "awaits-promote" => Some(StepState::AwaitsPromote),
            _ => None,
        }
    }

    /// How `step` starts once the step before it is done at `now_ms`: at once, or after the
    /// pause its canary publish waits out (the wait of the step before, carried by its tasks).
    pub fn entering(step: &Step, now_ms: i64) -> StepState {
        match step.iter().find_map(|(t, _)| t.wait()) {
            None => StepState::Running,
            Some(Wait::Seconds(s)) => StepState::Paused {
                due_ms: now_ms.saturating_add(i64::from(s) * 1000),
            },
            Some(Wait::Promote) => StepState::AwaitsPromote,
        }
    }
}

/// A rollout, teardown or rollback in progress, as far as its steps go.
#[derive(Clone, Copy, Debug)]
pub struct Rollout<'a> {
    pub action: Action,
    /// The generation is a rollback's (no watch after it: there is nothing further back).
    pub rollback: bool,
    pub generation: u64,
    pub spec: &'a DeploymentSpec,
    /// The specs of older generations still running somewhere.
    pub retired: &'a [DeploymentSpec],
}

impl Rollout<'_> {
    /// Its ordered steps: what `pl plan` shows and the daemon queues.
    pub fn steps(&self) -> Vec<Step> {
        if self.action == Action::Teardown {
            let mut running = self.retired.to_vec();
            running.push(self.spec.clone());
            super::teardown_steps(&self.spec.environment, self.generation, &running)
        } else if self.rollback {
            super::rollback_steps(self.spec, self.generation, self.retired)
        } else {
            super::rollout_steps(self.spec, self.generation, self.retired)
        }
    }
}

/// Where a generation's current step stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Standing<'a> {
    pub step: usize,
    pub state: StepState,
    pub jobs: StepJobs,
    /// What its canary measures (a step of `MeasureCanary` tasks) reported, one per job done.
    pub measured: &'a [Measured],
}

/// What one ingress measured of a canary's share (the agent's `CanaryMeasure`, as the ledger
/// keeps it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Measured {
    pub requests: u32,
    pub errors: u32,
    pub p95_micros: Option<u64>,
    /// False when the node had no proxy log to read.
    pub logged: bool,
}

/// A canary's gates judged on a share's measures.
#[derive(Clone, Debug, PartialEq)]
pub enum GateVerdict {
    /// No ingress had a proxy log to read: nothing to judge.
    Unlogged,
    /// Fewer requests than the gate's `minRequests`: not judged.
    NotJudged { requests: u32, min: u32 },
    /// Every gate passed on what was seen.
    Passed { seen: String },
    /// A gate failed: what was seen, and which gates it went over.
    Failed { seen: String, over: Vec<String> },
}

impl GateVerdict {
    /// In the daemon's words (events, a failure's reason).
    pub fn words(&self) -> String {
        match self {
            GateVerdict::Unlogged => "gates not judged: no ingress had a proxy log (one comes with the ingress server: a Caddy restarted without its saved configuration gets it back then)".to_owned(),
            GateVerdict::NotJudged { requests, min } => format!(
                "gates not judged: {requests} request(s) to the new release, fewer than minRequests {min}"
            ),
            GateVerdict::Passed { seen } => format!("gates passed: {seen}"),
            GateVerdict::Failed { seen, over } => {
                format!("the new release's {seen}: over {}", over.join(" and "))
            }
        }
    }
}

/// Judges `gate` on every ingress's measure of a share together: their round trips and
/// failures summed, and the highest p95 (a node whose share answers slowly fails the gate, as
/// the share it serves is what its clients see). Nodes with no proxy log are left out.
pub fn verdict(gate: &CanaryGate, measured: &[Measured]) -> GateVerdict {
    let logged: Vec<&Measured> = measured.iter().filter(|m| m.logged).collect();
    if logged.is_empty() {
        return GateVerdict::Unlogged;
    }
    let requests: u32 = logged.iter().map(|m| m.requests).fold(0, u32::saturating_add);
    let errors: u32 = logged.iter().map(|m| m.errors).fold(0, u32::saturating_add);
    if requests < gate.min_requests || requests == 0 {
        return GateVerdict::NotJudged {
            requests,
            min: gate.min_requests,
        };
    }
    let p95_micros = logged.iter().filter_map(|m| m.p95_micros).max().unwrap_or(0);
    let percent = f64::from(errors) * 100.0 / f64::from(requests);
    let p95_ms = p95_micros as f64 / 1000.0;
    let seen = format!("{errors} of {requests} requests 5xx or failed ({percent:.1}%), p95 {p95_ms:.0} ms");
    let mut over = Vec::new();
    if let Some(max) = gate.max_error_percent
        && percent > f64::from(max)
    {
        over.push(format!("maxErrorPercent {max}"));
    }
    if let Some(max) = gate.max_p95_ms
        && p95_micros > u64::from(max) * 1000
    {
        over.push(format!("maxP95Ms {max}"));
    }
    match over.is_empty() {
        true => GateVerdict::Passed { seen },
        false => GateVerdict::Failed { seen, over },
    }
}

/// The share of requests a canary step gave the new release, when a step that was one is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Share {
    /// Percent of the hostnames' requests.
    pub weight: u8,
    /// The canary's first share: its replicas are watched from here to the switch.
    pub first: bool,
}

/// What a failed step had moved off the old release, so that its failure takes the
/// environment back to it (held, as a failed watch does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Back {
    /// A canary that sent requests to the new release.
    Canary,
    /// Rolling batches that moved requests or stopped old replicas.
    Rolling,
}

impl Back {
    /// For the failure's words.
    pub fn what(self) -> &'static str {
        match self {
            Back::Canary => "a publish of its canary",
            Back::Rolling => "between its rolling batches",
        }
    }
}

/// What a finished rollout does with its watch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watch {
    /// Nothing to do.
    Keep,
    /// The new release is watched for this many seconds from its switch.
    Window(u32),
    /// The canary's watch (first share to switch) ends with the switch.
    End,
}

/// What a rollout in progress does next.
#[derive(Clone, Debug, PartialEq)]
pub enum Advance {
    /// Its current step's jobs still run, or its pause is not over: nothing to write.
    Wait,
    /// Its pause is over, or it was promoted: the current step's jobs are queued now.
    Resume { step: usize },
    /// Its current step is done: `step` (the next that has jobs) comes next, as `state` says
    /// (queued now when `Running`). `share`: the step done was a canary's share; `gate`: it
    /// was a canary's measures, and its gates passed (or were not judged).
    Next {
        step: usize,
        state: StepState,
        share: Option<Share>,
        gate: Option<GateVerdict>,
    },
    /// A job of its current step failed for good, or its measures failed the canary's gates:
    /// the generation fails and waits for a new one. `back`: what the steps done had moved off
    /// the old release, so it goes back; `gate`: the gates' verdict, when they failed it.
    Fail {
        back: Option<Back>,
        gate: Option<GateVerdict>,
    },
    /// No step is left (`steps`: how many there were).
    Done { steps: usize, watch: Watch },
}

/// The one decision: what `rollout`, whose steps are `steps` (from [`Rollout::steps`]) and
/// whose current step stands as `standing`, does next at `now_ms`.
pub fn advance(rollout: &Rollout<'_>, steps: &[Step], standing: Standing<'_>, now_ms: i64) -> Advance {
    match standing.state {
        StepState::AwaitsPromote => return Advance::Wait,
        StepState::Paused { due_ms } if now_ms < due_ms => return Advance::Wait,
        StepState::Paused { .. } => return Advance::Resume { step: standing.step },
        StepState::Running => {}
    }
    if standing.jobs.pending > 0 {
        return Advance::Wait;
    }
    let canary = canary_steps(steps);
    if standing.jobs.broken > 0 {
        let back = match canary.first() {
            Some(&(first, _)) => (standing.step >= first).then_some(Back::Canary),
            None => rolling_from(steps)
                .filter(|first| standing.step >= *first)
                .map(|_| Back::Rolling),
        };
        return Advance::Fail { back, gate: None };
    }
    // A step of measures: the canary's gates, judged on what every ingress measured.
    let gate = steps
        .get(standing.step)
        .and_then(|s| s.iter().find_map(|(t, _)| t.gate()))
        .map(|g| verdict(g, standing.measured));
    if let Some(v @ GateVerdict::Failed { .. }) = gate {
        return Advance::Fail {
            back: Some(Back::Canary),
            gate: Some(v),
        };
    }
    match first_step_from(steps, standing.step + 1) {
        Some(next) => Advance::Next {
            gate,
            step: next,
            state: StepState::entering(&steps[next], now_ms),
            share: canary.iter().position(|(i, _)| *i == standing.step).map(|k| Share {
                weight: canary[k].1,
                first: k == 0,
            }),
        },
        None => {
            // A new release is watched from its switch (a rollback's generation is not: there
            // is nothing further back to go to); a canary's watch ends there otherwise.
            let window = match rollout.action == Action::Rollout && !rollout.rollback {
                true => crate::watch::window(rollout.spec),
                false => None,
            };
            let watch = match (window, canary.is_empty()) {
                (Some(w), _) => Watch::Window(w),
                (None, false) => Watch::End,
                (None, true) => Watch::Keep,
            };
            Advance::Done {
                steps: steps.len(),
                watch,
            }
        }
    }
}

/// The canary steps of a rollout: the index of each weighted publish step, and its weight.
pub fn canary_steps(steps: &[Step]) -> Vec<(usize, u8)> {
    steps
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            s.iter().find_map(|(t, _)| match t {
                Task::PublishIngress { weight: Some(w), .. } => Some((i, *w)),
                _ => None,
            })
        })
        .collect()
}

/// The first step of rolling batches that moves something off the old release (a rolled
/// publish, or a batch's stop) before the last replicas start: a failure from there on rolls
/// the environment back, as a canary's does. `None` when the rollout does not roll.
pub fn rolling_from(steps: &[Step]) -> Option<usize> {
    let last_up = steps
        .iter()
        .rposition(|s| s.iter().any(|(t, _)| matches!(t, Task::EnsureApplication { .. })))?;
    steps[..last_up].iter().position(|s| {
        s.iter().any(|(t, _)| {
            matches!(
                t,
                Task::StopApplication { .. } | Task::PublishIngress { rolled: Some(_), .. }
            )
        })
    })
}

/// The step whose jobs are queued together with step `index`'s, each held until every job of
/// the steps before it on its own node succeeded: the replicas that follow an environment's
/// set-up. A node's replicas need only that node's network, firewall and routes, so they start
/// as soon as those are made there instead of when the last of the environment's nodes has
/// made its own (kubelet and Nomad's client likewise make an allocation's network before its
/// tasks on the node, with no barrier across nodes). `None` when anything else comes between
/// or follows: a release command (a migration runs once, before any replica of the new
/// release), a wait (a canary's pause or promote), or a step that is not replicas starting.
/// A failure of any set-up still fails the step as before; the held jobs are cancelled then.
pub fn held_with(steps: &[Step], index: usize) -> Option<usize> {
    let now = steps.get(index)?;
    if now.is_empty() || !now.iter().all(|(t, _)| matches!(t, Task::EnsureEnvironment { .. })) {
        return None;
    }
    let next = first_step_from(steps, index + 1)?;
    let starts = steps[next]
        .iter()
        .all(|(t, _)| matches!(t, Task::EnsureApplication { .. }));
    starts.then_some(next)
}

/// The first step at or after `from` that has jobs.
pub fn first_step_from(steps: &[Step], from: usize) -> Option<usize> {
    (from..steps.len()).find(|&i| !steps[i].is_empty())
}

/// Why a promote is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromoteRefusal {
    UnknownEnvironment,
    /// No rollout of it is in progress.
    NotInProgress,
    /// Its rollout is in progress but nothing of it waits (a step is running).
    NotPaused,
}

impl PromoteRefusal {
    pub fn code(self) -> &'static str {
        match self {
            PromoteRefusal::UnknownEnvironment => "unknown-environment",
            PromoteRefusal::NotInProgress => "not-in-progress",
            PromoteRefusal::NotPaused => "not-paused",
        }
    }
}

/// Whether a deployment with `status` whose current step stands in `state` can be promoted at
/// `now_ms`: a step that waits (a pause not over yet, or a promote) runs at once; anything else
/// is refused (a pause that is over, or a promote done, waits only for the next advance).
pub fn promote(status: Status, state: StepState, now_ms: i64) -> Result<(), PromoteRefusal> {
    if status != Status::InProgress {
        return Err(PromoteRefusal::NotInProgress);
    }
    match state {
        StepState::Paused { due_ms } if due_ms > now_ms => Ok(()),
        StepState::AwaitsPromote => Ok(()),
        StepState::Running | StepState::Paused { .. } => Err(PromoteRefusal::NotPaused),
    }
}

/// Whether a deployment doing `action` with `status` can be aborted: a rollout in progress
/// only (a teardown goes on; a finished rollout is rolled back, not aborted).
pub fn abort(action: Action, status: Status) -> Result<(), PromoteRefusal> {
    match (action, status) {
        (Action::Rollout, Status::InProgress) => Ok(()),
        _ => Err(PromoteRefusal::NotInProgress),
    }
}

/// Where a canary under way stands, for `pl status` and the view: the share the new release
/// has (0: none yet), and what its next step waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CanaryStanding {
    pub weight: u8,
    pub waits_for_promote: bool,
    /// When the next step is due, while it waits out a pause.
    pub next_at_ms: Option<i64>,
}

/// The standing of a deployment in progress whose last canary share done is `share` (the
/// `deployments.share` column the decision's [`Share`] writes) and whose step stands in
/// `state`; `None` when no canary is under way (no share given, nothing waiting).
pub fn canary_standing(share: u8, state: StepState) -> Option<CanaryStanding> {
    if share == 0 && state == StepState::Running {
        return None;
    }
    Some(CanaryStanding {
        weight: share,
        waits_for_promote: state == StepState::AwaitsPromote,
        next_at_ms: match state {
            StepState::Paused { due_ms } => Some(due_ms),
            _ => None,
        },
    })
}
