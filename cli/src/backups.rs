//! `pl backups ENV [VOLUME]` and `pl backup ENV VOLUME`: the backups of an environment's volumes
//! as their agents reported them (time, size, snapshot, status, why one failed), and an
//! operator's backup now, which returns only once its node reported how it ended; `pl restore`,
//! which returns once the role runs on the restored generation.

use crate::client::{Client, OutFormat, ServerArgs, print_json};
use anyhow::Result;
use operator_proto::DeploymentStatus;
use operator_proto::backups::{BackupStatus, Restore, RunBackup};
use operator_proto::jobs::JobState;
use std::time::{Duration, Instant};

/// How often `pl backup` looks for its backup's end.
const POLL: Duration = Duration::from_millis(500);

pub fn list(args: &ServerArgs, environment: &str, volume: Option<&str>, limit: u32) -> Result<u8> {
    let v = Client::new(args)?.backups(environment, volume, limit)?;
    if args.format == OutFormat::Json {
        return print_json(&v);
    }
    if v.backups.is_empty() {
        outln!("no backups of {environment} yet");
        return Ok(0);
    }
    for p in &v.proven {
        outln!(
            "{}: restore last proven {} (snapshot {})",
            p.volume,
            crate::out::utc(p.at_ms),
            p.snapshot.as_deref().unwrap_or("?")
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
    for r in &v.backups {
        outln!(
            "{:<23} {:<16} {:<12} {:<9} {:<10} {:>10}  {}",
            crate::out::utc(r.finished_at_ms),
            r.volume,
            r.node,
            r.status.as_str(),
            r.snapshot.as_deref().unwrap_or("-"),
            r.bytes.map_or("-".to_owned(), crate::volumes::bytes),
            r.reason,
        );
    }
    Ok(0)
}

/// Backs up a volume now (or, `verify`, runs a restore drill of its newest snapshot) and waits
/// (at most `timeout`) for its node's report.
pub fn run(args: &ServerArgs, environment: &str, volume: &str, verify: bool, timeout: Duration) -> Result<u8> {
    let client = Client::new(args)?;
    let job = client
        .run_backup(&RunBackup {
            environment: environment.to_owned(),
            volume: volume.to_owned(),
            verify,
        })?
        .job;
    let started = Instant::now();
    loop {
        let v = client.backups(environment, Some(volume), 20)?;
        if let Some(r) = v.backups.into_iter().find(|r| r.job == job) {
            let node = &r.node;
            let snapshot = r.snapshot.as_deref().unwrap_or("?");
            if args.format == OutFormat::Json {
                print_json(&r)?;
            } else {
                match r.status {
                    BackupStatus::Verified => outln!(
                        "verified {environment}/{volume} on {node}: snapshot {snapshot} restored and its verify command passed in {:.1} s",
                        started.elapsed().as_secs_f64()
                    ),
                    BackupStatus::VerifyFailed => {
                        eprintln!(
                            "error[backup-verify-failed]: {environment}/{volume} on {node}: {}",
                            r.reason
                        )
                    }
                    BackupStatus::Succeeded => outln!(
                        "backed up {environment}/{volume} on {node}: snapshot {snapshot} ({}, {} added) in {:.1} s",
                        r.bytes.map_or("?".to_owned(), crate::volumes::bytes),
                        r.data_added.map_or("?".to_owned(), crate::volumes::bytes),
                        started.elapsed().as_secs_f64()
                    ),
                    BackupStatus::Failed | BackupStatus::MoveFailed => {
                        eprintln!("error[backup-failed]: {environment}/{volume} on {node}: {}", r.reason)
                    }
                    // Not the job `pl backup` asked for: a move's save has its own key.
                    BackupStatus::Moved => outln!("{environment}/{volume} on {node}: {}", r.status),
                }
            }
            return Ok(match r.status {
                BackupStatus::Succeeded | BackupStatus::Verified | BackupStatus::Moved => 0,
                BackupStatus::Failed | BackupStatus::VerifyFailed | BackupStatus::MoveFailed => 1,
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

/// The agent's reason a job ended with, from its `job-failed` / `job-dead` event.
fn reason_of(client: &Client, job: &str) -> Result<String> {
    let events = client.events(0, 1000)?;
    Ok(events
        .events
        .into_iter()
        .rfind(|e| matches!(e.kind.as_str(), "job-failed" | "job-dead") && e.subject == job)
        .map(|e| e.detail)
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
    let before = client.environment(environment)?.map(|d| d.generation);
    let asked = client.restore(&Restore {
        environment: environment.to_owned(),
        volume: volume.to_owned(),
        snapshot: snapshot.map(str::to_owned),
    })?;
    let (job, to) = (asked.job.as_str(), asked.generation as i64);
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
        let at = client
            .volumes()?
            .volumes
            .into_iter()
            .find(|r| r.environment == environment && r.volume == volume)
            .map(|r| r.generation);
        if at == Some(to) {
            break;
        }
        let state = client
            .jobs(None, Some(environment), 200)?
            .jobs
            .into_iter()
            .find(|j| j.key == job)
            .map(|j| j.state);
        if matches!(state, Some(JobState::Failed | JobState::Dead | JobState::Cancelled)) {
            eprintln!(
                "error[volume-restore-failed]: {environment}/{volume} on {}: {}",
                asked.node,
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
        if let Some(d) = client.environment(environment)? {
            let newer = Some(d.generation) > before;
            let converged = d.status == DeploymentStatus::Done && d.running == d.replicas && d.stale == 0;
            if d.status == DeploymentStatus::Failed {
                eprintln!(
                    "error[deployment-failed]: {environment} generation {} failed after the restore; generation {} of {volume} holds the restored data, the one before it is kept",
                    d.generation, to
                );
                return Ok(1);
            }
            if newer && converged {
                if args.format == OutFormat::Json {
                    return print_json(&serde_json::json!({
                        "environment": environment,
                        "volume": volume,
                        "generation": to,
                        "snapshot": asked.snapshot,
                        "deployment": d.generation,
                        "restoredMs": restored.as_millis() as u64,
                        "runningMs": started.elapsed().as_millis() as u64,
                    }));
                }
                outln!(
                    "restored {environment}/{volume} from snapshot {} into generation {to} on {} in {:.1} s; generation {} of {environment} runs on it after {:.1} s (generation {} of the volume is kept)",
                    asked.snapshot,
                    asked.node,
                    restored.as_secs_f64(),
                    d.generation,
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
        assert_eq!(crate::out::utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(crate::out::utc(1_796_180_404_000), "2026-12-02 03:00:04 UTC");
        assert_eq!(crate::out::utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
    }

    #[test]
    fn a_listing_asks_for_one_volume_only_when_named() {
        assert_eq!(
            crate::client::backups_path("shop", None, 50),
            "/v1/backups?environment=shop&limit=50"
        );
        assert_eq!(
            crate::client::backups_path("shop", Some("pgdata"), 5),
            "/v1/backups?environment=shop&volume=pgdata&limit=5"
        );
    }
}
