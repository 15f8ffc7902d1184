//! `pl backups ENV [VOLUME]` and `pl backup ENV VOLUME`: the backups of an environment's volumes
//! as their agents reported them (time, size, snapshot, status, why one failed), and an
//! operator's backup now, which returns only once its node reported how it ended; `pl restore`,
//! which returns once the role runs on the restored generation.

use crate::operator::{Client, OutFormat, ServerArgs, print_json, query};
use anyhow::{Result, bail};
use serde_json::Value;
use std::time::{Duration, Instant};

/// How often `pl backup` looks for its backup's end.
const POLL: Duration = Duration::from_millis(500);

/// `2026-12-02 03:00:04 UTC`.
fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

fn list_path(environment: &str, volume: Option<&str>, limit: u32) -> String {
    format!(
        "/v1/backups{}",
        query(&[
            ("environment", Some(environment.to_owned())),
            ("volume", volume.map(str::to_owned)),
            ("limit", Some(limit.to_string())),
        ])
    )
}

pub fn list(args: &ServerArgs, environment: &str, volume: Option<&str>, limit: u32) -> Result<u8> {
    let v = Client::new(args)?.json("GET", &list_path(environment, volume, limit))?;
    if args.format == OutFormat::Json {
        return print_json(&v);
    }
    let rows: Vec<&Value> = v["backups"].as_array().into_iter().flatten().collect();
    if rows.is_empty() {
        outln!("no backups of {environment} yet");
        return Ok(0);
    }
    for p in v["proven"].as_array().into_iter().flatten() {
        outln!(
            "{}: restore last proven {} (snapshot {})",
            p["volume"].as_str().unwrap_or("?"),
            utc(p["atMs"].as_i64().unwrap_or(0)),
            p["snapshot"].as_str().unwrap_or("?")
        );
    }
    outln!(
        "{:<23} {:<16} {:<12} {:<9} {:<10} {:>10}  reason",
        "finished",
        "volume",
        "node",
        "status",
        "snapshot",
        "size"
    );
    for r in rows {
        outln!(
            "{:<23} {:<16} {:<12} {:<9} {:<10} {:>10}  {}",
            utc(r["finishedAtMs"].as_i64().unwrap_or(0)),
            r["volume"].as_str().unwrap_or("?"),
            r["node"].as_str().unwrap_or("?"),
            r["status"].as_str().unwrap_or("?"),
            r["snapshot"].as_str().unwrap_or("-"),
            r["bytes"].as_i64().map_or("-".to_owned(), crate::volumes::bytes),
            r["reason"].as_str().unwrap_or(""),
        );
    }
    Ok(0)
}

/// Backs up a volume now (or, `verify`, runs a restore drill of its newest snapshot) and waits
/// (at most `timeout`) for its node's report.
pub fn run(args: &ServerArgs, environment: &str, volume: &str, verify: bool, timeout: Duration) -> Result<u8> {
    let client = Client::new(args)?;
    let body = serde_json::json!({"environment": environment, "volume": volume, "verify": verify});
    let asked = client.post_json("/v1/backups/run", &body)?;
    let Some(job) = asked["job"].as_str() else {
        bail!("the control plane answered no job: {asked}");
    };
    let started = Instant::now();
    loop {
        let v = client.json("GET", &list_path(environment, Some(volume), 20))?;
        let ended = v["backups"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["job"] == job)
            .cloned();
        if let Some(r) = ended {
            if args.format == OutFormat::Json {
                print_json(&r)?;
            } else if r["status"] == "verified" {
                outln!(
                    "verified {environment}/{volume} on {}: snapshot {} restored and its verify command passed in {:.1} s",
                    r["node"].as_str().unwrap_or("?"),
                    r["snapshot"].as_str().unwrap_or("?"),
                    started.elapsed().as_secs_f64()
                );
            } else if r["status"] == "verify-failed" {
                eprintln!(
                    "error[backup-verify-failed]: {environment}/{volume} on {}: {}",
                    r["node"].as_str().unwrap_or("?"),
                    r["reason"].as_str().unwrap_or("?")
                );
            } else if r["status"] == "succeeded" {
                outln!(
                    "backed up {environment}/{volume} on {}: snapshot {} ({}, {} added) in {:.1} s",
                    r["node"].as_str().unwrap_or("?"),
                    r["snapshot"].as_str().unwrap_or("?"),
                    r["bytes"].as_i64().map_or("?".to_owned(), crate::volumes::bytes),
                    r["dataAdded"].as_i64().map_or("?".to_owned(), crate::volumes::bytes),
                    started.elapsed().as_secs_f64()
                );
            } else {
                eprintln!(
                    "error[backup-failed]: {environment}/{volume} on {}: {}",
                    r["node"].as_str().unwrap_or("?"),
                    r["reason"].as_str().unwrap_or("?")
                );
            }
            return Ok(if r["status"] == "succeeded" || r["status"] == "verified" {
                0
            } else {
                1
            });
        }
        if started.elapsed() >= timeout {
            eprintln!(
                "error[backup-pending]: {job} has not ended after {} s; `pl backups {environment} {volume}` shows it when it does",
                timeout.as_secs()
            );
            return Ok(1);
        }
        std::thread::sleep(POLL);
    }
}

