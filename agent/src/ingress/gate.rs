//! A canary's gates, measured by the ingress: Caddy's reverse proxy logs each round trip to an
//! upstream (at debug level: the upstream as configured, here a slot's `{file.*}` placeholder,
//! the duration, the status or the error);
//! a logger of ours (`pl-proxy`, one per machine, added with the ingress server, so never by a
//! reload under a canary's traffic) writes just
//! those lines, stripped of requests and headers, to a file beside the admin socket, rolled at
//! 10 MB (one old file kept). Before a canary's next step, the agent reads the lines since its
//! step before, keeps those of the new release's upstreams on this node, and judges them: 5xx
//! (or no answer at all) against `maxErrorPercent`, the p95 duration against `maxP95Ms`.
//! Fewer than `minRequests`: not judged (said in the note). Nothing of it is on the request
//! path beyond Caddy's own write.

use agent_proto::task::CanaryGate;
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

/// Judges `m` against `gate`: `Ok` with what was seen, or `Err` naming the gate that failed and
/// the measured values.
pub fn judge(gate: &CanaryGate, m: &Measured) -> Result<String, String> {
    if m.requests < gate.min_requests {
        return Ok(format!(
            "gates not judged: {} request(s) to the new release, fewer than minRequests {}",
            m.requests, gate.min_requests
        ));
    }
    let percent = f64::from(m.errors) * 100.0 / f64::from(m.requests);
    let p95 = m.p95_ms().unwrap_or(0.0);
    let seen = format!(
        "{} of {} requests 5xx or failed ({percent:.1}%), p95 {p95:.0} ms",
        m.errors, m.requests
    );
    let mut failed = Vec::new();
    if let Some(max) = gate.max_error_percent
        && percent > f64::from(max)
    {
        failed.push(format!("maxErrorPercent {max}"));
    }
    if let Some(max) = gate.max_p95_ms
        && p95 > f64::from(max)
    {
        failed.push(format!("maxP95Ms {max}"));
    }
    if failed.is_empty() {
        Ok(format!("gates passed: {seen}"))
    } else {
        Err(format!("{seen}: over {}", failed.join(" and ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(errors: Option<u8>, p95: Option<u32>) -> CanaryGate {
        CanaryGate {
            max_error_percent: errors,
            max_p95_ms: p95,
            min_requests: 10,
        }
    }

    #[test]
    fn the_file_s_round_trips_to_the_canary_since_its_step_are_judged() {
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
        assert!(judge(&gate(Some(25), None), &m).is_ok());
        let why = judge(&gate(Some(10), None), &m).expect_err("19% > 10%");
        assert!(
            why.starts_with("4 of 21 requests 5xx or failed (19.0%)") && why.ends_with("over maxErrorPercent 10"),
            "{why}"
        );
        // 21 durations, 0-19 ms and one of 500 ms: the 20th (nearest rank) is 19 ms.
        assert!(judge(&gate(None, Some(100)), &m).is_ok());
        let why = judge(&gate(None, Some(10)), &m).expect_err("p95 19 ms > 10 ms");
        assert!(why.contains("p95 19 ms") && why.ends_with("over maxP95Ms 10"), "{why}");
        let few = Measured {
            requests: 3,
            errors: 3,
            durations_ms: vec![1.0; 3],
        };
        assert!(judge(&gate(Some(0), None), &few).is_ok_and(|n| n.contains("not judged")));
        assert_eq!(measure(&dir.path().join("none"), &[], 0), Measured::default());
    }
}
