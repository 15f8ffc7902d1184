//! The Docker executors against a real dockerd and a registry on loopback: an environment's
//! network (created with the lease's subnet, adopted, a foreign one refused), a replica's
//! hardened container (pulled by digest, healthy by its HTTP probe, adopted on replay, started
//! again after a hand-made stop, a foreign container and an older generation refused), secrets
//! readable inside at `/run/secrets/<KEY>` and nowhere in `docker inspect`, a failed health
//! check and an exited worker with their reasons, stopping and tearing down, and runs of a
//! job with their exit codes, removed every time.

#[path = "support/docker.rs"]
mod docker_support;
mod support;

use agent_proto::{ApplicationSpec, HealthSpec, NetworkSpec, SealedSecret};
use docker_support::{Registry, clean, docker, docker_ok, require_dockerd};
use pushleft_agent::docker::Engine;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const PLAINTEXT: &str = "postgres://app:s3cret-in-a-file@db/app";

fn app(env: &str, image: &str, generation: u64, net: &NetworkSpec) -> ApplicationSpec {
    ApplicationSpec {
        resume: None,
        image_trust: None,
        deployment: "web".into(),
        spec_hash: format!("hash-g{generation}"),
        env: [("LOG_LEVEL".to_owned(), "info".to_owned())].into(),
        ..docker_support::web_replica(support::TEST_CONTROL_PLANE, env, "web", 0, image, generation, net)
    }
}

/// An engine on the machine's dockerd as `control_plane`'s node `n1`, its secrets and state
/// under `dir` (a prefix per engine), opening secrets with `identity`.
async fn engine_at(dir: &Path, prefix: &str, control_plane: &str, identity: &Path) -> Engine {
    Engine::connect(
        Path::new("/var/run/docker.sock"),
        control_plane,
        "n1",
        dir.join(format!("{prefix}secrets")),
        identity.to_owned(),
        dir.join(format!("{prefix}state/images-pulled")),
    )
    .await
    .expect("docker")
    .with_unused_image_grace(GRACE)
}

/// How long the tests' engines keep an unused image.
const GRACE: std::time::Duration = std::time::Duration::from_millis(500);

fn inspect(container: &str, format: &str) -> String {
    docker(&["inspect", "--format", format, container])
}

