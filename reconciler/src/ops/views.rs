//! What the operator reads: the daemon's status, judged commits, jobs, events, deployments,
//! certificates, the outbox and the live fleet, each as `operator_proto`'s
//! type. Reads only; what is judged on reading (a certificate's state, a domain `serving`) is
//! judged here, from what agents reported.

use super::{Answer, Kind, OpError, Ops, wire};
use crate::store::now_ms;
use operator_proto::domains::Certificates;
use operator_proto::events::{EventsPage, Outbox, OutboxState};
use operator_proto::jobs::JobsPage;
use operator_proto::revisions::RevisionsPage;
use operator_proto::status::{LinkDown, MeshSummary, Status};
use operator_proto::{Deployment, DeploymentsPage};
use std::sync::atomic::Ordering;

/// How many nodes' mesh rows `/v1/status` reads at a time (without their specs).
const MESH_PAGE: i64 = 512;

/// The most running deployments `/v1/fleet` answers with: at about 3 KiB of JSON each, 32 MiB,
/// half of what `pl` reads.
pub const MAX_FLEET_DEPLOYMENTS: usize = 10_000;

/// The cursor of the next page when this one is full.
fn next<T, C>(rows: &[T], limit: u32, cursor: impl Fn(&T) -> C) -> Option<C> {
    (rows.len() == limit as usize)
        .then(|| rows.last().map(&cursor))
        .flatten()
}

impl Ops {
    /// Whether the ledger answers (`/readyz`).
    pub async fn ping(&self) -> bool {
        self.ledger.ping().await.is_ok()
    }

    /// The counts of the last pass, which `/metrics` serves (see [`crate::hub::Hub::refresh_counts`]);
    /// read once at start when no pass has run yet.
    pub async fn cached_counts(&self) -> Option<crate::store::views::Counts> {
        if let Some(c) = self.hub.counts.lock().ok().and_then(|c| c.clone()) {
            return Some(c);
        }
        self.hub.refresh_counts(&self.ledger, false).await;
        self.hub.counts.lock().ok().and_then(|c| c.clone())
    }

    /// `GET /v1/status`, read live: an operator waiting on a rollout wants now.
    pub async fn status(&self) -> Answer<Status> {
        let counts = self.ledger.views().counts(now_ms()).await?;
        let in_force = self.ledger.revisions().last_accepted(&self.branch).await?;
        let last_judged = self.ledger.revisions().last_judged(&self.branch).await?;
        // The mesh: how many links agents report, and each judged down (`reconcile::mesh_health`).
        // Read a page of nodes at a time, without the specs (a 10,000-node fleet's meshes are
        // hundreds of MB).
        // The down links are counted, and named up to the bound `/metrics` names them to.
        let (mut links, mut down_total, mut down, mut after) = (0, 0, Vec::new(), None::<String>);
        loop {
            let page = self
                .ledger
                .nodes()
                .meshes_page(after.as_deref(), MESH_PAGE, false)
                .await?;
            for m in &page {
                links += wire::links(m).len();
                for peer in wire::down(m) {
                    down_total += 1;
                    if down.len() < crate::hub::MAX_NAMED_LINKS {
                        down.push(LinkDown {
                            node: m.node.clone(),
                            peer,
                        });
                    }
                }
            }
            match page.last() {
                Some(last) if page.len() == MESH_PAGE as usize => after = Some(last.node.clone()),
                _ => break,
            }
        }
        // The objectives over the last day: the hourly counts, and each node's freshness now
        // (not `/metrics`' reading, up to 15 s old: a node enrolled a moment ago counts).
        let now = now_ms();
        let day = self.ledger.events().tallies_since(now - super::slos::WINDOW_MS).await?;
        let nodes = self.heard_from().await?;
        let ages: Vec<i64> = nodes.iter().map(|(_, seen)| now - seen).collect();
        Ok(Status {
            control_plane: self.ledger.control_plane().await?,
            slos: super::slos::judge(&day, &ages),
            mesh: MeshSummary {
                links,
                down_total,
                down,
            },
            leader: self.hub.leader.load(Ordering::Relaxed),
            last_pass_ms_ago: now_ms() - self.hub.last_tick_ms.load(Ordering::Relaxed),
            branch: self.branch.clone(),
            in_force,
            last_judged,
            counts: wire::counts(counts),
        })
    }

