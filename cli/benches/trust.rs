//! Benchmark of trust operations against the tools a CI script would call per item:
//! - verifying the SSH signatures of 1,000 commits: one `pl verify A..B` process vs
//!   `git verify-commit` run once per commit;
//! - decrypting 1,000 secret values: in process (`pushleft_secrets::decrypt`) vs the `age`
//!   CLI run once per value.
//!
//! Run: `cargo bench -p pushleft-cli --bench trust` (`-- --commits 1000 --values 1000`). Needs
//! `git`, `ssh-keygen`, `age` and `age-keygen`. Setting up 1,000 signed commits takes a while.

#[path = "support/mod.rs"]
mod support;
use support::{git, pl_binary};

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn per_item(total: Duration, n: usize) -> String {
    format!("{:.3} ms", total.as_secs_f64() * 1000.0 / n as f64)
}

fn main() {
    let (mut commits, mut values) = (1000usize, 1000usize);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--commits" => commits = args.next().expect("n").parse().expect("number"),
            "--values" => values = args.next().expect("n").parse().expect("number"),
            _ => {}
        }
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();

    // Signatures.
    let key = dir.join("key");
    let o = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "bench", "-f"])
        .arg(&key)
        .output()
        .expect("ssh-keygen");
    assert!(o.status.success());
    let public = std::fs::read_to_string(key.with_extension("pub")).expect("pub");
    let signers = dir.join("allowed");
    std::fs::write(&signers, format!("ops-bench {public}")).expect("write");
    let repo = dir.join("repo");
    std::fs::create_dir_all(&repo).expect("mkdir");
    git(&repo, &["init", "-q", "-b", "main"]);
    let signing = format!("user.signingKey={}", key.display());
    git(&repo, &["commit", "-q", "--allow-empty", "-m", "root"]);
    let root = git(&repo, &["rev-parse", "HEAD"]);
    for i in 0..commits {
        std::fs::write(repo.join("state.yaml"), format!("n: {i}\n")).expect("write");
        git(&repo, &["add", "-A"]);
        git(
            &repo,
            &[
                "-c",
                "gpg.format=ssh",
                "-c",
                &signing,
                "commit",
                "-q",
                "-S",
                "-m",
                &format!("change {i}"),
            ],
        );
    }
    let shas: Vec<String> = git(&repo, &["rev-list", &format!("{root}..HEAD")])
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(shas.len(), commits);

    let t = Instant::now();
    let o = Command::new(pl_binary())
        .args([
            "verify",
            &format!("{root}..HEAD"),
            "--format",
            "json",
            "--allowed-signers",
        ])
        .arg(&signers)
        .arg("-C")
        .arg(&repo)
        .output()
        .expect("pl");
    let pl_time = t.elapsed();
    assert!(o.status.success(), "pl verify: {}", String::from_utf8_lossy(&o.stderr));

    let allowed = format!("gpg.ssh.allowedSignersFile={}", signers.display());
    let t = Instant::now();
    for sha in &shas {
        let ok = Command::new("git")
            .current_dir(&repo)
            .args(["-c", &allowed, "verify-commit", sha])
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .stderr(Stdio::null())
            .status()
            .expect("git");
        assert!(ok.success());
    }
    let git_time = t.elapsed();

    // Decryption.
    let id_file = dir.join("age.key");
    assert!(
        Command::new("age-keygen")
            .arg("-o")
            .arg(&id_file)
            .stderr(Stdio::null())
            .status()
            .expect("age-keygen")
            .success()
    );
    std::fs::set_permissions(&id_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
    let recipient = String::from_utf8(
        Command::new("age-keygen")
            .arg("-y")
            .arg(&id_file)
            .output()
            .expect("age-keygen -y")
            .stdout,
    )
    .expect("utf-8")
    .trim()
    .to_owned();
    let cts: Vec<String> = (0..values)
        .map(|i| {
            pushleft_secrets::encrypt(format!("value {i}").as_bytes(), std::slice::from_ref(&recipient))
                .expect("encrypt")
        })
        .collect();
    let ids = pushleft_secrets::load_identities(&id_file).expect("identity");
    let t = Instant::now();
    for ct in &cts {
        pushleft_secrets::decrypt(ct, &ids).expect("decrypt");
    }
    let lib_time = t.elapsed();
    let t = Instant::now();
    for ct in &cts {
        let mut child = Command::new("age")
            .arg("-d")
            .arg("-i")
            .arg(&id_file)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("age");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(ct.as_bytes())
            .expect("write");
        assert!(child.wait().expect("age").success());
    }
    let cli_time = t.elapsed();

    println!("| operation | Pushleft | baseline | per item (Pushleft / baseline) | ratio |");
    println!("|---|---:|---:|---:|---:|");
    println!(
        "| verify {commits} commit signatures | {:.1} ms (one `pl verify` process) | {:.1} ms (`git verify-commit` per commit) | {} / {} | {:.0}× |",
        pl_time.as_secs_f64() * 1000.0,
        git_time.as_secs_f64() * 1000.0,
        per_item(pl_time, commits),
        per_item(git_time, commits),
        git_time.as_secs_f64() / pl_time.as_secs_f64()
    );
    println!(
        "| decrypt {values} secret values | {:.1} ms (in process) | {:.1} ms (`age -d` per value) | {} / {} | {:.0}× |",
        lib_time.as_secs_f64() * 1000.0,
        cli_time.as_secs_f64() * 1000.0,
        per_item(lib_time, values),
        per_item(cli_time, values),
        cli_time.as_secs_f64() / lib_time.as_secs_f64()
    );
}
