//! What a lease hands a node, against `pl-reconciler run` and the agent's client library: the
//! network's subnet, the container to run (image by digest, command, variables, limits,
//! health, port) and the ingress upstreams, all from the job's own generation; and the
//! project's secrets sealed to the node's own age key (made at enrolment), readable with that
//! key by the real `age` CLI and by nothing else; likewise the certificate and key an
//! environment's `tls.secret` names, in its ingress job. The plaintext is nowhere in the
//! ledger. A secret the control host cannot open fails its job for good, with its code.

#[path = "../../reconciler/tests/support/daemon.rs"]
mod daemon_support;
#[path = "../../reconciler/tests/support/repo.rs"]
mod repo_support;
mod support;

use agent_proto::{Execution, FULL_CAPABILITIES, Heartbeat, LeasedJob, Outcome};
use daemon_support::{CONTROL_CA, Daemon, config, free_port, setup, write_private};
use pushleft_agent::client::AgentClient;
use repo_support::{DIGEST, Repo, environment};
use std::time::{Duration, Instant};
use support::sql;

const PLAINTEXT: &str = "postgres://app:hunter2-very-secret@db/app";

/// A Secret declaring `recipient`, its value encrypted to `sealed_to`.
fn secret(name: &str, recipient: &str, sealed_to: &str, value: &str) -> String {
    let ct = support::age_encrypt(value, sealed_to);
    let indented: String = ct.lines().map(|l| format!("      {l}\n")).collect();
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Secret\nmetadata: {{name: {name}}}\nspec:\n  recipients: [{recipient}]\n  data:\n    DATABASE_URL: |\n{indented}"
    )
}

fn project(name: &str, secret: &str) -> String {
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: {name}}}\nspec:\n  image: registry.example.invalid/{name}@{DIGEST}\n  env: {{LOG_LEVEL: info}}\n  secrets: [{secret}]\n  roles:\n    web: {{kind: web, port: 8080, health: {{path: /healthz, timeoutSeconds: 20}}, replicas: 1, command: [/bin/server, --port, \"8080\"], resources: {{cpu: 250m, memory: 128Mi, pids: 64}}}}\n"
    )
}

/// Leases until `n` jobs came (or 20 s passed).
fn lease_n(c: &AgentClient, n: usize) -> Vec<LeasedJob> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while out.len() < n && Instant::now() < deadline {
        out.extend(c.lease(8, Duration::from_secs(2)).expect("lease").jobs);
    }
    out
}

