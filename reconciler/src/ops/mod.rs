//! The operator's use cases, one module per command group, between the HTTP surface and the
//! store: each validates, decides (with the pure functions of `state_schema` where there is a
//! decision), calls the store, wakes what must wake, and returns the typed answer of
//! `operator_proto`, or an [`OpError`] with its stable code. `http/` only parses, authorises,
//! calls these and writes the answer; nothing here knows HTTP beyond the refusal's kind.
//! The agents' use cases are here too: a heartbeat (a decision over what the ledger held of
//! the node), enrolment and renewals (`agents`), and the group commit their leases and
//! completions go through (`group`).
//!
//! Architecture invariant: the operator surface (`http::operator`) reaches the store only
//! through `ops` (`tests/layers.rs`).

pub mod agents;
pub mod backups;
pub mod domains;
pub mod fleet_pages;
pub mod group;
pub mod images;
pub mod indicators;
pub mod lease_wakes;
pub mod nodes;
pub mod plans;
pub mod provenance;
pub mod releases;
pub mod replica_wakes;
pub mod rewrites;
pub mod rollbacks;
pub mod screens;
pub mod sessions;
pub mod slos;
pub mod views;
pub mod volumes;
pub mod wire;

pub use crate::store::now_ms;
/// The ledger's counts as the last pass left them (`/metrics`, `pl status`).
pub use crate::store::views::Counts;

use crate::hub::Hub;
use crate::store::{Ledger, LedgerError};
use std::sync::Arc;

/// What every use case reads and writes through: the ledger, the signals to the loop, and
/// the branch this daemon applies.
pub struct Ops {
    pub ledger: Arc<Ledger>,
    pub hub: Arc<Hub>,
    pub branch: String,
    /// How long a node may be silent before it is lost (`control.lost_after_seconds`).
    pub lost_after_ms: i64,
    /// Whether the control plane issues certificates (`[certificates]`).
    pub issues_certificates: bool,
    /// The repository this daemon reads (`source.path`, or a remote's `cache_dir`), for the
    /// plans the web view shows; `None` where there is none.
    pub repo_dir: Option<std::path::PathBuf>,
    /// One plan at a time: a plan of a large tree is the costliest read a viewer can ask.
    pub plans: tokio::sync::Semaphore,
    /// The newest reading of the service level indicators (`indicators`), which `/metrics`
    /// serves; one reader at a time.
    pub indicators: tokio::sync::Mutex<Option<std::sync::Arc<indicators::Indicators>>>,
    /// The image store (`[images]`), which `pl image gc` collects; `None` when not configured.
    pub images: Option<Arc<crate::images::store::Store>>,
    /// `images.gc_grace_hours`.
    pub images_grace_hours: u64,
    /// The fleet snapshots kept for their next pages (`GET /v1/fleet?limit=`).
    pub fleet_cursors: fleet_pages::FleetCursors,
}

impl Ops {
    /// The operator's use cases' state, from the daemon's configuration (the composition root's).
    pub fn new(
        config: &crate::config::Config,
        ledger: &Arc<Ledger>,
        hub: &Arc<Hub>,
        images: Option<&Arc<crate::images::store::Store>>,
    ) -> Ops {
        Ops {
            ledger: Arc::clone(ledger),
            hub: Arc::clone(hub),
            branch: config.source.branch.clone(),
            lost_after_ms: config.control.lost_after_ms(),
            issues_certificates: config.issues_certificates(),
            repo_dir: config.source.path.clone().or_else(|| config.source.cache_dir.clone()),
            plans: tokio::sync::Semaphore::new(1),
            indicators: Default::default(),
            images: images.cloned(),
            images_grace_hours: config.images.as_ref().map_or(24, |i| i.gc_grace_hours),
            fleet_cursors: Default::default(),
        }
    }
}

/// How a refusal reads to the caller (the HTTP surface maps each to its status).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// What was named does not exist (404).
    NotFound,
    /// It exists, and its state refuses the ask (409).
    Conflict,
    /// The ask is not well formed (400).
    Malformed,
    /// A node did the work and it failed there (502).
    FailedOnNode,
    /// A node has not done the work within the wait; it stays asked (504).
    Pending,
    /// The caller may not, whatever its role: a retired node (403).
    Forbidden,
    /// An answer too large to give (413).
    TooLarge,
    /// The ledger did not answer, or held what the wire does not know (503).
    Unavailable,
}

/// A use case's refusal: its kind, a stable code and the daemon's words.
#[derive(Debug, thiserror::Error)]
#[error("{code}: {message}")]
pub struct OpError {
    pub kind: Kind,
    pub code: &'static str,
    pub message: String,
}

impl OpError {
    pub fn new(kind: Kind, code: &'static str, message: impl Into<String>) -> OpError {
        OpError {
            kind,
            code,
            message: message.into(),
        }
    }

    pub fn not_found(code: &'static str, message: impl Into<String>) -> OpError {
        OpError::new(Kind::NotFound, code, message)
    }

    pub fn conflict(code: &'static str, message: impl Into<String>) -> OpError {
        OpError::new(Kind::Conflict, code, message)
    }

    pub fn malformed(message: impl Into<String>) -> OpError {
        OpError::new(Kind::Malformed, "malformed-request", message)
    }

    /// The ledger's trouble, said to the caller without its detail (which is logged).
    pub fn unavailable(e: impl std::fmt::Display) -> OpError {
        tracing::warn!(error = %e, "request failed");
        OpError::new(
            Kind::Unavailable,
            "ledger-unavailable",
            "the ledger did not answer; try again",
        )
    }
}

impl From<LedgerError> for OpError {
    fn from(e: LedgerError) -> OpError {
        OpError::unavailable(e)
    }
}

impl From<wire::Corrupt> for OpError {
    fn from(e: wire::Corrupt) -> OpError {
        OpError::unavailable(e)
    }
}

/// A use case's answer.
pub type Answer<T> = Result<T, OpError>;
