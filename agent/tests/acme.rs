//! ACME end to end on a simulated host (`support/host.rs`: a network namespace with a dockerd
//! of its own, a registry and Caddy inside it), against a real ACME CA (Debian's pebble,
//! external account binding required) whose resolver is a real DNS server the test runs
//! (dnsmasq, answering only the test's records; nothing leaves the namespace):
//! - a web project with a replica on each of two nodes: the control plane orders the
//!   hostname's certificate once, both nodes answer its HTTP-01 challenge (one token, a
//!   `place-acme-challenge` job each), and both serve the very certificate pebble issued over
//!   HTTPS (checked by a client trusting pebble's root alone), plain HTTP redirecting there;
//! - a hostname whose DNS points where nothing listens: the order fails with pebble's reason,
//!   kept, shown and evented, and is retried only after its backoff, which doubles;
//! - a renewal (its time come) orders again and both nodes serve the new certificate;
//! - custom domains (`Domain` documents) are checked in that DNS server: a `txt` domain stays
//!   pending (not routed, no order) until its `_pushleft-challenge` record appears with the
//!   value `/v1/domains` shows, then it is routed, ordered and served (`serving`); a `cname`
//!   domain pointing at the environment's hostname is proven at once; a domain whose record
//!   goes is `failing` (an event; still served, its certificate not renewed).

#[path = "support/acme.rs"]
mod acme_support;
#[path = "../../reconciler/tests/support/daemon.rs"]
mod daemon_support;
#[path = "support/host.rs"]
mod host_support;
#[path = "../../reconciler/tests/support/repo.rs"]
mod repo_support;
mod support;
#[path = "support/tls.rs"]
mod tls_support;

use acme_support::{Dns, Pebble, Record};
use daemon_support::{CONTROL_CA, Daemon, config, free_port, setup};
use host_support::Host;
use repo_support::{Repo, environment};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use support::{KillGroups, sql};

const ENV: &str = "api-production";
const HOSTNAME: &str = "api.example.com";
/// A Domain of the environment whose DNS points at a loopback address nothing listens on.
const BROKEN: &str = "broken.shop.test";
/// A `txt` Domain, proven only once the test adds its record.
const SHOP: &str = "shop.customer.test";
/// A `cname` Domain pointing at the environment's own hostname.
const WWW: &str = "www.customer.test";

fn project(image: &str) -> String {
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: api}}\nspec:\n  image: {image}\n  roles:\n    web:\n      kind: web\n      port: 8080\n      health: {{path: /healthz}}\n      replicas: 2\n      command: [/bin/busybox, httpd, -f, -p, '8080', -h, /www]\n"
    )
}

fn domain(name: &str, hostname: &str, verification: &str) -> String {
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Domain\nmetadata: {{name: {name}}}\nspec: {{hostname: {hostname}, environment: {ENV}, verification: {verification}}}\n"
    )
}

