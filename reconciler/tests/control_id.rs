//! A control plane's id pinned by its configuration (`[control] id`), the first part of
//! rebuilding a control plane whose ledger was lost: a fresh ledger takes the id (so every
//! object the hosts carry stays this control plane's), `/v1/status` and `pl status` show it, a
//! ledger that holds another id refuses to start and keeps its own, and an id that is not one
//! is refused at its line when the file is read.

#[path = "support/daemon.rs"]
mod daemon_support;
#[path = "support/repo.rs"]
mod repo_support;

use daemon_support::{Daemon, bin, config, free_port, rows, setup};
use repo_support::Repo;
use std::process::Command;
use std::time::Duration;

#[test]
fn a_pinned_id_is_taken_by_a_fresh_ledger_and_guards_another() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("git")).expect("git");
    let repo = Repo::new(&dir.path().join("git"));
    repo.commit("the root and a pool", true);
    let state = dir.path().join("control");
    std::fs::create_dir_all(&state).expect("state");
    std::fs::write(state.join("allowed_signers"), &repo.signers).expect("signers");
    let s = setup(&state);
    let url = format!("sqlite://{}", state.join("ledger.db").display());
    let port = free_port();

    // A fresh ledger takes the pinned id.
    let pinned = config(&s, "pinned", &repo.dir, &url, port, "[control]\nid = \"0a1b2c3d\"\n");
    let mut d = Daemon::start(&s, &pinned, port);
    d.wait_ready(Duration::from_secs(20));
    assert_eq!(rows(&url, "SELECT id FROM control_plane"), ["0a1b2c3d"]);
    let (code, body) = d.get("/v1/status", Some(&s.viewer));
    assert_eq!(code, 200, "{body}");
    let status: operator_proto::status::Status = serde_json::from_str(&body).expect("status");
    assert_eq!(status.control_plane, "0a1b2c3d");
    d.term();

    // The same id again: it starts. Another: refused before it serves, the ledger's id kept.
    let mut d = Daemon::start(&s, &pinned, port);
    d.wait_ready(Duration::from_secs(20));
    d.term();
    let other = config(&s, "other", &repo.dir, &url, port, "[control]\nid = \"ffffffff\"\n");
    let o = Command::new(bin())
        .args(["run", "--config"])
        .arg(&other)
        .output()
        .expect("pl-reconciler");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "a ledger of another control plane: {err}");
    assert!(
        err.contains("control-plane-id-mismatch") && err.contains("0a1b2c3d") && err.contains("ffffffff"),
        "{err}"
    );
    assert_eq!(rows(&url, "SELECT id FROM control_plane"), ["0a1b2c3d"]);

    // Not an id: refused where it is written.
    let bad = config(&s, "bad", &repo.dir, &url, port, "[control]\nid = \"ABC\"\n");
    let o = Command::new(bin())
        .args(["check-config", "--config"])
        .arg(&bad)
        .output()
        .expect("pl-reconciler");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("config-malformed") && err.contains("bad.toml:") && err.contains("8 lowercase hex digits"),
        "{err}"
    );
}
