//! Bench (a binary: each sample starts a control plane and containers): the time from `pl up`
//! to its URLs serving (over HTTPS, as `pl up` serves by default: its local CA issues each
//! hostname's certificate), for 1 and for 10 web projects, against `docker compose up -d --wait`
//! of the same services (same image by digest, warm in the engine's cache, an init process,
//! the health path probed every 200 ms), alternating in the same run; and a `pl up` that finds
//! nothing changed. All on a simulated host (`agent/tests/support/host.rs`: a network
//! namespace with a dockerd of its own), so `pl up`'s firewall tables and routes touch nothing
//! of the machine's.
//!
//! `cargo build --release -p reconciler -p pushleft-agent && cargo bench -p pushleft-cli --bench up`
//! (`-- --rounds N`, default 3; `-- --http` for `pl up --http`, plain HTTP as before HTTPS;
//! `-- --app` adds examples/app against Compose, `-- --app-only` runs it alone, see `up/app.rs`;
//! `-- --rollback` adds `pl rollback` against a fresh rollout of the old image, `-- --rollback-only`
//! runs it alone, see `up/rollback.rs`; Caddy and Compose first on
//! `PATH`, as `scripts/test` installs them: `PATH=/opt/pushleft-tools/bin:$PATH`).

#[path = "up/app.rs"]
mod app;
#[path = "../../agent/tests/support/host.rs"]
mod host_support;
#[path = "../../reconciler/tests/support/repo.rs"]
mod repo_support;
#[path = "up/rollback.rs"]
mod rollback;
#[path = "../../agent/tests/support/tls.rs"]
mod tls_support;

use host_support::Host;
use repo_support::{Repo, environment};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn project(name: &str, image: &str) -> String {
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: {name}}}\nspec:\n  image: {image}\n  roles:\n    web: {{kind: web, port: 8080, health: {{path: /healthz}}, replicas: 1, command: [/bin/busybox, httpd, -f, -p, '8080', -h, /www]}}\n"
    )
}

fn compose_file(dir: &Path, image: &str, n: usize) -> PathBuf {
    let mut text = String::from("services:\n");
    for i in 0..n {
        text.push_str(&format!(
            "  p{i}:\n    image: {image}\n    pull_policy: missing\n    init: true\n    command: [\"/bin/busybox\", \"httpd\", \"-f\", \"-p\", \"8080\", \"-h\", \"/www\"]\n    read_only: true\n    cap_drop: [ALL]\n    healthcheck:\n      test: [\"CMD\", \"/bin/busybox\", \"wget\", \"-q\", \"-O\", \"/dev/null\", \"http://127.0.0.1:8080/healthz\"]\n      interval: 200ms\n      timeout: 2s\n      retries: 150\n"
        ));
    }
    let path = dir.join(format!("compose-{n}.yaml"));
    std::fs::write(&path, text).expect("compose file");
    path
}