/// Waits until `q` on the ledger returns `want`, up to `secs`; fails with `context()`.
fn wait_for(url: &str, q: &str, want: &[&str], secs: u64, context: &dyn Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let got = sql(url, q);
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "{q}: {got:?}, not {want:?}\n{}", context());
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn served_digest(root: &Path, cp: &str, node: &str) -> String {
    std::fs::read_to_string(root.join(format!("ingress/{HOSTNAME}/tls/{cp}_{node}")))
        .unwrap_or_default()
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn acme_certificates_are_ordered_once_for_two_nodes_served_renewed_and_failures_back_off() {
    let base = PathBuf::from(format!("/tmp/placme-{}", std::process::id()));
    let host = Host::start(&format!("placme-{}", std::process::id()), &base);
    let (registry, port) = host.registry();
    let _registry = KillGroups(vec![registry]);
    let image = host.image(
        port,
        "one",
        &[("/www/index.html", "release one\n"), ("/www/healthz", "ok\n")],
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    std::fs::write(dir.path().join("allowed_signers"), &repo.signers).expect("signers");
    repo.commit("the fleet", true);
    let s = setup(dir.path());
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let (api, agent_api, http, https) = (free_port(), free_port(), free_port(), free_port());
    let certs_port = free_port();
    support::age_keygen(&s.dir.join("control.age"));
    let root = dir.path().to_owned();
    let socket = host.socket.clone();

    host.run(move || {
        let cp_txt = |host: &str| state_schema::domains::txt_value(&support::control_plane(&url), host);
        let records = |with_shop: bool| {
            let mut r = vec![
                Record::A(HOSTNAME.into(), "127.0.0.1".into()),
                Record::A(BROKEN.into(), "127.0.0.9".into()),
                Record::Txt(state_schema::domains::txt_name(BROKEN), cp_txt(BROKEN)),
                Record::A(SHOP.into(), "127.0.0.1".into()),
                Record::Cname(WWW.into(), HOSTNAME.into()),
            ];
            if with_shop {
                r.push(Record::Txt(state_schema::domains::txt_name(SHOP), cp_txt(SHOP)));
            }
            r
        };
        // Records wait for the control plane's id (the daemon makes it at its first start).
        let mut dns = Dns::start(&root.join("dns"), &[]);
        let pebble = Pebble::start(&root.join("pebble"), http, dns.port, 3600);
        daemon_support::write_private(&root.join("eab.key"), acme_support::EAB_KEY);
        let cfg = config(
            &s,
            "d",
            &repo.dir,
            &url,
            api,
            &format!(
                "{CONTROL_CA}age_identity = \"control.age\"\n\n[certificates]\nissuer = \"acme\"\n\n[certificates.acme]\ndirectory = \"{}\"\nca_root = {:?}\ncontact = [\"mailto:ops@pushleft.test\"]\neab_kid = \"{}\"\neab_hmac_key_file = \"eab.key\"\n\n[domains]\nresolver = [\"127.0.0.1:{}\"]\npending_recheck_seconds = 1\nrecheck_seconds = 2\n\n[agent_api]\nlisten = \"127.0.0.1:{agent_api}\"\n",
                pebble.directory,
                pebble.https_root.display().to_string(),
                acme_support::EAB_KID,
                dns.port,
            ),
        );
        let mut d = Daemon::start(&s, &cfg, api);
        d.wait_ready(Duration::from_secs(20));
        dns.set(&records(false));
        let (_, admin) = support::caddy_admin_address(&root.join("caddy-admin"));
        let caddy = support::spawn_caddy(&root.join("caddy"), &format!("{{\"admin\": {{\"listen\": \"{admin}\"}}}}"));
        let mut procs = KillGroups(vec![caddy]);
        let ca = std::fs::read_to_string(root.join("tls/ca.crt")).expect("ca");
        // The namespace starts with the kernel's default; an agent running the ingress turns
        // on `tcp_migrate_req` (a Caddy reload during a validation must not reset the CA's
        // connection: CI saw an order fail so).
        let migrate = "/proc/sys/net/ipv4/tcp_migrate_req";
        std::fs::write(migrate, "0\n").expect("tcp_migrate_req");
        // Two nodes on this machine, sharing its dockerd and Caddy (as `pl up`'s do).
        for node in ["n1", "n2"] {
            let token = d.enrolment_token(node, &s.operator);
            pushleft_agent::enroll::enroll(&format!("https://localhost:{api}"), &support::ca_pin(&ca), node, &root.join(node), &token)
                .expect("enrol");
            let agent_cfg = root.join(format!("{node}.toml"));
            std::fs::write(
                &agent_cfg,
                format!(
                    "control = \"https://localhost:{agent_api}\"\ndir = \"{node}\"\ndocker_socket = {:?}\nsecrets_dir = \"{node}-secrets\"\nstate_dir = \"{node}-state\"\nheartbeat_seconds = 1\ndrift_seconds = 1\ncaddy_admin = \"{admin}\"\ningress_listen = [\"127.0.0.1:{http}\"]\ningress_upstreams = \"ingress\"\ningress_tls_listen = [\"127.0.0.1:{https}\"]\ningress_tls_dir = \"ingress-tls\"\ningress_certs_listen = \"127.0.0.1:{certs_port}\"\n",
                    socket.display().to_string()
                ),
            )
            .expect("agent config");
            procs.0.push(support::spawn_agent(env!("CARGO_BIN_EXE_pl-agent"), &agent_cfg, &root.join(format!("{node}.log"))));
        }
        let daemon_log = d.log.clone();
        let context = || {
            format!(
                "jobs: {:?}\nresults: {:?}\ncertificates: {:?}\npebble: {}\ndaemon: {}\nn1: {}\nn2: {}",
                sql(&url, "SELECT key || ' ' || state FROM jobs ORDER BY id"),
                sql(&url, "SELECT j.key || ' ' || r.detail FROM job_results r JOIN jobs j ON j.id = r.job_id"),
                sql(&url, "SELECT hostname || ' ' || CAST(issued AS TEXT) || ' ' || CAST(failures AS TEXT) || ' ' || COALESCE(last_error, '') FROM certificates"),
                Pebble::log(&root.join("pebble")),
                std::fs::read_to_string(&daemon_log).unwrap_or_default(),
                std::fs::read_to_string(root.join("n1.log")).unwrap_or_default(),
                std::fs::read_to_string(root.join("n2.log")).unwrap_or_default(),
            )
        };

        // The project once both nodes heartbeat, so its two replicas go one to each.
        wait_for(&url, "SELECT CAST(COUNT(*) AS TEXT) FROM nodes WHERE last_seen IS NOT NULL AND capabilities LIKE '%ingress%' AND host IS NOT NULL", &["2"], 60, &context);
        assert_eq!(std::fs::read_to_string(migrate).expect("tcp_migrate_req").trim(), "1");
        repo.write("projects/api.yaml", &project(&image));
        repo.write("envs/api-production.yaml", &environment(ENV, "api"));
        repo.write("domains/broken.yaml", &domain("broken", BROKEN, "txt"));
        repo.write("domains/shop.yaml", &domain("shop", SHOP, "txt"));
        repo.write("domains/www.yaml", &domain("www", WWW, "cname"));
        repo.commit("release one", true);

        // One order, both nodes answering its challenge, both serving what pebble issued.
        wait_for(&url, "SELECT status FROM deployments", &["done"], 120, &context);
        wait_for(
            &url,
            &format!("SELECT CAST(issued AS TEXT) || ' ' || issuer FROM certificates WHERE hostname = '{HOSTNAME}'"),
            &["1 acme"],
            60,
            &context,
        );
        let placed = sql(
            &url,
            &format!("SELECT target_node || ' ' || state || ' ' || key FROM jobs WHERE key LIKE 'acme:{ENV}/{HOSTNAME}:%' ORDER BY target_node"),
        );
        assert_eq!(placed.len(), 2, "{placed:?}");
        assert!(placed[0].starts_with("n1 succeeded ") && placed[1].starts_with("n2 succeeded "), "{placed:?}");
        let token = |row: &str| row.split(':').nth(2).unwrap_or_default().to_owned();
        assert_eq!(token(&placed[0]), token(&placed[1]), "one order: one token, placed on both nodes");
        let cp = support::control_plane(&url);
        let republished = format!("SELECT state FROM jobs WHERE key LIKE 'ingress:{ENV}/{HOSTNAME}:g%:publish#r%' ORDER BY id");
        let deadline = Instant::now() + Duration::from_secs(30);
        while served_digest(&root, &cp, "n1").is_empty() || served_digest(&root, &cp, "n2").is_empty() {
            assert!(Instant::now() < deadline, "not served over HTTPS on both nodes: {}", context());
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(served_digest(&root, &cp, "n1"), served_digest(&root, &cp, "n2"), "the same certificate on both nodes");
        let issuing_root = pebble.issuing_root();
        let (status, text, first_leaf) = tls_support::get_tls(https, HOSTNAME, &issuing_root).expect("https, trusting pebble's root alone");
        assert_eq!(status, 200, "{text}");
        assert!(text.contains("release one"), "{text}");
        let plain = tls_support::head_plain(http, HOSTNAME);
        assert!(plain.starts_with("HTTP/1.1 308"), "{plain}");

        // The unreachable one: failed with pebble's reason, and not asked again before its backoff.
        let failed = format!("SELECT CAST(failures AS TEXT) || ' ' || CAST(retry_at - updated_at AS TEXT) FROM certificates WHERE hostname = '{BROKEN}'");
        wait_for(&url, &failed, &["1 60000"], 60, &context);
        let reason = sql(&url, &format!("SELECT last_error FROM certificates WHERE hostname = '{BROKEN}'"));
        assert!(reason[0].contains("connection") || reason[0].contains("Connection"), "{reason:?}");
        assert!(reason[0].contains("127.0.0.9"), "pebble's own words: {reason:?}");
        assert_eq!(
            sql(&url, &format!("SELECT kind FROM events WHERE subject = '{BROKEN}' ORDER BY id")),
            ["domain-pending", "domain-verified", "certificate-failed"],
            "proven first, then ordered"
        );
        let (code, listed) = d.get("/v1/certificates", Some(&s.viewer));
        assert_eq!(code, 200, "{listed}");
        assert!(listed.contains(BROKEN) && listed.contains("127.0.0.9"), "{listed}");
        let (_, metrics) = d.get("/metrics", None);
        assert!(metrics.contains(&format!("pushleft_certificate_failures{{hostname=\"{BROKEN}\"}} 1")), "{metrics}");
        // Its backoff over (moved to now), the next attempt fails too and waits twice as long.
        sql(&url, &format!("UPDATE certificates SET retry_at = 0 WHERE hostname = '{BROKEN}'"));
        repo.write("NOTES.md", "retry\n");
        repo.commit("a commit that changes no environment", true);
        wait_for(&url, &failed, &["2 120000"], 60, &context);

        // A renewal: ordered again; both nodes serve the new certificate.
        sql(&url, &format!("UPDATE certificates SET renew_after = 0 WHERE hostname = '{HOSTNAME}'"));
        repo.write("NOTES.md", "renewal\n");
        repo.commit("another commit that changes no environment", true);
        wait_for(
            &url,
            &format!("SELECT CAST(issued AS TEXT) FROM certificates WHERE hostname = '{HOSTNAME}'"),
            &["2"],
            60,
            &context,
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let states = sql(&url, &republished);
            let leaf = tls_support::get_tls(https, HOSTNAME, &issuing_root).map(|r| r.2).unwrap_or_default();
            if states.iter().all(|s| s == "succeeded") && states.len() >= 2 && !leaf.is_empty() && leaf != first_leaf {
                break;
            }
            assert!(Instant::now() < deadline, "the renewed certificate is not served: {states:?}\n{}", context());
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(served_digest(&root, &cp, "n1"), served_digest(&root, &cp, "n2"));
        // Custom domains. The cname one is proven and served; the txt one waits for its record:
        // pending, not routed, nothing ordered, and `/v1/domains` says what to make.
        let domains = || -> serde_json::Value {
            let (code, text) = d.get("/v1/domains", Some(&s.viewer));
            assert_eq!(code, 200, "{text}");
            serde_json::from_str(&text).expect("json")
        };
        let state_of = |v: &serde_json::Value, host: &str| {
            v["domains"].as_array().into_iter().flatten().find(|x| x["hostname"] == host).cloned().unwrap_or_default()
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while state_of(&domains(), WWW)["state"] != "serving" {
            assert!(Instant::now() < deadline, "{WWW} not serving: {}\n{}", domains(), context());
            std::thread::sleep(Duration::from_millis(200));
        }
        let (status, _, _) = tls_support::get_tls(https, WWW, &issuing_root).expect("the cname domain over https");
        assert_eq!(status, 200);
        let shop = state_of(&domains(), SHOP);
        assert_eq!(shop["state"], "pending", "{shop}");
        assert_eq!(shop["record"]["name"], state_schema::domains::txt_name(SHOP));
        assert_eq!(shop["record"]["value"], cp_txt(SHOP), "{shop}");
        assert!(shop["reason"].as_str().is_some_and(|r| r.contains("no TXT record")), "{shop}");
        assert_eq!(support::get_host(http, SHOP).map(|r| r.0), Ok(404), "not routed while pending");
        assert!(sql(&url, &format!("SELECT hostname FROM certificates WHERE hostname = '{SHOP}'")).is_empty(), "nothing ordered");
        // The record appears: proven, routed, ordered, served.
        dns.set(&records(true));
        let deadline = Instant::now() + Duration::from_secs(60);
        while state_of(&domains(), SHOP)["state"] != "serving" {
            assert!(Instant::now() < deadline, "{SHOP} not serving: {}\n{}", domains(), context());
            std::thread::sleep(Duration::from_millis(200));
        }
        let (status, text, _) = tls_support::get_tls(https, SHOP, &issuing_root).expect("the txt domain over https");
        assert_eq!((status, text.contains("release one")), (200, true), "{text}");
        assert!(sql(&url, &format!("SELECT kind FROM events WHERE subject = '{SHOP}' ORDER BY id")).contains(&"domain-verified".to_owned()));
        // The record goes: failing, with an event; still served; its renewal is not ordered.
        dns.set(&records(false));
        let deadline = Instant::now() + Duration::from_secs(60);
        while state_of(&domains(), SHOP)["state"] != "failing" {
            assert!(Instant::now() < deadline, "{SHOP} not failing: {}", domains());
            std::thread::sleep(Duration::from_millis(200));
        }
        let failing = sql(&url, &format!("SELECT detail FROM events WHERE subject = '{SHOP}' AND kind = 'domain-failing'"));
        assert!(failing.len() == 1 && failing[0].contains("keeps its certificate"), "{failing:?}");
        sql(&url, &format!("UPDATE certificates SET renew_after = 0 WHERE hostname = '{SHOP}'"));
        repo.write("NOTES.md", "no renewal for a failing domain\n");
        repo.commit("a third commit that changes no environment", true);
        std::thread::sleep(Duration::from_secs(3));
        assert_eq!(sql(&url, &format!("SELECT CAST(issued AS TEXT) FROM certificates WHERE hostname = '{SHOP}'")), ["1"]);
        assert_eq!(tls_support::get_tls(https, SHOP, &issuing_root).map(|r| r.0), Ok(200), "still served");

        // The certificate's key is sealed at rest and in no agent's log.
        let sealed = sql(&url, &format!("SELECT key_sealed FROM certificates WHERE hostname = '{HOSTNAME}'"));
        assert!(!sealed[0].contains("PRIVATE KEY"), "sealed to the control host");
        for node in ["n1", "n2"] {
            let log = std::fs::read_to_string(root.join(format!("{node}.log"))).unwrap_or_default();
            assert!(!log.contains("PRIVATE KEY"), "{node}'s log");
        }
        d.kill9();
        drop(procs);
        drop(pebble);
        drop(dns);
    });
    drop(host);
}
