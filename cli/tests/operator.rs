//! `pl status`, `pl revisions`, `pl jobs`, `pl events [--follow]` and `pl reconcile --now`
//! against a real `pl-reconciler` over TLS: output, JSON, refusals by role, and a token that
//! comes only from the environment or a file.

mod common;
#[path = "../../reconciler/tests/support/daemon.rs"]
mod daemon_support;
#[path = "../../reconciler/tests/support/repo.rs"]
mod repo_support;

use common::{pl, run, stderr, stdout};
use daemon_support::{Daemon, config, free_port, nodes_up, setup};
use repo_support::{Repo, environment, project};
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

#[test]
fn operator_commands_against_a_running_daemon() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    std::fs::write(dir.path().join("allowed_signers"), &repo.signers).expect("signers");
    repo.write("projects/api.yaml", &project("api", 1));
    repo.write("envs/api-production.yaml", &environment("api-production", "api"));
    repo.write(
        "domains/shop.yaml",
        "apiVersion: pushleft.dev/v1alpha1\nkind: Domain\nmetadata: {name: shop}\nspec: {hostname: shop.example.org, environment: api-production}\n",
    );
    let good = repo.commit("good", true);
    let s = setup(dir.path());
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let port = free_port();
    // Domains are looked up through a loopback port nothing answers on: they stay pending.
    let cfg = config(
        &s,
        "d",
        &repo.dir,
        &url,
        port,
        &format!("[domains]\nresolver = [\"127.0.0.1:{}\"]\n", free_port()),
    );
    let mut d = Daemon::start(&s, &cfg, port);
    d.wait_ready(Duration::from_secs(20));
    let server = format!("https://localhost:{port}");
    let ca = dir.path().join("tls/ca.crt");
    let viewer_file = dir.path().join("viewer.token");
    let operator_file = dir.path().join("operator.token");
    let with = |cmd: &mut std::process::Command, token: &std::path::Path| {
        cmd.env("PL_SERVER", &server)
            .env("PL_CA_CERT", &ca)
            .env("PL_TOKEN_FILE", token)
            .env_remove("PL_TOKEN");
    };

    let mut c = pl();
    c.arg("status");
    with(&mut c, &viewer_file);
    let o = run(&mut c);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains(&format!("main in force at {good}")), "{out}");
    assert!(out.contains("leader"), "{out}");

    let mut c = pl();
    c.args(["revisions", "--format", "json"]);
    with(&mut c, &viewer_file);
    let o = run(&mut c);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert_eq!(v["revisions"][0]["sha"], good.as_str());
    assert_eq!(v["revisions"][0]["verdict"], "accepted");

    let mut c = pl();
    c.args(["jobs", "--state", "queued"]);
    with(&mut c, &viewer_file);
    let out = stdout(&run(&mut c));
    // In words, not as the ledger's key (`net:api-production:g1:ensure@n1`).
    assert!(out.contains("set up the network of generation 1"), "{out}");
    assert!(!out.contains(":g1:"), "{out}");
    let head: Vec<&str> = out.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(
        head,
        ["STATE", "ATTEMPTS", "NODE", "GENERATION", "JOB"],
        "labelled columns: {out}"
    );
    let first = out.lines().nth(1).unwrap_or_default();
    assert!(first.starts_with("queued ") && first.contains(" 0/"), "{first}");

    let mut c = pl();
    c.args(["events", "--after", "0"]);
    with(&mut c, &viewer_file);
    let out = stdout(&run(&mut c));
    assert!(out.contains("revision-accepted"), "{out}");
    assert!(out.contains("deployment-rollout"), "{out}");

    // A viewer may not ask for a pass; an operator may. The token may also come from PL_TOKEN.
    let mut c = pl();
    c.args(["reconcile", "--now"]);
    with(&mut c, &viewer_file);
    let o = run(&mut c);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("[insufficient-role]"), "{}", stderr(&o));
    let mut c = pl();
    c.args(["reconcile", "--now"]);
    with(&mut c, &operator_file);
    c.env_remove("PL_TOKEN_FILE").env("PL_TOKEN", &s.operator);
    let o = run(&mut c);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("reconcile requested"));

    let mut c = pl();
    c.arg("status");
    with(&mut c, &viewer_file);
    c.env_remove("PL_TOKEN_FILE");
    let o = run(&mut c);
    assert!(stderr(&o).contains("no API token"), "{}", stderr(&o));

    // --follow streams: a new commit's events arrive on the open stream. A watchdog ends the
    // process if the stream stalls, so a regression fails instead of hanging.
    let mut c = pl();
    c.args(["events", "--follow", "--format", "json", "--after", "0"]);
    with(&mut c, &viewer_file);
    let mut child = c.stdout(Stdio::piped()).spawn().expect("pl events --follow");
    let watchdog = kill_after(child.id(), Duration::from_secs(30));
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    repo.write("projects/api.yaml", &project("api", 2));
    let next = repo.commit("scale", true);
    let want = format!("main@{next}");
    let mut seen = false;
    for line in lines.by_ref().take(200) {
        let line = line.expect("line");
        let e: serde_json::Value = serde_json::from_str(&line).expect("json event");
        if e["kind"] == "revision-accepted" && e["subject"] == want.as_str() {
            seen = true;
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    drop(watchdog);
    assert!(seen, "the new revision's event arrived on the stream");

    // A reader that goes away (`pl events --follow | head -1`): the next event's write meets
    // a closed pipe, and pl ends quietly instead of panicking.
    let mut c = pl();
    c.args(["events", "--follow", "--after", "0"]);
    with(&mut c, &viewer_file);
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pl events --follow");
    let _watchdog = kill_after(child.id(), Duration::from_secs(30));
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("one line");
    assert!(!first.is_empty());
    // The reader is dropped: the pipe is closed. New events must now be written.
    repo.write("projects/api.yaml", &project("api", 3));
    repo.commit("scale again", true);
    let o = child.wait_with_output().expect("pl exits");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(o.status.code(), Some(0), "{err}");

    // A force-push of main to its first commit is refused as a rewrite; only an admin may
    // approve it, and pl revisions says how.
    repo.git(&["reset", "-q", "--hard", &good]);
    let refused = (0..100).find_map(|_| {
        let mut c = pl();
        c.arg("revisions");
        with(&mut c, &viewer_file);
        let out = stdout(&run(&mut c));
        if out.contains("[history-rewritten]") {
            return Some(out);
        }
        std::thread::sleep(Duration::from_millis(100));
        None
    });
    let refused = refused.expect("the rewrite is listed within 10 s");
    assert!(
        refused.contains(&format!("pl revisions approve-rewrite main {good}")),
        "{refused}"
    );
    for (token, want) in [
        (&viewer_file, "[insufficient-role]"),
        (&operator_file, "[insufficient-role]"),
    ] {
        let mut c = pl();
        c.args(["revisions", "approve-rewrite", "main", &good]);
        with(&mut c, token);
        let o = run(&mut c);
        assert_eq!(o.status.code(), Some(1));
        assert!(stderr(&o).contains(want), "{}", stderr(&o));
    }
    let mut c = pl();
    c.args(["revisions", "approve-rewrite", "main", &good]);
    with(&mut c, &operator_file);
    c.env_remove("PL_TOKEN_FILE").env("PL_TOKEN", &s.admin);
    let o = run(&mut c);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("approved"), "{}", stdout(&o));
    let mut c = pl();
    c.args(["events", "--after", "0"]);
    with(&mut c, &viewer_file);
    let out = stdout(&run(&mut c));
    assert!(
        out.contains(&format!("rewrite-approved         main@{good} admin")),
        "{out}"
    );

    // Custom domains: pending, the record to make, and what the last lookup got (a lookup
    // that gets no answer takes up to 3 s).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let v = loop {
        let mut c = pl();
        c.args(["domains", "--format", "json"]);
        with(&mut c, &viewer_file);
        let v: serde_json::Value = serde_json::from_str(&stdout(&run(&mut c))).expect("json");
        if v["domains"][0]["reason"].is_string() {
            break v;
        }
        assert!(std::time::Instant::now() < deadline, "never looked up: {v}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(v["domains"][0]["state"], "pending", "{v}");
    assert_eq!(v["domains"][0]["record"]["type"], "TXT", "{v}");
    assert!(v["domains"][0]["certificate"].is_null(), "{v}");
    let mut c = pl();
    c.arg("domains");
    with(&mut c, &viewer_file);
    let o = run(&mut c);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let line = out
        .lines()
        .find(|l| l.starts_with("shop.example.org "))
        .unwrap_or_default();
    assert!(
        line.contains("api-production") && line.contains("txt") && line.contains("pending"),
        "{out}"
    );
    assert!(
        out.contains("needs TXT _pushleft-challenge.shop.example.org = pushleft-verify="),
        "{out}"
    );
    assert!(out.contains("last check: ") && out.contains("no answer"), "{out}");

    // The declared nodes: n1 heartbeats (the test support marks it up, as an agent from before
    // agents said their protocol: it is told apart), n2 is not enrolled.
    let mut c = pl();
    c.arg("nodes");
    with(&mut c, &viewer_file);
    let o = run(&mut c);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.lines()
            .any(|l| l.starts_with("n2 ") && l.contains("not-enrolled") && l.contains("never")),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("n1 ") && l.contains("active") && l.ends_with("(older: protocol 0)")),
        "{out}"
    );

    // An enrolment token for a declared node: on stdout alone, for `pl-agent enroll`.
    let mut c = pl();
    c.args(["node", "token", "n1"]);
    with(&mut c, &operator_file);
    let o = run(&mut c);
    assert!(o.status.success(), "{}", stderr(&o));
    let token = stdout(&o);
    assert!(
        token.trim().starts_with("ple_") && token.lines().count() == 1,
        "{token}"
    );
    assert!(stderr(&o).contains("valid 15 minutes"));
    let mut c = pl();
    c.args(["node", "token", "n1"]);
    with(&mut c, &viewer_file);
    let o = run(&mut c);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("[insufficient-role]"), "{}", stderr(&o));
    d.kill9();
}

