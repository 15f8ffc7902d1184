//! Disaster recovery with a real node serving throughout (docs/operations.md, the DR table): on
//! a simulated host (`support/host.rs`), `pl-reconciler run` and `pl-agent run` roll a web
//! project out, its replica answering through Caddy. `pl-reconciler snapshot save` copies the
//! control plane's state while it serves; the daemon is killed (SIGKILL) and its whole state
//! folder deleted; `snapshot restore` puts it back and a daemon starts on it. All the while a
//! client asks the application every 20 ms: not one request fails. The node re-attaches (its
//! agent, never restarted, is heard from again), the replica is the same container started at
//! the same time, and no job runs again (every job's state and attempts are as before the
//! loss). The times are printed (`RTO` lines).

#[path = "../../reconciler/tests/support/daemon.rs"]
mod daemon_support;
#[path = "support/host.rs"]
mod host_support;
#[path = "../../reconciler/tests/support/repo.rs"]
mod repo_support;
mod support;

use daemon_support::{CONTROL_CA, Daemon, bin, config, free_port, setup};
use host_support::Host;
use repo_support::{Repo, environment};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use support::{KillGroups, sql};

const ENV: &str = "api-production";
const NAME: &str = "api.example.com.localhost";

fn project(image: &str) -> String {
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: api}}\nspec:\n  image: {image}\n  roles:\n    web:\n      kind: web\n      port: 8080\n      health: {{path: /healthz}}\n      replicas: 1\n      command: [/bin/busybox, httpd, -f, -p, '8080', -h, /www]\n"
    )
}

fn snapshot(args: &[&str]) -> String {
    let o = Command::new(bin())
        .arg("snapshot")
        .args(args)
        .output()
        .expect("pl-reconciler");
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "snapshot {args:?}: {out}");
    out
}

/// Every job: its key, state and attempts, in order.
fn jobs(url: &str) -> Vec<String> {
    sql(
        url,
        "SELECT key || ' ' || state || ' ' || CAST(attempts AS TEXT) FROM jobs ORDER BY id",
    )
}

