//! Benchmark of `pl validate` on hostile YAML: the file the review found (880 KB, 60 nested
//! anchored sequences around 440,000 scalars, which once took 1.4 GB and 2.3 s) alone and
//! twice in one tree, beside a plain file of the same 440,000 scalars without anchors (the
//! floor: what the nodes themselves cost). Budget: under 200 MB and 2 s per tree, and any one
//! such file at most 64 MB to load.
//!
//! Run: `cargo bench -p pushleft-cli --bench hostile` (`-- --runs N`, default 5). Needs
//! `/usr/bin/time` (Debian `time`).

#[path = "support/mod.rs"]
mod support;
use support::pl_binary;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const ROOT: &str =
    "apiVersion: pushleft.dev/v1alpha1\nkind: Repository\nmetadata: {name: hostile}\nspec: {baseDomain: example.com}\n";

/// `levels` anchored sequences around `scalars` plain scalars (2 bytes each).
fn nested_anchors(levels: usize, scalars: usize) -> String {
    let mut text = String::from("a: ");
    for i in 0..levels {
        text.push_str(&format!("&l{i} ["));
    }
    text.push_str(&vec!["x"; scalars].join(","));
    text.push_str(&"]".repeat(levels));
    text.push('\n');
    text
}

/// Median wall time and largest peak RSS (KiB) of `runs` runs of `pl validate DIR`.
fn measure(pl: &Path, dir: &Path, runs: usize) -> (Duration, u64, String) {
    let mut times = Vec::new();
    let mut peak = 0u64;
    let mut codes = String::new();
    for _ in 0..runs {
        let start = Instant::now();
        let o = Command::new("/usr/bin/time")
            .args(["-f", "%M"])
            .arg(pl)
            .args(["validate", "--format", "json"])
            .arg(dir)
            .output()
            .expect("runs");
        times.push(start.elapsed());
        let err = String::from_utf8_lossy(&o.stderr);
        peak = peak.max(err.lines().last().and_then(|l| l.trim().parse().ok()).unwrap_or(0));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("validate JSON");
        let mut c: Vec<String> = v["diagnostics"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d["code"].as_str().map(str::to_owned))
            .collect();
        c.sort();
        c.dedup();
        codes = c.join(",");
    }
    times.sort();
    (times[times.len() / 2], peak, codes)
}

fn main() {
    let mut runs = 5usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--runs" {
            runs = args.next().and_then(|n| n.parse().ok()).expect("--runs N");
        }
    }
    let pl = pl_binary();
    let tmp = tempfile::tempdir().expect("tempdir");
    let hostile = nested_anchors(60, 440_000);
    println!("hostile file: {} bytes", hostile.len());
    let cases: [(&str, Vec<String>); 3] = [
        ("440,000 scalars, no anchors (floor)", vec![nested_anchors(0, 440_000)]),
        ("60 nested anchors around them", vec![hostile.clone()]),
        ("two such files", vec![hostile.clone(), hostile]),
    ];
    println!("| tree | pl validate, median | peak RSS | codes | budget |");
    println!("|---|---:|---:|---|---|");
    for (name, files) in cases {
        let dir = tmp.path().join(name.replace([' ', ',', '(', ')'], "-"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("pushleft.yaml"), ROOT).expect("root");
        for (i, f) in files.iter().enumerate() {
            std::fs::write(dir.join(format!("hostile-{i}.yaml")), f).expect("write");
        }
        let (t, kib, codes) = measure(&pl, &dir, runs);
        println!(
            "| {name} | {:.0} ms | {:.0} MB | {} | < 2 s, < 200 MB |",
            t.as_secs_f64() * 1000.0,
            kib as f64 / 1024.0,
            if codes.is_empty() { "-" } else { &codes }
        );
    }
}
