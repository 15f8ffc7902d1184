//! `pl logs` relayed through the agent: the requests a node picks up, and every limit on
//! what it sends back.

use super::*;

/// A request for the logs of an environment's role on the asking node, as
/// `/v1/agent/logs/wait` hands it over; the agent posts the lines to `/v1/agent/logs/{id}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LogRequest {
    pub id: String,
    pub environment: String,
    pub role: String,
    /// Lines from the end of each container's log (at most [`MAX_LOG_TAIL_LINES`]).
    pub tail: u32,
    /// Keep sending new lines until the reader leaves.
    pub follow: bool,
}

/// The answer to a piece of a log stream taken (`POST /v1/agent/logs/{id}`): nothing more
/// than that it was (`{}`); a refusal says why not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkTaken {}

/// `/v1/agent/logs/wait`: how long to wait for a request (at most [`MAX_LOG_WAIT_MS`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LogWait {
    pub wait_ms: u64,
}

/// The log requests for the asking node (at most [`MAX_LOG_STREAMS_PER_NODE`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogRequests {
    pub requests: Vec<LogRequest>,
}

/// Most lines a log request asks for from each container.
pub const MAX_LOG_TAIL_LINES: u32 = 10_000;

/// Largest body of one posted piece of a log stream.
pub const MAX_LOG_CHUNK_BYTES: usize = 64 * 1024;

/// Longest log line relayed (the engine splits longer output into 16 KiB pieces itself).
pub const MAX_LOG_LINE_BYTES: usize = 16 * 1024;

/// Most bytes a log request that does not follow relays in all (its tails, every container
/// together); past it the stream ends with a line that says so.
pub const MAX_LOG_TAIL_BYTES: usize = 16 * 1024 * 1024;

/// Longest wait for a log request.
pub const MAX_LOG_WAIT_MS: u64 = 25_000;

/// Most log streams open at once for one node.
pub const MAX_LOG_STREAMS_PER_NODE: usize = 8;