fn timed(cmd: &mut Command) -> Duration {
    let started = Instant::now();
    let o = cmd.output().expect("runs");
    assert!(
        o.status.success(),
        "{:?}: {}\n{}",
        cmd.get_program(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    started.elapsed()
}

fn serves_plain(port: u16, host: &str) -> bool {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_global(Some(Duration::from_secs(2)))
        .build()
        .into();
    agent
        .get(&format!("http://127.0.0.1:{port}/"))
        .header("Host", host)
        .call()
        .is_ok_and(|r| r.status().as_u16() == 200)
}

/// Whether `host` answers 200 over HTTPS on `port`, with a certificate from the local CA of
/// the state folder `state` (what `pl up` serves by default).
fn serves(port: u16, host: &str, state: &Path) -> bool {
    let Ok(ca) = std::fs::read_to_string(state.join("ingress-ca/ca.crt")) else {
        return false;
    };
    tls_support::get_tls(port, host, &ca).is_ok_and(|(status, _, _)| status == 200)
}

fn median(v: &mut [Duration]) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64()
}

fn main() {
    let rounds: usize = std::env::args()
        .skip_while(|a| a != "--rounds")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(3);
    let plain = std::env::args().any(|a| a == "--http");
    // `PLBENCH_PL` names another build's `pl` (its daemon and agent beside it), so one bench
    // binary can measure two builds side by side.
    let pl = std::env::var_os("PLBENCH_PL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/pl"));
    let pl = if pl.exists() {
        pl
    } else {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug/pl")
    };
    let base = PathBuf::from(format!("/tmp/plbench-up-{}", std::process::id()));
    let host = Host::start(&format!("plbench-up-{}", std::process::id()), &base);
    let (registry, port) = host.registry();
    let image = host.image(port, "web", &[("/www/index.html", "bench\n"), ("/www/healthz", "ok\n")]);
    host.docker(&["pull", "-q", &image]);
    let socket = host.socket.clone();
    let work = tempfile::tempdir().expect("tempdir");
    let mut report = Vec::new();
    // `--app-only`: examples/app alone.
    let app_only = std::env::args().any(|a| a == "--app-only");
    let rollback_only = std::env::args().any(|a| a == "--rollback-only");
    let sizes: &[usize] = if app_only || rollback_only { &[] } else { &[1, 10] };
    for &n in sizes {
        let dir = work.path().join(format!("n{n}"));
        std::fs::create_dir_all(&dir).expect("dir");
        let repo = Repo::new(&dir);
        for i in 0..n {
            repo.write(&format!("projects/p{i}.yaml"), &project(&format!("p{i}"), &image));
            repo.write(
                &format!("envs/p{i}.yaml"),
                &environment(&format!("p{i}-production"), &format!("p{i}")),
            );
        }
        let file = compose_file(&dir, &image, n);
        let (mut ours, mut theirs, mut noop) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let state = dir.join(format!("state-{round}"));
            let (pl, repo_dir, socket, file) = (pl.clone(), repo.dir.clone(), socket.clone(), file.clone());
            let (a, b, c) = host.run(move || {
                let up = |state: &Path| {
                    let mut c = Command::new(&pl);
                    c.args(["up", "--node", "n1", "--port", "18090"]);
                    if plain {
                        c.arg("--http");
                    } else {
                        c.args(["--https-port", "18443"]);
                    }
                    c.arg(&repo_dir)
                        .env("PL_STATE_DIR", state)
                        .env("PL_DOCKER_SOCKET", &socket);
                    c
                };
                let a = timed(&mut up(&state));
                for i in 0..n {
                    let host = format!("p{i}.example.com.localhost");
                    let ok = if plain {
                        serves_plain(18_090, &host)
                    } else {
                        serves(18_443, &host, &state)
                    };
                    assert!(ok, "p{i} serves");
                }
                let c = timed(&mut up(&state));
                timed(
                    Command::new(&pl)
                        .arg("down")
                        .arg(&repo_dir)
                        .env("PL_STATE_DIR", &state)
                        .env("PL_DOCKER_SOCKET", &socket),
                );
                let compose = |args: &[&str]| {
                    let mut c = Command::new("docker-compose");
                    c.arg("-f")
                        .arg(&file)
                        .args(["-p", "plbenchup"])
                        .args(args)
                        .env("DOCKER_HOST", format!("unix://{}", socket.display()));
                    c
                };
                let b = timed(&mut compose(&["up", "-d", "--wait", "--quiet-pull"]));
                timed(&mut compose(&["down", "-t", "1"]));
                (a, b, c)
            });
            eprintln!(
                "{n} web: pl up {:.2} s, compose {:.2} s, pl up no-op {:.2} s",
                a.as_secs_f64(),
                b.as_secs_f64(),
                c.as_secs_f64()
            );
            ours.push(a);
            theirs.push(b);
            noop.push(c);
        }
        let (a, b, c) = (median(&mut ours), median(&mut theirs), median(&mut noop));
        report.push(format!(
            "{n} web project(s): pl up {a:.2} s (cold: the control plane starts too), docker compose up -d --wait {b:.2} s, ratio {:.2}; pl up with nothing changed {c:.2} s (median of {rounds})",
            a / b
        ));
    }
    if rollback_only || std::env::args().any(|a| a == "--rollback") {
        report.push(rollback::bench(&host, port, &pl, rounds, work.path()));
    }
    if app_only || std::env::args().any(|a| a == "--app") {
        report.push(app::bench(&host, port, &pl, rounds, work.path()));
    }
    let mut registry = registry;
    let _ = registry.kill();
    let _ = registry.wait();
    for line in report {
        println!("{line}");
    }
}
