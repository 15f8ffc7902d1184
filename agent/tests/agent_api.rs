//! The agent API over mutual TLS, against `pl-reconciler run` as a real process and the agent's
//! own client library: enrolled nodes heartbeat, lease only their own jobs (long polling),
//! renew and complete them with their fencing proof; no certificate, another CA's, a revoked or
//! expired one, another node's job, a stale proof and a draining node are each refused with
//! their code, and a refusal changes nothing.

#[path = "../../reconciler/tests/support/daemon.rs"]
mod daemon_support;
#[path = "../../reconciler/tests/support/repo.rs"]
mod repo_support;
mod support;

use agent_proto::{Outcome, Refusal};
use daemon_support::{CONTROL_CA, Daemon, config, free_port, setup};
use pushleft_agent::client::{AgentClient, ClientError};
use repo_support::{POOL, Repo, environment, project};
use std::time::{Duration, Instant};
use support::sql;

fn refusal(r: Result<impl std::fmt::Debug, ClientError>) -> Refusal {
    match r {
        Err(ClientError::Refused { code, .. }) => code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A daemon over `repo` (committed) on SQLite, serving the operator API and the agent API.
struct Running {
    s: daemon_support::Setup,
    url: String,
    d: Daemon,
    control: String,
    agents: String,
    ca_pem: String,
}

fn start(dir: &std::path::Path, repo: &Repo) -> Running {
    let s = setup(dir);
    let url = format!("sqlite://{}", dir.join("ledger.db").display());
    let (port, agent_port) = (free_port(), free_port());
    let cfg = config(
        &s,
        "d",
        &repo.dir,
        &url,
        port,
        &format!("{CONTROL_CA}\n[agent_api]\nlisten = \"127.0.0.1:{agent_port}\"\n"),
    );
    let mut d = Daemon::start(&s, &cfg, port);
    d.wait_ready(Duration::from_secs(20));
    Running {
        s,
        url,
        d,
        control: format!("https://localhost:{port}"),
        agents: format!("https://localhost:{agent_port}"),
        ca_pem: std::fs::read_to_string(dir.join("tls/ca.crt")).expect("ca"),
    }
}

#[test]
fn nodes_lease_only_their_own_work_over_mutual_tls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    std::fs::write(dir.path().join("allowed_signers"), &repo.signers).expect("signers");
    repo.write("projects/api.yaml", &project("api", 1));
    repo.write("envs/api-production.yaml", &environment("api-production", "api"));
    repo.commit("one environment on n1", true);
    let Running {
        s,
        url,
        mut d,
        control,
        agents,
        ca_pem,
    } = start(dir.path(), &repo);
    let fingerprint = support::ca_pin(&ca_pem);
    let enrol = |node: &str| -> std::path::PathBuf {
        let node_dir = dir.path().join(node);
        let token = d.enrolment_token(node, &s.operator);
        pushleft_agent::enroll::enroll(&control, &fingerprint, node, &node_dir, &token).expect("enrol");
        node_dir
    };
    let (n1_dir, n2_dir) = (enrol("n1"), enrol("n2"));
    let n1 = AgentClient::from_dir(&agents, &n1_dir).expect("n1 client");
    let n2 = AgentClient::from_dir(&agents, &n2_dir).expect("n2 client");

    // n1's agent predates the one set-up task an environment (no `protocol` in its beat): its
    // environment's set-up is queued as the three tasks such an agent knows.
    let older = agent_proto::Heartbeat {
        protocol: 0,
        ..agent_proto::Heartbeat::new("test", &agent_proto::FULL_CAPABILITIES)
    };
    assert!(!serde_json::to_string(&older).expect("json").contains("protocol"));
    n1.heartbeat(&older).expect("heartbeat");
    assert_eq!(sql(&url, "SELECT name FROM nodes WHERE last_seen IS NOT NULL"), ["n1"]);
    // `pl nodes`' source: n1 heartbeats, n2 is enrolled but silent.
    let (status, body) = d.get("/v1/nodes", Some(&s.viewer));
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    let node = |name: &str| {
        v["nodes"]
            .as_array()
            .and_then(|a| a.iter().find(|n| n["name"] == name))
            .cloned()
    };
    let n1_row = node("n1").expect("n1");
    assert_eq!(
        (n1_row["state"].as_str(), n1_row["agentVersion"].as_str()),
        (Some("active"), Some("test"))
    );
    assert_eq!(n1_row["pool"], "main");
    // n1's agent is told apart as behind this control plane; n2 never beat, so it has none.
    assert_eq!(
        (&n1_row["agentProtocol"], &n1_row["olderAgent"]),
        (&serde_json::json!(0), &serde_json::json!(true))
    );
    let n2_row = node("n2").expect("n2");
    assert!(
        n2_row.get("agentProtocol").is_none() && n2_row["olderAgent"] == false,
        "{n2_row}"
    );
    assert_eq!(n1_row["cpuMillis"], 4000);
    assert_eq!(node("n2").expect("n2")["state"], "unhealthy");
    // A page at a time, by name; a full page's cursor is its last name, and past the last node
    // the page is empty with no cursor.
    let page = |q: &str| -> serde_json::Value {
        let (status, body) = d.get(&format!("/v1/nodes?{q}"), Some(&s.viewer));
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).expect("json")
    };
    let first = page("limit=1");
    assert_eq!(
        (first["nodes"].as_array().map(Vec::len), &first["next"]),
        (Some(1), &serde_json::json!("n1"))
    );
    assert_eq!(first["nodes"][0]["name"], "n1");
    assert_eq!(page("limit=1&after=n1")["nodes"][0]["name"], "n2");
    // A page reads its own nodes' reports and certificates: the same rows as the whole list.
    assert_eq!(first["nodes"][0], n1_row);
    assert!(n1_row["certificateCa"].is_string(), "{n1_row}");
    assert_eq!(page("limit=1&after=n1")["nodes"][0], node("n2").expect("n2"));
    let past = page("limit=1&after=n2");
    assert_eq!(
        (&past["nodes"], &past["next"]),
        (&serde_json::json!([]), &serde_json::Value::Null)
    );
    // n1's infrastructure jobs (network, firewall, routes, as its agent knows them), and none
    // of them for n2.
    let leased = n1.lease(8, Duration::from_secs(2)).expect("lease");
    let mut keys: Vec<&str> = leased.jobs.iter().map(|j| j.key.as_str()).collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "fw:api-production:g2:apply@n1",
            "net:api-production:g2:ensure@n1",
            "routes:api-production:g2:ensure@n1"
        ]
    );
    assert!(keys.iter().all(|k| k.ends_with("@n1")), "{keys:?}");
    assert!(n2.lease(8, Duration::ZERO).expect("lease").jobs.is_empty());
    let job = &leased.jobs[0];
    n1.renew(&job.proof).expect("renew");
    // Another node may not complete (or renew) n1's job; nothing changes.
    assert_eq!(
        refusal(n2.complete(&job.proof, Outcome::Succeeded, "")),
        Refusal::NotYourJob
    );
    assert_eq!(refusal(n2.renew(&job.proof)), Refusal::NotYourJob);
    let state = |key: &str| sql(&url, &format!("SELECT state FROM jobs WHERE key = '{key}'"));
    assert_eq!(state(&job.key), ["leased"]);
    // A secret-shaped detail is refused.
    assert_eq!(
        refusal(n1.complete(&job.proof, Outcome::Permanent, "AGE-SECRET-KEY-1QQQ")),
        Refusal::SecretInResult
    );
    n1.complete(&job.proof, Outcome::Succeeded, "ok").expect("complete");
    assert_eq!(state(&job.key), ["succeeded"]);
    // The same proof again is stale: 409, and nothing recorded.
    let results = sql(&url, "SELECT CAST(COUNT(*) AS TEXT) FROM job_results");
    assert_eq!(
        refusal(n1.complete(&job.proof, Outcome::Succeeded, "")),
        Refusal::StaleFencingToken
    );
    assert_eq!(sql(&url, "SELECT CAST(COUNT(*) AS TEXT) FROM job_results"), results);
    // Several completions in one request, each judged alone: another node's are refused and
    // record nothing; of n1's own, the live one is recorded and the finished one is stale.
    let (second, third) = (&leased.jobs[1], &leased.jobs[2]);
    let codes = |r: Vec<Option<agent_proto::RefusalBody>>| -> Vec<Option<Refusal>> {
        r.into_iter().map(|b| b.map(|b| b.code)).collect()
    };
    assert_eq!(
        codes(
            n2.complete_many(&[
                (&second.proof, Outcome::Succeeded, ""),
                (&third.proof, Outcome::Succeeded, "")
            ])
            .expect("batch")
        ),
        [Some(Refusal::NotYourJob), Some(Refusal::NotYourJob)]
    );
    assert_eq!(sql(&url, "SELECT CAST(COUNT(*) AS TEXT) FROM job_results"), results);
    assert_eq!(
        codes(
            n1.complete_many(&[
                (&second.proof, Outcome::Succeeded, "ok"),
                (&job.proof, Outcome::Succeeded, "")
            ])
            .expect("batch")
        ),
        [None, Some(Refusal::StaleFencingToken)]
    );
    assert_eq!(state(&second.key), ["succeeded"]);
    // Completions and the next lease in one request: the completion is recorded, and the
    // lease answers with n1's own jobs only.
    let (results, next) = n1
        .complete_and_lease(&[(&third.proof, Outcome::Succeeded, "")], 8, Duration::ZERO)
        .expect("complete and lease");
    assert_eq!(codes(results), [None]);
    assert_eq!(state(&third.key), ["succeeded"]);
    let next = next.expect("the lease");
    assert!(next.jobs.iter().all(|j| j.key.ends_with("@n1")), "{:?}", next.jobs);
    for j in &next.jobs {
        n1.complete(&j.proof, Outcome::Succeeded, "").expect("complete");
    }

    // Long polling: n2 (now heartbeating, so placement may use it) waits, and a commit that
    // places work on n2 reaches it while it waits.
    n2.heartbeat(&agent_proto::Heartbeat::new("test", &agent_proto::FULL_CAPABILITIES))
        .expect("heartbeat");
    let waiting = std::thread::spawn(move || {
        let started = Instant::now();
        let got = n2.lease(8, Duration::from_secs(20)).expect("lease");
        (got, started.elapsed(), n2)
    });
    std::thread::sleep(Duration::from_millis(300));
    repo.write("projects/api.yaml", &project("api", 2));
    repo.commit("work for n2", true);
    let (got, waited, n2) = waiting.join().expect("waiter");
    assert!(
        !got.jobs.is_empty(),
        "a job for n2 arrived while it waited: {:?} {:?}",
        sql(&url, "SELECT verdict || ' ' || reasons FROM revisions"),
        sql(&url, "SELECT key || ' ' || state FROM jobs")
    );
    assert!(got.jobs.iter().all(|j| j.key.ends_with("@n2")));
    assert!(waited < Duration::from_secs(10), "{waited:?}");

    // Renewal: a new key and certificate; the old one works until the new one is first used.
    let (key, csr) = pushleft_agent::enroll::signing_request("n1").expect("csr");
    let renewed = n1.renew_certificate(&csr).expect("renew");
    assert_eq!(
        refusal(n1.renew_certificate(&pushleft_agent::enroll::signing_request("n2").expect("csr").1)),
        Refusal::CsrNameMismatch,
        "a node renews only its own name"
    );
    n1.heartbeat(&agent_proto::Heartbeat::new(
        "still the old one",
        &agent_proto::FULL_CAPABILITIES,
    ))
    .expect("the old certificate until the new one is used");
    let n1_new = AgentClient::new(
        &agents,
        renewed.certificate.as_bytes(),
        key.serialize_pem().as_bytes(),
        renewed.ca.as_bytes(),
    )
    .expect("client");
    n1_new
        .heartbeat(&agent_proto::Heartbeat::new(
            "the new one",
            &agent_proto::FULL_CAPABILITIES,
        ))
        .expect("the new certificate works");
    assert_eq!(
        refusal(n1.heartbeat(&agent_proto::Heartbeat::new("old", &agent_proto::FULL_CAPABILITIES))),
        Refusal::CertificateRevoked,
        "first use revoked the old one"
    );
    let n1 = n1_new;

    // The machine id a heartbeat carries is bounded and plain; it is kept for the node.
    let mut odd = agent_proto::Heartbeat::new("test", &agent_proto::FULL_CAPABILITIES);
    odd.host = Some("../etc; drop".into());
    assert_eq!(refusal(n1.heartbeat(&odd)), Refusal::MalformedRequest);
    odd.host = Some("x".repeat(agent_proto::MAX_HOST_LEN + 1));
    assert_eq!(refusal(n1.heartbeat(&odd)), Refusal::MalformedRequest);
    odd.host = Some("3d1219c7c4c5404aaa1f6d2a48adfda4".into());
    // A mesh advert is checked before anything is kept: a key that is not one, a host name
    // where an IP belongs.
    let advert = agent_proto::mesh::MeshAdvert {
        public_key: "IjG2NTSQc3r9k/tNQfief6CqU2RRvmgCObP0GErpnAc=".into(),
        port: 51820,
        address: Some("node.example.invalid".into()),
        applied: 0,
        links: Vec::new(),
        names: Vec::new(),
    };
    odd.mesh = Some(advert.clone());
    assert_eq!(refusal(n1.heartbeat(&odd)), Refusal::MalformedRequest);
    odd.mesh = Some(agent_proto::mesh::MeshAdvert {
        public_key: "not a key".into(),
        address: None,
        ..advert.clone()
    });
    assert_eq!(refusal(n1.heartbeat(&odd)), Refusal::MalformedRequest);
    assert_eq!(
        sql(
            &url,
            "SELECT CAST(COUNT(*) AS TEXT) FROM nodes WHERE mesh_key IS NOT NULL"
        ),
        ["0"]
    );
    odd.mesh = Some(agent_proto::mesh::MeshAdvert {
        address: Some("10.77.0.1".into()),
        ..advert
    });
    n1.heartbeat(&odd).expect("a machine id");
    assert_eq!(
        sql(
            &url,
            "SELECT mesh_key || ' ' || CAST(mesh_port AS TEXT) || ' ' || mesh_address FROM nodes WHERE name = 'n1'"
        ),
        ["IjG2NTSQc3r9k/tNQfief6CqU2RRvmgCObP0GErpnAc= 51820 10.77.0.1"]
    );
    assert_eq!(
        sql(&url, "SELECT host FROM nodes WHERE name = 'n1'"),
        ["3d1219c7c4c5404aaa1f6d2a48adfda4"]
    );
    // The node's mesh comes with a lease when it is newer than the one the agent holds, and
    // only then.
    // (n1's key made the next pass decide its mesh: set at generation 7, and marked as
    // decided otherwise, so the next decision writes it anew.)
    let deadline = Instant::now() + Duration::from_secs(10);
    while sql(&url, "SELECT node FROM node_meshes WHERE node = 'n1'").is_empty() {
        assert!(Instant::now() < deadline, "n1's mesh never decided");
        std::thread::sleep(Duration::from_millis(50));
    }
    sql(
        &url,
        "UPDATE node_meshes SET generation = 7, hash = 'by hand' WHERE node = 'n1'",
    );
    let got = n1.lease_holding(1, Duration::ZERO, Some(6)).expect("lease");
    assert_eq!(got.mesh.as_ref().map(|m| m.generation), Some(7));
    assert!(
        n1.lease_holding(1, Duration::ZERO, Some(7))
            .expect("lease")
            .mesh
            .is_none()
    );
    assert!(
        n1.lease_holding(1, Duration::ZERO, None).expect("lease").mesh.is_none(),
        "not in the mesh"
    );
    // A long poll holding the newest is woken when the control plane changes the node's mesh
    // (here: n2 sends its key, the pass decides n1's mesh anew), not at the poll's end.
    let n1 = std::sync::Arc::new(n1);
    let waiting = {
        let n1 = std::sync::Arc::clone(&n1);
        std::thread::spawn(move || {
            let asked = Instant::now();
            let got = n1
                .lease_holding(1, Duration::from_secs(20), Some(7))
                .expect("long poll");
            (asked.elapsed(), got.mesh)
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let mut hb = agent_proto::Heartbeat::new("test", &agent_proto::FULL_CAPABILITIES);
    hb.mesh = Some(agent_proto::mesh::MeshAdvert {
        public_key: "xXPrkhFakfvfKd0n1YE1zPho/eReHYkNeL802VQx0SI=".into(),
        port: 51820,
        address: None,
        applied: 0,
        links: Vec::new(),
        names: Vec::new(),
    });
    n2.heartbeat(&hb).expect("n2's key");
    let (took, mesh) = waiting.join().expect("poll");
    assert!(
        mesh.as_ref().is_some_and(|m| m.generation == 8),
        "{mesh:?} after {took:?}"
    );
    assert!(
        took < Duration::from_secs(10),
        "woken by the change, not the poll's end: {took:?}"
    );
    let n1 = std::sync::Arc::into_inner(n1).expect("one owner");

    // Certificates: revoked, expired (as the ledger holds them), another CA's, none at all.
    let fp_n2 = sql(&url, "SELECT fingerprint FROM node_certificates WHERE node = 'n2'");
    sql(
        &url,
        &format!(
            "UPDATE node_certificates SET revoked_at = 1 WHERE fingerprint = '{}'",
            fp_n2[0]
        ),
    );
    // Revoked in the ledger behind this daemon's back (as another daemon would): admitted
    // certificates are cached for at most 5 s, so the refusal comes within that bound.
    let revoked_at = Instant::now();
    let got = loop {
        match n2.heartbeat(&agent_proto::Heartbeat::new("test", &agent_proto::FULL_CAPABILITIES)) {
            Ok(_) if revoked_at.elapsed() < Duration::from_secs(7) => std::thread::sleep(Duration::from_millis(200)),
            other => break refusal(other),
        }
    };
    assert_eq!(got, Refusal::CertificateRevoked);
    assert!(
        revoked_at.elapsed() <= Duration::from_millis(5_500),
        "{:?}",
        revoked_at.elapsed()
    );
    sql(
        &url,
        &format!(
            "UPDATE node_certificates SET revoked_at = NULL, not_after = 1 WHERE fingerprint = '{}'",
            fp_n2[0]
        ),
    );
    assert_eq!(refusal(n2.lease(1, Duration::ZERO)), Refusal::CertificateExpired);
    let (other_cert, other_key) = other_ca_certificate("n1");
    let stranger =
        AgentClient::new(&agents, other_cert.as_bytes(), other_key.as_bytes(), ca_pem.as_bytes()).expect("client");
    assert!(
        matches!(
            stranger.heartbeat(&agent_proto::Heartbeat::new("x", &agent_proto::FULL_CAPABILITIES)),
            Err(ClientError::Transport(_))
        ),
        "another CA's certificate fails the handshake"
    );
    let anonymous: ureq::Agent = ureq::Agent::config_builder()
        .tls_config(
            ureq::tls::TlsConfig::builder()
                .root_certs(ureq::tls::RootCerts::Specific(std::sync::Arc::new(vec![
                    ureq::tls::Certificate::from_pem(ca_pem.as_bytes())
                        .expect("ca")
                        .to_owned(),
                ])))
                .build(),
        )
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    assert!(
        anonymous
            .post(&format!("{agents}/v1/agent/heartbeat"))
            .send_json(serde_json::json!({"agentVersion": "x"}))
            .is_err(),
        "no certificate, no connection"
    );

    // A node retired in Git loses every certificate at once.
    repo.write(
        "pools/main.yaml",
        &POOL.replace("{name: n2,", "{name: n2, state: retired,"),
    );
    repo.commit("retire n2", true);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sql(
        &url,
        "SELECT node FROM node_certificates WHERE node = 'n2' AND revoked_at IS NULL",
    )
    .is_empty()
    {
        assert!(Instant::now() < deadline, "n2's certificates were not revoked");
        std::thread::sleep(Duration::from_millis(50));
    }

    // A node draining in Git gets no new work: with nothing of its own to take away, a lease
    // is refused.
    repo.write(
        "pools/main.yaml",
        &POOL.replace("{name: n1,", "{name: n1, state: draining,"),
    );
    repo.commit("drain n1", true);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match n1.lease(1, Duration::ZERO) {
            Err(ClientError::Refused {
                code: Refusal::NodeDraining,
                ..
            }) => break,
            other => {
                assert!(Instant::now() < deadline, "still leasing: {other:?}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    // The lease that comes with completions is refused the same way, and says why.
    let (results, next) = n1
        .complete_and_lease(&[], 1, Duration::ZERO)
        .expect("complete and lease");
    assert!(results.is_empty());
    assert!(
        matches!(
            next,
            Err(ClientError::Refused {
                code: Refusal::NodeDraining,
                ..
            })
        ),
        "{next:?}"
    );
    d.kill9();
}

/// A client certificate for `cn` from a CA the control plane never saw.
fn other_ca_certificate(cn: &str) -> (String, String) {
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    ca.self_signed(&ca_key).expect("ca");
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().expect("key");
    let mut p = rcgen::CertificateParams::new(vec![cn.to_owned()]).expect("params");
    p.distinguished_name.push(rcgen::DnType::CommonName, cn);
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = p.signed_by(&key, &issuer).expect("cert");
    (cert.pem(), key.serialize_pem())
}

/// Tasks that succeed at once and remember what ran, in order.
#[derive(Default)]
struct Recorded(std::sync::Mutex<Vec<String>>);

impl pushleft_agent::lease_loop::Tasks for Recorded {
    fn execute(
        &self,
        job: &agent_proto::LeasedJob,
    ) -> impl std::future::Future<Output = Result<pushleft_agent::lease_loop::Ended, pushleft_agent::outcome::Failure>> + Send
    {
        let what = match &job.task {
            agent_proto::Task::EnsureApplication { instance, .. } => format!("ensure-application {instance}"),
            other => other.kind().to_owned(),
        };
        self.0.lock().expect("lock").push(what.trim().to_owned());
        std::future::ready(Ok(String::new().into()))
    }
}

/// One node, n1, enrolled and heartbeating, with `replicas` of `api-production` committed for
/// it, running the agent's own lease loop over `tasks` until [`OneNode::stop`].
struct OneNode<T: pushleft_agent::lease_loop::Tasks> {
    url: String,
    d: Daemon,
    leasing: std::sync::Arc<pushleft_agent::lease_loop::LeaseLoop<T>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    rt: tokio::runtime::Runtime,
    running: Option<tokio::task::JoinHandle<()>>,
    /// Last: the daemon and the loop go before their folder.
    _dir: tempfile::TempDir,
}

impl<T: pushleft_agent::lease_loop::Tasks> OneNode<T> {
    fn start(replicas: u32, tasks: std::sync::Arc<T>) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = Repo::new(dir.path());
        std::fs::write(dir.path().join("allowed_signers"), &repo.signers).expect("signers");
        let pool = POOL.replace("    - {name: n2, capacity: {cpu: \"4\", memory: 8Gi}}\n", "");
        repo.write("pools/main.yaml", &pool);
        repo.write("projects/api.yaml", &project("api", replicas));
        repo.write("envs/api-production.yaml", &environment("api-production", "api"));
        repo.commit("replicas on n1", true);
        let Running {
            s,
            url,
            d,
            control,
            agents,
            ca_pem,
        } = start(dir.path(), &repo);
        let node_dir = dir.path().join("n1");
        let token = d.enrolment_token("n1", &s.operator);
        pushleft_agent::enroll::enroll(&control, &support::ca_pin(&ca_pem), "n1", &node_dir, &token).expect("enrol");
        let client = std::sync::Arc::new(AgentClient::from_dir(&agents, &node_dir).expect("client"));
        client
            .heartbeat(&agent_proto::Heartbeat::new("test", &agent_proto::FULL_CAPABILITIES))
            .expect("heartbeat");
        let leasing = std::sync::Arc::new(pushleft_agent::lease_loop::LeaseLoop::new(
            client,
            tasks,
            4,
            Duration::from_millis(200),
        ));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let rt = support::runtime();
        let running = {
            let (leasing, stop) = (std::sync::Arc::clone(&leasing), std::sync::Arc::clone(&stop));
            Some(rt.spawn(async move { leasing.run(&stop).await }))
        };
        OneNode {
            url,
            d,
            leasing,
            stop,
            rt,
            running,
            _dir: dir,
        }
    }

    /// Stops the loop and waits for it.
    fn stop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(running) = self.running.take() {
            self.rt.block_on(running).expect("lease loop");
        }
    }
}

#[test]
fn the_agents_lease_loop_drives_a_rollout_reporting_each_steps_ends_with_the_next_lease() {
    let tasks = std::sync::Arc::new(Recorded::default());
    let mut node = OneNode::start(3, std::sync::Arc::clone(&tasks));
    let url = node.url.clone();
    let open = || sql(&url, "SELECT key FROM jobs WHERE state <> 'succeeded'");
    let deadline = Instant::now() + Duration::from_secs(30);
    // The rollout's last step is the hostname's route.
    let published = || {
        !sql(
            &url,
            "SELECT key FROM jobs WHERE key LIKE 'ingress:%:publish@%' AND state = 'succeeded'",
        )
        .is_empty()
    };
    while !(published() && open().is_empty()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    node.stop();
    assert_eq!(
        open(),
        Vec::<String>::new(),
        "every job of the rollout succeeded: {:?}",
        sql(&url, "SELECT detail FROM job_results")
    );

    // In the order the rollout asks: the environment's set-up, the replicas, then ingress.
    let ran = tasks.0.lock().expect("lock").clone();
    let first = |kind: &str| ran.iter().position(|t| t.starts_with(kind)).expect(kind);
    assert_eq!(
        ran.iter().filter(|t| t.starts_with("ensure-environment")).count(),
        1,
        "{ran:?}"
    );
    assert!(first("ensure-environment") < first("ensure-application"), "{ran:?}");
    assert!(first("ensure-application") < first("publish-ingress"), "{ran:?}");
    let replicas: Vec<&String> = ran.iter().filter(|t| t.starts_with("ensure-application")).collect();
    assert_eq!(replicas.len(), 3, "{ran:?}");
    let jobs = sql(&url, "SELECT key FROM jobs").len();
    assert_eq!(ran.len(), jobs, "each job ran once: {ran:?}");
    assert_eq!(node.leasing.recorded(), jobs as u64, "every end recorded");
    // A step's ends travel together, with the next lease: at most one report per step (the
    // network, its firewall, its routes, the three replicas, the route), never one per job.
    assert!(
        node.leasing.reports() <= 5,
        "{} reports for {jobs} jobs: {ran:?}",
        node.leasing.reports()
    );
    node.d.kill9();
}

/// Tasks whose replicas fail for good with the longest log tail a report may carry, full of
/// what JSON escapes; everything else succeeds.
struct LongFailures;

impl pushleft_agent::lease_loop::Tasks for LongFailures {
    fn execute(
        &self,
        job: &agent_proto::LeasedJob,
    ) -> impl std::future::Future<Output = Result<pushleft_agent::lease_loop::Ended, pushleft_agent::outcome::Failure>> + Send
    {
        std::future::ready(match &job.task {
            agent_proto::Task::EnsureApplication { .. } => Err(pushleft_agent::outcome::permanent(
                "exit-code",
                "\u{1b}[31m\"crashed\"\\\n".repeat(4_000),
            )),
            _ => Ok(String::new().into()),
        })
    }
}

/// Eight replicas of one step fail at once with long logs (a bad release does that): their
/// ends must reach the ledger. Eight full reports in one request are past the agent API's body
/// limit; sent as one, they were refused, put back and sent again for ever.
#[test]
fn a_steps_failures_with_long_logs_are_reported_in_requests_the_control_plane_accepts() {
    let mut node = OneNode::start(8, std::sync::Arc::new(LongFailures));
    let url = node.url.clone();
    let failed = || sql(&url, "SELECT key FROM jobs WHERE key LIKE 'app:%' AND state = 'failed'");
    let deadline = Instant::now() + Duration::from_secs(30);
    while failed().len() < 8 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    node.stop();
    assert_eq!(failed().len(), 8, "every replica's failure recorded");
    // Each with its log's end, control characters left out, within the detail's limit.
    let details = sql(
        &url,
        "SELECT r.detail FROM job_results r JOIN jobs j ON j.id = r.job_id WHERE j.key LIKE 'app:%'",
    );
    assert_eq!(details.len(), 8, "one result each");
    for detail in &details {
        assert!(detail.starts_with("exit-code: …"), "{}", &detail[..40]);
        assert!(detail.ends_with("[31m\"crashed\"\\\n"), "the log's end is kept");
        assert!(!detail.contains('\u{1b}'), "no control characters");
        assert!(detail.len() <= agent_proto::MAX_DETAIL_BYTES);
    }
    node.d.kill9();
}