#[test]
fn docker_executors_adopt_repair_and_refuse() {
    require_dockerd();
    let registry = Registry::start();
    let image = registry.image(
        "web",
        &[("/www/index.html", "generation one\n"), ("/www/healthz", "ok\n")],
    );
    // A fixed name, so what a killed run left behind is cleaned first.
    let env = "pltest-docker".to_owned();
    clean(&env);
    clean(&format!("{env}x"));
    let dir = tempfile::tempdir().expect("tempdir");
    let identity = dir.path().join("age.key");
    let recipient = support::age_keygen(&identity);
    let rt = support::runtime();
    rt.block_on(async {
        let engine = engine_at(dir.path(), "", support::TEST_CONTROL_PLANE, &identity).await;

        // The network: created with the lease's subnet, adopted, another subnet refused.
        let net = NetworkSpec {
            environment: env.clone(),
            network: format!("pl_{env}"),
            subnet: "10.208.251.0/24".into(),
        };
        assert!(engine.ensure_network(&net).await.expect("create").contains("created"));
        assert!(engine.ensure_network(&net).await.expect("adopt").contains("adopted"));
        assert_eq!(
            inspect(&net.network, "{{range .IPAM.Config}}{{.Subnet}}{{end}}"),
            "10.208.251.0/24"
        );
        // Another control plane's agent on this engine (same node name): the network is
        // foreign to it, and its subnet is one the heartbeat reports as taken; ours is not.
        let other = engine_at(dir.path(), "other-", "89abcdef", &identity).await;
        assert_eq!(
            other.ensure_network(&net).await.expect_err("foreign").code,
            "foreign-network"
        );
        assert_eq!(
            other.remove_network(&net.network).await.expect_err("foreign").code,
            "foreign-network"
        );
        assert!(
            other
                .taken_subnets()
                .await
                .expect("taken")
                .contains(&"10.208.251.0/24".to_owned())
        );
        assert!(
            !engine
                .taken_subnets()
                .await
                .expect("taken")
                .contains(&"10.208.251.0/24".to_owned()),
            "its own network is not taken from it"
        );
        let moved = NetworkSpec {
            subnet: "10.208.252.0/24".into(),
            ..net.clone()
        };
        assert_eq!(
            engine.ensure_network(&moved).await.expect_err("mismatch").code,
            "network-subnet-mismatch"
        );
        // A network with our name that is not ours is refused and left alone.
        let foreign = format!("pl_{env}x");
        docker(&["network", "create", "--subnet", "10.208.253.0/24", &foreign]);
        let theirs = NetworkSpec {
            environment: format!("{env}x"),
            network: foreign.clone(),
            subnet: "10.208.253.0/24".into(),
        };
        assert_eq!(
            engine.ensure_network(&theirs).await.expect_err("foreign").code,
            "foreign-network"
        );
        assert_eq!(
            engine.remove_network(&foreign).await.expect_err("foreign").code,
            "foreign-network"
        );
        assert!(docker_ok(&["network", "inspect", &foreign]), "left untouched");
        docker(&["network", "rm", &foreign]);

        // A replica, pulled by digest, healthy, hardened, with its secret as a file.
        let mut g1 = app(&env, &image, 1, &net);
        g1.secrets = vec![SealedSecret {
            key: "DATABASE_URL".into(),
            sealed: support::age_encrypt(PLAINTEXT, &recipient),
        }];
        let note = engine.ensure_application(&g1).await.expect("g1");
        assert!(note.contains("created, healthy"), "{note}");
        let id = inspect(&g1.container, "{{.Id}}");
        assert_eq!(inspect(&g1.container, "{{.HostConfig.ReadonlyRootfs}}"), "true");
        assert_eq!(inspect(&g1.container, "{{.HostConfig.CapDrop}}"), "[ALL]");
        assert_eq!(
            inspect(&g1.container, "{{.HostConfig.SecurityOpt}}"),
            "[no-new-privileges]"
        );
        assert_eq!(inspect(&g1.container, "{{.HostConfig.Init}}"), "true");
        assert_eq!(inspect(&g1.container, "{{.HostConfig.NanoCpus}}"), "250000000");
        assert_eq!(
            inspect(&g1.container, "{{.HostConfig.Memory}}"),
            (64u64 << 20).to_string()
        );
        assert_eq!(
            inspect(&g1.container, "{{.HostConfig.MemorySwap}}"),
            (64u64 << 20).to_string()
        );
        assert_eq!(inspect(&g1.container, "{{.HostConfig.PidsLimit}}"), "64");
        let ports = inspect(&g1.container, "{{json .HostConfig.PortBindings}}");
        assert!(ports == "null" || ports == "{}", "no published port: {ports}");
        assert_eq!(
            inspect(
                &g1.container,
                "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}"
            ),
            net.network,
            "only the environment's network"
        );
        let everything = docker(&["inspect", &g1.container]);
        assert!(!everything.contains(PLAINTEXT), "the secret is not in docker inspect");
        assert_eq!(
            docker(&["exec", &g1.container, "cat", "/run/secrets/DATABASE_URL"]),
            PLAINTEXT
        );
        assert!(
            !docker_ok(&["exec", &g1.container, "sh", "-c", "echo x > /run/secrets/DATABASE_URL"]),
            "read-only secrets"
        );
        assert!(
            !docker_ok(&["exec", &g1.container, "sh", "-c", "echo x > /x"]),
            "read-only root"
        );

        // Replayed: adopted, the same container.
        assert!(engine.ensure_application(&g1).await.expect("again").contains("adopted"));
        assert_eq!(inspect(&g1.container, "{{.Id}}"), id);
        // Stopped by hand: started again as a new container of the same name, whose `/tmp` is
        // writable by anyone again (a restarted one's is root's 0755: see `recreate`).
        let tmp_mode = |c: &str| docker(&["exec", c, "/bin/busybox", "stat", "-c", "%a", "/tmp"]);
        assert_eq!(tmp_mode(&g1.container), "1777");
        docker(&["stop", "-t", "1", &g1.container]);
        assert!(
            engine
                .ensure_application(&g1)
                .await
                .expect("repair")
                .contains("restarted")
        );
        assert_ne!(inspect(&g1.container, "{{.Id}}"), id);
        assert_eq!(inspect(&g1.container, "{{.State.Running}}"), "true");
        assert_eq!(tmp_mode(&g1.container), "1777");

        // Generation 2 comes up; then a task for generation 1 is stale.
        let g2 = app(&env, &image, 2, &net);
        engine.ensure_application(&g2).await.expect("g2");
        assert_eq!(
            engine.ensure_application(&g1).await.expect_err("stale").code,
            "stale-generation"
        );
        // The old one stops once the new one is healthy.
        assert!(
            engine
                .stop_older(&env, "web", 0, 2, false)
                .await
                .expect("stop")
                .contains("stopped")
        );
        assert_eq!(inspect(&g1.container, "{{.State.Running}}"), "false");
        assert_eq!(inspect(&g2.container, "{{.State.Running}}"), "true");
        // Drift: the newest generation stopped by hand is started again; the older one, stopped
        // on purpose, stays stopped.
        // Repairs are per host: another test of this binary, running alongside under the same
        // test control plane, may have a stopped replica of its own at this moment, so only
        // this environment's repairs are asserted.
        let ours_only = |all: Vec<(String, String)>| -> Vec<String> {
            all.into_iter()
                .filter(|(e, _)| *e == env)
                .map(|(_, what)| what)
                .collect()
        };
        docker(&["stop", "-t", "1", &g2.container]);
        let repaired = ours_only(engine.repair_containers().await.expect("repair"));
        assert_eq!(repaired.len(), 1, "{repaired:?}");
        assert!(repaired[0].contains(&g2.container), "{repaired:?}");
        assert_eq!(inspect(&g2.container, "{{.State.Running}}"), "true");
        assert_eq!(inspect(&g1.container, "{{.State.Running}}"), "false");
        assert_eq!(tmp_mode(&g2.container), "1777", "the repaired one's /tmp too");
        assert_eq!(
            inspect(
                &g2.container,
                "{{.HostConfig.ReadonlyRootfs}} {{.HostConfig.Init}} {{.HostConfig.CapDrop}}"
            ),
            "true true [ALL]",
            "made again with the same hardening"
        );
        let again = ours_only(engine.repair_containers().await.expect("again"));
        assert!(again.is_empty(), "nothing left to repair: {again:?}");
        // A paused container (a backup reads its volume) is not stopped: left alone.
        let paused_id = inspect(&g2.container, "{{.Id}}");
        docker(&["pause", &g2.container]);
        let paused = ours_only(engine.repair_containers().await.expect("paused"));
        assert!(paused.is_empty(), "a paused container is no drift: {paused:?}");
        assert_eq!(inspect(&g2.container, "{{.Id}}"), paused_id, "the very container");
        docker(&["unpause", &g2.container]);

        // A container with generation 3's name that is not ours: refused, left alone.
        let g3 = app(&env, &image, 3, &net);
        docker(&[
            "create",
            "--name",
            &g3.container,
            "--label",
            &format!("dev.pushleft.environment={env}"),
            &image,
            "/bin/busybox",
            "sleep",
            "60",
        ]);
        assert_eq!(
            engine.ensure_application(&g3).await.expect_err("foreign").code,
            "foreign-container"
        );
        assert!(docker_ok(&["inspect", &g3.container]), "left untouched");
        docker(&["rm", "-f", &g3.container]);

        // A failed health check says why: the probes' outcomes and the log tail.
        let mut sick = app(&env, &image, 3, &net);
        sick.health = Some(HealthSpec {
            path: "/missing".into(),
            timeout_seconds: 2,
        });
        let f = engine.ensure_application(&sick).await.expect_err("unhealthy");
        assert_eq!(f.code, "health-deadline");
        assert!(f.detail.contains("404"), "{}", f.detail);
        assert!(
            !docker_ok(&["inspect", &sick.container]),
            "a replica that never became healthy goes"
        );
        assert_eq!(
            inspect(&g2.container, "{{.State.Running}}"),
            "true",
            "the generation before keeps serving"
        );
        // A worker whose process exits at once.
        let mut dead = app(&env, &image, 4, &net);
        dead.role_kind = "worker".into();
        dead.health = None;
        dead.port = None;
        dead.command = ["/bin/sh", "-c", "echo starting; exit 7"].map(String::from).to_vec();
        let f = engine.ensure_application(&dead).await.expect_err("exited");
        assert_eq!(f.code, "exited");
        assert!(
            f.detail.contains("exit code 7") && f.detail.contains("starting"),
            "{}",
            f.detail
        );

        // Teardown removes every generation of the replica.
        engine.teardown(&env, "web", 0, 4).await.expect("teardown");
        assert_eq!(
            docker(&[
                "ps",
                "-aq",
                "--filter",
                &format!("label=dev.pushleft.environment={env}")
            ]),
            ""
        );

        // Runs: exit 0 succeeds, another code fails for good; the container goes either way.
        let mut job = app(&env, &image, 5, &net);
        job.instance = None;
        job.role = "migrate".into();
        job.role_kind = "release".into();
        job.container = agent_proto::container_name(support::TEST_CONTROL_PLANE, &env, "migrate", None, 5);
        job.health = None;
        job.command = ["/bin/sh", "-c", "echo migrated"].map(String::from).to_vec();
        let ok = engine.run_once(&job, Duration::from_secs(30)).await.expect("run");
        assert!(ok.contains("migrated"), "{ok}");
        assert!(!docker_ok(&["inspect", &job.container]), "removed");
        job.command = ["/bin/sh", "-c", "echo boom; exit 3"].map(String::from).to_vec();
        let f = engine
            .run_once(&job, Duration::from_secs(30))
            .await
            .expect_err("exit 3");
        assert_eq!(f.code, "exit-code");
        assert!(
            f.detail.contains("exit code 3") && f.detail.contains("boom"),
            "{}",
            f.detail
        );
        assert!(!docker_ok(&["inspect", &job.container]), "removed");

        // A run whose agent died mid-run (its job's future dropped after the container
        // started) and whose job never came back (a newer release cancelled it): the run
        // exits on its own and the drift round's sweep removes it once its grace is over,
        // and nothing else: a foreign container with our label names but another control
        // plane's id stays.
        let mut orphan = job.clone();
        orphan.container = agent_proto::container_name(support::TEST_CONTROL_PLANE, &env, "migrate", None, 7);
        orphan.command = ["/bin/sh", "-c", "echo half-way; sleep 1"].map(String::from).to_vec();
        let killed = tokio::time::timeout(
            Duration::from_millis(800),
            engine.run_once(&orphan, Duration::from_secs(30)),
        )
        .await;
        assert!(killed.is_err(), "the run was cut off mid-run");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while inspect(&orphan.container, "{{.State.Status}}") != "exited" {
            assert!(std::time::Instant::now() < deadline, "the orphaned run never ended");
            std::thread::sleep(Duration::from_millis(100));
        }
        let foreign_run = format!("{}-foreign", orphan.container);
        docker(&[
            "create",
            "--name",
            &foreign_run,
            "--label",
            "dev.pushleft.owned=true",
            "--label",
            "dev.pushleft.control-plane=someone-else",
            "--label",
            "dev.pushleft.node=n1",
            &image,
            "/bin/true",
        ]);
        let patient = engine_at(dir.path(), "", support::TEST_CONTROL_PLANE, &identity)
            .await
            .with_run_sweep_grace(Duration::from_secs(3600));
        assert_eq!(
            patient.sweep_runs().await.expect("sweep"),
            Vec::<String>::new(),
            "within its grace"
        );
        assert!(
            docker_ok(&["inspect", &orphan.container]),
            "kept for a replay within the grace"
        );
        let swept = engine_at(dir.path(), "", support::TEST_CONTROL_PLANE, &identity)
            .await
            .with_run_sweep_grace(Duration::ZERO)
            .sweep_runs()
            .await
            .expect("sweep");
        assert_eq!(swept, [orphan.container.clone()], "only the orphaned run");
        assert!(!docker_ok(&["inspect", &orphan.container]), "the orphaned run is gone");
        assert!(
            docker_ok(&["inspect", &foreign_run]),
            "a foreign container is never touched"
        );
        docker(&["rm", "-f", &foreign_run]);

        // An image that does not exist is permanent.
        let mut missing = app(&env, &image, 6, &net);
        missing.image = format!("127.0.0.1:{}/pl-test/none@sha256:{}", registry.port, "0".repeat(64));
        assert_eq!(
            engine.ensure_application(&missing).await.expect_err("no image").code,
            "image-not-found"
        );
        // A placeholder registry (the examples' `.invalid`): refused at once, with a hint, and
        // the engine is never asked (so no resolver is).
        missing.image = format!("registry.example.invalid/hello@sha256:{}", "0".repeat(64));
        let started = std::time::Instant::now();
        let f = engine.ensure_application(&missing).await.expect_err("placeholder");
        assert_eq!(f.code, "image-registry-unreachable");
        assert!(f.detail.contains("pl up --build"), "{}", f.detail);
        assert!(started.elapsed() < Duration::from_secs(2), "fails fast");

        // Disk: an image the agent pulled goes once nothing uses it; one it did not pull (or
        // one still in use) is never touched.
        let foreign_tar = dir.path().join("empty.tar");
        assert!(
            Command::new("tar")
                .args(["-cf"])
                .arg(&foreign_tar)
                .args(["-T", "/dev/null"])
                .status()
                .expect("tar")
                .success()
        );
        docker(&["import", &foreign_tar.to_string_lossy(), "pl-test/not-ours:1"]);
        let holder = format!("{env}-holder");
        docker(&["create", "--name", &holder, &image, "/bin/busybox", "true"]);
        assert!(engine.collect_images().await.expect("collect").is_empty(), "in use");
        assert!(docker_ok(&["image", "inspect", &image]));
        docker(&["rm", "-f", &holder]);
        // Unused now: kept for the grace (a replica coming back starts without a pull), then
        // removed.
        assert!(
            engine.collect_images().await.expect("collect").is_empty(),
            "within the grace"
        );
        assert!(docker_ok(&["image", "inspect", &image]));
        std::thread::sleep(GRACE);
        assert_eq!(
            engine.collect_images().await.expect("collect"),
            std::slice::from_ref(&image)
        );
        assert!(!docker_ok(&["image", "inspect", &image]), "removed");
        assert!(
            docker_ok(&["image", "inspect", "pl-test/not-ours:1"]),
            "not ours: untouched"
        );
        docker(&["rmi", "pl-test/not-ours:1"]);

        assert!(
            engine
                .remove_network(&net.network)
                .await
                .expect("remove")
                .contains("removed")
        );
        assert!(
            engine
                .remove_network(&net.network)
                .await
                .expect("again")
                .contains("already gone")
        );
    });
    clean(&env);
}

