//! Bench (a binary): from a commit adding a hostname to that hostname serving HTTPS with a
//! certificate from a real ACME CA, against Caddy alone obtaining a certificate from the same
//! CA for a hostname added to its own configuration (the floor).
//!
//! Everything runs in a network namespace the bench makes (`tests/support/host.rs`: its own
//! dockerd, a registry on its loopback), with Debian's pebble as the CA (no validation sleeps)
//! resolving through dnsmasq. Ours: `pl-reconciler` (`issuer = "acme"`) and one `pl-agent`
//! with Caddy on 127.0.0.1, an environment already serving; each round commits a `Domain`
//! (`cname` to the environment's hostname), which is a new generation, a DNS proof, one ACME
//! order and the publishes, and is timed until an HTTPS request trusting pebble's root alone
//! answers 200. The floor: a second Caddy on 127.0.0.2 (pebble validates on one port, so the
//! two listen on the same port of two loopback addresses) with its own ACME issuer pointed at
//! the same pebble; each round loads its configuration with one more site and is timed the same
//! way. The two alternate; a first round of each (account registration) is not counted.
//!
//! `cargo bench -p pushleft-agent --bench acme` (needs Caddy ≥ 2.8 on `PATH`, pebble and
//! dnsmasq: `scripts/test` installs them; `-- --rounds N`, default 5).

#[path = "../tests/support/acme.rs"]
mod acme_support;
#[path = "../../reconciler/tests/support/daemon.rs"]
mod daemon_support;
#[path = "../tests/support/host.rs"]
mod host_support;
#[path = "../../reconciler/tests/support/repo.rs"]
mod repo_support;
#[path = "../tests/support/mod.rs"]
mod support;
#[path = "../tests/support/tls.rs"]
mod tls_support;

use acme_support::{Dns, Pebble, Record};
use daemon_support::{CONTROL_CA, Daemon, config, free_port, setup};
use host_support::Host;
use repo_support::{Repo, environment};
use std::time::{Duration, Instant};
use support::KillGroups;

const ENV: &str = "api-production";
const HOSTNAME: &str = "api.example.com";
/// Longest a round may take before the bench gives up.
const ROUND_LIMIT: Duration = Duration::from_secs(120);