/// The environment's deployment (`GET /v1/environments/{name}`), in its JSON form.
fn deployment(client: &Client, environment: &str) -> Result<Option<Value>> {
    client
        .environment(environment)?
        .map(serde_json::to_value)
        .transpose()
        .map_err(Into::into)
}

/// The agent's reason a job ended with, from its `job-failed` / `job-dead` event.
fn reason_of(client: &Client, job: &str) -> Result<String> {
    let events = client.json("GET", "/v1/events?after=0&limit=1000")?;
    Ok(events["events"]
        .as_array()
        .into_iter()
        .flatten()
        .rfind(|e| matches!(e["kind"].as_str(), Some("job-failed" | "job-dead")) && e["subject"] == job)
        .and_then(|e| e["detail"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "see `pl events`".to_owned()))
}

/// Restores a snapshot into the volume's next generation and waits (at most `timeout`) until
/// the role runs on it: the restore done on the node, then the environment's new generation
/// rolled out with every replica running.
pub fn restore(
    args: &ServerArgs,
    environment: &str,
    volume: &str,
    snapshot: Option<&str>,
    timeout: Duration,
) -> Result<u8> {
    let client = Client::new(args)?;
    let before = deployment(&client, environment)?.and_then(|d| d["generation"].as_i64());
    let mut body = serde_json::json!({"environment": environment, "volume": volume});
    if let Some(s) = snapshot {
        body["snapshot"] = Value::from(s);
    }
    let asked = client.post_json("/v1/restores", &body)?;
    let (Some(job), Some(to)) = (asked["job"].as_str(), asked["generation"].as_i64()) else {
        bail!("the control plane answered no job: {asked}");
    };
    let started = Instant::now();
    let late = |what: &str| -> Result<u8> {
        eprintln!(
            "error[restore-pending]: {what} after {} s; `pl volumes {environment}` and `pl status` show how it goes",
            timeout.as_secs()
        );
        Ok(1)
    };
    // 1. The node filled the new generation (the volume moved to it), or the job failed.
    loop {
        let volumes = client.json("GET", "/v1/volumes")?;
        let at = volumes["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["environment"] == environment && r["volume"] == volume)
            .and_then(|r| r["generation"].as_i64());
        if at == Some(to) {
            break;
        }
        let jobs = client.json(
            "GET",
            &format!(
                "/v1/jobs{}",
                query(&[
                    ("environment", Some(environment.to_owned())),
                    ("limit", Some("200".into()))
                ])
            ),
        )?;
        let state = jobs["jobs"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|j| j["key"] == job)
            .and_then(|j| j["state"].as_str().map(str::to_owned));
        if matches!(state.as_deref(), Some("failed" | "dead" | "cancelled")) {
            eprintln!(
                "error[volume-restore-failed]: {environment}/{volume} on {}: {}",
                asked["node"].as_str().unwrap_or("?"),
                reason_of(&client, job)?
            );
            return Ok(1);
        }
        if started.elapsed() >= timeout {
            return late("the restore has not ended");
        }
        std::thread::sleep(POLL);
    }
    let restored = started.elapsed();
    // 2. Its role placed again on it: a new generation, rolled out, every replica running.
    loop {
        if let Some(d) = deployment(&client, environment)? {
            let newer = d["generation"].as_i64() > before;
            let converged = d["status"] == "done" && d["running"] == d["replicas"] && d["stale"].as_u64() == Some(0);
            if d["status"] == "failed" {
                eprintln!(
                    "error[deployment-failed]: {environment} generation {} failed after the restore; generation {} of {volume} holds the restored data, the one before it is kept",
                    d["generation"], to
                );
                return Ok(1);
            }
            if newer && converged {
                if args.format == OutFormat::Json {
                    return print_json(&serde_json::json!({
                        "environment": environment,
                        "volume": volume,
                        "generation": to,
                        "snapshot": asked["snapshot"],
                        "deployment": d["generation"],
                        "restoredMs": restored.as_millis() as u64,
                        "runningMs": started.elapsed().as_millis() as u64,
                    }));
                }
                outln!(
                    "restored {environment}/{volume} from snapshot {} into generation {to} on {} in {:.1} s; generation {} of {environment} runs on it after {:.1} s (generation {} of the volume is kept)",
                    asked["snapshot"].as_str().unwrap_or("?"),
                    asked["node"].as_str().unwrap_or("?"),
                    restored.as_secs_f64(),
                    d["generation"],
                    started.elapsed().as_secs_f64(),
                    to - 1
                );
                return Ok(0);
            }
        }
        if started.elapsed() >= timeout {
            return late("the role does not run on the restored volume yet");
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn times_read_as_utc_dates() {
        assert_eq!(super::utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(super::utc(1_796_180_404_000), "2026-12-02 03:00:04 UTC");
        assert_eq!(super::utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
    }

    #[test]
    fn a_listing_asks_for_one_volume_only_when_named() {
        assert_eq!(
            super::list_path("shop", None, 50),
            "/v1/backups?environment=shop&limit=50"
        );
        assert_eq!(
            super::list_path("shop", Some("pgdata"), 5),
            "/v1/backups?environment=shop&volume=pgdata&limit=5"
        );
    }
}
