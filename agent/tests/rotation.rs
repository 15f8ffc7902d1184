//! Rotating the control CA in two phases with no outage, against `pl-reconciler run`:
//! 1. both trusted: new certificates come from the new CA, nodes holding the old one's keep
//!    working, renew onto the new one, and enrol pinned to either;
//! 2. only the new one: its certificates work, the old one's are refused at the handshake.
//!
//! `pl nodes` shows which CA each node's certificate is from, so the second phase can wait
//! until every node shows the new one.
//!
//! It is also the drill of the control CA's key lost (docs/operations.md, the DR table): the
//! old key is deleted before phase 1 and never needed again; the times from its loss to the
//! daemon serving with a new CA, and to a node renewed onto it, are printed (`RTO` lines).

#[path = "../../reconciler/tests/support/daemon.rs"]
mod daemon_support;
#[path = "../../reconciler/tests/support/repo.rs"]
mod repo_support;
mod support;

use agent_proto::{FULL_CAPABILITIES, Heartbeat};
use daemon_support::{CONTROL_CA, Daemon, bin, config, free_port, setup};
use pushleft_agent::client::{AgentClient, ClientError};
use repo_support::{POOL, Repo, environment, project};
use std::path::Path;
use std::time::Duration;

fn fingerprint(pem_file: &Path) -> String {
    let pem = std::fs::read_to_string(pem_file).expect("ca");
    support::ca_pin(&pem).trim_start_matches("SHA256:").to_owned()
}

fn beat(c: &AgentClient) -> Result<(), ClientError> {
    c.heartbeat(&Heartbeat::new("test", &FULL_CAPABILITIES)).map(|_| ())
}

/// Each node's `certificateCa` from `GET /v1/nodes`.
fn cas(d: &Daemon, viewer: &str) -> Vec<(String, String)> {
    let (status, body) = d.get("/v1/nodes", Some(viewer));
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    v["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| {
            (
                n["name"].as_str().unwrap_or("").to_owned(),
                n["certificateCa"].as_str().unwrap_or("-").to_owned(),
            )
        })
        .collect()
}

#[test]
fn the_control_ca_rotates_in_two_phases_without_an_outage() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    std::fs::write(dir.path().join("allowed_signers"), &repo.signers).expect("signers");
    repo.write(
        "pools/main.yaml",
        &format!("{POOL}    - {{name: n3, capacity: {{cpu: \"4\", memory: 8Gi}}}}\n"),
    );
    repo.write("projects/api.yaml", &project("api", 1));
    repo.write("envs/api-production.yaml", &environment("api-production", "api"));
    repo.commit("one environment", true);
    let s = setup(dir.path());
    let next = dir.path().join("tls-next");
    let o = std::process::Command::new(bin())
        .args(["tls-init", "--dir"])
        .arg(&next)
        .output()
        .expect("tls-init");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (old_ca, new_ca) = (
        fingerprint(&dir.path().join("tls/ca.crt")),
        fingerprint(&next.join("ca.crt")),
    );
    assert_ne!(old_ca, new_ca);
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let (port, agent_port) = (free_port(), free_port());
    let agent_api = format!("\n[agent_api]\nlisten = \"127.0.0.1:{agent_port}\"\n");
    let control = format!("https://localhost:{port}");
    let agents = format!("https://localhost:{agent_port}");
    let enrol = |d: &Daemon, node: &str, pin: &str| -> AgentClient {
        let node_dir = dir.path().join(node);
        let token = d.enrolment_token(node, &s.operator);
        pushleft_agent::enroll::enroll(&control, &format!("SHA256:{pin}"), node, &node_dir, &token).expect("enrol");
        AgentClient::from_dir(&agents, &node_dir).expect("client")
    };

    // Before: one CA. n1 and n3 enrol with it.
    let cfg = config(&s, "before", &repo.dir, &url, port, &format!("{CONTROL_CA}{agent_api}"));
    let mut d = Daemon::start(&s, &cfg, port);
    d.wait_ready(Duration::from_secs(20));
    let n1 = enrol(&d, "n1", &old_ca);
    let n3 = enrol(&d, "n3", &old_ca);
    beat(&n1).expect("n1 before");
    beat(&n3).expect("n3 before");
    d.term();

    // The old CA's key is lost: only its certificate (public, on every node too) remains.
    std::fs::remove_file(dir.path().join("tls/ca.key")).expect("the old key is gone");
    let lost = std::time::Instant::now();
    // Phase 1: the new CA signs, the old one is still trusted. Nothing breaks.
    let phase1 = format!(
        "[control]\nca_cert = \"tls-next/ca.crt\"\nca_key = \"tls-next/ca.key\"\ntrusted_cas = [\"tls/ca.crt\"]\n{agent_api}"
    );
    let cfg = config(&s, "phase1", &repo.dir, &url, port, &phase1);
    let mut d = Daemon::start(&s, &cfg, port);
    d.wait_ready(Duration::from_secs(20));
    println!("RTO CA key lost: serving with a new CA {:?} after", lost.elapsed());
    beat(&n1).expect("an old-CA certificate still works in phase 1");
    beat(&n3).expect("an old-CA certificate still works in phase 1");
    assert_eq!(cas(&d, &s.viewer)[0], ("n1".into(), old_ca.clone()));
    // n1 renews: its new certificate comes from the new CA, with a bundle of both.
    let (key, csr) = pushleft_agent::enroll::signing_request("n1").expect("csr");
    let renewed = n1.renew_certificate(&csr).expect("renew");
    assert_eq!(renewed.ca.matches("BEGIN CERTIFICATE").count(), 2, "both CAs");
    let n1 = AgentClient::new(
        &agents,
        renewed.certificate.as_bytes(),
        key.serialize_pem().as_bytes(),
        renewed.ca.as_bytes(),
    )
    .expect("client");
    beat(&n1).expect("the new certificate");
    assert_eq!(cas(&d, &s.viewer)[0], ("n1".into(), new_ca.clone()));
    println!(
        "RTO CA key lost: a node renewed onto the new CA {:?} after",
        lost.elapsed()
    );
    // A node enrolling now may be given either fingerprint.
    let n2 = enrol(&d, "n2", &new_ca);
    beat(&n2).expect("n2 enrolled in phase 1");
    // n3 has not renewed yet: `pl nodes` says so (phase 2 would cut it off).
    assert_eq!(
        cas(&d, &s.viewer),
        [
            ("n1".to_owned(), new_ca.clone()),
            ("n2".to_owned(), new_ca.clone()),
            ("n3".to_owned(), old_ca.clone())
        ]
    );
    let bundle = renewed.ca.clone();
    d.term();

    // Phase 2: only the new CA. The API's own certificate is the new CA's too, and `pl`'s
    // users are handed the new CA.
    std::fs::copy(next.join("ca.crt"), dir.path().join("tls/ca.crt")).expect("hand out the new CA");
    let phase2 = format!("[control]\nca_cert = \"tls-next/ca.crt\"\nca_key = \"tls-next/ca.key\"\n{agent_api}");
    let cfg = config(&s, "phase2", &repo.dir, &url, port, &phase2);
    let text = std::fs::read_to_string(&cfg)
        .expect("config")
        .replace("tls/api.crt", "tls-next/api.crt")
        .replace("tls/api.key", "tls-next/api.key");
    std::fs::write(&cfg, text).expect("config");
    let mut d = Daemon::start(&s, &cfg, port);
    d.wait_ready(Duration::from_secs(20));
    beat(&n1).expect("n1, renewed, works in phase 2");
    beat(&n2).expect("n2 works in phase 2");
    // n3's certificate, of the old CA (never renewed, never revoked), is refused at the
    // handshake, even by a client that trusts the new CA's server certificate.
    let n3_dir = dir.path().join("n3");
    let stale = AgentClient::new(
        &agents,
        &std::fs::read(n3_dir.join(pushleft_agent::enroll::CERT)).expect("cert"),
        &std::fs::read(n3_dir.join(pushleft_agent::enroll::KEY)).expect("key"),
        bundle.as_bytes(),
    )
    .expect("client");
    assert!(
        matches!(beat(&stale), Err(ClientError::Transport(_))),
        "the old CA's certificate is refused"
    );
    d.kill9();
}

