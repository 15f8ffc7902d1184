//! Crash and replay: the agent's executors run in a child process (this test binary again,
//! told by an environment variable what to run) that the test SIGKILLs in the middle of a
//! task; then the same task runs again, as it does when a lease expires and the job is leased
//! anew.
//! - Ensure application, killed while it waits for the new container's health: the replay
//!   adopts the very container (same id, same start time), sees it healthy, and no second
//!   container of the replica exists.
//! - Apply firewall, killed at chosen instants (0 to 45 ms into the run: before, during and
//!   after `nft`'s batch) of ten runs: each replay converges the table (read back equal), the
//!   namespace holds exactly one table of the environment, and the fence holds the generation.
//!   The table lives in a network namespace this test makes; the machine's own rules are
//!   compared before and after.

#[path = "support/docker.rs"]
mod docker_support;
mod support;

use agent_proto::{ApplicationSpec, HealthSpec, NetworkSpec};
use docker_support::{Registry, clean, docker, require_dockerd};
use pushleft_agent::docker::Engine;
use pushleft_agent::firewall::Firewall;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Set in the child: what it runs (`app` or `firewall`), with the rest in `PL_CRASH_*`.
const CHILD: &str = "PL_CRASH_CHILD";
const NETNS: &str = "plcrash-node";

async fn engine(dir: &Path) -> Engine {
    Engine::connect(
        Path::new("/var/run/docker.sock"),
        support::TEST_CONTROL_PLANE,
        "n1",
        dir.join("secrets"),
        dir.join("age.key"),
        dir.join("state/images-pulled"),
    )
    .await
    .expect("docker")
}

fn firewall(dir: &Path) -> Firewall {
    Firewall {
        control_plane: support::TEST_CONTROL_PLANE.into(),
        node: "n1".into(),
        nft: dir.join("nft"),
        state_dir: dir.join("state"),
    }
}

/// The child's side: run the task it is told, then exit (if it lives that long).
fn child(what: &str) -> ! {
    let dir = PathBuf::from(std::env::var("PL_CRASH_DIR").expect("dir"));
    match what {
        "app" => {
            let spec: ApplicationSpec =
                serde_json::from_str(&std::env::var("PL_CRASH_SPEC").expect("spec")).expect("spec json");
            let r = support::runtime().block_on(async { engine(&dir).await.ensure_application(&spec).await });
            eprintln!("child finished: {r:?}");
        }
        "firewall" => {
            let generation: u64 = std::env::var("PL_CRASH_GENERATION")
                .expect("generation")
                .parse()
                .expect("number");
            let r = firewall(&dir).apply("pltest-crash", "10.208.77.0/24", generation, &Default::default());
            eprintln!("child finished: {r:?}");
        }
        other => panic!("unknown child {other}"),
    }
    std::process::exit(0)
}

