//! `pl-agent enroll` against `pl-reconciler run` as real processes: the node's key and age
//! identity are made on the node (0600 in a 0700 folder), the token comes from standard input,
//! the control plane is trusted only through the pinned CA fingerprint, and a refusal leaves no
//! key behind.

#[path = "../../reconciler/tests/support/daemon.rs"]
mod daemon_support;
#[path = "../../reconciler/tests/support/repo.rs"]
mod repo_support;
mod support;

use daemon_support::{CONTROL_CA, Daemon, config, free_port, setup};
use repo_support::Repo;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

fn enroll(control: &str, fingerprint: &str, node: &str, dir: &std::path::Path, token: &str) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pl-agent"))
        .args([
            "enroll",
            "--control",
            control,
            "--ca-fingerprint",
            fingerprint,
            "--node",
            node,
            "--dir",
        ])
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pl-agent runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(format!("{token}\n").as_bytes())
        .expect("token");
    child.wait_with_output().expect("pl-agent ends")
}

#[test]
fn enrol_with_a_pinned_ca_and_a_token_from_stdin() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    std::fs::write(dir.path().join("allowed_signers"), &repo.signers).expect("signers");
    repo.commit("pool", true);
    let s = setup(dir.path());
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let port = free_port();
    let cfg = config(&s, "d", &repo.dir, &url, port, CONTROL_CA);
    let mut d = Daemon::start(&s, &cfg, port);
    d.wait_ready(Duration::from_secs(20));
    let control = format!("https://localhost:{port}");
    let ca_pem = std::fs::read(dir.path().join("tls/ca.crt")).expect("ca");
    let (_, pem) = x509_parser::pem::parse_x509_pem(&ca_pem).expect("pem");
    let fingerprint: String = {
        use sha2::Digest;
        sha2::Sha256::digest(&pem.contents)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let pinned = format!("SHA256:{fingerprint}");
    let token = || d.enrolment_token("n1", &s.operator);
    let t = token();

    // Another CA's fingerprint: refused before anything is sent or written.
    let node_dir = dir.path().join("node");
    let wrong = format!("SHA256:{}", "ab".repeat(32));
    let o = enroll(&control, &wrong, "n1", &node_dir, &t);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("[ca-fingerprint-mismatch]"));
    assert!(!node_dir.exists(), "nothing written");
    // A refused token leaves no key behind.
    let o = enroll(&control, &pinned, "n1", &node_dir, "ple_wrong");
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("[token-unknown]"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!node_dir.join("node.key").exists() && !node_dir.join("age.key").exists());

    let o = enroll(&control, &pinned, "n1", &node_dir, &t);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mode = |p: &std::path::Path| std::fs::metadata(p).expect("exists").permissions().mode() & 0o777;
    assert_eq!(mode(&node_dir), 0o700);
    for f in ["node.key", "node.crt", "ca.crt", "age.key"] {
        assert_eq!(mode(&node_dir.join(f)), 0o600, "{f}");
    }
    let age_key = std::fs::read_to_string(node_dir.join("age.key")).expect("age");
    assert!(age_key.starts_with("AGE-SECRET-KEY-1"));
    let recipients = ledger_nodes(&url);
    assert_eq!(recipients.len(), 1);
    assert!(recipients[0].starts_with("n1|age1"), "{recipients:?}");
    // Enrolment never overwrites a node's keys.
    let o = enroll(&control, &pinned, "n1", &node_dir, &token());
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("enrolled already"));
    // The token never reached the daemon's log.
    assert!(!std::fs::read_to_string(&d.log).expect("log").contains(&t));
}

/// The ledger's `nodes` rows, `name|age_recipient` (the API lists nodes without recipients).
fn ledger_nodes(url: &str) -> Vec<String> {
    support::sql(url, "SELECT name || '|' || age_recipient FROM nodes")
}
