//! Disaster recovery, drilled for real: a daemon (SQLite ledger, loopback TLS, the control CA)
//! applies a release; `pl-reconciler snapshot save` copies its state while it serves; the daemon
//! is stopped and its whole state folder deleted; `snapshot restore` puts every file back, and a
//! daemon started on them answers with the same deployment, the same control-plane id (which
//! every object on the hosts carries) and the same tokens, then applies the commit made after
//! the snapshot from Git. The times are printed (`RTO` lines; docs/operations.md's DR table).
//! Refusals change nothing: restoring over existing files, a wrong identity, an archive cut
//! short, a manifest that does not match its files.

#[path = "support/daemon.rs"]
mod daemon_support;
#[path = "support/play.rs"]
mod play;
#[path = "support/repo.rs"]
mod repo_support;

use daemon_support::{CONTROL_CA, Daemon, bin, config, free_port, setup};
use reconciler::store::{Ledger, Outcome, now_ms};
use repo_support::{Repo, environment, project};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn snapshot(args: &[&str]) -> (bool, String) {
    let o = Command::new(bin())
        .arg("snapshot")
        .args(args)
        .output()
        .expect("pl-reconciler");
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

/// Plays node `n1`'s agent (through the ledger, as `tests/daemon.rs` does) until the
/// environment's deployment reads `want` (generation|status), at most 30 s.
async fn converge(url: &str, want: &str) {
    let ledger = Ledger::connect(url, 2).await.expect("ledger");
    let start = Instant::now();
    loop {
        play::round(&ledger, "n1", &|_| Outcome::Succeeded).await;
        let d = ledger
            .views()
            .deployment("api-production", now_ms())
            .await
            .expect("read")
            .map(|d| format!("{}|{}", d.generation, d.status))
            .unwrap_or_default();
        if d == want {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{d}, not {want}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ledger.close().await;
}

async fn control_plane_id(url: &str) -> String {
    let ledger = Ledger::connect(url, 1).await.expect("ledger");
    let id = ledger.control_plane().await.expect("id");
    ledger.close().await;
    id
}

fn identity(dir: &Path) -> (std::path::PathBuf, String) {
    use std::os::unix::fs::PermissionsExt;
    let id = age::x25519::Identity::generate();
    let path = dir.join("operator.agekey");
    std::fs::write(
        &path,
        format!("{}\n", age::secrecy::ExposeSecret::expose_secret(&id.to_string())),
    )
    .expect("identity");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("mode");
    (path, id.to_public().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_folder_deleted_and_restored_from_a_snapshot() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("git")).expect("git");
    let repo = Repo::new(&dir.path().join("git"));
    let state = dir.path().join("control");
    std::fs::create_dir_all(&state).expect("state");
    std::fs::write(state.join("allowed_signers"), &repo.signers).expect("signers");
    repo.write("projects/api.yaml", &project("api", 2));
    repo.write("envs/api-production.yaml", &environment("api-production", "api"));
    repo.commit("the first release", true);
    let s = setup(&state);
    let url = format!("sqlite://{}", state.join("ledger.db").display());
    let port = free_port();
    let cfg = config(&s, "control", &repo.dir, &url, port, CONTROL_CA);
    daemon_support::nodes_up(&url, &["n1"]);
    let mut d = Daemon::start(&s, &cfg, port);
    d.wait_ready(Duration::from_secs(20));
    converge(&url, "1|done").await;
    let id = control_plane_id(&url).await;

    // Saved while the daemon serves.
    let vault = dir.path().join("vault");
    std::fs::create_dir_all(&vault).expect("vault");
    let (key, recipient) = identity(&vault);
    let archive = vault.join("control.snapshot");
    let started = Instant::now();
    let (ok, out) = snapshot(&[
        "save",
        "--config",
        cfg.to_str().expect("utf-8"),
        "--to",
        archive.to_str().expect("utf-8"),
        "--recipient",
        &recipient,
    ]);
    assert!(ok, "{out}");
    println!("RPO/RTO snapshot save (online): {:?}", started.elapsed());
    assert!(out.contains("the sqlite ledger and"), "{out}");
    let (ok, again) = snapshot(&[
        "save",
        "--config",
        cfg.to_str().expect("utf-8"),
        "--to",
        archive.to_str().expect("utf-8"),
        "--recipient",
        &recipient,
    ]);
    assert!(!ok && again.contains("snapshot-output-exists"), "{again}");
    let sealed = std::fs::read(&archive).expect("archive");
    assert!(sealed.starts_with(b"age-encryption.org/v1"), "encrypted");
    for secret in [s.viewer.as_str(), "BEGIN PRIVATE KEY", "BEGIN EC PRIVATE KEY"] {
        assert!(
            !sealed.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "no plaintext in the archive"
        );
    }

    // A commit after the snapshot: the ledger lost with the host will not have it.
    repo.write(
        "projects/api.yaml",
        &project("api", 2).replace(repo_support::DIGEST, &format!("sha256:{}", "e".repeat(64))),
    );
    repo.commit("a release after the snapshot", true);
    converge(&url, "2|done").await;

    // The control host's state folder is lost.
    d.term();
    std::fs::remove_dir_all(&state).expect("the state folder deleted");

    // Refusals first: a wrong identity, a cut archive, a manifest its files do not match.
    let (_, stranger) = identity(dir.path());
    let other = dir.path().join("operator.agekey");
    let (ok, out) = snapshot(&[
        "restore",
        "--from",
        archive.to_str().expect("p"),
        "--identity",
        other.to_str().expect("p"),
    ]);
    assert!(!ok && out.contains("snapshot-undecryptable"), "{out}");
    let _ = stranger;
    let cut = vault.join("cut.snapshot");
    std::fs::write(&cut, &sealed[..sealed.len() - 100]).expect("cut");
    let (ok, out) = snapshot(&[
        "restore",
        "--from",
        cut.to_str().expect("p"),
        "--identity",
        key.to_str().expect("p"),
    ]);
    assert!(
        !ok && (out.contains("snapshot-malformed") || out.contains("snapshot-undecryptable")),
        "{out}"
    );
    assert!(!state.exists(), "a refused restore writes nothing: {out}");
    let forged = forged_archive(&vault, &recipient, &state);
    let (ok, out) = snapshot(&[
        "restore",
        "--from",
        forged.to_str().expect("p"),
        "--identity",
        key.to_str().expect("p"),
    ]);
    assert!(!ok && out.contains("snapshot-manifest-mismatch"), "{out}");
    assert!(!state.exists(), "a refused restore writes nothing: {out}");

    // Restored, and a daemon started on it: ready, the same id, tokens and deployment.
    let started = Instant::now();
    let (ok, out) = snapshot(&[
        "restore",
        "--from",
        archive.to_str().expect("p"),
        "--identity",
        key.to_str().expect("p"),
    ]);
    assert!(ok, "{out}");
    assert!(
        out.contains("ledger.db") && out.contains("ca.key") && out.contains("control.toml"),
        "{out}"
    );
    let restored = started.elapsed();
    let mut d = Daemon::start(&s, &cfg, port);
    d.wait_ready(Duration::from_secs(20));
    println!(
        "RTO state folder lost: restore {restored:?}, ready {:?} after the restore began",
        started.elapsed()
    );
    assert_eq!(
        control_plane_id(&url).await,
        id,
        "the hosts' objects stay this control plane's"
    );
    let (code, body) = d.get("/v1/environments/api-production", Some(&s.viewer));
    assert_eq!(code, 200, "the viewer token still works: {body}");
    // What was lost (the commit after the snapshot) comes back from Git: its release again.
    converge(&url, "2|done").await;
    let (code, body) = d.get("/v1/revisions", Some(&s.viewer));
    assert_eq!(code, 200);
    assert!(
        body.contains("a release after") || body.matches("\"accepted\"").count() >= 2,
        "{body}"
    );
    println!(
        "RTO the commit after the snapshot applied again: {:?} after the restore began",
        started.elapsed()
    );

    // Restoring again: every file exists, so nothing is written.
    let (ok, out) = snapshot(&[
        "restore",
        "--from",
        archive.to_str().expect("p"),
        "--identity",
        key.to_str().expect("p"),
    ]);
    assert!(!ok && out.contains("restore-would-overwrite"), "{out}");
    d.term();
}

/// An archive encrypted to the operator's key whose manifest names a file its content does
/// not match (as a corrupted copy would): restore refuses it before writing anything.
fn forged_archive(vault: &Path, recipient: &str, state: &Path) -> std::path::PathBuf {
    use std::io::Write;
    let manifest = reconciler::snapshot::Manifest {
        format: 1,
        created_at_ms: 0,
        backend: "sqlite".into(),
        ledger: None,
        files: vec![reconciler::snapshot::Entry {
            name: "files/0".into(),
            path: state.join("control.toml"),
            bytes: 5,
            mode: 0o600,
            sha256: "0".repeat(64),
        }],
    };
    let mut tar = tar::Builder::new(Vec::new());
    for (name, data) in [
        ("manifest.json", serde_json::to_vec(&manifest).expect("json")),
        ("files/0", b"hello".to_vec()),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o600);
        h.set_cksum();
        tar.append_data(&mut h, name, data.as_slice()).expect("append");
    }
    let plain = tar.into_inner().expect("tar");
    let r: age::x25519::Recipient = recipient.parse().expect("recipient");
    let enc = age::Encryptor::with_recipients(std::iter::once(&r as &dyn age::Recipient)).expect("encryptor");
    let path = vault.join("forged.snapshot");
    let mut w = enc
        .wrap_output(std::fs::File::create(&path).expect("file"))
        .expect("wrap");
    w.write_all(&plain).expect("write");
    w.finish().expect("finish");
    path
}

/// `[snapshots]`: the leader takes one at start (none is recent), records it (its age is a
/// metric), and keeps the newest `keep` of its own archives, touching no other file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_takes_scheduled_snapshots_and_keeps_the_newest() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("git")).expect("git");
    let repo = Repo::new(&dir.path().join("git"));
    let state = dir.path().join("control");
    std::fs::create_dir_all(&state).expect("state");
    std::fs::write(state.join("allowed_signers"), &repo.signers).expect("signers");
    repo.commit("a pool", true);
    let vault = dir.path().join("vault");
    std::fs::create_dir_all(&vault).expect("vault");
    let (key, recipient) = identity(dir.path());
    for old in [
        "pushleft-20000101T000000Z.snapshot",
        "pushleft-20000102T000000Z.snapshot",
        "notes.txt",
    ] {
        std::fs::write(vault.join(old), "old").expect("old");
    }
    let s = setup(&state);
    let url = format!("sqlite://{}", state.join("ledger.db").display());
    let port = free_port();
    let plan = format!(
        "[snapshots]\ndir = {:?}\nkeep = 2\nrecipients = [{recipient:?}]\n",
        vault
    );
    let cfg = config(&s, "control", &repo.dir, &url, port, &plan);
    let mut d = Daemon::start(&s, &cfg, port);
    d.wait_ready(Duration::from_secs(20));
    let start = Instant::now();
    let metrics = loop {
        let (_, m) = d.get("/metrics", None);
        if m.contains("pushleft_snapshot_last_success_age_seconds ")
            && !m.contains("pushleft_snapshot_last_success_age_seconds +Inf")
        {
            break m;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no snapshot taken:\n{m}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(metrics.contains("# TYPE pushleft_snapshot_last_success_age_seconds gauge"));
    let mut names: Vec<String> = std::fs::read_dir(&vault)
        .expect("vault")
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    assert_eq!(
        names.len(),
        3,
        "the oldest of the schedule's archives removed, notes kept: {names:?}"
    );
    assert_eq!(names[0], "notes.txt");
    assert_eq!(names[1], "pushleft-20000102T000000Z.snapshot");
    let taken = vault.join(&names[2]);
    assert!(
        names[2].starts_with("pushleft-20") && names[2].ends_with("Z.snapshot"),
        "{names:?}"
    );
    // It opens with the operator's identity (and, the daemon's files being where they are,
    // restore refuses to write over them).
    let (ok, out) = snapshot(&[
        "restore",
        "--from",
        taken.to_str().expect("p"),
        "--identity",
        key.to_str().expect("p"),
    ]);
    assert!(!ok && out.contains("restore-would-overwrite"), "{out}");
    d.term();
}
