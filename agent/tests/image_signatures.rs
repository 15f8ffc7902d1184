//! Signed images, end to end: a state repository whose `image-signatures/` holds an SSH
//! signature made by OpenSSH's own `ssh-keygen -Y sign -n pushleft-image`, a daemon whose
//! policy says who may sign which projects' images, a node enrolled over mutual TLS, and the
//! agent's Docker executor on a real dockerd pulling from a registry on loopback. The image a
//! trusted key signed is pulled and runs; an unsigned one (`image-unsigned`), one signed by a
//! key no rule trusts (`image-signer-untrusted`) and one whose signature names another digest
//! (`image-signature-invalid`) are refused before any pull: their images never reach the
//! engine, and their jobs fail for good with those codes. A project no rule names runs as
//! before, unchecked.

#[path = "../../reconciler/tests/support/daemon.rs"]
mod daemon_support;
#[path = "support/docker.rs"]
mod docker_support;
#[path = "../../reconciler/tests/support/repo.rs"]
mod repo_support;
#[path = "../../tests-support/ssh.rs"]
mod ssh;
mod support;

use agent_proto::{Execution, FULL_CAPABILITIES, Heartbeat, LeasedJob, Outcome};
use daemon_support::{CONTROL_CA, Daemon, config, free_port, setup};
use docker_support::{Registry, clean, docker_ok, require_dockerd};
use pushleft_agent::client::AgentClient;
use repo_support::{Repo, environment};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use support::sql;

