//! The whole loop on a simulated host (`support/host.rs`: a network namespace with a dockerd
//! of its own, a registry and Caddy inside it): `pl-reconciler run` and `pl-agent run` with
//! every executor on roll a signed commit's web project out (network, firewall table, routes,
//! the replica pulled by digest and healthy, the Caddy route), and the hostname answers through
//! Caddy over HTTPS, with a certificate the control plane's local CA issued (`[certificates]`,
//! checked by a client that trusts that CA alone), while plain HTTP redirects to it. Then a
//! second release, with the certificate due for renewal and the agent SIGKILLed (its whole
//! process group) right after it started the new container: restarted, the agent adopts that
//! very container (same id and start time), the new release answers with the renewed
//! certificate, and the old generation is kept paused for a rollback. The machine's own nftables ruleset, rules
//! and routes are the same before and after. Between the roles, service names: the web replica
//! resolves `cache` (and `cache.<environment>.internal`) to the worker's replica of the live
//! generation through the environment's firewall, and reaches it at that address on the port
//! the worker declared, and not on one it serves without declaring.

#[path = "../../reconciler/tests/support/daemon.rs"]
mod daemon_support;
#[path = "support/host.rs"]
mod host_support;
#[path = "../../reconciler/tests/support/repo.rs"]
mod repo_support;
mod support;
#[path = "support/tls.rs"]
mod tls_support;

use daemon_support::{CONTROL_CA, Daemon, config, free_port, setup};
use host_support::Host;
use repo_support::{Repo, environment};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use support::{KillGroups, sql};

const ENV: &str = "api-production";
const HOSTNAME: &str = "api.example.com";

fn machine_state() -> String {
    let mut out = String::new();
    for args in [
        vec!["nft", "list", "ruleset"],
        vec!["ip", "rule"],
        vec!["ip", "route", "show", "table", "all"],
    ] {
        let o = Command::new(args[0]).args(&args[1..]).output().expect("state");
        out.push_str(&String::from_utf8_lossy(&o.stdout));
    }
    out
}

fn project(image: &str) -> String {
    // The server starts after a second, so a kill lands while the agent waits for health.
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: api}}\nspec:\n  image: {image}\n  roles:\n    web:\n      kind: web\n      port: 8080\n      health: {{path: /healthz}}\n      replicas: 1\n      command: [/bin/busybox, sh, -c, 'sleep 1; exec /bin/busybox httpd -f -p 8080 -h /www']\n    cache:\n      kind: worker\n      replicas: 1\n      ports: [6379]\n      command: [/bin/busybox, sh, -c, '/bin/busybox httpd -p 7000 -h /www; exec /bin/busybox httpd -f -p 6379 -h /www']\n"
    )
}

/// The IPv4 addresses `name` resolves to inside `container` (through Docker's resolver, to the
/// agent's name server on the environment's gateway, through the environment's firewall).
fn resolve(socket: &Path, container: &str, name: &str) -> Vec<String> {
    let out = host_support::docker_at(
        socket,
        &[
            "exec",
            container,
            "/bin/busybox",
            "timeout",
            "5",
            "/bin/busybox",
            "nslookup",
            "-type=a",
            name,
        ],
    );
    support::nslookup_addresses(&out)
}

/// The name `pl up`-style routes and the local CA's certificates carry.
const LOCAL_NAME: &str = "api.example.com.localhost";

/// One HTTPS request through Caddy on the host's loopback, trusting only the local CA in
/// `ca`: (status, body) and the leaf certificate shown.
fn get(port: u16, ca: &Path) -> Option<((u16, String), Vec<u8>)> {
    let ca = std::fs::read_to_string(ca).ok()?;
    let (status, text, leaf) = tls_support::get_tls(port, LOCAL_NAME, &ca).ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.trim().to_owned())
        .unwrap_or_default();
    Some(((status, body), leaf))
}