    /// `GET /v1/revisions`: newest first, before the cursor.
    pub async fn revisions(&self, branch: Option<&str>, before: Option<i64>, limit: u32) -> Answer<RevisionsPage> {
        let revisions = wire::all(
            self.ledger.views().revisions(branch, before, limit).await?,
            wire::revision,
        )?;
        Ok(RevisionsPage {
            next: next(&revisions, limit, |r| r.id),
            revisions,
        })
    }

    /// `GET /v1/jobs`: newest first, before the cursor.
    pub async fn jobs(
        &self,
        state: Option<&str>,
        environment: Option<&str>,
        before: Option<i64>,
        limit: u32,
    ) -> Answer<JobsPage> {
        let jobs = wire::all(
            self.ledger.views().jobs(state, environment, before, limit).await?,
            wire::job,
        )?;
        Ok(JobsPage {
            next: next(&jobs, limit, |j| j.id),
            jobs,
        })
    }

    /// `GET /v1/events`: oldest first after the cursor.
    pub async fn events(&self, after: i64, limit: u32) -> Answer<EventsPage> {
        let rows = self.ledger.events().events_after(after, limit).await?;
        Ok(EventsPage {
            next: rows.last().map_or(after, |e| e.id),
            events: rows.iter().map(wire::event).collect(),
        })
    }

    /// `GET /v1/deployments`: a page by environment name.
    pub async fn deployments(&self, after: Option<&str>, limit: u32) -> Answer<DeploymentsPage> {
        let rows = self.ledger.views().deployments(after, limit, now_ms()).await?;
        let full = rows.len() == limit as usize;
        let deployments = wire::all(rows, wire::deployment)?;
        let next = full
            .then(|| deployments.last().map(|d| d.environment.clone()))
            .flatten();
        Ok(DeploymentsPage { deployments, next })
    }

    /// One environment's deployment now (`None`: it has none).
    pub async fn environment(&self, name: &str) -> Answer<Option<Deployment>> {
        match self.ledger.views().deployment(name, now_ms()).await? {
            Some(row) => Ok(Some(wire::deployment(row)?)),
            None => Ok(None),
        }
    }

    /// `GET /v1/certificates`: each one's state judged now.
    pub async fn certificates(&self) -> Answer<Certificates> {
        let now = now_ms();
        Ok(Certificates {
            certificates: self
                .ledger
                .certificates()
                .certificates()
                .await?
                .iter()
                .map(|r| wire::certificate(r, now))
                .collect(),
        })
    }

    /// `GET /v1/outbox`: newest first, of one state or all.
    pub async fn outbox(&self, state: Option<&str>, limit: i64) -> Answer<Outbox> {
        let state = match state.map(OutboxState::parse) {
            Some(None) => return Err(OpError::malformed("state is pending, delivered or dead")),
            Some(Some(st)) => Some(st.as_str()),
            None => None,
        };
        Ok(Outbox {
            outbox: wire::all(self.ledger.events().outbox(state, limit).await?, wire::outbox)?,
        })
    }

    /// `GET /v1/fleet`: the live fleet as re-placement sees it now
    /// (`state_schema::replacement::Snapshot`), what `pl plan --fleet` decides on.
    pub async fn fleet(&self) -> Answer<state_schema::replacement::Snapshot> {
        let snapshot = self.ledger.nodes().fleet_snapshot(now_ms(), self.lost_after_ms).await?;
        if snapshot.running.len() > MAX_FLEET_DEPLOYMENTS {
            return Err(OpError::new(
                Kind::TooLarge,
                "fleet-too-large",
                format!(
                    "{} running deployments; /v1/fleet answers with at most {MAX_FLEET_DEPLOYMENTS}",
                    snapshot.running.len()
                ),
            ));
        }
        Ok(snapshot)
    }
}
