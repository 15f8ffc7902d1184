//! Enrolment against `pl-reconciler run` as a real process: an operator makes a one-time token
//! for a node declared in Git, the node trades it, a signing request and its age recipient for
//! a client certificate signed by the control CA; every refusal has its code and records
//! nothing.

#[path = "support/daemon.rs"]
mod daemon_support;
#[path = "support/dump.rs"]
mod dump;
#[path = "support/repo.rs"]
mod repo_support;

use daemon_support::{CONTROL_CA, Daemon, config, free_port, setup};
use repo_support::{POOL, Repo};
use std::time::Duration;
use x509_parser::prelude::{FromDer, X509Certificate};

/// A signing request for a new key, naming `cn`.
fn csr(cn: &str) -> String {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.distinguished_name.push(rcgen::DnType::CommonName, cn);
    params.serialize_request(&key).expect("csr").pem().expect("pem")
}

fn recipient() -> String {
    age::x25519::Identity::generate().to_public().to_string()
}

/// What enrolment writes: counted before and after each refusal, which must write nothing.
async fn written(url: &str) -> Vec<String> {
    let mut out = Vec::new();
    for q in [
        "SELECT COUNT(*) FROM nodes",
        "SELECT COUNT(*) FROM node_certificates",
        "SELECT COUNT(*) FROM enrolment_tokens WHERE used_at IS NOT NULL",
        "SELECT COUNT(*) FROM events WHERE kind = 'node-enrolled'",
    ] {
        out.extend(dump::rows(url, q).await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_enrol_once_with_a_token_and_every_refusal_writes_nothing() {
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
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let port = free_port();
    let cfg = config(&s, "d", &repo.dir, &url, port, CONTROL_CA);
    let mut d = Daemon::start(&s, &cfg, port);
    d.wait_ready(Duration::from_secs(20));
    // The pool's commit is accepted before tokens are asked for.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while dump::rows(&url, "SELECT COUNT(*) FROM revisions WHERE verdict = 'accepted'").await != ["1"] {
        assert!(std::time::Instant::now() < deadline, "the commit was not accepted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let operator = format!("Bearer {}", s.operator);
    let viewer = format!("Bearer {}", s.viewer);
    let token_for =
        |node: &str, auth: &str| d.post(&format!("/v1/nodes/{node}/token"), &[("authorization", auth)], b"");
    let code = |body: &str| -> String {
        let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        v["code"].as_str().unwrap_or("").to_owned()
    };

    // Tokens: an operator's, for a declared node that is not retired.
    let (status, body) = token_for("n1", &viewer);
    assert_eq!((status, code(&body).as_str()), (403, "insufficient-role"));
    let (status, body) = token_for("nx", &operator);
    assert_eq!((status, code(&body).as_str()), (404, "node-not-declared"));
    let (status, body) = token_for("n3", &operator);
    assert_eq!((status, code(&body).as_str()), (403, "node-retired"));
    let (status, body) = token_for("n1", &operator);
    assert_eq!(status, 200, "{body}");
    let t: operator_proto::nodes::NodeToken = serde_json::from_str(&body).expect("token");
    assert!(t.token.starts_with("ple_") && t.token.len() == 4 + 64, "{}", t.token);
    let stored = dump::rows(&url, "SELECT token_hash FROM enrolment_tokens").await;
    assert!(!stored.iter().any(|h| h.contains(&t.token)), "only the hash is kept");
    let (_, other) = token_for("n2", &operator);
    let other: operator_proto::nodes::NodeToken = serde_json::from_str(&other).expect("token");

    let enroll = |node: &str, token: &str, csr: &str, recipient: &str| {
        let body = serde_json::json!({"node": node, "token": token, "csr": csr, "ageRecipient": recipient});
        d.post(
            "/v1/enroll",
            &[("content-type", "application/json")],
            body.to_string().as_bytes(),
        )
    };
    let before = written(&url).await;
    // An expired token (made 16 minutes ago, written straight into the ledger).
    let expired = "ple_expired-for-the-test";
    let hash: String = {
        use sha2::Digest;
        sha2::Sha256::digest(expired.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let ledger = reconciler::store::Ledger::connect(&url, 1).await.expect("ledger");
    let old = reconciler::store::now_ms() - 16 * 60 * 1000;
    ledger
        .execute_raw(&format!(
            "INSERT INTO enrolment_tokens (token_hash, node, created_by, created_at, expires_at) VALUES ('{hash}', 'n1', 'test', {old}, {})",
            old + 15 * 60 * 1000
        ))
        .await
        .expect("insert");
    for (node, token, request, rcpt, status, want) in [
        ("n1", "ple_0000", csr("n1"), recipient(), 401, "token-unknown"),
        ("n1", expired, csr("n1"), recipient(), 401, "token-expired"),
        (
            "n1",
            other.token.as_str(),
            csr("n1"),
            recipient(),
            401,
            "token-wrong-node",
        ),
        ("n1", t.token.as_str(), csr("n2"), recipient(), 400, "csr-name-mismatch"),
        (
            "n1",
            t.token.as_str(),
            "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n".to_owned(),
            recipient(),
            400,
            "csr-invalid",
        ),
        (
            "n1",
            t.token.as_str(),
            csr("n1"),
            "age1notakey".to_owned(),
            400,
            "recipient-invalid",
        ),
    ] {
        let (got, body) = enroll(node, token, &request, &rcpt);
        assert_eq!((got, code(&body).as_str()), (status, want), "{body}");
        assert_eq!(written(&url).await, before, "{want} wrote nothing");
    }
    let (got, body) = d.post("/v1/enroll", &[("content-type", "application/json")], b"{\"node\": 1}");
    assert_eq!((got, code(&body).as_str()), (400, "malformed-request"));

    // The real thing.
    let (got, body) = enroll("n1", &t.token, &csr("n1"), &recipient());
    assert_eq!(got, 200, "{body}");
    let issued: agent_proto::EnrollResponse = serde_json::from_str(&body).expect("answer");
    let (_, pem) = x509_parser::pem::parse_x509_pem(issued.certificate.as_bytes()).expect("pem");
    let (_, cert) = X509Certificate::from_der(&pem.contents).expect("certificate");
    assert_eq!(
        cert.subject().iter_common_name().next().and_then(|c| c.as_str().ok()),
        Some("n1")
    );
    let hours = (cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp()) as f64 / 3600.0;
    assert!((24.0..=24.2).contains(&hours), "{hours}");
    let (_, ca_pem) = x509_parser::pem::parse_x509_pem(issued.ca.as_bytes()).expect("ca pem");
    let (_, ca) = X509Certificate::from_der(&ca_pem.contents).expect("ca");
    cert.verify_signature(Some(ca.public_key()))
        .expect("signed by the control CA");
    assert!(
        cert.extended_key_usage()
            .ok()
            .flatten()
            .is_some_and(|e| e.value.client_auth)
    );
    let (status, served_ca) = d.get("/v1/ca", None);
    assert_eq!((status, served_ca.as_str()), (200, issued.ca.as_str()));
    assert_eq!(written(&url).await, ["1", "1", "1", "1"]);
    // Once only.
    let (got, body) = enroll("n1", &t.token, &csr("n1"), &recipient());
    assert_eq!((got, code(&body).as_str()), (401, "token-used"));
    assert_eq!(written(&url).await, ["1", "1", "1", "1"]);
    // No token reaches the log.
    let log = std::fs::read_to_string(&d.log).expect("log");
    assert!(!log.contains(&t.token) && !log.contains(&other.token));
}
