//! `pl volumes [ENV]`, `pl volume rm ENV VOLUME` and `pl volume move ENV VOLUME --to NODE`:
//! what the control plane knows of each volume (its node, generation, state, size against
//! what its agent measured, a move under way), an admin's removal of a released one, which
//! returns only once its node removed it, and an admin's move, which returns once the role
//! runs healthy on the new node, with how long it was down.

use crate::operator::{Client, OutFormat, ServerArgs, print_json};
use anyhow::{Result, bail};
use serde_json::Value;
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
    let mut v = Client::new(args)?.json("GET", "/v1/volumes")?;
    if let (Some(env), Some(list)) = (environment, v["volumes"].as_array_mut()) {
        list.retain(|r| r["environment"] == env);
    }
    if args.format == OutFormat::Json {
        return print_json(&v);
    }
    let list: Vec<&Value> = v["volumes"].as_array().into_iter().flatten().collect();
    if list.is_empty() {
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
    for r in list {
        let used = r["usedBytes"].as_i64().map_or("unmeasured".to_owned(), bytes);
        let size = r["sizeBytes"].as_i64().map_or("-".to_owned(), bytes);
        let until = match (r["removeAfterMs"].as_i64(), r["movingTo"].as_str()) {
            (_, Some(to)) => format!("moving to {to}"),
            (Some(t), _) if t > now => format!("removed in {} h", (t - now + 3_599_999) / 3_600_000),
            (Some(_), _) => "removal due".to_owned(),
            (None, _) => "-".to_owned(),
        };
        outln!(
            "{:<24} {:<16} {:<12} {:>4} {:<9} {:>21}  {until}",
            r["environment"].as_str().unwrap_or("?"),
            r["volume"].as_str().unwrap_or("?"),
            r["node"].as_str().unwrap_or("?"),
            r["generation"].as_i64().unwrap_or(0),
            r["state"].as_str().unwrap_or("?"),
            format!("{used} / {size}"),
        );
        for k in r["kept"].as_array().into_iter().flatten() {
            outln!(
                "  kept: generation {} on {} (`pl volume rm {} {} --generation {}` removes it)",
                k["generation"],
                k["node"].as_str().unwrap_or("?"),
                r["environment"].as_str().unwrap_or("?"),
                r["volume"].as_str().unwrap_or("?"),
                k["generation"],
            );
        }
    }
    Ok(0)
}

pub fn remove(args: &ServerArgs, environment: &str, volume: &str, generation: Option<i64>) -> Result<u8> {
    let mut body = serde_json::json!({"environment": environment, "volume": volume});
    if let Some(g) = generation {
        body["generation"] = Value::from(g);
    }
    let v = Client::new(args)?.post_json("/v1/volumes/remove", &body)?;
    if args.format == OutFormat::Json {
        return print_json(&v);
    }
    let what = generation.map_or(String::new(), |g| format!("'s generation {g}"));
    outln!(
        "removed {environment}/{volume}{what} from {}",
        v["node"].as_str().unwrap_or("its node")
    );
    Ok(0)
}

/// Moves a volume to `to` and waits (at most `timeout`) until its role runs healthy there:
/// 0 with the downtime, or 1 with why not (the volume then stays where it was).
pub fn move_to(args: &ServerArgs, environment: &str, volume: &str, to: &str, timeout: Duration) -> Result<u8> {
    let client = Client::new(args)?;
    let body = serde_json::json!({"environment": environment, "volume": volume, "to": to});
    let asked = client.post_json("/v1/volumes/move", &body)?;
    let Some(asked_at) = asked["askedAtMs"].as_i64() else {
        bail!("the control plane answered no move: {asked}");
    };
    let (from, role) = (
        asked["from"].as_str().unwrap_or("?"),
        asked["role"].as_str().unwrap_or("?"),
    );
    let started = Instant::now();
    loop {
        let volumes = client.json("GET", "/v1/volumes")?;
        let row = volumes["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["environment"] == environment && r["volume"] == volume)
            .cloned()
            .unwrap_or(Value::Null);
        let ours = row["moveAskedAtMs"].as_i64() == Some(asked_at);
        if ours && row["movingTo"].is_null() {
            let Some(up) = row["movedUpAtMs"].as_i64() else {
                eprintln!(
                    "error[volume-move-failed]: {environment}/{volume}: {}",
                    row["moveFailure"].as_str().unwrap_or("see `pl events`")
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
                    "to": row["node"],
                    "generation": row["generation"],
                    "downMs": down.as_millis() as u64,
                }));
            }
            outln!(
                "moved {environment}/{volume} from {from} to {} (generation {}); {role} was down {:.1} s at most, from the move's start to healthy on {}",
                row["node"].as_str().unwrap_or(to),
                row["generation"],
                down.as_secs_f64(),
                row["node"].as_str().unwrap_or(to),
            );
            return Ok(0);
        }
        if started.elapsed() >= timeout {
            eprintln!(
                "error[volume-move-pending]: the move has not ended after {} s (now: {}); `pl volumes {environment}` and `pl events` show how it goes",
                timeout.as_secs(),
                if row["movedFrom"].is_null() {
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
