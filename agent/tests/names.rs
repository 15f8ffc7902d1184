//! Service names against a real dockerd: two environments' networks and replicas made by the
//! Docker executors, the agent's name servers on their gateways, and lookups from inside the
//! containers through Docker's own resolver (busybox `nslookup`):
//! - `db` and `db.<environment>.internal` resolve, from another role's container, to the
//!   `db` replica; another environment cannot resolve them (not by name, not by asking the
//!   first environment's server directly);
//! - a replica still starting is not in the answer; a new generation takes the name once
//!   judged healthy, and only it; after a stop the old one is gone;
//! - a restarted agent (a new service) keeps answering for what runs;
//! - the same answers over TCP.

#[path = "support/docker.rs"]
mod docker_support;
mod support;

use agent_proto::{ApplicationSpec, NetworkSpec};
use docker_support::{Registry, clean, docker, require_dockerd};
use pushleft_agent::docker::Engine;
use pushleft_agent::names::server::NameService;
use std::net::Ipv4Addr;
use std::path::Path;

fn replica(env: &str, role: &str, image: &str, generation: u64, net: &NetworkSpec) -> ApplicationSpec {
    docker_support::web_replica(support::TEST_CONTROL_PLANE, env, role, 0, image, generation, net)
}

/// The addresses `name` resolves to inside `container` (busybox `nslookup`, through Docker's
/// resolver; 2 tries of at most a few seconds), or `server` asked directly.
fn lookup(container: &str, name: &str, server: Option<&str>) -> Vec<Ipv4Addr> {
    let mut args = vec![
        "exec",
        container,
        "/bin/busybox",
        "timeout",
        "5",
        "/bin/busybox",
        "nslookup",
        "-type=a",
        name,
    ];
    args.extend(server);
    let out = std::process::Command::new("docker")
        .args(&args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    support::nslookup_addresses(&out)
        .iter()
        .filter_map(|a| a.parse().ok())
        .collect()
}

/// The A records the server at `gateway`:53 gives for `name` over TCP (RFC 7766 framing),
/// asked from inside `container` (busybox `nc`; the query made and the answer read here).
fn ask_tcp(container: &str, gateway: &str, name: &str) -> Vec<Ipv4Addr> {
    use hickory_proto::op::{Message, Query};
    use hickory_proto::rr::{Name, RData, RecordType};
    let mut query = Message::query();
    query.add_query(Query::query(Name::from_ascii(name).expect("name"), RecordType::A));
    let bytes = query.to_vec().expect("query");
    let mut framed = u16::try_from(bytes.len()).expect("len").to_be_bytes().to_vec();
    framed.extend(bytes);
    let octal: String = framed.iter().map(|b| format!("\\{b:03o}")).collect();
    let script = format!("printf '{octal}' | /bin/busybox nc -w 3 {gateway} 53 | /bin/busybox od -An -v -tx1");
    let out = std::process::Command::new("docker")
        .args(["exec", container, "/bin/busybox", "sh", "-c", &script])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let reply: Vec<u8> = out
        .split_whitespace()
        .filter_map(|h| u8::from_str_radix(h, 16).ok())
        .collect();
    let Some(message) = reply.get(2..).and_then(|m| Message::from_vec(m).ok()) else {
        return Vec::new();
    };
    message
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect()
}

fn address(container: &str) -> Ipv4Addr {
    docker(&[
        "inspect",
        "--format",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
        container,
    ])
    .parse()
    .expect("address")
}

async fn engine(dir: &Path, identity: &Path) -> Engine {
    Engine::connect(
        Path::new("/var/run/docker.sock"),
        support::TEST_CONTROL_PLANE,
        "n1",
        dir.join("secrets"),
        identity.to_owned(),
        dir.join("state/images-pulled"),
    )
    .await
    .expect("docker")
}

#[test]
fn roles_find_each_other_by_name_within_their_environment_only() {
    require_dockerd();
    let registry = Registry::start();
    let image = registry.image("names", &[("/www/index.html", "hello\n"), ("/www/healthz", "ok\n")]);
    let (shop, blog) = ("pltest-names-shop".to_owned(), "pltest-names-blog".to_owned());
    clean(&shop);
    clean(&blog);
    // Whatever happens below, nothing of the test stays behind (its subnets are its own).
    struct Clean(Vec<String>);
    impl Drop for Clean {
        fn drop(&mut self) {
            self.0.iter().for_each(|e| clean(e));
        }
    }
    let _clean = Clean(vec![shop.clone(), blog.clone()]);
    let dir = tempfile::tempdir().expect("tempdir");
    let identity = dir.path().join("age.key");
    support::age_keygen(&identity);
    let rt = support::runtime();
    rt.block_on(async {
        let engine = engine(dir.path(), &identity).await;
        let net = |env: &str, n: u8| NetworkSpec {
            environment: env.into(),
            network: format!("pl_{env}"),
            subnet: format!("10.208.{n}.0/24"),
        };
        let (shop_net, blog_net) = (net(&shop, 241), net(&blog, 242));
        engine.ensure_network(&shop_net).await.expect("shop network");
        engine.ensure_network(&blog_net).await.expect("blog network");
        // No upstream: nothing this test asks leaves the machine.
        let names = NameService::new(None);
        let (web, db1) = (
            replica(&shop, "web", &image, 1, &shop_net),
            replica(&shop, "db", &image, 1, &shop_net),
        );
        let other = replica(&blog, "web", &image, 1, &blog_net);
        for app in [&web, &db1, &other] {
            engine.ensure_application(app).await.expect("replica");
            names.judge(&app.container);
        }
        names.refresh(&engine).await;

        let db1_at = address(&db1.container);
        assert_eq!(lookup(&web.container, "db", None), vec![db1_at]);
        assert_eq!(
            lookup(&web.container, &format!("db.{shop}.internal"), None),
            vec![db1_at]
        );
        // The other environment: neither name resolves there, and the shop's server does not
        // answer it when asked directly.
        assert!(lookup(&other.container, "db", None).is_empty());
        assert!(lookup(&other.container, &format!("db.{shop}.internal"), None).is_empty());
        assert!(lookup(&other.container, "db", Some("10.208.241.1")).is_empty());
        assert_eq!(lookup(&other.container, "web", None), vec![address(&other.container)]);

        // A second generation of db: not in the answer until judged, then alone in it.
        let db2 = replica(&shop, "db", &image, 2, &shop_net);
        engine.ensure_application(&db2).await.expect("g2");
        names.refresh(&engine).await;
        assert_eq!(lookup(&web.container, "db", None), vec![db1_at], "g2 is not judged yet");
        names.judge(&db2.container);
        names.refresh(&engine).await;
        let db2_at = address(&db2.container);
        assert_eq!(lookup(&web.container, "db", None), vec![db2_at]);
        // Over TCP too (what a client asks after a truncated answer).
        assert_eq!(
            ask_tcp(&web.container, "10.208.241.1", &format!("db.{shop}.internal")),
            vec![db2_at]
        );
        engine.stop_older(&shop, "db", 0, 2, false).await.expect("stop g1");
        names.refresh(&engine).await;
        assert_eq!(lookup(&web.container, "db", None), vec![db2_at]);

        // Paused (a backup of its volume pauses it for a moment) is not gone: a refresh during
        // the pause keeps its name, and it answers again once running (the example app's CI
        // failure: `db` stopped resolving after a backup).
        let docker = |args: &[&str]| {
            let o = std::process::Command::new("docker")
                .args(args)
                .output()
                .expect("docker");
            assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        };
        docker(&["pause", &db2.container]);
        names.refresh(&engine).await;
        docker(&["unpause", &db2.container]);
        names.refresh(&engine).await;
        assert_eq!(lookup(&web.container, "db", None), vec![db2_at], "after a pause");

        // A restarted agent: what runs keeps its names.
        drop(names);
        let names = NameService::new(None);
        names.refresh(&engine).await;
        assert_eq!(lookup(&web.container, "db", None), vec![db2_at]);
        assert_eq!(names.names_of(&shop).expect("shop").len(), 2);
    });
}