#[test]
fn the_state_folder_lost_and_restored_while_the_node_serves() {
    let base = PathBuf::from(format!("/tmp/pldr-{}", std::process::id()));
    let host = Host::start(&format!("plhost-dr-{}", std::process::id()), &base);
    let (registry, port) = host.registry();
    let _registry = KillGroups(vec![registry]);
    let image = host.image(
        port,
        "one",
        &[("/www/index.html", "release one\n"), ("/www/healthz", "ok\n")],
    );

    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("git")).expect("git");
    let repo = Repo::new(&dir.path().join("git"));
    let state = dir.path().join("control");
    std::fs::create_dir_all(&state).expect("state");
    std::fs::write(state.join("allowed_signers"), &repo.signers).expect("signers");
    repo.write("projects/api.yaml", &project(&image));
    repo.write("envs/api-production.yaml", &environment(ENV, "api"));
    repo.commit("release one", true);
    let s = setup(&state);
    let url = format!("sqlite://{}", state.join("ledger.db").display());
    let (api, agent_api, http) = (free_port(), free_port(), free_port());
    let cfg = config(
        &s,
        "control",
        &repo.dir,
        &url,
        api,
        &format!("{CONTROL_CA}\n[agent_api]\nlisten = \"127.0.0.1:{agent_api}\"\n"),
    );
    let vault = dir.path().join("vault");
    std::fs::create_dir_all(&vault).expect("vault");
    let key = vault.join("operator.agekey");
    let recipient = support::age_keygen(&key);
    let node_dir = dir.path().join("node");
    let socket = host.socket.clone();
    let operator = s.operator.clone();

    host.run(move || {
        let mut d = Daemon::start(&s, &cfg, api);
        d.wait_ready(Duration::from_secs(20));
        let (_, admin) = support::caddy_admin_address(&node_dir.join("caddy-admin"));
        let caddy = support::spawn_caddy(&node_dir.join("caddy"), &format!("{{\"admin\": {{\"listen\": \"{admin}\"}}}}"));
        let mut procs = KillGroups(vec![caddy]);
        let ca = std::fs::read_to_string(state.join("tls/ca.crt")).expect("ca");
        let token = d.enrolment_token("n1", &operator);
        pushleft_agent::enroll::enroll(&format!("https://localhost:{api}"), &support::ca_pin(&ca), "n1", &node_dir.join("n1"), &token)
            .expect("enrol");
        let agent_cfg = node_dir.join("agent.toml");
        std::fs::write(
            &agent_cfg,
            format!(
                "control = \"https://localhost:{agent_api}\"\ndir = \"n1\"\ndocker_socket = {:?}\nsecrets_dir = \"secrets\"\nstate_dir = \"state\"\nheartbeat_seconds = 1\ndrift_seconds = 1\nmesh = false\ncaddy_admin = \"{admin}\"\ningress_listen = [\"127.0.0.1:{http}\"]\ningress_upstreams = \"ingress\"\ningress_host_suffix = \".localhost\"\ningress_tls_listen = []\n",
                socket.display().to_string()
            ),
        )
        .expect("agent config");
        let log = node_dir.join("agent.log");
        let agent = support::spawn_agent(env!("CARGO_BIN_EXE_pl-agent"), &agent_cfg, &log);
        let agent_pid = agent.id();
        procs.0.push(agent);

        // Release one live, answering through Caddy.
        let deadline = Instant::now() + Duration::from_secs(90);
        while support::get_host(http, NAME) != Ok((200, "release one".into())) {
            assert!(
                Instant::now() < deadline,
                "release one never answered: {:?}\n{}",
                sql(&url, "SELECT key || ' ' || state FROM jobs ORDER BY id"),
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        let settled = Instant::now() + Duration::from_secs(30);
        while sql(&url, "SELECT status FROM deployments") != ["done"] {
            assert!(Instant::now() < settled, "{:?}", sql(&url, "SELECT status FROM deployments"));
            std::thread::sleep(Duration::from_millis(200));
        }
        let replica = || host_support::docker_at(&socket, &["ps", "-q", "--no-trunc", "--filter", "label=dev.pushleft.role=web"]);
        let started = |id: &str| host_support::docker_at(&socket, &["inspect", "--format", "{{.Id}} {{.State.StartedAt}}", id]);
        let before = started(&replica());
        let jobs_before = jobs(&url);

        // A client asks every 20 ms from here to the end (at most 10 minutes or 30,000 asks).
        let stop = Arc::new(AtomicBool::new(false));
        let (asked, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let client = {
            let (stop, asked, failed) = (stop.clone(), asked.clone(), failed.clone());
            std::thread::spawn(move || {
                let start = Instant::now();
                let mut failures = Vec::new();
                while !stop.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(600) && asked.load(Ordering::Relaxed) < 30_000 {
                    asked.fetch_add(1, Ordering::Relaxed);
                    let got = support::get_host(http, NAME);
                    if got != Ok((200, "release one".into())) {
                        failed.fetch_add(1, Ordering::Relaxed);
                        failures.push(format!("{:?}: {got:?}", start.elapsed()));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                failures
            })
        };

        // Saved while the daemon serves; then the control host's state is lost.
        let archive = dir_of(&key).join("control.snapshot");
        let t = Instant::now();
        snapshot(&["save", "--config", &cfg.to_string_lossy(), "--to", &archive.to_string_lossy(), "--recipient", &recipient]);
        println!("RTO snapshot save (online, with a node serving): {:?}", t.elapsed());
        d.kill9();
        std::fs::remove_dir_all(&state).expect("the state folder deleted");
        let lost = Instant::now();
        std::thread::sleep(Duration::from_secs(2));

        // Restored, and a daemon started on it.
        snapshot(&["restore", "--from", &archive.to_string_lossy(), "--identity", &key.to_string_lossy()]);
        let restored = lost.elapsed();
        let mut d = Daemon::start(&s, &cfg, api);
        d.wait_ready(Duration::from_secs(20));
        let ready = lost.elapsed();
        // The node re-attaches: its agent, running all along, is heard from after the restore.
        let restart_ms = i64::try_from(
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("now").as_millis(),
        )
        .expect("ms");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let seen: i64 = sql(&url, "SELECT CAST(last_seen AS TEXT) FROM nodes WHERE name = 'n1'")
                .first()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            if seen >= restart_ms {
                break;
            }
            assert!(Instant::now() < deadline, "n1 never heard from again: {}", std::fs::read_to_string(&log).unwrap_or_default());
            std::thread::sleep(Duration::from_millis(100));
        }
        let reattached = lost.elapsed();
        println!("RTO state folder lost with a node serving: restored {restored:?}, ready {ready:?}, node re-attached {reattached:?} after the loss (2 s of it the outage itself)");
        // A few passes and drift rounds later: nothing ran again, nothing restarted.
        std::thread::sleep(Duration::from_secs(5));
        stop.store(true, Ordering::Relaxed);
        let failures = client.join().expect("client");
        assert_eq!(jobs(&url), jobs_before, "no job ran again after the restore");
        assert_eq!(started(&replica()), before, "the replica is the same container, never restarted");
        assert_eq!(sql(&url, "SELECT status FROM deployments"), ["done"]);
        assert!(Path::new(&format!("/proc/{agent_pid}")).exists(), "the agent ran throughout");
        let (n, f) = (asked.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
        println!("requests to the application during the drill: {n}, failed: {f}");
        assert!(n > 100, "the client asked throughout: {n}");
        assert_eq!(f, 0, "not one request failed: {failures:?}");
        d.term();
        drop(procs);
    });
}

fn dir_of(p: &std::path::Path) -> PathBuf {
    p.parent().expect("parent").to_owned()
}

use std::path::Path;
