//! `pl volumes [ENV]`, `pl volume rm ENV VOLUME` and `pl volume move ENV VOLUME --to NODE`:
//! what the control plane knows of each volume (its node, generation, state, size against
//! what its agent measured, a move under way), an admin's removal of a released one, which
//! returns only once its node removed it, and an admin's move, which returns once the role
//! runs healthy on the new node, with how long it was down.

use crate::client::{Client, OutFormat, ServerArgs, print_json};
use anyhow::Result;
use operator_proto::volumes::{MoveVolume, RemoveVolume};
use std::time::{Duration, Instant};

/// How often a move's progress is read.
const POLL: Duration = Duration::from_millis(250);

/// `1.5 GiB`, `12 KiB`, `512 B`.
pub(crate) fn bytes(n: i64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

pub fn list(args: &ServerArgs, environment: Option<&str>) -> Result<u8> {
    let mut v = Client::new(args)?.volumes()?;
    if let Some(env) = environment {
        v.volumes.retain(|r| r.environment == env);
    }
    if args.format == OutFormat::Json {
        return print_json(&v);
    }
    if v.volumes.is_empty() {
        outln!("no volumes");
        return Ok(0);
    }
    outln!(
        "{:<24} {:<16} {:<12} {:>4} {:<9} {:>21}  until",
        "environment",
        "volume",
        "node",
        "gen",
        "state",
        "used / size"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    for r in &v.volumes {
        let used = r.used_bytes.map_or("unmeasured".to_owned(), bytes);
        let size = r.size_bytes.map_or("-".to_owned(), bytes);
        let until = match (r.remove_after_ms, &r.moving_to) {
            (_, Some(to)) => format!("moving to {to}"),
            (Some(t), _) if t > now => format!("removed in {} h", (t - now + 3_599_999) / 3_600_000),
            (Some(_), _) => "removal due".to_owned(),
            (None, _) => "-".to_owned(),
        };
        outln!(
            "{:<24} {:<16} {:<12} {:>4} {:<9} {:>21}  {until}",
            r.environment,
            r.volume,
            r.node,
            r.generation,
            r.state.as_str(),
            format!("{used} / {size}"),
        );
        for k in &r.kept {
            outln!(
                "  kept: generation {} on {} (`pl volume rm {} {} --generation {}` removes it)",
                k.generation,
                k.node,
                r.environment,
                r.volume,
                k.generation,
            );
        }
    }
    Ok(0)
}

pub fn remove(args: &ServerArgs, environment: &str, volume: &str, generation: Option<i64>) -> Result<u8> {
    let v = Client::new(args)?.remove_volume(&RemoveVolume {
        environment: environment.to_owned(),
        volume: volume.to_owned(),
        generation,
    })?;
    if args.format == OutFormat::Json {
        return print_json(&v);
    }
    let what = generation.map_or(String::new(), |g| format!("'s generation {g}"));
    outln!("removed {environment}/{volume}{what} from {}", v.node);
    Ok(0)
}

/// Moves a volume to `to` and waits (at most `timeout`) until its role runs healthy there:
/// 0 with the downtime, or 1 with why not (the volume then stays where it was).
pub fn move_to(args: &ServerArgs, environment: &str, volume: &str, to: &str, timeout: Duration) -> Result<u8> {
    let client = Client::new(args)?;
    let asked = client.move_volume(&MoveVolume {
        environment: environment.to_owned(),
        volume: volume.to_owned(),
        to: to.to_owned(),
    })?;
    let (from, role, asked_at) = (&asked.from, &asked.role, asked.asked_at_ms);
    let started = Instant::now();
    loop {
        let volumes = client.volumes()?;
        let row = volumes
            .volumes
            .into_iter()
            .find(|r| r.environment == environment && r.volume == volume);
        let ours = row.as_ref().filter(|r| r.move_asked_at_ms == Some(asked_at));
        if let Some(row) = ours.filter(|r| r.moving_to.is_none()) {
            let Some(up) = row.moved_up_at_ms else {
                eprintln!(
                    "error[volume-move-failed]: {environment}/{volume}: {}",
                    row.move_failure.as_deref().unwrap_or("see `pl events`")
                );
                return Ok(1);
            };
            let down = Duration::from_millis(u64::try_from(up - asked_at).unwrap_or(0));
            if args.format == OutFormat::Json {
                return print_json(&serde_json::json!({
                    "environment": environment,
                    "volume": volume,
                    "role": role,
                    "from": from,
                    "to": row.node,
                    "generation": row.generation,
                    "downMs": down.as_millis() as u64,
                }));
            }
            outln!(
                "moved {environment}/{volume} from {from} to {} (generation {}); {role} was down {:.1} s at most, from the move's start to healthy on {}",
                row.node,
                row.generation,
                down.as_secs_f64(),
                row.node,
            );
            return Ok(0);
        }
        if started.elapsed() >= timeout {
            eprintln!(
                "error[volume-move-pending]: the move has not ended after {} s (now: {}); `pl volumes {environment}` and `pl events` show how it goes",
                timeout.as_secs(),
                if row.and_then(|r| r.moved_from).is_none() {
                    "saving and restoring its data"
                } else {
                    "starting its role on the new node"
                }
            );
            return Ok(1);
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(super::bytes(512), "512 B");
        assert_eq!(super::bytes(1536), "1.5 KiB");
        assert_eq!(super::bytes(1 << 30), "1.0 GiB");
    }
}
