//! `pl backups ENV [VOLUME]` and `pl backup ENV VOLUME`: the backups of an environment's volumes
//! as their agents reported them (time, size, snapshot, status, why one failed), and an
//! operator's backup now, which returns only once its node reported how it ended.

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

/// Backs up a volume now and waits (at most `timeout`) for its node's report.
pub fn run(args: &ServerArgs, environment: &str, volume: &str, timeout: Duration) -> Result<u8> {
    let client = Client::new(args)?;
    let body = serde_json::json!({"environment": environment, "volume": volume});
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
            return Ok(if r["status"] == "succeeded" { 0 } else { 1 });
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