#[test]
fn plan_with_a_live_fleet_shows_the_re_placements_the_daemon_would_make() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    std::fs::write(dir.path().join("allowed_signers"), &repo.signers).expect("signers");
    repo.write("projects/api.yaml", &project("api", 2));
    repo.write("envs/api-production.yaml", &environment("api-production", "api"));
    repo.commit("two replicas", true);
    let s = setup(dir.path());
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    // Both nodes heartbeat: the two replicas spread over them.
    nodes_up(&url, &["n1", "n2"]);
    let port = free_port();
    let cfg = config(&s, "d", &repo.dir, &url, port, "");
    let mut d = Daemon::start(&s, &cfg, port);
    d.wait_ready(Duration::from_secs(20));
    let plan = |extra: &[&str]| {
        let mut c = pl();
        c.args(["plan", "--base", "HEAD"])
            .arg(&repo.dir)
            .args(extra)
            .env("PL_SERVER", format!("https://localhost:{port}"))
            .env("PL_CA_CERT", dir.path().join("tls/ca.crt"))
            .env("PL_TOKEN_FILE", dir.path().join("viewer.token"))
            .env_remove("PL_TOKEN");
        run(&mut c)
    };
    // Wait for the commit to be applied: its deployment runs on both nodes.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let token = std::fs::read_to_string(dir.path().join("viewer.token")).expect("token");
        let (code, body) = d.get("/v1/fleet", Some(token.trim()));
        assert_eq!(code, 200, "{body}");
        if body.contains("api-production") {
            assert!(body.contains("\"n2\"") && body.contains("lastSeenMs"), "{body}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never applied: {body}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // In pages (what `pl plan --fleet` reads): one deployment is one page, naming no next;
    // a cursor the daemon does not keep is refused with its code.
    let token = std::fs::read_to_string(dir.path().join("viewer.token")).expect("token");
    let (code, body) = d.get("/v1/fleet?limit=1", Some(token.trim()));
    let page: state_schema::replacement::SnapshotPage = serde_json::from_str(&body).expect("a page");
    assert_eq!((code, page.snapshot.running.len(), page.next), (200, 1, None), "{body}");
    assert!(
        page.snapshot.nodes.contains_key("n2"),
        "the first page carries the nodes"
    );
    let (code, body) = d.get("/v1/fleet?limit=1&cursor=0123456789abcdef.1", Some(token.trim()));
    assert_eq!((code, body.contains("\"fleet-cursor-unknown\"")), (404, true), "{body}");
    let o = plan(&["--fleet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        !stdout(&o).contains("live fleet"),
        "a healthy fleet moves nothing: {}",
        stdout(&o)
    );

    // The working tree drains n2: its replica moves to n1 on the live fleet, a new generation.
    repo.write(
        "pools/main.yaml",
        &repo_support::POOL.replace("{name: n2, capacity", "{name: n2, state: draining, capacity"),
    );
    let o = plan(&["--fleet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("node main/n2 draining"), "{out}");
    assert!(
        out.contains("replica api-production/web/1 moves from node n2 to n1 (live fleet; new generation)"),
        "{out}"
    );
    let o = plan(&["--fleet", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    let moves = &v["consequences"]["replacements"];
    assert_eq!(moves[0]["from"], "n2", "{v}");
    assert_eq!(moves[0]["to"], "n1", "{v}");
    assert_eq!(moves[0]["newGeneration"], true, "{v}");
    // More replicas than there is room for: without --fleet the plan places on the capacities
    // Git declares (n3 counts, though no agent of it was ever heard from); with it, on the
    // live fleet, by the daemon's own placement (n3 is not eligible: more wait).
    repo.write(
        "pools/main.yaml",
        &repo_support::POOL
            .replace("{name: n2, capacity", "{name: n2, state: draining, capacity")
            .replace(
                "    - {name: n2,",
                "    - {name: n3, capacity: {cpu: \"4\", memory: 8Gi}}\n    - {name: n2,",
            ),
    );
    repo.write("projects/api.yaml", &project("api", 40));
    let waiting = |live: bool| {
        let o = plan(if live {
            &["--fleet", "--format", "json"]
        } else {
            &["--format", "json"]
        });
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
        let u = &v["consequences"]["unplaced"][0];
        assert_eq!(
            (u["environment"].as_str(), u["reason"].as_str()),
            (Some("api-production"), Some("no-capacity")),
            "{v}"
        );
        u["waiting"].as_u64().expect("waiting")
    };
    let (declared, live) = (waiting(false), waiting(true));
    assert!(declared > 0 && live > declared, "declared {declared}, live {live}");
    let o = plan(&["--fleet"]);
    assert!(
        stdout(&o).contains(&format!(
            "{live} replica(s) of api-production/web will not fit on the live fleet: no-capacity"
        )),
        "{}",
        stdout(&o)
    );
    let o = plan(&[]);
    assert!(
        stdout(&o).contains(&format!(
            "{declared} replica(s) of api-production/web will not fit on the nodes Git declares"
        )),
        "{}",
        stdout(&o)
    );
    repo.write(
        "pools/main.yaml",
        &repo_support::POOL.replace("{name: n2, capacity", "{name: n2, state: draining, capacity"),
    );
    repo.write("projects/api.yaml", &project("api", 2));
    // An environment a rollback holds: the plan on the live fleet says it differs from Git.
    daemon_support::execute(
        &url,
        r#"UPDATE deployments SET hold = '{"by":"ops","atMs":1,"from":1,"to":1,"generation":1,"gitHash":"x"}' WHERE environment = 'api-production'"#,
    );
    let o = plan(&["--fleet"]);
    assert!(
        stdout(&o).contains("environment api-production is held by a rollback (ops) at generation 1")
            && stdout(&o).contains("it differs from Git"),
        "{}",
        stdout(&o)
    );
    let o = plan(&["--fleet", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert_eq!(v["consequences"]["held"][0]["by"], "ops", "{v}");
    // Without --fleet the plan asks no control plane and shows no live moves.
    let o = plan(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stdout(&o).contains("live fleet"), "{}", stdout(&o));
    // --server alone is refused: it only goes with --fleet.
    let o = plan(&["--server", "https://localhost:1"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("--fleet"), "{}", stderr(&o));
    // A token without the viewer role gets nothing (no such token: refused by the API).
    let mut c = pl();
    c.args(["plan", "--base", "HEAD", "--fleet"])
        .arg(&repo.dir)
        .env("PL_SERVER", format!("https://localhost:{port}"))
        .env("PL_CA_CERT", dir.path().join("tls/ca.crt"))
        .env("PL_TOKEN", "plt_not-a-token")
        .env_remove("PL_TOKEN_FILE");
    let o = run(&mut c);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("bad-token") || stderr(&o).contains("401"),
        "{}",
        stderr(&o)
    );
    d.kill9();
}

/// Kills `pid` after `after` unless the returned guard is dropped first.
fn kill_after(pid: u32, after: Duration) -> std::sync::mpsc::Sender<()> {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(after) {
            let _ = std::process::Command::new("kill")
                .arg("-KILL")
                .arg(pid.to_string())
                .status();
        }
    });
    tx
}