#[test]
fn a_lease_carries_everything_the_job_needs_with_secrets_sealed_to_the_node() {
    let dir = tempfile::tempdir().expect("tempdir");
    let control_key = dir.path().join("control.age");
    let control = support::age_keygen(&control_key);
    let stranger = support::age_keygen(&dir.path().join("stranger.age"));
    let repo = Repo::new(dir.path());
    std::fs::write(dir.path().join("allowed_signers"), &repo.signers).expect("signers");
    repo.write(
        "pushleft.yaml",
        &repo_support::ROOT.replace(
            "previewDomain:",
            &format!("controlRecipient: {control}, previewDomain:"),
        ),
    );
    repo.write("secrets/db.yaml", &secret("db", &control, &control, PLAINTEXT));
    repo.write("projects/api.yaml", &project("api", "db"));
    // HTTPS with a certificate the user brings: CERT and KEY, sealed to the control host.
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["api.example.com".to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("cert");
    let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());
    let key_line = key_pem.lines().nth(1).expect("a line of the key").to_owned();
    let armored = |v: &str| -> String {
        support::age_encrypt(v, &control)
            .lines()
            .map(|l| format!("      {l}\n"))
            .collect()
    };
    repo.write(
        "secrets/api-cert.yaml",
        &format!(
            "apiVersion: pushleft.dev/v1alpha1\nkind: Secret\nmetadata: {{name: api-cert}}\nspec:\n  recipients: [{control}]\n  data:\n    CERT: |\n{}    KEY: |\n{}",
            armored(&cert_pem),
            armored(&key_pem)
        ),
    );
    repo.write(
        "envs/api-production.yaml",
        &environment("api-production", "api")
            .replace("pool: main}", "pool: main, tls: {secret: api-cert, hsts: true}}"),
    );
    // A secret that names the control host but was sealed to someone else: it passes
    // validation (which cannot open it), and the control host cannot deliver it.
    repo.write("secrets/lost.yaml", &secret("lost", &control, &stranger, "unreachable"));
    repo.write("projects/other.yaml", &project("other", "lost"));
    repo.write("envs/other-production.yaml", &environment("other-production", "other"));
    repo.commit("two environments with secrets", true);
    let s = setup(dir.path());
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let (port, agent_port) = (free_port(), free_port());
    write_private(
        &s.dir.join("control-identity.age"),
        &std::fs::read_to_string(&control_key).expect("key"),
    );
    let cfg = config(
        &s,
        "d",
        &repo.dir,
        &url,
        port,
        &format!(
            "{CONTROL_CA}age_identity = \"control-identity.age\"\n\n[agent_api]\nlisten = \"127.0.0.1:{agent_port}\"\n"
        ),
    );
    let mut d = Daemon::start(&s, &cfg, port);
    d.wait_ready(Duration::from_secs(20));
    let ca_pem = std::fs::read_to_string(dir.path().join("tls/ca.crt")).expect("ca");
    let fingerprint = support::ca_pin(&ca_pem);
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

    // Infrastructure: each environment's set-up, its network with a subnet of its own on
    // this node.
    let infra = lease_n(&n1, 2);
    assert_eq!(infra.len(), 2, "the set-up of both environments");
    assert!(infra.iter().all(|j| j.key.starts_with("env:")), "{infra:?}");
    let mut subnets = std::collections::BTreeMap::new();
    for j in &infra {
        let Execution::Network(net) = &j.execution else {
            panic!("{:?}", j.execution)
        };
        assert_eq!(
            net.network,
            format!("pl_{}_{}_n1", support::control_plane(&url), net.environment)
        );
        subnets.insert(net.environment.clone(), net.subnet.clone());
        n1.complete(&j.proof, Outcome::Succeeded, "").expect("complete");
    }
    assert_eq!(subnets.len(), 2);
    let mut distinct: Vec<&String> = subnets.values().collect();
    distinct.dedup();
    assert_eq!(distinct.len(), 2, "one subnet per environment on a node: {subnets:?}");
    assert!(
        subnets
            .values()
            .all(|s| s.starts_with("10.208.") && s.ends_with(".0/24"))
    );

    // The replica: everything to run it, and the secret sealed to n1's own key. (Generation 1
    // waited for a node; n1's first heartbeat placed it as generation 2.)
    let apps = lease_n(&n1, 1);
    let app = apps
        .iter()
        .find(|j| j.key.starts_with("app:api-production/"))
        .expect("api's replica");
    let Execution::Application(spec) = &app.execution else {
        panic!("{:?}", app.execution)
    };
    let cp = support::control_plane(&url);
    assert_eq!(spec.container, format!("pl_{cp}_api-production_web_0_g2"));
    assert_eq!(spec.image, format!("registry.example.invalid/api@{DIGEST}"));
    assert_eq!(spec.command, ["/bin/server", "--port", "8080"]);
    assert_eq!(spec.env.get("LOG_LEVEL").map(String::as_str), Some("info"));
    assert_eq!((spec.cpu_millis, spec.memory_bytes, spec.pids), (250, 128 << 20, 64));
    assert_eq!(spec.port, Some(8080));
    assert_eq!(
        spec.health.as_ref().map(|h| (h.path.as_str(), h.timeout_seconds)),
        Some(("/healthz", 20))
    );
    assert_eq!(spec.network.subnet, subnets["api-production"]);
    assert_eq!(spec.secrets.len(), 1);
    let sealed = &spec.secrets[0];
    assert_eq!(sealed.key, "DATABASE_URL");
    assert!(!sealed.sealed.contains(PLAINTEXT));
    assert_eq!(
        support::age_decrypt(&sealed.sealed, &node_dir.join("age.key")).as_deref(),
        Some(PLAINTEXT),
        "n1's own identity opens it"
    );
    assert_eq!(
        support::age_decrypt(&sealed.sealed, &control_key),
        None,
        "sealed to the node alone"
    );
    n1.complete(&app.proof, Outcome::Succeeded, "healthy")
        .expect("complete");

    // The other environment's secret cannot be opened by the control host: that job failed
    // for good with its code, and was never handed out.
    assert!(
        apps.iter().all(|j| !j.key.starts_with("app:other-production/")),
        "{apps:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut later = Vec::new();
    while sql(&url, "SELECT state FROM jobs WHERE key LIKE 'app:other-production/%'") != ["failed"] {
        assert!(Instant::now() < deadline, "other's replica did not fail");
        later.extend(n1.lease(8, Duration::from_millis(200)).expect("lease").jobs);
    }
    let detail = sql(
        &url,
        "SELECT r.detail FROM job_results r JOIN jobs j ON j.id = r.job_id WHERE j.key LIKE 'app:other-production/%'",
    );
    assert!(detail[0].starts_with("secret-undeliverable:"), "{detail:?}");

    // Ingress: the hostname's route to this generation's replica on this node.
    let routes = if later.is_empty() { lease_n(&n1, 1) } else { later };
    let Execution::Ingress(ingress) = &routes[0].execution else {
        panic!("{:?}", routes[0].execution)
    };
    assert_eq!(ingress.hostname, "api.example.com");
    assert_eq!(ingress.generation, 2);
    let tls = ingress.tls.as_ref().expect("the certificate comes with the route");
    assert_eq!((tls.secret.as_str(), tls.hsts), ("api-cert", true));
    let node_key = node_dir.join("age.key");
    assert_eq!(
        support::age_decrypt(&tls.cert, &node_key).as_deref(),
        Some(cert_pem.as_str())
    );
    assert_eq!(
        support::age_decrypt(&tls.key, &node_key).as_deref(),
        Some(key_pem.as_str())
    );
    assert_eq!(
        support::age_decrypt(&tls.key, &control_key),
        None,
        "sealed to the node alone"
    );
    assert_eq!(ingress.upstreams.len(), 1);
    assert_eq!(
        (ingress.upstreams[0].container.clone(), ingress.upstreams[0].port),
        (format!("pl_{cp}_api-production_web_0_g2"), 8080)
    );

    // The plaintext is nowhere in the ledger: not in a job, a result, an event or a sealed copy.
    for table in [
        "jobs",
        "job_results",
        "events",
        "deployments",
        "desired_objects",
        "sealed_secrets",
    ] {
        let text = sql(
            &url,
            &format!(
                "SELECT CAST(COUNT(*) AS TEXT) FROM {table} WHERE CAST({} AS TEXT) LIKE '%hunter2%'",
                column(table)
            ),
        );
        assert_eq!(text, ["0"], "{table}");
        let key_text = sql(
            &url,
            &format!(
                "SELECT CAST(COUNT(*) AS TEXT) FROM {table} WHERE CAST({} AS TEXT) LIKE '%{key_line}%'",
                column(table)
            ),
        );
        assert_eq!(key_text, ["0"], "{table}: the certificate's key");
    }
    assert_eq!(
        sql(&url, "SELECT CAST(COUNT(*) AS TEXT) FROM sealed_secrets"),
        ["3"],
        "one sealed copy each: the secret, the certificate and its key"
    );
    let log = std::fs::read_to_string(&d.log).unwrap_or_default();
    assert!(!log.contains("hunter2") && !log.contains(&key_line), "the daemon's log");
    d.kill9();
}

/// The widest text column of each table.
fn column(table: &str) -> &'static str {
    match table {
        "jobs" => "task",
        "job_results" => "detail",
        "events" => "detail",
        "deployments" => "spec",
        "desired_objects" => "document",
        _ => "sealed",
    }
}
