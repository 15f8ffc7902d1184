//! `pl volumes [ENV]` and `pl volume rm ENV VOLUME`: what the control plane knows of each
//! volume (its node, generation, state, size against what its agent measured), and an admin's
//! removal of a released one, which returns only once its node removed it.

use crate::operator::{Client, OutFormat, ServerArgs, print_json};
use anyhow::Result;
use serde_json::Value;

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
        let until = match r["removeAfterMs"].as_i64() {
            Some(t) if t > now => format!("removed in {} h", (t - now + 3_599_999) / 3_600_000),
            Some(_) => "removal due".to_owned(),
            None => "-".to_owned(),
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
    }
    Ok(0)
}

pub fn remove(args: &ServerArgs, environment: &str, volume: &str) -> Result<u8> {
    let body = serde_json::json!({"environment": environment, "volume": volume});
    let v = Client::new(args)?.post_json("/v1/volumes/remove", &body)?;
    if args.format == OutFormat::Json {
        return print_json(&v);
    }
    outln!(
        "removed {environment}/{volume} from {}",
        v["node"].as_str().unwrap_or("its node")
    );
    Ok(0)
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
