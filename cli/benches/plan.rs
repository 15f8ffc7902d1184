//! Benchmark of `pl plan --base` on synthetic repositories (cold process, committed in git),
//! beside `terraform plan -refresh=false` of as many `terraform_data` resources and the floor
//! of `git ls-tree -r` + `git cat-file --batch` reading every blob.
//!
//! Run: `cargo bench -p pushleft-cli --bench plan` (sizes and runs: `-- --sizes 100,1000
//! --runs 5 --no-terraform`; `--baseline PATH` measures another `pl` binary, an older commit's
//! build, on the same repositories in the same run, for regressions). Needs `git`, `terraform` and `/usr/bin/time` (Debian `time`).
//! Repositories are packed with `git gc` first, as a clone would be.

#[path = "support/mod.rs"]
mod support;
use support::{git, pl_binary};

use state_schema::synthetic::{Params, generate};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn write_tree(dir: &Path, params: &Params) {
    for (path, text) in generate(params) {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    }
}

/// Median wall time and the largest peak RSS (KiB) of `runs` runs of a shell command.
fn measure(cmd: &str, dir: &Path, runs: usize) -> (Duration, u64) {
    let mut times = Vec::new();
    let mut peak = 0u64;
    for _ in 0..runs {
        let start = Instant::now();
        let o = Command::new("/usr/bin/time")
            .args(["-f", "%M", "sh", "-c", cmd])
            .current_dir(dir)
            .env("CHECKPOINT_DISABLE", "1")
            .env("TF_CLI_CONFIG_FILE", "/dev/null")
            .stdout(Stdio::null())
            .output()
            .expect("runs");
        times.push(start.elapsed());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success() || o.status.code() == Some(2), "{cmd} failed: {err}");
        peak = peak.max(err.lines().last().and_then(|l| l.trim().parse().ok()).unwrap_or(0));
    }
    times.sort();
    (times[times.len() / 2], peak)
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn main() {
    let mut sizes = vec![100usize, 1_000, 10_000];
    let mut runs = 5usize;
    let mut terraform = true;
    let mut baseline: Option<std::path::PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--sizes" => {
                sizes = args
                    .next()
                    .expect("sizes")
                    .split(',')
                    .map(|s| s.parse().expect("number"))
                    .collect()
            }
            "--runs" => runs = args.next().expect("runs").parse().expect("number"),
            "--no-terraform" => terraform = false,
            "--baseline" => baseline = Some(args.next().expect("a pl binary").into()),
            _ => {} // cargo bench passes --bench
        }
    }
    let pl = pl_binary();
    println!("Median of {runs} cold runs of `pl plan . --base A --head B --format json` in a packed repository;");
    println!(
        "peak RSS is the largest of those runs; the floor is `git ls-tree -r | git cat-file --batch` of the head."
    );
    println!();
    println!(
        "| environments | full change, local | full change, whole trees | one-file change | peak RSS (local / whole / one) | git floor | terraform plan | terraform / pl (local / whole) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for n in sizes {
        let tmp = tempfile::tempdir().expect("tempdir");
        let repo = tmp.path().join("state");
        std::fs::create_dir_all(&repo).expect("mkdir");
        git(&repo, &["init", "-q", "-b", "main"]);
        write_tree(&repo, &Params::new(n));
        git(&repo, &["add", "-A"]);
        git(&repo, &["commit", "-qm", "base"]);
        // A full change that is local: every environment's replicas change.
        let full = Params {
            replicas_bump: 1,
            ..Params::new(n)
        };
        write_tree(&repo, &full);
        git(&repo, &["commit", "-qam", "full, local"]);
        // A full change that is not local: every environment's variables change, so the
        // plan reads both trees whole.
        let whole = Params { vars_bump: 1, ..full };
        write_tree(&repo, &whole);
        git(&repo, &["commit", "-qam", "full, whole trees"]);
        // A one-file change on top of it.
        write_tree(
            &repo,
            &Params {
                only: Some(n / 2),
                ..whole
            },
        );
        git(&repo, &["commit", "-qam", "one file"]);
        git(&repo, &["gc", "-q"]);
        let pl_cmd =
            |base: &str, head: &str| format!("{} plan . --base {base} --head {head} --format json", pl.display());
        // With a baseline, each run of this build is followed by one of the baseline on the
        // same repository, so neither side gets the warmer caches or the quieter minute.
        let base_cmd = |base: &str, head: &str| {
            baseline
                .as_ref()
                .map(|b| format!("{} plan . --base {base} --head {head} --format json", b.display()))
        };
        let both = |base: &str, head: &str| -> ((Duration, u64), Option<(Duration, u64)>) {
            let (ours_cmd, theirs_cmd) = (pl_cmd(base, head), base_cmd(base, head));
            let Some(theirs_cmd) = theirs_cmd else {
                return (measure(&ours_cmd, &repo, runs), None);
            };
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for _ in 0..runs {
                a.push(measure(&ours_cmd, &repo, 1));
                b.push(measure(&theirs_cmd, &repo, 1));
            }
            let med = |mut v: Vec<(Duration, u64)>| {
                let peak = v.iter().map(|x| x.1).max().unwrap_or(0);
                v.sort();
                (v[v.len() / 2].0, peak)
            };
            (med(a), Some(med(b)))
        };
        let ((full, rss), base_full) = both("HEAD~3", "HEAD~2");
        let ((whole_t, whole_rss), base_whole) = both("HEAD~2", "HEAD~1");
        let ((one, one_rss), base_one) = both("HEAD~1", "HEAD");
        let (floor, _) = measure("git ls-tree -r --object-only HEAD | git cat-file --batch", &repo, runs);
        let against = match (base_full, base_whole, base_one) {
            (Some(f), Some(w), Some(o)) => Some([f, w, o]),
            _ => None,
        };
        let tf = terraform.then(|| {
            let tfdir = tmp.path().join("tf");
            std::fs::create_dir_all(&tfdir).expect("mkdir");
            let mut main = String::new();
            for i in 0..n {
                main.push_str(&format!("resource \"terraform_data\" \"env_{i}\" {{\n  input = {{ project = \"proj-{}\", replicas = {} }}\n}}\n", i / 10, 1 + i % 3));
            }
            std::fs::write(tfdir.join("main.tf"), main).expect("write tf");
            let init = Command::new("terraform")
                .args(["init", "-input=false"])
                .current_dir(&tfdir)
                .env("CHECKPOINT_DISABLE", "1")
                .env("TF_CLI_CONFIG_FILE", "/dev/null")
                .output()
                .expect("terraform init");
            assert!(init.status.success(), "terraform init: {}", String::from_utf8_lossy(&init.stderr));
            measure("terraform plan -refresh=false -input=false -lock=false", &tfdir, runs.min(3)).0
        });
        let (tf_s, ratio) = match tf {
            Some(t) => (
                ms(t),
                format!(
                    "{:.0}× / {:.0}×",
                    t.as_secs_f64() / full.as_secs_f64(),
                    t.as_secs_f64() / whole_t.as_secs_f64()
                ),
            ),
            None => ("-".into(), "-".into()),
        };
        let mb = |kib: u64| kib as f64 / 1024.0;
        println!(
            "| {n} | {} | {} | {} | {:.0} / {:.0} / {:.0} MB | {} | {tf_s} | {ratio} |",
            ms(full),
            ms(whole_t),
            ms(one),
            mb(rss),
            mb(whole_rss),
            mb(one_rss),
            ms(floor)
        );
        if let Some([(bf, bfr), (bw, bwr), (bo, bor)]) = against {
            let r = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
            println!(
                "| {n}, baseline | {} | {} | {} | {:.0} / {:.0} / {:.0} MB | this build / baseline: {:.2} / {:.2} / {:.2} | | |",
                ms(bf),
                ms(bw),
                ms(bo),
                mb(bfr),
                mb(bwr),
                mb(bor),
                r(full, bf),
                r(whole_t, bw),
                r(one, bo)
            );
        }
    }
}
