//! Images without a registry, end to end: an image built on this machine's dockerd, saved with
//! `docker save` and piped to `pl image push`, kept by a real daemon's store (`[images]`); a
//! second image sharing its base layer sends only what the store lacks. A project naming the
//! pushed reference (`pushleft.invalid/web@sha256:…`) is leased to a node enrolled over mutual
//! TLS, whose agent pulls it through its loopback endpoint (which refuses anyone without the
//! credentials it made) from the agent API: the replica runs the pushed content, with no
//! registry anywhere. Then `pl image gc`: a dry run lists what nothing references once it is
//! older than the grace (an image pushed and never committed), and `--delete` removes exactly
//! that, leaving the running image's blobs and those of an image an earlier accepted revision
//! named (a `pl rollback --commit` to it needs them).

#[path = "../../reconciler/tests/support/daemon.rs"]
mod daemon_support;
#[path = "support/docker.rs"]
mod docker_support;
#[path = "../../reconciler/tests/support/repo.rs"]
mod repo_support;
mod support;

use agent_proto::{Execution, FULL_CAPABILITIES, Heartbeat, LeasedJob, Outcome};
use daemon_support::{CONTROL_CA, Daemon, config, free_port, setup};
use docker_support::{clean, docker, docker_ok, require_dockerd};
use pushleft_agent::client::AgentClient;
use repo_support::{Repo, environment};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn worker(name: &str, image: &str) -> String {
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: {name}}}\nspec:\n  image: {image}\n  roles:\n    work: {{kind: worker, replicas: 1, command: [/bin/sleep, \"600\"], resources: {{cpu: 100m, memory: 32Mi, pids: 16}}}}\n"
    )
}

/// A local image: the static busybox as a base (imported), and `which` in a layer of its own
/// above it (the legacy builder, which needs no registry).
fn build(tag: &str, base: &str, which: &str) {
    let ctx = tempfile::tempdir().expect("context");
    std::fs::write(ctx.path().join("which"), which).expect("file");
    std::fs::write(
        ctx.path().join("Dockerfile"),
        format!("FROM {base}\nCOPY which /etc/which\n"),
    )
    .expect("dockerfile");
    let o = Command::new("docker")
        .args(["build", "-q", "-t", tag])
        .arg(ctx.path())
        .env("DOCKER_BUILDKIT", "0")
        .output()
        .expect("docker build");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

fn base_image(tag: &str) {
    let root = tempfile::tempdir().expect("root");
    let bin = root.path().join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("busybox-static");
    std::fs::copy(busybox, bin.join("busybox")).expect("busybox");
    for applet in ["sh", "sleep", "cat"] {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).expect("applet");
    }
    let tar = root.path().with_extension("tar");
    assert!(
        Command::new("tar")
            .arg("-C")
            .arg(root.path())
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .status()
            .expect("tar")
            .success()
    );
    docker(&["import", &tar.to_string_lossy(), tag]);
    let _ = std::fs::remove_file(&tar);
}

/// `docker save TAG | pl image push NAME` with `token`: (success, stdout, stderr).
fn push(s: &daemon_support::Setup, port: u16, token: &str, tag: &str, name: &str) -> (bool, String, String) {
    let mut save = Command::new("docker")
        .args(["save", tag])
        .stdout(Stdio::piped())
        .spawn()
        .expect("docker save");
    let o = Command::new(support::pl_binary())
        .args(["image", "push", name, "--input", "-", "--server"])
        .arg(format!("https://localhost:{port}"))
        .arg("--ca-cert")
        .arg(s.dir.join("tls/ca.crt"))
        .env("PL_TOKEN", token)
        .stdin(save.stdout.take().expect("pipe"))
        .output()
        .expect("pl image push");
    let _ = save.wait();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn gc(s: &daemon_support::Setup, port: u16, delete: bool) -> operator_proto::images::ImagesCollected {
    let mut c = Command::new(support::pl_binary());
    c.args(["image", "gc", "--format", "json", "--server"])
        .arg(format!("https://localhost:{port}"))
        .arg("--ca-cert")
        .arg(s.dir.join("tls/ca.crt"))
        .env("PL_TOKEN", &s.admin);
    if delete {
        c.arg("--delete");
    }
    let o = c.output().expect("pl image gc");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("json")
}

#[test]
fn a_pushed_image_runs_on_a_node_with_no_registry() {
    require_dockerd();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .subsec_nanos();
    let unique = format!("{}-{nanos}", std::process::id());
    let (base, one, two, three) = (
        format!("pl-store-test/base:{unique}"),
        format!("pl-store-test/web:one-{unique}"),
        format!("pl-store-test/web:two-{unique}"),
        format!("pl-store-test/web:three-{unique}"),
    );
    base_image(&base);
    build(&one, &base, "one\n");
    build(&two, &base, "two\n");
    build(&three, &base, "three\n");
    clean("web-production");

    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    std::fs::write(dir.path().join("allowed_signers"), &repo.signers).expect("signers");
    // No environment yet: nothing runs until the image is pushed.
    repo.write(
        "projects/web.yaml",
        &worker(
            "web",
            &format!("registry.example.invalid/none@sha256:{}", "0".repeat(64)),
        ),
    );
    repo.commit("a project, its image not pushed yet", true);
    let s = setup(dir.path());
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let (port, agent_port) = (free_port(), free_port());
    let store = dir.path().join("images");
    let cfg = config(
        &s,
        "d",
        &repo.dir,
        &url,
        port,
        &format!(
            "{CONTROL_CA}\n[agent_api]\nlisten = \"127.0.0.1:{agent_port}\"\n\n[images]\ndir = {store:?}\ngc_grace_hours = 1\n"
        ),
    );
    let mut d = Daemon::start(&s, &cfg, port);
    d.wait_ready(Duration::from_secs(20));

    // Pushes: the first sends everything; the second only its own layer, config and manifest.
    let (ok, first, err) = push(&s, port, &s.operator, &one, "web");
    assert!(ok, "{err}");
    assert!(first.starts_with("pushleft.invalid/web@sha256:"), "{first}");
    assert!(err.contains(", 0 already held"), "{err}");
    let (ok, second, err) = push(&s, port, &s.operator, &two, "web");
    assert!(ok, "{err}");
    assert!(
        err.contains(", 1 already held"),
        "the base layer is not sent again: {err}"
    );
    let (again, same, err) = push(&s, port, &s.operator, &two, "web");
    assert!(again && same == second, "the same image has the same digest: {err}");
    assert!(err.contains("0 blobs sent"), "{err}");
    let (ok, _, err) = push(&s, port, &s.viewer, &two, "web");
    assert!(!ok && err.contains("image-store-unauthorized"), "{err}");
    let (ok, third, err) = push(&s, port, &s.operator, &three, "web");
    assert!(ok, "{err}");
    // `docker push` works too, logged in with the operator token as the password.
    let cli = dir.path().join("docker-cli");
    let cli_arg = cli.to_string_lossy().into_owned();
    let mut login = Command::new("docker")
        .args(["--config", &cli_arg, "login", "-u", "ci", "--password-stdin"])
        .arg(format!("127.0.0.1:{port}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("docker login");
    use std::io::Write;
    login
        .stdin
        .take()
        .expect("stdin")
        .write_all(s.operator.as_bytes())
        .expect("token");
    let o = login.wait_with_output().expect("login");
    assert!(
        o.status.success(),
        "docker login: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let remote = format!("127.0.0.1:{port}/web:two");
    docker(&["tag", &two, &remote]);
    let pushed = docker(&["--config", &cli_arg, "push", &remote]);
    docker(&["rmi", &remote]);
    let docker_digest = pushed
        .split("digest: ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .expect("docker push says the digest")
        .to_owned();
    let (status, _) = d.get(&format!("/v2/web/manifests/{docker_digest}"), Some(&s.viewer));
    assert_eq!(status, 200, "the store holds what docker pushed");
    // `pl image push IMAGE`: the engine pushes it itself, with a credential only for this push
    // (the user's docker configuration is not written), and its push tag goes again.
    let home = dir.path().join("home");
    std::fs::create_dir_all(home.join(".docker")).expect("home");
    std::fs::write(home.join(".docker/config.json"), "{}").expect("user config");
    let pl_push = |image: &str, extra: &[&str]| {
        let o = Command::new(support::pl_binary())
            .args(["image", "push", image])
            .args(extra)
            .arg("--server")
            .arg(format!("https://localhost:{port}"))
            .arg("--ca-cert")
            .arg(s.dir.join("tls/ca.crt"))
            .env("PL_TOKEN", &s.operator)
            .env("HOME", &home)
            .env_remove("DOCKER_CONFIG")
            .output()
            .expect("pl image push");
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).trim().to_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (ok, engine_ref, err) = pl_push(&two, &["--name", "web"]);
    assert!(ok, "{err}");
    assert_eq!(
        engine_ref,
        format!("pushleft.invalid/web@{docker_digest}"),
        "the engine's push is the image docker push sent"
    );
    assert_eq!(
        std::fs::read_to_string(home.join(".docker/config.json")).expect("user config"),
        "{}",
        "no credential is left in the user's configuration"
    );
    let tags = docker(&["image", "inspect", "--format", "{{json .RepoTags}}", &two]);
    assert!(!tags.contains("pl-push-"), "the push's tag is gone: {tags}");
    let (ok, _, err) = pl_push("pl-store-test/none:missing", &[]);
    assert!(!ok && err.contains("image-not-local"), "{err}");
    // The node must pull for real: the engine forgets the built images.
    for tag in [&one, &two, &three, &base] {
        docker(&["rmi", "-f", tag]);
    }

    // An accepted revision names the first image; the next one the second, which runs.
    repo.write("projects/web.yaml", &worker("web", &first));
    repo.commit("web names the first pushed image", true);
    let deadline = Instant::now() + Duration::from_secs(20);
    while support::sql(&url, "SELECT image FROM revision_images").is_empty() {
        assert!(Instant::now() < deadline, "the first revision was never accepted");
        std::thread::sleep(Duration::from_millis(100));
    }
    let fingerprint = support::ca_pin(&std::fs::read_to_string(dir.path().join("tls/ca.crt")).expect("ca"));
    let node_dir = dir.path().join("n1");
    let token = d.enrolment_token("n1", &s.operator);
    pushleft_agent::enroll::enroll(
        &format!("https://localhost:{port}"),
        &fingerprint,
        "n1",
        &node_dir,
        &token,
    )
    .expect("enrol");
    let n1 = AgentClient::from_dir(&format!("https://localhost:{agent_port}"), &node_dir).expect("client");
    n1.heartbeat(&Heartbeat::new("test", &FULL_CAPABILITIES))
        .expect("heartbeat");
    // The node is live before the environment comes: placed at once, not waiting for it.
    repo.write("projects/web.yaml", &worker("web", &second));
    repo.write("envs/web.yaml", &environment("web-production", "web"));
    repo.commit("web runs the second pushed image", true);
    let cp = support::control_plane(&url);
    let rt = support::runtime();
    let proxy_client =
        Arc::new(AgentClient::from_dir(&format!("https://localhost:{agent_port}"), &node_dir).expect("client"));
    let proxy = rt
        .block_on(pushleft_agent::image_proxy::start(proxy_client))
        .expect("the loopback endpoint");
    let engine_dir = tempfile::tempdir().expect("engine dir");
    let engine = rt
        .block_on(docker_support::engine_n1(engine_dir.path(), &cp))
        .with_image_store(proxy.clone());

    // Anyone else on the machine reaches the loopback endpoint and gets nothing.
    let plain: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    let digest = second.rsplit_once('@').expect("digest").1;
    let r = plain
        .get(&format!("http://{}/v2/web/manifests/{digest}", proxy.addr))
        .call()
        .expect("answer");
    assert_eq!(r.status().as_u16(), 401);
    let r = plain
        .get(&format!("http://{}/v2/web/manifests/{digest}", proxy.addr))
        .header("authorization", "Basic cHVzaGxlZnQ6Z3Vlc3M=")
        .call()
        .expect("answer");
    assert_eq!(r.status().as_u16(), 401, "a guessed password");

    let deadline = Instant::now() + Duration::from_secs(120);
    let mut ran = None::<LeasedJob>;
    while ran.is_none() {
        assert!(Instant::now() < deadline, "web was never leased");
        // Beating as an agent does, so the node stays live however slow the machine is.
        n1.heartbeat(&Heartbeat::new("test", &FULL_CAPABILITIES))
            .expect("heartbeat");
        for j in n1.lease(8, Duration::from_secs(1)).expect("lease").jobs {
            match &j.execution {
                // The environment's set-up: its network is what this test needs of it.
                Execution::Network(net) if j.key.starts_with("env:") => {
                    rt.block_on(engine.ensure_network(net)).expect("network");
                    n1.complete(&j.proof, Outcome::Succeeded, "created").expect("complete");
                }
                Execution::Application(app) if app.image == second => {
                    let note = rt.block_on(engine.ensure_application(app)).expect("runs");
                    n1.complete(&j.proof, Outcome::Succeeded, &note).expect("complete");
                    ran = Some(j);
                }
                _ => n1.complete(&j.proof, Outcome::Succeeded, "").expect("complete"),
            }
        }
    }
    let Some(LeasedJob {
        execution: Execution::Application(app),
        ..
    }) = ran
    else {
        unreachable!()
    };
    let which = docker(&["exec", &app.container, "cat", "/etc/which"]);
    assert_eq!(which.trim(), "two", "the pushed content runs");
    let label = docker(&[
        "inspect",
        "--format",
        "{{index .Config.Labels \"dev.pushleft.image\"}}",
        &app.container,
    ]);
    assert_eq!(label.trim(), second, "the label keeps the reference Git names");
    assert!(docker_ok(&[
        "image",
        "inspect",
        &format!("{}/web@{digest}", proxy.addr)
    ]));

    // A node is served only the images of its own work: the second image's manifest and its
    // layers (its job named it), not the third's, which no job of n1 names, though the store
    // holds it and its digest is known; nor a blob that no manifest of its work reaches.
    use agent_proto::images::Fetch;
    let status = |kind: Fetch, d: &str| match n1.fetch(kind, d, true) {
        Ok(r) => r.status().as_u16(),
        Err(e) => panic!("fetch {d}: {e}"),
    };
    let third_digest = third.rsplit_once('@').expect("digest").1;
    assert_eq!(status(Fetch::Manifest, digest), 200, "its own work's image");
    assert_eq!(
        status(Fetch::Manifest, third_digest),
        403,
        "an image no job of n1 names"
    );
    let layers = |d: &str| -> Vec<String> {
        let m: serde_json::Value = serde_json::from_slice(
            &std::fs::read(store.join("blobs/sha256").join(&d["sha256:".len()..])).expect("manifest"),
        )
        .expect("json");
        m["layers"]
            .as_array()
            .expect("layers")
            .iter()
            .map(|l| l["digest"].as_str().expect("digest").to_owned())
            .collect()
    };
    let own = layers(digest);
    let theirs: Vec<String> = layers(third_digest).into_iter().filter(|l| !own.contains(l)).collect();
    assert!(!theirs.is_empty(), "the third image has a layer of its own");
    assert_eq!(
        status(Fetch::Blob, &own[own.len() - 1]),
        200,
        "a layer of its own work's image"
    );
    assert_eq!(status(Fetch::Blob, &theirs[0]), 403, "a layer only the third image has");
    let refused = n1.fetch(Fetch::Manifest, third_digest, false).expect("answer");
    let body = refused.into_body().read_to_string().expect("body");
    assert!(body.contains("image-not-placed"), "{body}");

    // Collection: nothing is old enough yet; made old, the third image's own blobs go (its
    // manifest, config and layer, never committed) and what `docker push` sent (its manifest
    // and compressed layers; the config is the second image's), and what web runs or ran
    // stays.
    let young = gc(&s, port, false);
    assert!(young.blobs.is_empty() && young.young >= 3, "{young:?}");
    let old = std::time::SystemTime::now() - Duration::from_secs(2 * 3600);
    for e in std::fs::read_dir(store.join("blobs/sha256")).expect("blobs") {
        let f = std::fs::File::options()
            .write(true)
            .open(e.expect("entry").path())
            .expect("blob");
        f.set_modified(old).expect("mtime");
    }
    let dry = gc(&s, port, false);
    let first_digest = first.rsplit_once('@').expect("digest").1;
    assert!(!dry.deleted);
    assert_eq!(dry.blobs.len(), 6, "{dry:?}");
    assert!(dry.blobs.iter().any(|b| b.digest == docker_digest), "{dry:?}");
    assert!(dry.blobs.iter().any(|b| b.digest == third_digest), "{dry:?}");
    assert!(dry.blobs.iter().all(|b| b.digest != digest && b.digest != first_digest));
    let held = std::fs::read_dir(store.join("blobs/sha256")).expect("blobs").count();
    assert_eq!(held, 13, "a dry run removes nothing");
    let done = gc(&s, port, true);
    assert!(done.deleted && done.blobs == dry.blobs, "{done:?}");
    assert_eq!(std::fs::read_dir(store.join("blobs/sha256")).expect("blobs").count(), 7);
    assert_eq!(gc(&s, port, false).blobs.len(), 0);

    d.kill9();
    clean("web-production");
    let _ = docker_ok(&["rmi", "-f", &format!("{}/web@{digest}", proxy.addr)]);
}