/// `pl-agent run` renews its certificate at two thirds of its life (`renewal::run`; its
/// timing is unit-tested): a renewal writes the new key, certificate and CA into the
/// enrolment folder and switches the running client to them; the old certificate stops
/// working once the new one is used, and the folder alone starts a client that works.
#[test]
fn the_agent_renews_its_certificate_into_its_folder() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    std::fs::write(dir.path().join("allowed_signers"), &repo.signers).expect("signers");
    repo.commit("a pool", true);
    let s = setup(dir.path());
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let (port, agent_port) = (free_port(), free_port());
    let agent_api = format!("\n[agent_api]\nlisten = \"127.0.0.1:{agent_port}\"\n");
    let cfg = config(
        &s,
        "renewal",
        &repo.dir,
        &url,
        port,
        &format!("{CONTROL_CA}{agent_api}"),
    );
    let mut d = Daemon::start(&s, &cfg, port);
    d.wait_ready(Duration::from_secs(20));
    let ca = fingerprint(&dir.path().join("tls/ca.crt"));
    let node_dir = dir.path().join("n1");
    let token = d.enrolment_token("n1", &s.operator);
    pushleft_agent::enroll::enroll(
        &format!("https://localhost:{port}"),
        &format!("SHA256:{ca}"),
        "n1",
        &node_dir,
        &token,
    )
    .expect("enrol");
    let agents = format!("https://localhost:{agent_port}");
    let client = AgentClient::from_dir(&agents, &node_dir).expect("client");
    beat(&client).expect("enrolled");
    let old = AgentClient::from_dir(&agents, &node_dir).expect("a client of the old files");
    let old_cert = std::fs::read(node_dir.join(pushleft_agent::enroll::CERT)).expect("cert");

    let until = pushleft_agent::renewal::renew(&client, "n1", &node_dir).expect("renewed");
    let new_cert = std::fs::read(node_dir.join(pushleft_agent::enroll::CERT)).expect("cert");
    assert_ne!(old_cert, new_cert, "the folder holds the new certificate");
    let (from, to) = pushleft_agent::renewal::validity(&new_cert).expect("validity");
    assert_eq!(to, until / 1000 * 1000, "the answer's expiry is the certificate's");
    assert!(
        pushleft_agent::renewal::due_at(from, to) > from,
        "its own renewal is later"
    );
    // The running client uses the new certificate at once; that first use revokes the old.
    beat(&client).expect("the switched client");
    assert!(
        beat(&old).is_err(),
        "the old certificate is revoked once the new one is used"
    );
    // A restart reads the folder: the new key and certificate, which work.
    let restarted = AgentClient::from_dir(&agents, &node_dir).expect("client from the folder");
    beat(&restarted).expect("a restarted agent");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(node_dir.join(pushleft_agent::enroll::KEY))
            .expect("key")
            .permissions(),
    );
    assert_eq!(mode & 0o077, 0, "the new key is private");
    assert!(!node_dir.join("node.crt.new").exists(), "no renewal left half done");
    d.kill9();
}