/// What a hostile application can try from inside its container, from the hardening review:
/// - its health endpoint answers `302` to a service on the host's loopback (which the agent,
///   running as root on the host, could reach): the probe follows no redirect, fails with
///   where it pointed, and the loopback service sees no request;
/// - it writes 24 MiB to stdout: its log on the node stays within its role's bound
///   (1 MiB a file, 2 files here), and the log tail a result carries stays within 16 KiB;
/// - another environment's container has the name this replica's would have (environment
///   `a-web` + role `web` spelled as environment `a` + role `web-web` under the old names):
///   it is foreign by its labels, refused and left running, never removed as "another spec".
#[test]
fn a_hostile_container_cannot_redirect_the_probe_fill_the_disk_or_take_a_name() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    require_dockerd();
    let registry = Registry::start();
    let env = "pltest-hostile".to_owned();
    let other = format!("{env}-web");
    clean(&env);
    clean(&other);
    // A "service on the host's loopback" the redirect points at: it counts connections.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let target = listener.local_addr().expect("addr").port();
    let reached = Arc::new(AtomicUsize::new(0));
    {
        let reached = Arc::clone(&reached);
        std::thread::spawn(move || {
            for conn in listener.incoming().take(100) {
                reached.fetch_add(1, Ordering::SeqCst);
                if let Ok(mut c) = conn {
                    use std::io::Write;
                    let _ = c.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok");
                }
            }
        });
    }
    let redirecting = registry.image(
        "redirect",
        &[(
            "/www/cgi-bin/healthz",
            &format!("#!/bin/sh\nprintf 'Status: 302 Found\\r\\nLocation: http://127.0.0.1:{target}/\\r\\n\\r\\n'\n"),
        )],
    );
    let image = registry.image("web", &[("/www/index.html", "ok\n"), ("/www/healthz", "ok\n")]);
    let dir = tempfile::tempdir().expect("tempdir");
    let identity = dir.path().join("age.key");
    support::age_keygen(&identity);
    let rt = support::runtime();
    rt.block_on(async {
        let engine = engine_at(dir.path(), "", support::TEST_CONTROL_PLANE, &identity).await;
        let net = NetworkSpec {
            environment: env.clone(),
            network: format!("pl_{env}"),
            subnet: "10.208.249.0/24".into(),
        };
        engine.ensure_network(&net).await.expect("network");

        // The redirect: not followed, a failed probe that says where it pointed.
        let mut sly = app(&env, &redirecting, 1, &net);
        sly.health = Some(HealthSpec {
            path: "/cgi-bin/healthz".into(),
            timeout_seconds: 2,
        });
        let f = engine.ensure_application(&sly).await.expect_err("a redirect is no health");
        assert_eq!(f.code, "health-deadline");
        assert!(
            f.detail.contains(&format!("302 redirect to http://127.0.0.1:{target}/ not followed")),
            "{}",
            f.detail
        );
        assert_eq!(reached.load(Ordering::SeqCst), 0, "the loopback service saw no request");

        // The flood: 24 MiB of output, bounded on disk by the role's log limits.
        let mut loud = app(&env, &image, 1, &net);
        loud.role = "worker".into();
        loud.role_kind = "worker".into();
        loud.container = agent_proto::container_name(support::TEST_CONTROL_PLANE, &env, "worker", Some(0), 1);
        loud.health = None;
        loud.port = None;
        loud.log_max_bytes = 1 << 20;
        loud.log_max_files = 2;
        let line = "x".repeat(1023);
        loud.command = [
            "/bin/busybox".to_owned(),
            "sh".to_owned(),
            "-c".to_owned(),
            format!("/bin/busybox yes {line} | /bin/busybox head -n 24576; echo flood-written; exec /bin/busybox sleep 600"),
        ]
        .to_vec();
        engine.ensure_application(&loud).await.expect("worker");
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !docker(&["logs", "--tail", "1", &loud.container]).contains("flood-written") {
            assert!(std::time::Instant::now() < deadline, "the flood never ended");
            std::thread::sleep(Duration::from_millis(200));
        }
        assert_eq!(
            inspect(&loud.container, "{{.HostConfig.LogConfig.Type}} {{index .HostConfig.LogConfig.Config \"max-size\"}} {{index .HostConfig.LogConfig.Config \"max-file\"}}"),
            "json-file 1048576 2"
        );
        let log = std::path::PathBuf::from(inspect(&loud.container, "{{.LogPath}}"));
        let folder = log.parent().expect("log folder");
        let stem = log.file_name().expect("name").to_string_lossy().into_owned();
        let on_disk: u64 = std::fs::read_dir(folder)
            .expect("container folder")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&stem))
            .map(|e| e.metadata().expect("size").len())
            .sum();
        assert!(
            on_disk <= 2 * (1 << 20) + 64 * 1024,
            "24 MiB written, {on_disk} bytes kept: the bound is 2 files of 1 MiB"
        );
        let tail = engine.log_tail(&loud.container).await;
        assert!(tail.len() <= pushleft_agent::docker::LOG_TAIL_BYTES, "{}", tail.len());
        assert!(tail.contains("flood-written"));

        // The name: another environment's replica holds it; refused by its labels, untouched.
        let victim = app(&other, &image, 1, &net);
        engine.ensure_application(&victim).await.expect("victim");
        let victim_id = inspect(&victim.container, "{{.Id}}");
        let mut taker = app(&env, &image, 1, &net);
        taker.role = "web-web".into();
        taker.spec_hash = "the-taker".into();
        taker.container = victim.container.clone();
        assert_eq!(
            engine.ensure_application(&taker).await.expect_err("foreign").code,
            "foreign-container"
        );
        let mut run = taker.clone();
        run.instance = None;
        assert_eq!(
            engine.run_once(&run, Duration::from_secs(5)).await.expect_err("foreign").code,
            "foreign-container"
        );
        assert_eq!(inspect(&victim.container, "{{.Id}}"), victim_id, "the same container");
        assert_eq!(inspect(&victim.container, "{{.State.Running}}"), "true", "still serving");
        // Under today's names the two never meet.
        assert_ne!(
            agent_proto::container_name(support::TEST_CONTROL_PLANE, &env, "web-web", Some(0), 1),
            agent_proto::container_name(support::TEST_CONTROL_PLANE, &other, "web", Some(0), 1)
        );
    });
    clean(&env);
    clean(&other);
    let _ = docker_ok(&["network", "rm", &format!("pl_{env}")]);
}