/// Waits until the environment's deployment is done at a generation above `after`, its
/// hostname published; its generation. Fails with the jobs and their results when a job fails.
fn wait_done(url: &str, after: i64, log: &Path) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let row = sql(url, "SELECT status || ' ' || CAST(generation AS TEXT) FROM deployments");
        if let Some((status, generation)) = row.first().and_then(|r| r.split_once(' ')) {
            let generation: i64 = generation.parse().expect("generation");
            // Done with its replica placed: the node may join after the first commit, whose
            // generation then places nothing and a later one places the replica.
            let published = sql(
                url,
                &format!("SELECT state FROM jobs WHERE key LIKE 'ingress:{ENV}/{HOSTNAME}:g{generation}:publish%'"),
            );
            if status == "done" && generation > after && published == ["succeeded"] {
                return generation;
            }
            assert!(
                status != "failed",
                "the rollout failed: {:?}",
                sql(
                    url,
                    "SELECT j.key || ' ' || r.detail FROM job_results r JOIN jobs j ON j.id = r.job_id"
                )
            );
        }
        assert!(
            Instant::now() < deadline,
            "not done: {:?}\n{:?}\nagent log: {}",
            sql(url, "SELECT key || ' ' || state FROM jobs ORDER BY id"),
            sql(
                url,
                "SELECT j.key || ' ' || r.detail FROM job_results r JOIN jobs j ON j.id = r.job_id"
            ),
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_whole_loop_rolls_out_serves_and_survives_a_killed_agent() {
    let before = machine_state();
    let base = PathBuf::from(format!("/tmp/plhost-{}", std::process::id()));
    let host = Host::start(&format!("plhost-loop-{}", std::process::id()), &base);
    let (registry, port) = host.registry();
    let _registry = KillGroups(vec![registry]);
    let one = host.image(
        port,
        "one",
        &[("/www/index.html", "release one\n"), ("/www/healthz", "ok\n")],
    );
    let two = host.image(
        port,
        "two",
        &[("/www/index.html", "release two\n"), ("/www/healthz", "ok\n")],
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    std::fs::write(dir.path().join("allowed_signers"), &repo.signers).expect("signers");
    repo.write("projects/api.yaml", &project(&one));
    repo.write("envs/api-production.yaml", &environment(ENV, "api"));
    repo.commit("release one", true);
    let s = setup(dir.path());
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let (api, agent_api, http) = (free_port(), free_port(), free_port());
    let cfg = config(
        &s,
        "d",
        &repo.dir,
        &url,
        api,
        &format!(
            "{CONTROL_CA}age_identity = \"control.age\"\n\n[certificates]\nissuer = \"local\"\n\n[agent_api]\nlisten = \"127.0.0.1:{agent_api}\"\n"
        ),
    );
    support::age_keygen(&s.dir.join("control.age"));
    let local_ca = s.dir.join("ingress-ca/ca.crt");
    let https = free_port();
    let certs_port = free_port();
    let socket = host.socket.clone();
    let root = dir.path().to_owned();
    let s_dir = s.dir.clone();
    let operator = s.operator.clone();
    let viewer = s.viewer.clone();

    // Everything below runs inside the host's namespace.
    host.run(move || {
        let mut d = Daemon::start(&s, &cfg, api);
        d.wait_ready(Duration::from_secs(20));
        let (_, admin) = support::caddy_admin_address(&root.join("caddy-admin"));
        let caddy = support::spawn_caddy(&root.join("caddy"), &format!("{{\"admin\": {{\"listen\": \"{admin}\"}}}}"));
        let mut procs = KillGroups(vec![caddy]);
        let ca = std::fs::read_to_string(root.join("tls/ca.crt")).expect("ca");
        let token = d.enrolment_token("n1", &operator);
        pushleft_agent::enroll::enroll(
            &format!("https://localhost:{api}"),
            &support::ca_pin(&ca),
            "n1",
            &root.join("n1"),
            &token,
        )
        .expect("enrol");
        let agent_cfg = root.join("agent.toml");
        std::fs::write(
            &agent_cfg,
            format!(
                "control = \"https://localhost:{agent_api}\"\ndir = \"n1\"\ndocker_socket = {:?}\nsecrets_dir = \"secrets\"\nstate_dir = \"state\"\nheartbeat_seconds = 1\ndrift_seconds = 1\ncaddy_admin = \"{admin}\"\ningress_listen = [\"127.0.0.1:{http}\"]\ningress_upstreams = \"ingress\"\ningress_host_suffix = \".localhost\"\ningress_tls_listen = [\"127.0.0.1:{https}\"]\ningress_tls_dir = \"ingress-tls\"\ningress_certs_listen = \"127.0.0.1:{certs_port}\"\n",
                socket.display().to_string()
            ),
        )
        .expect("agent config");
        let log = root.join("agent.log");
        let start_agent = || support::spawn_agent(env!("CARGO_BIN_EXE_pl-agent"), &agent_cfg, &log);
        let agent = start_agent();
        let agent_pid = agent.id();
        procs.0.push(agent);

        // Release one: every step, every executor, and the hostname answers through Caddy over
        // HTTPS with the local CA's certificate; plain HTTP redirects there.
        let g1 = wait_done(&url, 0, &log);
        let (answer, first_leaf) = get(https, &local_ca).expect("https");
        assert_eq!(answer, (200, "release one".into()));
        let plain = tls_support::head_plain(http, LOCAL_NAME);
        assert!(plain.starts_with("HTTP/1.1 308"), "{plain}");
        assert_eq!(
            sql(&url, "SELECT hostname || ' ' || issuer || ' ' || CAST(issued AS TEXT) FROM certificates"),
            [format!("{HOSTNAME} local 1")]
        );
        // Its expiry in /metrics: 30 days ahead (the default lifetime), from what the ledger holds.
        let (code, metrics) = d.get("/metrics", None);
        assert_eq!(code, 200);
        let expiry: i64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("pushleft_certificate_expiry_timestamp_seconds{{hostname=\"{HOSTNAME}\"}} ")))
            .unwrap_or_else(|| panic!("no expiry in {metrics}"))
            .parse()
            .expect("seconds");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("now").as_secs() as i64;
        assert!((expiry - now - 30 * 86_400).abs() < 600, "{expiry} vs {now}");
        assert!(metrics.contains(&format!("pushleft_certificate_failures{{hostname=\"{HOSTNAME}\"}} 0")), "{metrics}");
        let (code, listed) = d.get("/v1/certificates", Some(&viewer));
        assert_eq!(code, 200, "{listed}");
        let listed: serde_json::Value = serde_json::from_str(&listed).expect("json");
        let first = &listed["certificates"][0];
        assert_eq!((first["hostname"].as_str(), first["state"].as_str(), first["issuer"].as_str()), (Some(HOSTNAME), Some("valid"), Some("local")));
        assert!(first.get("chain").is_none() && first.get("keySealed").is_none(), "{first}");
        let cp = support::control_plane(&url);
        let container = |g: i64| agent_proto::container_name(&cp, ENV, "web", Some(0), g as u64);
        let table = Command::new("nft").args(["list", "table", "inet", &format!("pl_{cp}_{ENV}_n1")]).output().expect("nft");
        assert!(table.status.success(), "the environment's table is in the host's namespace");
        let rules = String::from_utf8_lossy(&Command::new("ip").arg("rule").output().expect("ip").stdout).into_owned();
        assert!(rules.contains("from 10.208."), "the environment's rule: {rules}");
        // Service names: the web replica finds the cache by its role's name, through the
        // firewall, and reaches its port at that address.
        let cache = |g: i64| agent_proto::container_name(&cp, ENV, "cache", Some(0), g as u64);
        let cache_at = |g: i64| {
            host_support::docker_at(&socket, &["inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", &cache(g)])
        };
        assert_eq!(resolve(&socket, &container(g1), "cache"), [cache_at(g1)]);
        assert_eq!(resolve(&socket, &container(g1), &format!("cache.{ENV}.internal")), [cache_at(g1)]);
        // (By the address the name gave, over busybox nc: the static busybox's wget crashes
        // without glibc's name service modules.)
        let fetched = host_support::docker_at(
            &socket,
            &["exec", &container(g1), "/bin/busybox", "sh", "-c", &format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | /bin/busybox nc -w 5 {} 6379", cache_at(g1))],
        );
        assert!(fetched.starts_with("HTTP/1.") && fetched.ends_with("release one"), "{fetched}");
        // The cache serves 7000 too, which it did not declare: the environment's firewall
        // refuses it (from the web replica; inside the cache's own container it answers).
        let undeclared = host_support::docker_at(
            &socket,
            &["exec", &container(g1), "/bin/busybox", "sh", "-c", &format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | /bin/busybox nc -w 3 {} 7000", cache_at(g1))],
        );
        assert_eq!(undeclared, "", "an undeclared port is refused");
        let itself = host_support::docker_at(
            &socket,
            &["exec", &cache(g1), "/bin/busybox", "sh", "-c", "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | /bin/busybox nc -w 3 127.0.0.1 7000"],
        );
        assert!(itself.starts_with("HTTP/1."), "the cache does serve 7000: {itself}");

        // Release two, with the certificate due for renewal; the agent dies right after it
        // started the new container.
        sql(&url, "UPDATE certificates SET renew_after = 0");
        repo.write("projects/api.yaml", &project(&two));
        repo.commit("release two", true);
        let deadline = Instant::now() + Duration::from_secs(60);
        let started = loop {
            let state = host_support::docker_at(
                &socket,
                &["ps", "--filter", &format!("label=dev.pushleft.generation={}", g1 + 1), "--filter", "label=dev.pushleft.role=web", "--format", "{{.Names}}"],
            );
            if !state.is_empty() {
                break host_support::docker_at(&socket, &["inspect", "--format", "{{.Id}} {{.State.StartedAt}}", &state]);
            }
            assert!(Instant::now() < deadline, "the new container never started");
            std::thread::sleep(Duration::from_millis(20));
        };
        let _ = Command::new("kill").args(["-9", "--", &format!("-{agent_pid}")]).status();
        // The old release keeps serving while the agent is down.
        assert_eq!(get(https, &local_ca).map(|g| g.0), Some((200, "release one".into())));
        sql(&url, "UPDATE jobs SET lease_expires_at = 0 WHERE state = 'leased'");
        procs.0.push(start_agent());
        let g2 = wait_done(&url, g1, &log);
        assert_eq!(g2, g1 + 1);
        let after = host_support::docker_at(&socket, &["inspect", "--format", "{{.Id}} {{.State.StartedAt}}", &container(g2)]);
        assert_eq!(after, started, "the restarted agent adopted the very container");
        assert_eq!(
            sql(&url, &format!("SELECT CAST(attempts AS TEXT) FROM jobs WHERE key LIKE 'app:{ENV}/web/0:g{g2}:ensure%'")),
            ["2"],
            "the ensure task ran twice: killed, then replayed"
        );
        let (answer, second_leaf) = get(https, &local_ca).expect("https");
        assert_eq!(answer, (200, "release two".into()));
        // The name moved to the new generation (the restarted agent judged it), and only there.
        assert_eq!(resolve(&socket, &container(g2), "cache"), [cache_at(g2)]);
        assert_ne!(second_leaf, first_leaf, "the renewed certificate is the one shown");
        assert_eq!(
            sql(&url, "SELECT CAST(issued AS TEXT) FROM certificates"),
            ["2"],
            "issued once more, for the renewal"
        );
        // A renewal while nothing rolls out (a commit that changes no environment wakes the
        // check): the serving node publishes the hostname again, with the new certificate.
        sql(&url, "UPDATE certificates SET renew_after = 0");
        repo.write("NOTES.md", "renewal\n");
        repo.commit("a commit that changes no environment", true);
        let deadline = Instant::now() + Duration::from_secs(30);
        while sql(&url, &format!("SELECT state FROM jobs WHERE key LIKE 'ingress:{ENV}/{HOSTNAME}:g{g2}:publish#r%'")) != ["succeeded"] {
            assert!(Instant::now() < deadline, "no re-publish: {:?}", sql(&url, "SELECT key || ' ' || state FROM jobs ORDER BY id"));
            std::thread::sleep(Duration::from_millis(100));
        }
        let (answer, third_leaf) = get(https, &local_ca).expect("https");
        assert_eq!(answer, (200, "release two".into()));
        assert_ne!(third_leaf, second_leaf, "the certificate renewed in place is the one shown");
        let key = std::fs::read_to_string(s_dir.join("ingress-ca/ca.key")).expect("ca key");
        assert!(!std::fs::read_to_string(&log).unwrap_or_default().contains(key.lines().nth(1).unwrap_or("-")));
        assert_eq!(
            host_support::docker_at(&socket, &["inspect", "--format", "{{.State.Status}}", &container(g1)]),
            "paused",
            "the old generation is kept paused for a rollback"
        );
        d.kill9();
        drop(procs);
    });
    drop(host);
    assert_eq!(
        machine_state(),
        before,
        "the machine's own ruleset, rules and routes are unchanged"
    );
}
