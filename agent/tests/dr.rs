//! Disaster recovery with a real node serving throughout (docs/operations.md, the DR table): on
//! a simulated host (`support/host.rs`), `pl-reconciler run` and `pl-agent run` roll a web
//! project out, its replica answering through Caddy, and then the control host loses its state
//! while a client asks the application every 20 ms. Two drills:
//!
//! - the whole state folder lost: `pl-reconciler snapshot save` copied it while the daemon
//!   served; the daemon is killed (SIGKILL) and the folder deleted; `snapshot restore` puts it
//!   back and a daemon starts on it. No job runs again (every job's state and attempts are as
//!   before the loss).
//! - the ledger lost with no snapshot (rebuilt from Git): the daemon is killed and its ledger
//!   deleted; a daemon starts on an empty one with the same CA, keys, configuration and
//!   repository, its control-plane id pinned and `readmit_nodes` on. Two environments run, one
//!   at its second generation, deployed in the order that would give them each other's subnets
//!   if the new ledger chose afresh: the node is re-admitted by its certificate, and the plan
//!   adopts the generations, subnets and containers it reports.
//!
//! In both not one request fails, the agent is never restarted, the node re-attaches and every
//! replica is the same container started at the same time. The times are printed (`RTO`
//! lines).

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
/// The rebuild drill's second environment: its name sorts first, so a ledger choosing afresh
/// would give it the first subnet, which `ENV` holds on the node.
const STAGING: &str = "a-staging";
const NAME: &str = "api.example.com.localhost";
/// The node pool: the one node the drills enrol.
const ONE_NODE: &str = "apiVersion: pushleft.dev/v1alpha1\nkind: NodePool\nmetadata: {name: main}\nspec:\n  region: eu\n  nodes:\n    - {name: n1, capacity: {cpu: \"4\", memory: 8Gi}}\n";

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

/// What the control host loses.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Loss {
    /// The whole state folder; a snapshot brings it back.
    StateFolder,
    /// The ledger alone, with no snapshot: rebuilt from Git.
    Ledger,
}

#[test]
fn the_state_folder_lost_and_restored_while_the_node_serves() {
    drill(Loss::StateFolder);
}

#[test]
fn the_ledger_lost_with_no_snapshot_rebuilt_from_git_while_the_node_serves() {
    drill(Loss::Ledger);
}

/// Each web replica of `env` at `generation`: its container id and start time.
fn started_of(socket: &Path, env: &str, generation: u64) -> String {
    let ids = host_support::docker_at(
        socket,
        &[
            "ps",
            "-q",
            "--no-trunc",
            "--filter",
            &format!("label=dev.pushleft.environment={env}"),
            "--filter",
            &format!("label=dev.pushleft.generation={generation}"),
            "--filter",
            "label=dev.pushleft.role=web",
        ],
    );
    assert!(!ids.trim().is_empty(), "{env} runs generation {generation}");
    let mut args = vec!["inspect", "--format", "{{.Id}} {{.State.StartedAt}}"];
    args.extend(ids.split_whitespace());
    host_support::docker_at(socket, &args)
}

