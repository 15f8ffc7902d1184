//! Volumes against a real dockerd: a role's volume is made with our labels and mounted, its
//! data survives a new generation (which starts only after the old one stopped: one writer),
//! a stop and start, and a teardown of the replica; what it holds is measured; a foreign
//! volume with our name is refused and left as it was; removal takes only ours.

#[path = "support/docker.rs"]
mod docker_support;
mod support;

use agent_proto::{ApplicationSpec, NetworkSpec, VolumeMount};
use docker_support::{Registry, clean, docker, docker_ok, require_dockerd};

/// A web replica that appends its generation to `/data/log` when it starts and serves
/// `/data` (the health path is a file there).
fn replica(env: &str, image: &str, generation: u64, net: &NetworkSpec) -> ApplicationSpec {
    let script =
        format!("echo g{generation} >> /data/log && echo ok > /data/healthz && exec /bin/httpd -f -p 8080 -h /data");
    ApplicationSpec {
        resume: None,
        image_trust: None,
        command: ["/bin/sh", "-c", &script].map(String::from).to_vec(),
        volumes: vec![VolumeMount {
            volume: "data".into(),
            generation: 1,
            path: "/data".into(),
            load: None,
        }],
        ..docker_support::web_replica(support::TEST_CONTROL_PLANE, env, "db", 0, image, generation, net)
    }
}

fn read_log(container: &str) -> String {
    docker(&["exec", container, "/bin/cat", "/data/log"])
}

#[test]
fn a_volume_is_ours_survives_generations_and_teardown_and_a_foreign_one_is_refused() {
    require_dockerd();
    let registry = Registry::start();
    let image = registry.image("vol", &[("/www/healthz", "ok\n")]);
    let env = "pltest-volumes".to_owned();
    clean(&env);
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = support::runtime();
    rt.block_on(async {
        let engine = docker_support::engine_n1(dir.path(), support::TEST_CONTROL_PLANE).await;
        let net = NetworkSpec {
            environment: env.clone(),
            network: format!("pl_{env}"),
            subnet: "10.208.243.0/24".into(),
        };
        engine.ensure_network(&net).await.expect("network");

        // Generation 1 makes the volume, with our labels, and writes to it.
        let g1 = replica(&env, &image, 1, &net);
        engine.ensure_application(&g1).await.expect("g1");
        let volume = agent_proto::volume_name(support::TEST_CONTROL_PLANE, "n1", &env, "data", 1);
        let labels = docker(&["volume", "inspect", "--format", "{{json .Labels}}", &volume]);
        for want in [
            "\"dev.pushleft.owned\":\"true\"",
            &format!("\"dev.pushleft.control-plane\":\"{}\"", support::TEST_CONTROL_PLANE),
            "\"dev.pushleft.node\":\"n1\"",
            &format!("\"dev.pushleft.environment\":\"{env}\""),
            "\"dev.pushleft.volume\":\"data\"",
            "\"dev.pushleft.volume-generation\":\"1\"",
        ] {
            assert!(labels.contains(want), "{want} in {labels}");
        }
        assert_eq!(read_log(&g1.container), "g1");

        // Generation 2: the old one is stopped before the new one starts (one writer), and
        // the new one finds the data.
        let g2 = replica(&env, &image, 2, &net);
        engine.ensure_application(&g2).await.expect("g2");
        assert_eq!(
            docker(&["inspect", "--format", "{{.State.Running}}", &g1.container]),
            "false",
            "the older generation stopped"
        );
        let started = |c: &str| docker(&["inspect", "--format", "{{.State.StartedAt}}", c]);
        let finished = docker(&["inspect", "--format", "{{.State.FinishedAt}}", &g1.container]);
        assert!(
            finished <= started(&g2.container),
            "g1 ended {finished}, g2 started after"
        );
        assert_eq!(read_log(&g2.container), "g1\ng2");

        // Killed and started again by the drift round: the same volume.
        docker(&["kill", &g2.container]);
        engine.repair_containers().await.expect("repair");
        assert_eq!(read_log(&g2.container), "g1\ng2\ng2");

        // What it holds is measured.
        let used = engine.measure_volumes().await.expect("measure");
        let ours: Vec<_> = used.iter().filter(|v| v.environment == env).collect();
        assert_eq!(ours.len(), 1, "{used:?}");
        assert_eq!((ours[0].volume.as_str(), ours[0].generation), ("data", 1));
        assert_eq!(ours[0].bytes, "g1\ng2\ng2\n".len() as u64 + "ok\n".len() as u64);

        // Tearing the replica down removes its containers, never its volume; a later
        // generation finds the data.
        engine.teardown(&env, "db", 0, 2).await.expect("teardown");
        assert!(
            docker_ok(&["volume", "inspect", &volume]),
            "a teardown keeps the volume"
        );
        let g3 = replica(&env, &image, 3, &net);
        engine.ensure_application(&g3).await.expect("g3");
        assert_eq!(read_log(&g3.container), "g1\ng2\ng2\ng3");

        // In use: removal is refused by Docker and retried later, never forced.
        let busy = engine.remove_volume(&env, "data", 1).await.expect_err("in use");
        assert_eq!(busy.code, "volume-remove-failed");
        engine.teardown(&env, "db", 0, 3).await.expect("teardown");
        assert!(
            engine
                .remove_volume(&env, "data", 1)
                .await
                .expect("remove")
                .contains("removed")
        );
        assert!(!docker_ok(&["volume", "inspect", &volume]));
        assert!(
            engine
                .remove_volume(&env, "data", 1)
                .await
                .expect("again")
                .contains("already gone")
        );

        // A volume with our name and someone else's labels: refused, not mounted, not removed.
        docker(&["volume", "create", "--label", "owner=someone-else", &volume]);
        let foreign = engine
            .ensure_application(&replica(&env, &image, 4, &net))
            .await
            .expect_err("foreign");
        assert_eq!(foreign.code, "foreign-volume");
        assert_eq!(
            engine.remove_volume(&env, "data", 1).await.expect_err("foreign").code,
            "foreign-volume"
        );
        assert!(docker_ok(&["volume", "inspect", &volume]), "left as it was");
        assert!(
            engine
                .measure_volumes()
                .await
                .expect("measure")
                .iter()
                .all(|v| v.environment != env),
            "a foreign volume is not reported"
        );
        docker(&["volume", "rm", &volume]);
    });
    clean(&env);
}
