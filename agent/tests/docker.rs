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
        environment: env.into(),
        deployment: "web".into(),
        role: "web".into(),
        role_kind: "web".into(),
        instance: Some(0),
        generation,
        spec_hash: format!("hash-g{generation}"),
        container: format!("pl-{env}-web-0-g{generation}"),
        image: image.into(),
        command: ["/bin/busybox", "httpd", "-f", "-p", "8080", "-h", "/www"]
            .map(String::from)
            .to_vec(),
        env: [("LOG_LEVEL".to_owned(), "info".to_owned())].into(),
        cpu_millis: 250,
        memory_bytes: 64 << 20,
        pids: 64,
        port: Some(8080),
        health: Some(HealthSpec {
            path: "/healthz".into(),
            timeout_seconds: 10,
        }),
        network: net.clone(),
        secrets: Vec::new(),
    }
}

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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let engine = Engine::connect(
            Path::new("/var/run/docker.sock"),
            "n1",
            dir.path().join("secrets"),
            identity.clone(),
            dir.path().join("state/images-pulled"),
        )
        .await
        .expect("docker");

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
        // Stopped by hand: started again, the same container.
        docker(&["stop", "-t", "1", &g1.container]);
        assert!(
            engine
                .ensure_application(&g1)
                .await
                .expect("repair")
                .contains("restarted")
        );
        assert_eq!(inspect(&g1.container, "{{.Id}}"), id);
        assert_eq!(inspect(&g1.container, "{{.State.Running}}"), "true");

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
                .stop_older(&env, "web", 0, 2)
                .await
                .expect("stop")
                .contains("stopped")
        );
        assert_eq!(inspect(&g1.container, "{{.State.Running}}"), "false");
        assert_eq!(inspect(&g2.container, "{{.State.Running}}"), "true");
        // Drift: the newest generation stopped by hand is started again; the older one, stopped
        // on purpose, stays stopped.
        docker(&["stop", "-t", "1", &g2.container]);
        let repaired = engine.repair_containers().await.expect("repair");
        assert_eq!(repaired.len(), 1, "{repaired:?}");
        assert!(repaired[0].1.contains(&g2.container), "{repaired:?}");
        assert_eq!(inspect(&g2.container, "{{.State.Running}}"), "true");
        assert_eq!(inspect(&g1.container, "{{.State.Running}}"), "false");
        assert!(
            engine.repair_containers().await.expect("again").is_empty(),
            "nothing left to repair"
        );

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
        job.container = format!("pl-{env}-migrate-run-g5");
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

        // An image that does not exist is permanent.
        let mut missing = app(&env, &image, 6, &net);
        missing.image = format!("127.0.0.1:{}/pl-test/none@sha256:{}", registry.port, "0".repeat(64));
        assert_eq!(
            engine.ensure_application(&missing).await.expect_err("no image").code,
            "image-not-found"
        );

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
