//! `pl volume move` with two nodes on one machine (two agents sharing its engine, one restic
//! repository both reach): a database-like service keeps its rows on a volume pinned to the
//! node it was first placed on. A drain of that node waits for it (`volume-pinned`); the move
//! stops the role, carries the volume's files through the repository into its next generation
//! on the other node, and starts the role there with every row, reporting how long it was
//! down; the generation it left stays on the old node until an admin removes it. Moves that
//! cannot work are refused before anything changes: to the node it is on, to
//! a node the role could not run on, and of a volume nothing backs up; one that fails on the
//! way (its repository cannot be made) says why and leaves the volume where it was, its role
//! started there again.

use super::*;

#[test]
fn a_volume_moves_to_another_node_with_its_rows_and_a_drain_waits_for_it() {
    siblings();
    let base = PathBuf::from(format!("/tmp/plmove-{}", std::process::id()));
    let host = Host::start(&format!("plhost-mv-{}", std::process::id()), &base);
    let (registry, port) = host.registry();
    let _registry = Kill(registry);
    let image = host.image(port, "mv", &[("/www/healthz", "ok\n")]);
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    let (repo_dir, state, socket) = (repo.dir.clone(), dir.path().join("pl-state"), host.socket.clone());
    let (dev, recipient) = developer_identity(dir.path(), &repo_dir);
    backups_secret(&repo, &repo_dir, &recipient, "moving day");
    // `db` saves a dump on schedule (its command); a move carries its files all the same.
    // `cache` has a volume nothing backs up.
    repo.write(
        "projects/api.yaml",
        &format!(
            "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: api}}\nspec:\n  image: {image}\n  roles:\n    db:\n      kind: service\n      volumes: [{{name: data, path: /data, backup: {{schedule: \"0 0 1 1 *\", keep: 2, command: [/bin/busybox, cat, /data/rows]}}}}]\n      command: [/bin/busybox, sh, -c, '[ -f /data/rows ] || echo row1 > /data/rows; exec /bin/busybox sleep 100000']\n    cache:\n      kind: worker\n      volumes: [{{name: scratch, path: /scratch}}]\n      command: [/bin/busybox, sleep, '100000']\n"
        ),
    );
    repo.write(
        "envs/api-production.yaml",
        &format!(
            "apiVersion: pushleft.dev/v1alpha1\nkind: Environment\nmetadata: {{name: api-production}}\nspec:\n  project: api\n  stage: production\n  pool: main\n  backups: {{repository: {}, secret: backups}}\n",
            state.join("backups/api").display()
        ),
    );
    let _detached = Detached(vec![state.clone()]);
    host.run(move || {
        let port_arg = "18085".to_owned();
        let dev_arg = dev.to_string_lossy().into_owned();
        let up = |nodes: &[&str]| {
            let mut args = vec!["up", "--http", "--port", &port_arg, "--identity", &dev_arg];
            for n in nodes {
                args.extend(["--node", n]);
            }
            pl(&args, &repo_dir, &state, &socket)
        };
        let (code, out, err) = up(&["n1", "n2"]);
        assert_eq!(code, 0, "pl up: {out}\n{err}");
        let volume = |name: &str| -> serde_json::Value {
            let (code, out, err) = pl(&["volumes", "--format", "json", "--local"], &repo_dir, &state, &socket);
            assert_eq!(code, 0, "{out}\n{err}");
            let v: serde_json::Value = serde_json::from_str(&out).expect("json");
            v["volumes"]
                .as_array()
                .expect("volumes")
                .iter()
                .find(|r| r["volume"] == name)
                .cloned()
                .unwrap_or_else(|| panic!("no volume {name}: {out}"))
        };
        let from = volume("data")["node"].as_str().expect("node").to_owned();
        let to = if from == "n1" { "n2" } else { "n1" }.to_owned();
        let db_on = |node: &str| {
            docker(
                &socket,
                &[
                    "ps",
                    "-q",
                    "--filter",
                    "label=dev.pushleft.role=db",
                    "--filter",
                    &format!("label=dev.pushleft.node={node}"),
                ],
            )
        };
        let db = db_on(&from);
        assert!(!db.is_empty() && db_on(&to).is_empty(), "db runs on {from} only");
        // A row written after the start: what moves is the data as it is, not as it began.
        docker(
            &socket,
            &["exec", &db, "/bin/busybox", "sh", "-c", "echo row2 >> /data/rows"],
        );
        assert_eq!(
            docker(&socket, &["exec", &db, "/bin/busybox", "cat", "/data/rows"]),
            "row1\nrow2"
        );

        // Refused before anything changes: where it is, a node the role cannot run on, and a
        // volume nothing backs up.
        let mv = |volume: &str, node: &str| {
            pl(
                &["volume", "move", "api-production", volume, "--to", node, "--local"],
                &repo_dir,
                &state,
                &socket,
            )
        };
        let scratch_elsewhere = if volume("scratch")["node"] == "n1" { "n2" } else { "n1" };
        for (volume, node, code) in [
            ("data", from.as_str(), "volume-already-there"),
            ("data", "n9", "move-target-refused"),
            ("scratch", scratch_elsewhere, "move-needs-backup"),
            ("nothing", to.as_str(), "volume-unknown"),
        ] {
            let (status, out, err) = mv(volume, node);
            assert_eq!(status, 1, "{volume} to {node}: {out}\n{err}");
            assert!(err.contains(code), "{volume} to {node}: {err}");
        }
        assert_eq!(db_on(&from), db, "a refusal changes nothing");

        // A move that fails (the repository cannot be made: a file is where it goes) says why,
        // and leaves the volume where it was; its role starts there again, every row kept.
        let repository = state.join("backups/api");
        std::fs::create_dir_all(repository.parent().expect("parent")).expect("backups dir");
        std::fs::write(&repository, "not a repository").expect("blocker");
        let (status, out, err) = mv("data", &to);
        assert_eq!(status, 1, "{out}\n{err}");
        assert!(
            err.contains("error[volume-move-failed]") && err.contains(&format!("saving it on {from} failed")),
            "{err}"
        );
        let deadline = Instant::now() + Duration::from_secs(90);
        while db_on(&from).is_empty() {
            assert!(Instant::now() < deadline, "db never started again on {from}");
            std::thread::sleep(Duration::from_millis(300));
        }
        let db = db_on(&from);
        assert!(db_on(&to).is_empty());
        assert_eq!(
            docker(&socket, &["exec", &db, "/bin/busybox", "cat", "/data/rows"]),
            "row1\nrow2"
        );
        assert_eq!(volume("data")["node"].as_str(), Some(from.as_str()));
        assert_eq!(volume("data")["generation"].as_i64(), Some(1));
        std::fs::remove_file(&repository).expect("unblock");

        // The node drains in Git: the database stays where its data is, and says so.
        let pool = repo_support::POOL.replace(
            &format!("{{name: {from},"),
            &format!("{{name: {from}, state: draining,"),
        );
        assert_ne!(pool, repo_support::POOL);
        std::fs::write(repo_dir.join("pools/main.yaml"), &pool).expect("write");
        let (code, out, err) = up(&[]);
        assert_eq!(code, 0, "drained: {out}\n{err}");
        let events = || {
            let (_, out, _) = pl(&["events", "--format", "json", "--local"], &repo_dir, &state, &socket);
            out
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !events().contains("volume-pinned") {
            assert!(Instant::now() < deadline, "no volume-pinned event: {}", events());
            std::thread::sleep(Duration::from_millis(300));
        }
        assert_eq!(db_on(&from), db, "the drain does not move the database");

        // The move: stopped, saved, restored on the other node, started there.
        let (code, out, err) = mv("data", &to);
        assert_eq!(
            code,
            0,
            "move: {out}\n{err}\n{to}'s agent: {}",
            std::fs::read_to_string(state.join(format!("agents/{to}/agent.log"))).unwrap_or_default()
        );
        eprintln!("{out}");
        assert!(
            out.contains(&format!("moved api-production/data from {from} to {to} (generation 2)"))
                && out.contains("was down"),
            "{out}"
        );
        let moved = db_on(&to);
        assert!(!moved.is_empty() && db_on(&from).is_empty(), "db runs on {to} only");
        assert_eq!(
            docker(&socket, &["exec", &moved, "/bin/busybox", "cat", "/data/rows"]),
            "row1\nrow2",
            "every row moved"
        );
        let row = volume("data");
        assert_eq!(
            (
                row["node"].as_str(),
                row["generation"].as_i64(),
                row["movedFrom"].as_str()
            ),
            (Some(to.as_str()), Some(2), Some(from.as_str())),
            "{row}"
        );
        assert!(row["movingTo"].is_null() && row["movedUpAtMs"].is_i64(), "{row}");
        let said = events();
        for kind in [
            "volume-move-requested",
            "volume-move-saved",
            "volume-moved",
            "volume-move-done",
        ] {
            assert!(said.contains(kind), "no {kind}: {said}");
        }
        // The move's snapshot is listed as what it was, not as a backup to restore from.
        let (code, out, _) = pl(
            &["backups", "api-production", "data", "--format", "json", "--local"],
            &repo_dir,
            &state,
            &socket,
        );
        assert_eq!(code, 0);
        assert!(
            out.contains("\"status\": \"moved\"") || out.contains("\"status\":\"moved\""),
            "{out}"
        );
        // The generation it left is kept on the old node (listed, never mounted again) until
        // an admin removes it; the current one cannot be removed while its role mounts it.
        assert_eq!(
            row["kept"],
            serde_json::json!([{"generation": 1, "node": from, "keptAtMs": row["kept"][0]["keptAtMs"]}]),
            "{row}"
        );
        let generation_on = |node: &str, generation: &str| {
            docker(
                &socket,
                &[
                    "volume",
                    "ls",
                    "-q",
                    "--filter",
                    "label=dev.pushleft.volume=data",
                    "--filter",
                    &format!("label=dev.pushleft.node={node}"),
                    "--filter",
                    &format!("label=dev.pushleft.volume-generation={generation}"),
                ],
            )
        };
        assert!(!generation_on(&from, "1").is_empty() && !generation_on(&to, "2").is_empty());
        let rm = |generation: &str| {
            pl(
                &[
                    "volume",
                    "rm",
                    "api-production",
                    "data",
                    "--generation",
                    generation,
                    "--local",
                ],
                &repo_dir,
                &state,
                &socket,
            )
        };
        let (status, _, err) = rm("2");
        assert_eq!(status, 1);
        assert!(err.contains("volume-generation-current"), "{err}");
        let (status, out, err) = rm("1");
        assert_eq!(status, 0, "{out}\n{err}");
        assert!(
            out.contains(&format!("removed api-production/data's generation 1 from {from}")),
            "{out}"
        );
        assert!(generation_on(&from, "1").is_empty(), "gone from {from}");
        assert!(!generation_on(&to, "2").is_empty(), "the current one stays");
        assert_eq!(volume("data")["kept"], serde_json::json!([]));
        let (status, _, err) = rm("1");
        assert_eq!(status, 1);
        assert!(err.contains("volume-generation-unknown"), "{err}");

        // Moved once, it stays: a second move to the same node is refused.
        let (status, _, err) = mv("data", &to);
        assert_eq!(status, 1);
        assert!(err.contains("volume-already-there"), "{err}");
    });
}