fn spawn_child(what: &str, dir: &Path, extra: &[(&str, String)]) -> Child {
    Command::new(std::env::current_exe().expect("exe"))
        .args(["--exact", "crash_and_replay", "--nocapture", "--test-threads", "1"])
        .env(CHILD, what)
        .env("PL_CRASH_DIR", dir)
        .envs(extra.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("child")
}

fn kill9(mut c: Child) {
    c.kill().expect("SIGKILL");
    let status = c.wait().expect("wait");
    assert!(!status.success(), "the child was killed, not done: {status:?}");
}

fn sh(cmd: &str) -> String {
    let o = Command::new("sh").arg("-c").arg(cmd).output().expect("sh");
    assert!(o.status.success(), "{cmd}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

struct Netns;
impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", NETNS]).status();
    }
}

#[test]
fn crash_and_replay() {
    if let Ok(what) = std::env::var(CHILD) {
        child(&what);
    }
    require_dockerd();
    let dir = tempfile::tempdir().expect("tempdir");
    support::age_keygen(&dir.path().join("age.key"));
    application_is_adopted_after_a_kill(dir.path());
    firewall_converges_after_kills(dir.path());
}

fn application_is_adopted_after_a_kill(dir: &Path) {
    let registry = Registry::start();
    let image = registry.image("crash", &[("/www/index.html", "crash\n"), ("/www/healthz", "ok\n")]);
    let env = "pltest-crash";
    clean(env);
    let net = NetworkSpec {
        environment: env.into(),
        network: format!("pl_{env}"),
        subnet: "10.208.78.0/24".into(),
    };
    support::runtime().block_on(async { engine(dir).await.ensure_network(&net).await.expect("network") });
    // Healthy only after 3 s (the server starts late): the child is killed while it waits.
    let spec = ApplicationSpec {
        resume: None,
        image_trust: None,
        deployment: "web".into(),
        spec_hash: "crash-g1".into(),
        command: [
            "/bin/busybox",
            "sh",
            "-c",
            "sleep 3; exec /bin/busybox httpd -f -p 8080 -h /www",
        ]
        .map(String::from)
        .to_vec(),
        health: Some(HealthSpec {
            path: "/healthz".into(),
            timeout_seconds: 20,
        }),
        ..docker_support::web_replica(support::TEST_CONTROL_PLANE, env, "web", 0, &image, 1, &net)
    };

    let c = spawn_child(
        "app",
        dir,
        &[("PL_CRASH_SPEC", serde_json::to_string(&spec).expect("json"))],
    );
    // Kill it once its container runs (and before it could be healthy).
    let deadline = Instant::now() + Duration::from_secs(30);
    let started = loop {
        let state = Command::new("docker")
            .args([
                "inspect",
                "--format",
                "{{.Id}} {{.State.Running}} {{.State.StartedAt}}",
                &spec.container,
            ])
            .output()
            .expect("docker");
        let text = String::from_utf8_lossy(&state.stdout).trim().to_owned();
        if text.contains(" true ") {
            break text;
        }
        assert!(Instant::now() < deadline, "the child's container never ran");
        std::thread::sleep(Duration::from_millis(20));
    };
    kill9(c);
    let note = support::runtime()
        .block_on(async { engine(dir).await.ensure_application(&spec).await })
        .expect("replay");
    assert!(note.contains("adopted") && note.contains("healthy"), "{note}");
    let after = docker(&[
        "inspect",
        "--format",
        "{{.Id}} {{.State.Running}} {{.State.StartedAt}}",
        &spec.container,
    ]);
    assert_eq!(after, started, "the same container, never restarted");
    let replicas = docker(&[
        "ps",
        "-a",
        "--filter",
        &format!("label=dev.pushleft.environment={env}"),
        "--format",
        "{{.Names}}",
    ]);
    assert_eq!(replicas, spec.container, "no duplicate");
    clean(env);
}

fn firewall_converges_after_kills(dir: &Path) {
    let _ = Command::new("ip")
        .args(["netns", "del", NETNS])
        .stderr(Stdio::null())
        .status();
    sh(&format!("ip netns add {NETNS}"));
    let _netns = Netns;
    let nft = dir.join("nft");
    std::fs::write(&nft, format!("#!/bin/sh\nexec ip netns exec {NETNS} nft \"$@\"\n")).expect("wrapper");
    sh(&format!("chmod 0755 {}", nft.display()));
    let host = sh("nft list ruleset");
    let fw = firewall(dir);
    let mut landed = Vec::new();
    for (i, delay_ms) in [0u64, 2, 5, 8, 12, 16, 20, 25, 35, 45].into_iter().enumerate() {
        let generation = i as u64 + 1;
        let c = spawn_child("firewall", dir, &[("PL_CRASH_GENERATION", generation.to_string())]);
        std::thread::sleep(Duration::from_millis(delay_ms));
        // A child may have finished already at the later instants: then this is a replay of
        // a task that completed but never reported, which must converge all the same.
        let _ = Command::new("kill").args(["-9", &c.id().to_string()]).status();
        let mut c = c;
        let _ = c.wait();
        // Where the kill landed: before `nft` ran (no table of this generation), after the
        // batch but before the fence, or after the task ended.
        let fenced = std::fs::read_to_string(dir.join("state/firewall/pltest-crash.generation"))
            .is_ok_and(|f| f.starts_with(&format!("{generation} ")));
        landed.push((delay_ms, fenced));
        let note = fw
            .apply("pltest-crash", "10.208.77.0/24", generation, &Default::default())
            .expect("replay converges");
        assert!(note.contains("pl_0123abcd_pltest-crash_n1"), "{note}");
        let tables = sh(&format!("ip netns exec {NETNS} nft list tables"));
        assert_eq!(
            tables, "table inet pl_0123abcd_pltest-crash_n1",
            "exactly one table, after a kill at {delay_ms} ms"
        );
        let fence = std::fs::read_to_string(dir.join("state/firewall/pltest-crash.generation")).expect("fence");
        assert!(
            fence.starts_with(&format!("{generation} ")),
            "fence {fence:?} at generation {generation}"
        );
    }
    eprintln!("kills (delay ms, task had finished): {landed:?}");
    assert!(landed.iter().any(|l| !l.1), "some kills interrupted the task");
    // Once more at the last generation: replaced and read back equal; the host never changed.
    assert!(
        fw.apply("pltest-crash", "10.208.77.0/24", 10, &Default::default())
            .expect("again")
            .contains("read back")
    );
    assert_eq!(sh("nft list ruleset"), host, "the machine's own rules are unchanged");
}
