//! Events: `GET /v1/events` (viewer) and the Server-Sent Events of `GET /v1/events/stream`,
//! whose every `data:` line is one [`Event`]; and the outgoing notifications (`GET /v1/outbox`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One event of the ledger.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Its cursor (and the stream's event `id`).
    pub id: i64,
    pub at_ms: i64,
    /// What happened (`revision-accepted`, `job-failed`, …); the stream's event name.
    pub kind: String,
    /// What it happened to (an environment, a node, a commit).
    pub subject: String,
    pub detail: String,
}

/// `GET /v1/events`: oldest first after the cursor, and the cursor to ask from next.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EventsPage {
    pub events: Vec<Event>,
    pub next: i64,
}

spelled! {
    /// Where an outgoing notification stands.
    pub enum OutboxState {
        Pending = "pending",
        Delivered = "delivered",
        /// Out of attempts: a dead letter, with its last error.
        Dead = "dead",
    }
}

/// One outgoing notification (a forge status or a webhook).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutboxEntry {
    pub id: i64,
    pub target: String,
    pub event_id: i64,
    pub kind: String,
    /// The body sent, as JSON text (opaque: its shape is the target's).
    pub payload: String,
    pub state: OutboxState,
    pub attempts: i64,
    pub next_at: i64,
    pub last_error: String,
    pub created_at: i64,
    pub updated_at: i64,
}

/// `GET /v1/outbox`: newest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Outbox {
    pub outbox: Vec<OutboxEntry>,
}
