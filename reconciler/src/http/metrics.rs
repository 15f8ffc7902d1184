//! The unauthenticated probes: `GET /readyz` (the ledger answers and the loop ticked within
//! 30 s) and `GET /metrics` (Prometheus text of the last pass, and the service level
//! indicators read at most every 15 s: a flood of scrapes costs one read), and the API's own
//! description, `GET /v1/openapi.json`.

use crate::http::server::{answer, internal};
use crate::hub::{DURATION_BUCKETS, Hub};
use crate::ops::{Counts, Ops, now_ms};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use operator_proto::status::Ready;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;

/// `GET /readyz`: `200` when ready, `503` with the same body when not.
pub async fn readyz(ops: &Ops, hub: &Hub) -> Response {
    let ledger = ops.ping().await;
    let age = now_ms() - hub.last_tick_ms.load(Ordering::Relaxed);
    let ticked = age <= 30_000;
    let body = Ready {
        ledger,
        loop_ticked_ms_ago: age,
        leader: hub.leader.load(Ordering::Relaxed),
    };
    let code = if ledger && ticked {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    answer(code, &body)
}

/// The API's own description (`http::openapi`): anyone may read it, as it says nothing of the
/// fleet.
pub async fn openapi() -> Response {
    ([("content-type", "application/json")], crate::http::openapi::json()).into_response()
}

/// Unauthenticated, so it serves the values of the last pass: a scrape (or a flood of them)
/// costs no query.
pub async fn metrics(ops: &Ops, hub: &Hub) -> Response {
    let Some(counts) = ops.cached_counts().await else {
        return internal("no counts yet");
    };
    let mut out = String::new();
    passes(&mut out, hub, &counts);
    certificates(&mut out, hub);
    backups(&mut out, hub);
    mesh(&mut out, hub);
    family(
        &mut out,
        "pushleft_leader",
        "gauge",
        "Whether this daemon reconciles (1) or stands by (0).",
    );
    let _ = writeln!(out, "pushleft_leader {}", u8::from(hub.leader.load(Ordering::Relaxed)));
    match ops.indicators().await {
        Ok(i) => crate::http::slis::render(&mut out, &i, now_ms()),
        // The pass's own figures still serve; the indicators' absence is an alert's input.
        Err(e) => tracing::warn!(error = %e.message, "cannot read the service level indicators"),
    }
    ([("content-type", "text/plain; version=0.0.4")], out).into_response()
}

/// A metric family's `# HELP` and `# TYPE` lines.
fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// The reconcile passes' durations and errors, revisions by verdict, jobs by state, the queue.
fn passes(out: &mut String, hub: &Hub, counts: &Counts) {
    let m = &hub.metrics;
    family(
        out,
        "pushleft_reconcile_duration_seconds",
        "histogram",
        "Time one reconcile pass took.",
    );
    for (i, b) in DURATION_BUCKETS.iter().enumerate() {
        let _ = writeln!(
            out,
            "pushleft_reconcile_duration_seconds_bucket{{le=\"{b}\"}} {}",
            m.buckets[i].load(Ordering::Relaxed)
        );
    }
    let ticks = m.ticks.load(Ordering::Relaxed);
    let _ = writeln!(out, "pushleft_reconcile_duration_seconds_bucket{{le=\"+Inf\"}} {ticks}");
    let sum = m.duration_sum_us.load(Ordering::Relaxed) as f64 / 1e6;
    let _ = writeln!(out, "pushleft_reconcile_duration_seconds_sum {sum}");
    let _ = writeln!(out, "pushleft_reconcile_duration_seconds_count {ticks}");
    family(
        out,
        "pushleft_reconcile_errors_total",
        "counter",
        "Passes that failed and were retried.",
    );
    let _ = writeln!(
        out,
        "pushleft_reconcile_errors_total {}",
        m.tick_errors.load(Ordering::Relaxed)
    );
    family(out, "pushleft_revisions_total", "counter", "Judged commits by verdict.");
    for v in ["accepted", "rejected"] {
        let n = counts.revisions.get(v).copied().unwrap_or(0);
        let _ = writeln!(out, "pushleft_revisions_total{{verdict=\"{v}\"}} {n}");
    }
    family(out, "pushleft_jobs", "gauge", "Jobs by state.");
    for st in operator_proto::jobs::JobState::ALL.iter().map(|s| s.as_str()) {
        let n = counts.jobs.get(st).copied().unwrap_or(0);
        let _ = writeln!(out, "pushleft_jobs{{state=\"{st}\"}} {n}");
    }
    family(
        out,
        "pushleft_queue_age_seconds",
        "gauge",
        "Age of the oldest due job still queued.",
    );
    let _ = writeln!(
        out,
        "pushleft_queue_age_seconds {}",
        counts.queue_age_ms as f64 / 1000.0
    );
}

/// Each issued certificate's expiry and failures in a row, once there are any.
fn certificates(out: &mut String, hub: &Hub) {
    let certificates = hub.certificates.lock().map(|c| c.clone()).unwrap_or_default();
    if certificates.is_empty() {
        return;
    }
    family(
        out,
        "pushleft_certificate_expiry_timestamp_seconds",
        "gauge",
        "When each hostname's issued certificate expires (0: none issued yet).",
    );
    for (host, not_after, _) in &certificates {
        let _ = writeln!(
            out,
            "pushleft_certificate_expiry_timestamp_seconds{{hostname=\"{host}\"}} {}",
            not_after / 1000
        );
    }
    family(
        out,
        "pushleft_certificate_failures",
        "gauge",
        "Failed issuances of each hostname's certificate in a row.",
    );
    for (host, _, failures) in &certificates {
        let _ = writeln!(out, "pushleft_certificate_failures{{hostname=\"{host}\"}} {failures}");
    }
}

/// Each backed-up volume's newest success and failures since, once there are any.
fn backups(out: &mut String, hub: &Hub) {
    let backups = hub.backups.lock().map(|b| b.clone()).unwrap_or_default();
    if backups.is_empty() {
        return;
    }
    family(
        out,
        "pushleft_backup_last_success_age_seconds",
        "gauge",
        "Seconds since each volume's newest successful backup ended (+Inf: none succeeded yet).",
    );
    let now = now_ms();
    for b in &backups {
        let age = b
            .last_success_at
            .map_or("+Inf".to_owned(), |at| format!("{}", (now - at).max(0) as f64 / 1000.0));
        let _ = writeln!(
            out,
            "pushleft_backup_last_success_age_seconds{{environment=\"{}\",volume=\"{}\"}} {age}",
            b.environment, b.volume
        );
    }
    family(
        out,
        "pushleft_backup_failures",
        "gauge",
        "Failed backups of each volume since its newest success.",
    );
    for b in &backups {
        let _ = writeln!(
            out,
            "pushleft_backup_failures{{environment=\"{}\",volume=\"{}\"}} {}",
            b.environment, b.volume, b.failures_since
        );
    }
}

/// The mesh's links as last judged, once there are any: counted by state, and those not up
/// one by one (at most `hub::MAX_NAMED_LINKS`; a link that is up has no series of its own).
fn mesh(out: &mut String, hub: &Hub) {
    let links = hub.mesh_links.lock().map(|l| l.clone()).unwrap_or_default();
    if links.up + links.connecting + links.down == 0 {
        return;
    }
    family(
        out,
        "pushleft_mesh_links",
        "gauge",
        "Mesh links (node to peer) by state: up (handshook within WireGuard's session limit), connecting (not yet, just after its mesh was applied), down.",
    );
    for (state, n) in [("up", links.up), ("connecting", links.connecting), ("down", links.down)] {
        let _ = writeln!(out, "pushleft_mesh_links{{state=\"{state}\"}} {n}");
    }
    family(
        out,
        "pushleft_mesh_link_up",
        "gauge",
        "Each mesh link not up (0), by node and peer: the down ones first, at most 1,000.",
    );
    for (node, peer, _) in &links.not_up {
        let _ = writeln!(out, "pushleft_mesh_link_up{{node=\"{node}\",peer=\"{peer}\"}} 0");
    }
}
