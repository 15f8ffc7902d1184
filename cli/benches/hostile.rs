//! Benchmark of `pl validate` on hostile YAML: the file the review found (880 KB, 60 nested
//! anchored sequences around 440,000 scalars, which once took 1.4 GB and 2.3 s) alone and
//! twice in one tree; nested anchors small enough to be copied; and the largest files the node
//! budget lets through (a flow list and a block list just under 250,000 nodes), which are what
//! a file legitimately costs. Budget: under 200 MB and 2 s per tree, and any one file under
//! 1 MiB at most 64 MB to load.
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
    let flow = format!("a: [{}]\n", vec!["x"; 249_000].join(","));
    let block = format!("a:\n{}", "- x\n".repeat(249_000));
    let cases: [(&str, Vec<String>); 6] = [
        ("flow list of 249,000 scalars (largest allowed)", vec![flow]),
        ("block list of 249,000 scalars (largest allowed)", vec![block]),
        ("60 nested anchors around 440,000 scalars", vec![hostile.clone()]),
        ("two such files", vec![hostile.clone(), hostile]),
        (
            "60 nested anchors around 9,000 scalars",
            vec![nested_anchors(60, 9_000)],
        ),
        ("ten of those", vec![nested_anchors(60, 9_000); 10]),
    ];
    println!("| tree | pl validate, median | peak RSS | codes | budget |");
    println!("|---|---:|---:|---|---|");
    for (name, files) in cases {
        let dir = tmp.path().join(name.replace([' ', ',', '(', ')'], "-"));
        let bytes: usize = files.iter().map(String::len).sum();
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("pushleft.yaml"), ROOT).expect("root");
        for (i, f) in files.iter().enumerate() {
            std::fs::write(dir.join(format!("hostile-{i}.yaml")), f).expect("write");
        }
        let (t, kib, codes) = measure(&pl, &dir, runs);
        println!(
            "| {name} ({} KB) | {:.0} ms | {:.0} MB | {} | < 2 s, < 200 MB |",
            bytes / 1000,
            t.as_secs_f64() * 1000.0,
            kib as f64 / 1024.0,
            if codes.is_empty() { "-" } else { &codes }
        );
    }
}