fn worker(name: &str, image: &str) -> String {
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: {name}}}\nspec:\n  image: {image}\n  roles:\n    work: {{kind: worker, replicas: 1, command: [/bin/sleep, \"600\"], resources: {{cpu: 100m, memory: 32Mi, pids: 16}}}}\n"
    )
}

fn openssh_sign(key: &Path, digest: &str) -> String {
    ssh::openssh_sign(key, "pushleft-image", digest)
}

fn digest(image: &str) -> &str {
    image.rsplit_once('@').expect("pinned").1
}

fn signature_file(digest: &str) -> String {
    format!("image-signatures/sha256-{}.sig", digest.trim_start_matches("sha256:"))
}

/// `pl ARGS` against the daemon on `port`, as a viewer.
fn pl(s: &daemon_support::Setup, port: u16, args: &[&str]) -> std::process::Output {
    let pl = support::pl_binary();
    Command::new(&pl)
        .args(args)
        .arg("--server")
        .arg(format!("https://localhost:{port}"))
        .arg("--ca-cert")
        .arg(s.dir.join("tls/ca.crt"))
        .env("PL_TOKEN", &s.viewer)
        .output()
        .expect("pl")
}

#[test]
fn only_images_a_trusted_key_signed_are_pulled_and_run() {
    require_dockerd();
    let registry = Registry::start();
    let signed = registry.image("signed", &[("/etc/which", "signed\n")]);
    let unsigned = registry.image("unsigned", &[("/etc/which", "unsigned\n")]);
    let stolen = registry.image("stolen", &[("/etc/which", "stolen\n")]);
    let swapped = registry.image("swapped", &[("/etc/which", "swapped\n")]);
    let free = registry.image("free", &[("/etc/which", "free\n")]);
    let envs = [
        "api-production",
        "rogue-production",
        "stolen-production",
        "swapped-production",
    ];
    for e in envs.iter().chain(&["free-production"]) {
        clean(e);
    }

    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    let ci = dir.path().join("ci");
    let ci_public = repo_support::new_key(&ci);
    let intruder = dir.path().join("intruder");
    repo_support::new_key(&intruder);
    // The CI key may sign images only; the commit key may not sign them.
    std::fs::write(
        dir.path().join("allowed_signers"),
        format!("{}\nci-release namespaces=\"pushleft-image\" {ci_public}", repo.signers),
    )
    .expect("signers");
    std::fs::write(
        dir.path().join("policy.yaml"),
        "images:\n  - projects: [api, rogue, stolen, swapped]\n    principals: [ci-release]\n",
    )
    .expect("policy");
    for (project, image) in [
        ("api", &signed),
        ("rogue", &unsigned),
        ("stolen", &stolen),
        ("swapped", &swapped),
        ("free", &free),
    ] {
        repo.write(&format!("projects/{project}.yaml"), &worker(project, image));
        repo.write(
            &format!("envs/{project}.yaml"),
            &environment(&format!("{project}-production"), project),
        );
    }
    repo.write(&signature_file(digest(&signed)), &openssh_sign(&ci, digest(&signed)));
    repo.write(
        &signature_file(digest(&stolen)),
        &openssh_sign(&intruder, digest(&stolen)),
    );
    // The trusted key's signature of another image, filed under this one's digest.
    repo.write(&signature_file(digest(&swapped)), &openssh_sign(&ci, digest(&signed)));
    repo.commit("five workers, some signed", true);

    let s = setup(dir.path());
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let (port, agent_port) = (free_port(), free_port());
    let cfg = config(
        &s,
        "d",
        &repo.dir,
        &url,
        port,
        &format!("{CONTROL_CA}\n[agent_api]\nlisten = \"127.0.0.1:{agent_port}\"\n"),
    );
    let text = std::fs::read_to_string(&cfg).expect("config");
    let with_policy = text.replace(
        "allowed_signers = \"allowed_signers\"\n",
        "allowed_signers = \"allowed_signers\"\npolicy = \"policy.yaml\"\n",
    );
    assert_ne!(text, with_policy);
    std::fs::write(&cfg, with_policy).expect("config");
    let mut d = Daemon::start(&s, &cfg, port);
    d.wait_ready(Duration::from_secs(20));
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
    let cp = support::control_plane(&url);

    let rt = support::runtime();
    let engine_dir = tempfile::tempdir().expect("engine dir");
    let engine = rt.block_on(docker_support::engine_n1(engine_dir.path(), &cp));
    // The infrastructure steps: networks made for real (the containers join them); the
    // firewall and routes are other tests' subject, reported done here.
    let all: Vec<&str> = envs.iter().copied().chain(["free-production"]).collect();
    let mut apps = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !all
        .iter()
        .all(|e| apps.iter().any(|j: &LeasedJob| j.key.starts_with(&format!("app:{e}/"))))
    {
        assert!(Instant::now() < deadline, "never leased every replica: {apps:?}");
        for j in n1.lease(8, Duration::from_secs(1)).expect("lease").jobs {
            match &j.execution {
                // The environment's set-up: its network is what this test needs of it.
                Execution::Network(net) if j.key.starts_with("env:") => {
                    rt.block_on(engine.ensure_network(net)).expect("network");
                    n1.complete(&j.proof, Outcome::Succeeded, "created").expect("complete");
                }
                Execution::Application(_) => apps.push(j),
                _ => n1.complete(&j.proof, Outcome::Succeeded, "").expect("complete"),
            }
        }
    }

    let mut refused = std::collections::BTreeMap::new();
    for j in &apps {
        let Execution::Application(app) = &j.execution else {
            unreachable!()
        };
        if app.environment == "free-production" {
            assert!(app.image_trust.is_none(), "no rule names `free`: nothing to check");
        } else {
            let trust = app.image_trust.as_ref().expect("checked");
            assert!(trust.required);
            assert_eq!(
                trust.signers.iter().map(|s| s.principal.as_str()).collect::<Vec<_>>(),
                ["ci-release"],
                "the commit key (no image namespace) is not among them"
            );
        }
        match rt.block_on(engine.ensure_application(app)) {
            Ok(note) => n1.complete(&j.proof, Outcome::Succeeded, &note).expect("complete"),
            Err(f) => {
                n1.complete(&j.proof, Outcome::Permanent, &format!("{}: {}", f.code, f.detail))
                    .expect("complete");
                eprintln!("{}: {} {}", app.environment, f.code, f.detail);
                refused.insert(app.environment.clone(), (f.code, app.image.clone()));
            }
        }
    }
    assert_eq!(
        refused
            .iter()
            .map(|(e, (code, _))| (e.as_str(), *code))
            .collect::<Vec<_>>(),
        [
            ("rogue-production", "image-unsigned"),
            ("stolen-production", "image-signer-untrusted"),
            ("swapped-production", "image-signature-invalid"),
        ]
    );
    // Refused before the pull: the engine never had those images.
    for (_, image) in refused.values() {
        assert!(!docker_ok(&["image", "inspect", image]), "{image} was pulled");
    }
    for (env, image) in [("api-production", &signed), ("free-production", &free)] {
        assert!(docker_ok(&["image", "inspect", image]), "{image} pulled");
        let running = std::process::Command::new("docker")
            .args(["ps", "-q", "--filter", &format!("label=dev.pushleft.environment={env}")])
            .output()
            .expect("docker ps");
        assert!(!running.stdout.is_empty(), "{env} runs");
    }
    // The refusals are the ledger's, with their codes.
    let failed = sql(
        &url,
        "SELECT r.detail FROM job_results r JOIN jobs j ON j.id = r.job_id WHERE j.key LIKE 'app:rogue-production/%' AND j.state = 'failed'",
    );
    assert!(failed.iter().any(|d| d.starts_with("image-unsigned:")), "{failed:?}");

    // Provenance: the heartbeat reports what the engine runs (images and signers from the
    // containers' labels); `pl provenance` reads it back with the commit and its signer.
    let mut beat = Heartbeat::new("test", &FULL_CAPABILITIES);
    beat.running = rt.block_on(pushleft_agent::run::observed(&engine));
    n1.heartbeat(&beat).expect("heartbeat");
    let head = repo_support::git(&repo.dir, &["rev-parse", "HEAD"]).trim().to_owned();
    let key = Command::new("ssh-keygen")
        .arg("-lf")
        .arg(ci.with_extension("pub"))
        .output()
        .expect("ssh-keygen -l");
    let ci_fingerprint = String::from_utf8_lossy(&key.stdout)
        .split_whitespace()
        .nth(1)
        .expect("fingerprint")
        .to_owned();
    let provenance = |env: &str| -> operator_proto::provenance::Provenance {
        let o = pl(&s, port, &["provenance", env, "--format", "json"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).expect("json")
    };
    let api = provenance("api-production");
    assert_eq!(api.replicas.len(), 1, "{api:?}");
    let r = &api.replicas[0];
    assert_eq!(
        (r.node.as_str(), r.role.as_str(), r.image.as_deref()),
        ("n1", "work", Some(signed.as_str()))
    );
    assert_eq!(r.image_signer.as_deref(), Some("ci-release"));
    assert_eq!(r.image_fingerprint.as_deref(), Some(ci_fingerprint.as_str()));
    assert!(r.image_verified_at_ms.is_some_and(|t| t > 1_700_000_000_000), "{r:?}");
    assert_eq!(r.commit.as_deref(), Some(head.as_str()));
    assert_eq!(r.commit_signer.as_deref(), Some("ops-alice"));
    let free_one = provenance("free-production");
    assert_eq!(free_one.replicas[0].image.as_deref(), Some(free.as_str()));
    assert_eq!(free_one.replicas[0].image_signer, None, "no rule, no signer");
    // As a person reads it.
    let text = pl(&s, port, &["provenance", "api-production"]);
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(
        text.contains("work/0 on n1") && text.contains("signed by ci-release"),
        "{text}"
    );
    assert!(
        text.contains(&format!("commit    {} signed by ops-alice", &head[..12])),
        "{text}"
    );
    let o = pl(&s, port, &["provenance", "nowhere"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("environment-unknown"));

    d.kill9();
    for e in all {
        clean(e);
    }
    for image in [&signed, &free] {
        let _ = docker_ok(&["rmi", "-f", image]);
    }
}