fn drill(loss: Loss) {
    let tag = match loss {
        Loss::StateFolder => "dr",
        Loss::Ledger => "rb",
    };
    let base = PathBuf::from(format!("/tmp/pl{tag}-{}", std::process::id()));
    let host = Host::start(&format!("plhost-{tag}-{}", std::process::id()), &base);
    let (registry, port) = host.registry();
    let _registry = KillGroups(vec![registry]);
    let image = host.image(
        port,
        "one",
        &[("/www/index.html", "release one\n"), ("/www/healthz", "ok\n")],
    );
    let two = host.image(
        port,
        "two",
        &[("/www/index.html", "release two\n"), ("/www/healthz", "ok\n")],
    );

    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("git")).expect("git");
    let repo = Repo::new(&dir.path().join("git"));
    repo.write("pools/main.yaml", ONE_NODE);
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
        let live = |page: &str, settled: &[&str]| {
            let deadline = Instant::now() + Duration::from_secs(90);
            loop {
                let got = support::get_host(http, NAME);
                if got == Ok((200, page.into())) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{page} never answered: {got:?}\n{:?}\n{:?}\n{:?}\n{}",
                    sql(&url, "SELECT key || ' ' || state FROM jobs ORDER BY id"),
                    sql(&url, "SELECT environment || ' ' || CAST(generation AS TEXT) || ' ' || status FROM deployments"),
                    sql(&url, "SELECT kind || ' ' || subject || ' ' || detail FROM events ORDER BY id"),
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(200));
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            while sql(&url, "SELECT status FROM deployments ORDER BY environment") != settled {
                assert!(Instant::now() < deadline, "{:?}", sql(&url, "SELECT environment || ' ' || status FROM deployments"));
                std::thread::sleep(Duration::from_millis(200));
            }
        };
        live("release one", &["done"]);
        // The rebuild's drill: release two of `ENV` (a generation after the first), and a
        // second environment whose name sorts before it (so its subnet is the second given).
        let page = match loss {
            Loss::StateFolder => "release one",
            Loss::Ledger => {
                repo.write("projects/api.yaml", &project(&two));
                repo.write(
                    "envs/a-staging.yaml",
                    &format!("apiVersion: pushleft.dev/v1alpha1\nkind: Environment\nmetadata: {{name: {STAGING}}}\nspec: {{project: api, stage: production, pool: main, hostname: staging.example.com}}\n"),
                );
                repo.commit("release two, and staging", true);
                live("release two", &["done", "done"]);
                "release two"
            }
        };
        // Each environment's generation as the ledger has it (a first release placed once its
        // node came is generation 2).
        let generations = sql(&url, "SELECT environment || ' ' || CAST(generation AS TEXT) || ' done' FROM deployments ORDER BY environment");
        let generation = |env: &str| -> u64 {
            let row = generations.iter().find(|r| r.starts_with(&format!("{env} "))).expect("a deployment");
            row.split(' ').nth(1).and_then(|g| g.parse().ok()).expect("a generation")
        };
        let (prod, staging) = (generation(ENV), (loss == Loss::Ledger).then(|| generation(STAGING)));
        if loss == Loss::Ledger {
            assert!(prod > 1, "a generation a fresh ledger would not number alike: {generations:?}");
        }
        let replicas = || -> Vec<String> {
            let mut out = vec![started_of(&socket, ENV, prod)];
            out.extend(staging.map(|g| started_of(&socket, STAGING, g)));
            out
        };
        let before = replicas();
        let jobs_before = jobs(&url);
        let subnets_before = sql(&url, "SELECT environment || ' ' || CAST(idx AS TEXT) FROM subnets ORDER BY environment");
        let control_plane = sql(&url, "SELECT id FROM control_plane");

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
                    if got != Ok((200, page.into())) {
                        failed.fetch_add(1, Ordering::Relaxed);
                        failures.push(format!("{:?}: {got:?}", start.elapsed()));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                failures
            })
        };

        let lost = match loss {
            Loss::StateFolder => {
                // Saved while the daemon serves; then the control host's state is lost.
                let archive = dir_of(&key).join("control.snapshot");
                let t = Instant::now();
                snapshot(&["save", "--config", &cfg.to_string_lossy(), "--to", &archive.to_string_lossy(), "--recipient", &recipient]);
                println!("RTO snapshot save (online, with a node serving): {:?}", t.elapsed());
                d.kill9();
                std::fs::remove_dir_all(&state).expect("the state folder deleted");
                let lost = Instant::now();
                std::thread::sleep(Duration::from_secs(2));
                snapshot(&["restore", "--from", &archive.to_string_lossy(), "--identity", &key.to_string_lossy()]);
                println!("RTO restore: {:?} after the loss", lost.elapsed());
                lost
            }
            Loss::Ledger => {
                // The ledger is gone and there is no snapshot: what the operator kept beside
                // the CA key is the control plane's id, pinned now with re-admission on.
                d.kill9();
                for f in ["ledger.db", "ledger.db-wal", "ledger.db-shm"] {
                    let _ = std::fs::remove_file(state.join(f));
                }
                let lost = Instant::now();
                let text = std::fs::read_to_string(&cfg).expect("config");
                let pinned = text.replacen(
                    "[control]\n",
                    &format!("[control]\nid = \"{}\"\nreadmit_nodes = true\n", control_plane[0]),
                    1,
                );
                assert_ne!(pinned, text, "the configuration has a [control] table");
                std::fs::write(&cfg, pinned).expect("config");
                std::thread::sleep(Duration::from_secs(2));
                lost
            }
        };
        let mut d = Daemon::start(&s, &cfg, api);
        d.wait_ready(Duration::from_secs(20));
        let ready = lost.elapsed();
        // The node re-attaches: its agent, running all along, is heard from again.
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
        if loss == Loss::Ledger {
            // Planned from what the node reports, and every deployment done again.
            let settled = Instant::now() + Duration::from_secs(60);
            while sql(&url, "SELECT environment || ' ' || CAST(generation AS TEXT) || ' ' || status FROM deployments ORDER BY environment") != generations {
                assert!(
                    Instant::now() < settled,
                    "{:?}\n{:?}\n{:?}\n{}",
                    sql(&url, "SELECT environment || ' ' || CAST(generation AS TEXT) || ' ' || status FROM deployments"),
                    sql(&url, "SELECT key || ' ' || state FROM jobs ORDER BY id"),
                    sql(&url, "SELECT kind || ' ' || subject || ' ' || detail FROM events ORDER BY id"),
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
            println!("RTO ledger lost, rebuilt from Git: every deployment done again {:?} after the loss", lost.elapsed());
        }
        println!("RTO {loss:?} lost with a node serving: daemon ready {ready:?}, node re-attached {reattached:?} after the loss (2 s of it the outage itself)");
        // A few passes and drift rounds later: nothing ran again, nothing restarted.
        std::thread::sleep(Duration::from_secs(5));
        stop.store(true, Ordering::Relaxed);
        let failures = client.join().expect("client");
        assert_eq!(replicas(), before, "every replica is the same container, never restarted");
        assert_eq!(
            sql(&url, "SELECT environment || ' ' || CAST(idx AS TEXT) FROM subnets ORDER BY environment"),
            subnets_before,
            "the same subnets"
        );
        match loss {
            Loss::StateFolder => {
                assert_eq!(jobs(&url), jobs_before, "no job ran again after the restore");
                assert_eq!(sql(&url, "SELECT status FROM deployments"), ["done"]);
            }
            Loss::Ledger => {
                assert_eq!(sql(&url, "SELECT id FROM control_plane"), control_plane, "the pinned id");
                assert_eq!(sql(&url, "SELECT kind FROM events WHERE kind = 'node-readmitted'"), ["node-readmitted"]);
                assert_eq!(sql(&url, "SELECT kind FROM events WHERE kind = 'rebuild-planned'"), ["rebuild-planned"]);
                let recipient = sql(&url, "SELECT age_recipient FROM nodes WHERE name = 'n1'");
                assert!(recipient[0].starts_with("age1"), "the node's recipient learned from its heartbeat: {recipient:?}");
            }
        }
        assert!(Path::new(&format!("/proc/{agent_pid}")).exists(), "the agent ran throughout");
        let (n, f) = (asked.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
        println!("requests to the application during the {loss:?} drill: {n}, failed: {f}");
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