/// Waits (polling every 20 ms, bounded) until `host` answers 200 over HTTPS at `ip:port`
/// trusting `root` alone; the time it took from `from`.
fn until_https(ip: [u8; 4], port: u16, host: &str, root: &str, from: Instant) -> Duration {
    loop {
        if tls_support::get_tls_at(ip, port, host, root).is_ok_and(|r| r.0 == 200) {
            return from.elapsed();
        }
        assert!(from.elapsed() < ROUND_LIMIT, "{host} never served HTTPS");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The floor's configuration: sites `floor0..=floor<n>.customer.test` on 127.0.0.2, their
/// certificates from pebble through Caddy's own ACME issuer.
fn floor_config(admin: &str, http: u16, https: u16, n: usize, pebble: &Pebble) -> String {
    let hosts: Vec<String> = (0..=n).map(|k| format!("floor{k}.customer.test")).collect();
    serde_json::json!({
        "admin": {"listen": admin},
        "apps": {
            "http": {
                "http_port": http,
                "https_port": https,
                "servers": {
                    "floor": {
                        "listen": [format!("127.0.0.2:{https}")],
                        "routes": [{"match": [{"host": hosts}], "handle": [{"handler": "static_response", "body": "floor"}]}],
                    },
                    "floor_plain": {"listen": [format!("127.0.0.2:{http}")], "routes": []},
                },
            },
            "tls": {"automation": {"policies": [{"issuers": [{
                "module": "acme",
                "ca": pebble.directory,
                "trusted_roots_pem_files": [pebble.https_root],
                "external_account": {"key_id": acme_support::EAB_KID, "mac_key": acme_support::EAB_KEY},
                "challenges": {"tls-alpn": {"disabled": true}},
            }]}]}},
        },
    })
    .to_string()
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds: usize = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let base = std::path::PathBuf::from(format!("/tmp/placme-bench-{}", std::process::id()));
    let host = Host::start(&format!("placme-b{}", std::process::id()), &base);
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
    let (api, agent_api, http, https, floor_https) = (free_port(), free_port(), free_port(), free_port(), free_port());
    let certs_port = free_port();
    support::age_keygen(&s.dir.join("control.age"));
    let root = dir.path().to_owned();
    let socket = host.socket.clone();

    let (ours, floor) = host.run(move || {
        let mut records = vec![Record::A(HOSTNAME.into(), "127.0.0.1".into())];
        for k in 0..=rounds {
            records.push(Record::Cname(format!("site{k}.customer.test"), HOSTNAME.into()));
            records.push(Record::A(format!("floor{k}.customer.test"), "127.0.0.2".into()));
        }
        let dns = Dns::start(&root.join("dns"), &records);
        let pebble = Pebble::start(&root.join("pebble"), http, dns.port, 3600);
        daemon_support::write_private(&root.join("eab.key"), acme_support::EAB_KEY);
        let cfg = config(
            &s,
            "d",
            &repo.dir,
            &url,
            api,
            &format!(
                "{CONTROL_CA}age_identity = \"control.age\"\n\n[certificates]\nissuer = \"acme\"\n\n[certificates.acme]\ndirectory = \"{}\"\nca_root = {:?}\neab_kid = \"{}\"\neab_hmac_key_file = \"eab.key\"\n\n[domains]\nresolver = [\"127.0.0.1:{}\"]\n\n[agent_api]\nlisten = \"127.0.0.1:{agent_api}\"\n",
                pebble.directory,
                pebble.https_root.display().to_string(),
                acme_support::EAB_KID,
                dns.port,
            ),
        );
        let mut d = Daemon::start(&s, &cfg, api);
        d.wait_ready(Duration::from_secs(20));
        let (_, admin) = support::caddy_admin_address(&root.join("caddy-admin"));
        let mut procs = KillGroups(vec![support::spawn_caddy(&root.join("ours"), &format!("{{\"admin\": {{\"listen\": \"{admin}\"}}}}"))]);
        let (floor_socket, floor_admin) = support::caddy_admin_address(&root.join("floor-admin"));
        procs.0.push(support::spawn_caddy(&root.join("floor"), &format!("{{\"admin\": {{\"listen\": \"{floor_admin}\"}}}}")));
        let ca = std::fs::read_to_string(root.join("tls/ca.crt")).expect("ca");
        let token = d.enrolment_token("n1", &s.operator);
        pushleft_agent::enroll::enroll(&format!("https://localhost:{api}"), &support::ca_pin(&ca), "n1", &root.join("n1"), &token)
            .expect("enrol");
        let agent_cfg = root.join("n1.toml");
        std::fs::write(
            &agent_cfg,
            format!(
                "control = \"https://localhost:{agent_api}\"\ndir = \"n1\"\ndocker_socket = {:?}\nsecrets_dir = \"secrets\"\nstate_dir = \"state\"\nheartbeat_seconds = 1\ndrift_seconds = 5\ncaddy_admin = \"{admin}\"\ningress_listen = [\"127.0.0.1:{http}\"]\ningress_upstreams = \"ingress\"\ningress_tls_listen = [\"127.0.0.1:{https}\"]\ningress_tls_dir = \"ingress-tls\"\ningress_certs_listen = \"127.0.0.1:{certs_port}\"\n",
                socket.display().to_string()
            ),
        )
        .expect("agent config");
        procs.0.push(support::spawn_agent(env!("CARGO_BIN_EXE_pl-agent"), &agent_cfg, &root.join("n1.log")));
        let deadline = Instant::now() + Duration::from_secs(60);
        while support::sql(&url, "SELECT CAST(COUNT(*) AS TEXT) FROM nodes WHERE capabilities LIKE '%ingress%'") != ["1"] {
            assert!(Instant::now() < deadline, "the agent never heartbeat");
            std::thread::sleep(Duration::from_millis(100));
        }
        repo.write(
            "projects/api.yaml",
            &format!(
                "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: api}}\nspec:\n  image: {image}\n  roles:\n    web:\n      kind: web\n      port: 8080\n      health: {{path: /healthz}}\n      replicas: 1\n      command: [/bin/busybox, httpd, -f, -p, '8080', -h, /www]\n"
            ),
        );
        repo.write("envs/api-production.yaml", &environment(ENV, "api"));
        repo.commit("release one", true);
        let pebble_root = pebble.issuing_root();
        until_https([127, 0, 0, 1], https, HOSTNAME, &pebble_root, Instant::now());

        let (mut ours, mut floor) = (Vec::new(), Vec::new());
        for k in 0..=rounds {
            // Ours: a commit adding a Domain.
            let site = format!("site{k}.customer.test");
            repo.write(
                &format!("domains/site{k}.yaml"),
                &format!("apiVersion: pushleft.dev/v1alpha1\nkind: Domain\nmetadata: {{name: site{k}}}\nspec: {{hostname: {site}, environment: {ENV}, verification: cname}}\n"),
            );
            let t = Instant::now();
            repo.commit(&format!("add {site}"), true);
            let took = until_https([127, 0, 0, 1], https, &site, &pebble_root, t);
            // The floor: Caddy's configuration with one more site.
            let config = floor_config(&floor_admin, http, floor_https, k, &pebble);
            let t = Instant::now();
            let (code, body) = support::caddy_admin_post_load(&floor_socket, &config).expect("load");
            assert_eq!(code, 200, "{body}");
            let floor_took = until_https([127, 0, 0, 2], floor_https, &format!("floor{k}.customer.test"), &pebble_root, t);
            println!("round {k}: ours {} ms, floor {} ms{}", took.as_millis(), floor_took.as_millis(), if k == 0 { " (warm-up: not counted)" } else { "" });
            if k > 0 {
                ours.push(took);
                floor.push(floor_took);
            }
        }
        d.kill9();
        drop(procs);
        (ours, floor)
    });
    drop(host);
    let (mut ours, mut floor) = (ours, floor);
    let (o, f) = (median(&mut ours), median(&mut floor));
    println!(
        "commit → HTTPS, median of {rounds}: ours {} ms, Caddy alone {} ms: {:.2}× the floor (target ≤ 1.5×)",
        o.as_millis(),
        f.as_millis(),
        o.as_secs_f64() / f.as_secs_f64()
    );
}