/// `pl up`'s build registry wants credentials (every local user reaches its port): without
/// them the agent's pull is refused by the registry; with `registry_auth` naming a 0600 file
/// of `username:password`, the replica is pulled and runs; a file others may read is refused
/// by name, its content in no error.
#[test]
fn pulls_from_a_registry_that_wants_credentials() {
    use std::os::unix::fs::PermissionsExt;
    require_dockerd();
    let registry = Registry::with_credentials("pl-up", "a-long-random-password");
    let image = registry.image("private", &[("/www/healthz", "ok\n")]);
    let env = "pltest-auth".to_owned();
    clean(&env);
    let dir = tempfile::tempdir().expect("tempdir");
    let identity = dir.path().join("age.key");
    support::age_keygen(&identity);
    let auth = dir.path().join("registry.auth");
    std::fs::write(&auth, "pl-up:a-long-random-password\n").expect("auth");
    let rt = support::runtime();
    rt.block_on(async {
        let engine = |files: Vec<(String, std::path::PathBuf)>| {
            let (dir, identity) = (dir.path().to_owned(), identity.clone());
            async move {
                engine_at(&dir, "", support::TEST_CONTROL_PLANE, &identity)
                    .await
                    .with_registry_auth(files.into_iter().collect())
            }
        };
        let net = NetworkSpec {
            environment: env.clone(),
            network: format!("pl_{env}"),
            subnet: "10.208.248.0/24".into(),
        };
        let anonymous = engine(Vec::new()).await;
        anonymous.ensure_network(&net).await.expect("network");
        let g1 = app(&env, &image, 1, &net);
        let f = anonymous.ensure_application(&g1).await.expect_err("no credentials");
        assert!(f.code.starts_with("image-"), "{}: {}", f.code, f.detail);
        let registry_name = format!("127.0.0.1:{}", registry.port);
        std::fs::set_permissions(&auth, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let exposed = engine(vec![(registry_name.clone(), auth.clone())]).await;
        let f = exposed.ensure_application(&g1).await.expect_err("readable by others");
        assert_eq!(f.code, "registry-auth-unreadable");
        assert!(!f.detail.contains("a-long-random-password"), "{}", f.detail);
        std::fs::set_permissions(&auth, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let allowed = engine(vec![(registry_name, auth.clone())]).await;
        let note = allowed.ensure_application(&g1).await.expect("pulled with credentials");
        assert!(note.contains("created, healthy"), "{note}");
        allowed.teardown(&env, "web", 0, 1).await.expect("teardown");
        allowed.remove_network(&net.network).await.expect("network goes");
    });
    clean(&env);
}

/// A rollout's cleanup pauses the previous generation's web replica (kept for a rollback); a
/// rollback's replica resumes it in place of a new container, serving as the rollback's
/// generation (what the heartbeat reports, what the next cleanup spares), and the window's end
/// stops what stays paused.
#[test]
fn a_previous_release_is_paused_and_a_rollback_resumes_it() {
    require_dockerd();
    let registry = Registry::start();
    let image = registry.image("web", &[("/www/index.html", "one\n"), ("/www/healthz", "ok\n")]);
    let env = "pltest-resume".to_owned();
    clean(&env);
    let dir = tempfile::tempdir().expect("tempdir");
    let identity = dir.path().join("age.key");
    support::age_keygen(&identity);
    let rt = support::runtime();
    rt.block_on(async {
        let engine = engine_at(dir.path(), "", support::TEST_CONTROL_PLANE, &identity)
            .await
            .with_rollback_window(Duration::from_secs(2));
        let net = NetworkSpec {
            environment: env.clone(),
            network: format!("pl_{env}"),
            subnet: "10.208.247.0/24".into(),
        };
        engine.ensure_network(&net).await.expect("network");
        let state = |c: &str| inspect(c, "{{.State.Status}}");
        let generation_of = |all: &[(String, std::collections::HashMap<String, String>, bool)], c: &str| {
            all.iter()
                .find(|(n, _, _)| n == c)
                .and_then(|(_, l, _)| l.get("dev.pushleft.generation").cloned())
        };
        let (g1, g2) = (app(&env, &image, 1, &net), app(&env, &image, 2, &net));
        engine.ensure_application(&g1).await.expect("g1");
        engine.ensure_application(&g2).await.expect("g2");
        let note = engine.stop_older(&env, "web", 0, 2, true).await.expect("cleanup");
        assert!(note.contains("paused for a rollback"), "{note}");
        assert_eq!(state(&g1.container), "paused");

        // The rollback (generation 3 runs generation 1's spec): generation 1's container is
        // thawed and serves; no container of generation 3 is made.
        let mut g3 = app(&env, &image, 3, &net);
        g3.spec_hash = g1.spec_hash.clone();
        g3.resume = Some(g1.container.clone());
        let started = std::time::Instant::now();
        let note = engine.ensure_application(&g3).await.expect("resumed");
        let took = started.elapsed();
        assert!(note.contains("thawed as") && note.contains(&g3.container), "{note}");
        assert!(took < Duration::from_secs(2), "a resume takes {took:?}");
        assert_eq!(state(&g1.container), "running");
        assert!(!docker_ok(&["inspect", &g3.container]), "nothing made for generation 3");
        assert_eq!(engine.serving(&g3.container), g1.container);
        let all = engine.ours(&[("dev.pushleft.environment", &env)]).await.expect("ours");
        assert_eq!(
            generation_of(&all, &g1.container).as_deref(),
            Some("3"),
            "it serves as generation 3"
        );
        // Replayed, it adopts what it resumed.
        assert!(
            engine
                .ensure_application(&g3)
                .await
                .expect("again")
                .contains("running as")
        );
        // The rollback's cleanup keeps generation 2 paused and spares the resumed one.
        let note = engine.stop_older(&env, "web", 0, 3, true).await.expect("cleanup");
        assert!(note.contains(&format!("{} paused", g2.container)), "{note}");
        assert_eq!(state(&g1.container), "running");
        // The window ends: the paused one is stopped by the drift round.
        tokio::time::sleep(Duration::from_millis(2100)).await;
        let stopped = engine.expire_paused().await.expect("expire");
        assert!(stopped.contains(&g2.container), "{stopped:?}");
        assert_eq!(state(&g2.container), "exited");
        assert_eq!(state(&g1.container), "running", "the serving one is not touched");
        // A teardown removes them all, and forgets what was resumed.
        engine.teardown(&env, "web", 0, 3).await.expect("teardown");
        assert!(!docker_ok(&["inspect", &g1.container]) && !docker_ok(&["inspect", &g2.container]));
        assert_eq!(engine.serving(&g3.container), g3.container);
    });
    clean(&env);
}
