//! A canary's gates, measured by the ingress: Caddy's reverse proxy logs each round trip to an
//! upstream (at debug level: the upstream as configured, here a slot's `{file.*}` placeholder,
//! the duration, the status or the error);
//! a logger of ours (`pl-proxy`, one per machine, added with the ingress server, so never by a
//! reload under a canary's traffic) writes just
//! those lines, stripped of requests and headers, to a file beside the admin socket, rolled at
//! 10 MB (one old file kept). A `measure-canary` task reads the lines since this node's share
//! began, keeps those of the new release's upstreams on this node, and reports their count,
//! those answered 5xx (or not at all) and their p95; the control plane judges the gates on
//! every ingress's report together (`state_schema::rollout::advance::verdict`). Nothing of it
//! is on the request path beyond Caddy's own write.

use agent_proto::CanaryMeasure;
use serde::Deserialize;
use serde_json::{Value, json};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// The logger's name in Caddy's configuration.
pub const LOGGER: &str = "pl-proxy";
/// Its file, in the admin socket's folder (Caddy writes it, the agent reads it).
pub const FILE: &str = "pl-proxy.log";
/// The most of the file read for one judgement (the file rolls at 10 MB).
const MAX_READ: u64 = 16 << 20;
/// The most round trips kept for one judgement.
const MAX_SAMPLES: usize = 200_000;

/// The logger's configuration: the reverse proxy's debug lines only, as JSON without the
/// request and its headers (nothing of a client's reaches the file but its upstream's answer).
pub fn logger(file: &Path) -> Value {
    json!({
        "level": "DEBUG",
        "include": ["http.handlers.reverse_proxy"],
        "writer": {"output": "file", "filename": file.display().to_string(), "roll_size_mb": 10, "roll_keep": 1},
        "encoder": {
            "format": "filter",
            "wrap": {"format": "json"},
            "fields": {"request": {"filter": "delete"}, "headers": {"filter": "delete"}},
        },
    })
}

/// One line of the file, as far as a gate reads it.
#[derive(Deserialize)]
struct Line {
    msg: String,
    #[serde(default)]
    upstream: String,
    ts: f64,
    #[serde(default)]
    duration: f64,
    #[serde(default)]
    status: Option<u16>,
    #[serde(default)]
    error: Option<String>,
}

/// What the ingress saw of some upstreams: round trips, those that failed (5xx or no answer),
/// and their durations in milliseconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Measured {
    pub requests: u32,
    pub errors: u32,
    pub durations_ms: Vec<f64>,
}

impl Measured {
    /// The 95th percentile of the durations (nearest rank), in milliseconds.
    pub fn p95_ms(&self) -> Option<f64> {
        let mut d = self.durations_ms.clone();
        if d.is_empty() {
            return None;
        }
        d.sort_by(f64::total_cmp);
        let rank = ((d.len() as f64) * 0.95).ceil() as usize;
        d.get(rank.saturating_sub(1)).copied()
    }

    /// As the agent reports it (read from a proxy log).
    pub fn report(&self) -> CanaryMeasure {
        CanaryMeasure {
            requests: self.requests,
            errors: self.errors,
            p95_micros: self.p95_ms().map(|p| (p * 1000.0).round() as u64),
            logged: true,
        }
    }
}

/// Reads the round trips to `dials` (as the log names them) logged at or after `since_ms` from `file` (its last
/// [`MAX_READ`] bytes; a file not there yet: nothing).
pub fn measure(file: &Path, dials: &[String], since_ms: i64) -> Measured {
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(file) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len > MAX_READ {
            let _ = f.seek(SeekFrom::Start(len - MAX_READ));
        }
        let _ = f.take(MAX_READ).read_to_string(&mut text);
    }
    let since = since_ms as f64 / 1000.0;
    let mut m = Measured::default();
    for line in text.lines() {
        let Ok(l) = serde_json::from_str::<Line>(line) else {
            continue;
        };
        if l.msg != "upstream roundtrip" || l.ts < since || !dials.contains(&l.upstream) {
            continue;
        }
        m.requests += 1;
        if l.error.is_some() || l.status.is_none_or(|s| s >= 500) {
            m.errors += 1;
        }
        if m.durations_ms.len() < MAX_SAMPLES {
            m.durations_ms.push(l.duration * 1000.0);
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_s_round_trips_to_the_canary_since_its_share_are_measured() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join(FILE);
        let mut text = String::new();
        text.push_str(r#"{"level":"debug","ts":99.0,"logger":"http.handlers.reverse_proxy","msg":"upstream roundtrip","upstream":"10.0.0.2:8080","duration":0.001,"status":500}"#);
        text.push('\n');
        for i in 0..20 {
            let status = if i < 3 { 502 } else { 200 };
            text.push_str(&format!(
                r#"{{"level":"debug","ts":100.{i},"logger":"http.handlers.reverse_proxy","msg":"upstream roundtrip","upstream":"10.0.0.2:8080","duration":0.0{i:02},"status":{status}}}"#
            ));
            text.push('\n');
            text.push_str(r#"{"level":"debug","ts":100.5,"logger":"http.handlers.reverse_proxy","msg":"selected upstream","dial":"10.0.0.2:8080"}"#);
            text.push('\n');
        }
        text.push_str(r#"{"ts":101.0,"msg":"upstream roundtrip","upstream":"10.0.0.2:8080","duration":0.5,"error":"dial tcp: connection refused"}"#);
        text.push('\n');
        text.push_str(
            r#"{"ts":101.0,"msg":"upstream roundtrip","upstream":"10.0.0.9:8080","duration":0.5,"status":500}"#,
        );
        text.push_str("\nnot json\n");
        std::fs::write(&file, text).expect("write");
        let m = measure(&file, &["10.0.0.2:8080".to_owned()], 100_000);
        assert_eq!(
            (m.requests, m.errors),
            (21, 4),
            "since the step, this upstream, 5xx and no answer"
        );
        // 21 durations, 0-19 ms and one of 500 ms: the 20th (nearest rank) is 19 ms.
        assert_eq!(
            m.report(),
            CanaryMeasure {
                requests: 21,
                errors: 4,
                p95_micros: Some(19_000),
                logged: true
            }
        );
        assert_eq!(measure(&dir.path().join("none"), &[], 0), Measured::default());
    }
}
