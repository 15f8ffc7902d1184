//! Re-admission (`control.readmit_nodes`) against `pl-reconciler run` as a real process, through
//! the agent API's mutual TLS: a certificate the control CA signed for a node Git declares and
//! the ledger never knew re-admits that node once, and its first heartbeat gives its age
//! recipient; a certificate for a node Git does not declare, or retires, a second certificate
//! for a node the ledger now knows, and any certificate while re-admission is off are refused
//! and write nothing. (The rebuild it serves is drilled in `agent/tests/dr.rs`.)

#[path = "support/daemon.rs"]
mod daemon_support;
#[path = "support/dump.rs"]
mod dump;
#[path = "support/repo.rs"]
mod repo_support;

use daemon_support::{CONTROL_CA, Daemon, config, free_port, setup};
use pushleft_agent::client::{AgentClient, ClientError};
use repo_support::{POOL, Repo};
use std::path::Path;
use std::time::Duration;

/// A new key and a certificate the CA in `tls` signed for `node`: (certificate, key) PEM.
fn signed(tls: &Path, node: &str) -> (String, String) {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.distinguished_name.push(rcgen::DnType::CommonName, node);
    let csr = params.serialize_request(&key).expect("csr").pem().expect("pem");
    let issued =
        reconciler::pki::sign_node_csr(&csr, node, 24, &tls.join("ca.crt"), &tls.join("ca.key")).expect("signed");
    (issued.pem, key.serialize_pem())
}

/// What re-admission writes: counted before and after each refusal.
async fn written(url: &str) -> Vec<String> {
    let mut out = Vec::new();
    for q in [
        "SELECT COUNT(*) FROM nodes",
        "SELECT COUNT(*) FROM node_certificates",
        "SELECT COUNT(*) FROM events WHERE kind = 'node-readmitted'",
    ] {
        out.extend(dump::rows(url, q).await);
    }
    out
}

/// A heartbeat from the node holding `cert`, with its age recipient.
fn beat(agent_api: u16, tls: &Path, (cert, key): &(String, String), recipient: &str) -> Result<(), ClientError> {
    let ca = std::fs::read(tls.join("ca.crt")).expect("ca");
    let client = AgentClient::new(
        &format!("https://localhost:{agent_api}"),
        cert.as_bytes(),
        key.as_bytes(),
        &ca,
    )?;
    let mut hb = agent_proto::Heartbeat::new("test", &["docker"]);
    hb.age_recipient = Some(recipient.to_owned());
    client.heartbeat(&hb).map(|_| ())
}

fn refused_as(r: Result<(), ClientError>, want: &str) {
    match r {
        Err(ClientError::Refused { code, .. }) => assert_eq!(code.code(), want),
        other => panic!("expected [{want}], got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_node_the_ledger_never_knew_is_readmitted_once_by_its_certificate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    std::fs::write(dir.path().join("allowed_signers"), &repo.signers).expect("signers");
    // n3 is retired in Git.
    repo.write(
        "pools/main.yaml",
        &format!("{POOL}    - {{name: n3, state: retired, capacity: {{cpu: \"4\", memory: 8Gi}}}}\n"),
    );
    repo.commit("pool", true);
    let s = setup(dir.path());
    let tls = dir.path().join("tls");
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let (port, agent_api) = (free_port(), free_port());
    let agents = format!("\n[agent_api]\nlisten = \"127.0.0.1:{agent_api}\"\n");
    let off = config(&s, "d", &repo.dir, &url, port, &format!("{CONTROL_CA}{agents}"));
    let on_text =
        std::fs::read_to_string(&off)
            .expect("config")
            .replacen("[control]\n", "[control]\nreadmit_nodes = true\n", 1);
    let on = dir.path().join("readmit.toml");
    std::fs::write(&on, on_text).expect("config");
    let recipient = age::x25519::Identity::generate().to_public().to_string();
    let accepted = async || {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while dump::rows(&url, "SELECT COUNT(*) FROM revisions WHERE verdict = 'accepted'").await != ["1"] {
            assert!(std::time::Instant::now() < deadline, "the commit was not accepted");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };

    // Off (the default): a certificate the CA signed that the ledger does not hold is refused.
    let mut d = Daemon::start(&s, &off, port);
    d.wait_ready(Duration::from_secs(20));
    accepted().await;
    let n2 = signed(&tls, "n2");
    let before = written(&url).await;
    let (a, t, c, r) = (agent_api, tls.clone(), n2.clone(), recipient.clone());
    refused_as(
        tokio::task::spawn_blocking(move || beat(a, &t, &c, &r))
            .await
            .expect("join"),
        "certificate-revoked",
    );
    assert_eq!(written(&url).await, before, "a refusal writes nothing");
    d.term();

    // On: refusals first, each writing nothing.
    let mut d = Daemon::start(&s, &on, port);
    d.wait_ready(Duration::from_secs(20));
    for node in ["ghost", "n3"] {
        let cert = signed(&tls, node);
        let (a, t, r) = (agent_api, tls.clone(), recipient.clone());
        let got = tokio::task::spawn_blocking(move || beat(a, &t, &cert, &r))
            .await
            .expect("join");
        refused_as(got, "certificate-revoked");
        assert_eq!(written(&url).await, before, "{node}: a refusal writes nothing");
    }
    // A declared node's certificate re-admits it, and its heartbeat gives its recipient.
    let n1 = signed(&tls, "n1");
    let (a, t, c, r) = (agent_api, tls.clone(), n1.clone(), recipient.clone());
    tokio::task::spawn_blocking(move || beat(a, &t, &c, &r))
        .await
        .expect("join")
        .expect("n1 re-admitted");
    assert_eq!(
        dump::rows(
            &url,
            "SELECT kind || ' ' || subject FROM events WHERE kind LIKE 'node-re%' ORDER BY id"
        )
        .await,
        ["node-readmitted n1", "node-recipient-learned n1"]
    );
    assert_eq!(
        dump::rows(&url, "SELECT age_recipient FROM nodes WHERE name = 'n1'").await,
        std::slice::from_ref(&recipient)
    );
    assert_eq!(
        dump::rows(&url, "SELECT COUNT(*) FROM node_certificates WHERE node = 'n1'").await,
        ["1"]
    );
    // Again with the same certificate: admitted, nothing new written.
    let after = written(&url).await;
    let (a, t, c, r) = (agent_api, tls.clone(), n1.clone(), recipient.clone());
    tokio::task::spawn_blocking(move || beat(a, &t, &c, &r))
        .await
        .expect("join")
        .expect("n1 again");
    assert_eq!(written(&url).await, after);
    // A second certificate of n1 the ledger does not hold: n1 is known now, so it is refused.
    let other = signed(&tls, "n1");
    let (a, t, r) = (agent_api, tls.clone(), recipient.clone());
    refused_as(
        tokio::task::spawn_blocking(move || beat(a, &t, &other, &r))
            .await
            .expect("join"),
        "certificate-revoked",
    );
    assert_eq!(written(&url).await, after, "a refusal writes nothing");
    d.term();
}
