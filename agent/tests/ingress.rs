//! The ingress executor against a real Caddy (≥ 2.8, `scripts/test` installs 2.11 from PyPI)
//! on free loopback ports, with busybox httpd upstreams on loopback standing in for two
//! generations of a web replica, and a streaming upstream (an upgraded, WebSocket-like
//! connection, the kind Caddy closes on a reload) for another environment:
//! - a hostname answers 404 until it is published; a published route serves its upstream and
//!   is adopted when published again; another hostname is never disturbed;
//! - across a generation switch a sequential loop and 8 concurrent loops of requests see no
//!   error at all, and afterwards only the new generation answers;
//! - an open stream to environment A survives ten route changes of environment B (each a
//!   reload of Caddy's configuration) and A's own generation switch;
//! - a stale publish is refused, a remove of an older generation keeps the route, replicas
//!   scale within the slots, a route deleted by hand is put back by the drift repair, and a
//!   teardown removes the route.

#[path = "support/streams.rs"]
mod streams;
mod support;
#[path = "support/tls.rs"]
mod tls_support;

use pushleft_agent::ingress::Ingress;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

struct Kill(Vec<Child>);
impl Drop for Kill {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One request through Caddy for `host`, on a connection of its own.
fn get(port: u16, host: &str) -> Result<(u16, String), String> {
    support::get_host(port, host)
}

/// A streaming upstream on loopback: each connection gets `101 Switching Protocols` and then
/// a line every 50 ms, `ticks` of them (bounded), as a WebSocket server's frames would come.
fn streaming_upstream(ticks: usize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        for conn in listener.incoming().take(4) {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
                    if conn.read_exact(&mut byte).is_err() {
                        return;
                    }
                    head.push(byte[0]);
                }
                let _ = conn.write_all(
                    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
                );
                for i in 0..ticks {
                    if conn.write_all(format!("tick {i}\n").as_bytes()).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            });
        }
    });
    addr
}

/// Opens an upgraded stream through Caddy to `host`; a thread counts the lines it reads
/// (until the stream ends or 30 s pass).
fn open_stream(port: u16, host: &str) -> (Arc<AtomicUsize>, std::thread::JoinHandle<()>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    s.write_all(streams::upgrade_request(host).as_bytes()).expect("request");
    streams::count_ticks(s, 30, usize::MAX)
}

/// Caddy with its admin API on a unix socket in `dir`'s `caddy-admin` folder (0700): the
/// socket, the address the agent takes, and the process.
fn caddy(dir: &std::path::Path) -> (std::path::PathBuf, String, Child) {
    let version = Command::new("caddy")
        .arg("version")
        .output()
        .expect("caddy on PATH (scripts/test installs it)");
    let text = String::from_utf8_lossy(&version.stdout).to_string();
    let minor: u32 = text
        .strip_prefix("v2.")
        .and_then(|t| t.split('.').next())
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    assert!(
        minor >= 8,
        "Caddy {text} is older than 2.8; scripts/test puts 2.11 first on PATH"
    );
    support::caddy_with_admin(dir)
}

/// Runs `during` while one sequential loop and 8 concurrent ones (bounded in count and time)
/// request `host`; returns (failed, served) requests.
fn under_load(http: u16, host: &'static str, during: impl FnOnce()) -> (usize, usize) {
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(AtomicUsize::new(0));
    let served = Arc::new(AtomicUsize::new(0));
    let loops: Vec<_> = (0..9)
        .map(|_| {
            let (stop, failures, served) = (Arc::clone(&stop), Arc::clone(&failures), Arc::clone(&served));
            std::thread::spawn(move || {
                for _ in 0..2_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    match get(http, host) {
                        Ok((200, body)) if body.starts_with("generation") => {
                            served.fetch_add(1, Ordering::Relaxed);
                        }
                        other => {
                            eprintln!("failed request: {other:?}");
                            failures.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    during();
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    for l in loops {
        l.join().expect("loop");
    }
    (failures.load(Ordering::Relaxed), served.load(Ordering::Relaxed))
}

#[test]
fn routes_switch_generations_without_errors_and_keep_other_streams() {
    let dir = tempfile::tempdir().expect("tempdir");
    let http = support::free_port();
    let (socket, admin, caddy) = caddy(dir.path());
    let mut children = vec![caddy];
    let mut upstreams = Vec::new();
    for text in ["generation one", "generation two", "another app"] {
        let www = dir.path().join(text.replace(' ', "-"));
        std::fs::create_dir_all(&www).expect("www");
        std::fs::write(www.join("index.html"), format!("{text}\n")).expect("index");
        let port = support::free_port();
        children.push(
            Command::new("busybox")
                .args(["httpd", "-f", "-p", &format!("127.0.0.1:{port}"), "-h"])
                .arg(&www)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("httpd"),
        );
        upstreams.push((port, format!("127.0.0.1:{port}")));
    }
    let _kill = Kill(children);
    for (port, _) in &upstreams {
        support::wait_port(*port);
    }
    let dials: Vec<String> = upstreams.iter().map(|u| u.1.clone()).collect();
    let ingress = Ingress::new(
        &admin,
        vec![format!("127.0.0.1:{http}")],
        dir.path().join("upstreams"),
        "0123abcd_n1",
    )
    .expect("ingress");
    assert!(
        Ingress::new(&admin, Vec::new(), "relative/dir".into(), "n1").is_err(),
        "a relative upstream folder is refused"
    );
    assert!(
        Ingress::new("http://127.0.0.1:2019", Vec::new(), dir.path().join("upstreams"), "n1").is_err(),
        "an admin API on TCP is refused"
    );

    // Another hostname first; ours answers 404 until it is published.
    ingress
        .publish("web", "other.localhost", 1, &dials[2..3], None)
        .expect("other");
    support::wait_port(http);
    assert_eq!(get(http, "other.localhost"), Ok((200, "another app".into())));
    assert_eq!(get(http, "app.localhost").map(|r| r.0), Ok(404));
    let note = ingress
        .publish("web", "app.localhost", 1, &dials[0..1], None)
        .expect("g1");
    assert!(note.contains("published"), "{note}");
    assert_eq!(get(http, "app.localhost"), Ok((200, "generation one".into())));
    let note = ingress
        .publish("web", "app.localhost", 1, &dials[0..1], None)
        .expect("again");
    assert!(note.contains("adopted"), "{note}");

    // The switch, under load: it must fail no request.
    let (failures, served) = under_load(http, "app.localhost", || {
        let note = ingress
            .publish("web", "app.localhost", 2, &dials[1..2], None)
            .expect("g2");
        assert!(note.contains("switched"), "a switch reloads nothing: {note}");
        std::thread::sleep(Duration::from_millis(300));
        let note = ingress.remove("web", "app.localhost", 1).expect("older remove");
        assert!(
            note.contains("kept"),
            "a remove of an older generation keeps the route: {note}"
        );
    });
    assert_eq!(failures, 0, "requests failed during the switch");
    assert!(served > 100);
    for _ in 0..10 {
        assert_eq!(get(http, "app.localhost"), Ok((200, "generation two".into())));
    }
    assert_eq!(get(http, "other.localhost"), Ok((200, "another app".into())));

    // A stale publish (a retry of generation 1) cannot bring the old upstream back.
    let stale = ingress
        .publish("web", "app.localhost", 1, &dials[0..1], None)
        .expect_err("stale");
    assert_eq!(stale.code, "stale-generation");
    assert_eq!(get(http, "app.localhost"), Ok((200, "generation two".into())));

    // Replicas: two slots, then back to one (the spare slot repeats the live replica).
    ingress
        .publish("web", "app.localhost", 2, &dials[0..2], None)
        .expect("two replicas");
    let bodies: std::collections::BTreeSet<String> = (0..40)
        .filter_map(|_| get(http, "app.localhost").ok().map(|r| r.1))
        .collect();
    assert_eq!(bodies.len(), 2, "both replicas answer: {bodies:?}");
    let note = ingress
        .publish("web", "app.localhost", 2, &dials[1..2], None)
        .expect("one replica");
    assert!(note.contains("switched") && note.contains("12 slot"), "{note}");
    for _ in 0..20 {
        assert_eq!(get(http, "app.localhost"), Ok((200, "generation two".into())));
    }

    // Streams: environment A's stream stays open while environment B's routes change ten
    // times (each a new configuration in Caddy) and while A switches generation.
    let stream = streaming_upstream(60);
    ingress
        .publish("a", "a.localhost", 1, std::slice::from_ref(&stream), None)
        .expect("a");
    let (ticks, reader) = open_stream(http, "a.localhost");
    std::thread::sleep(Duration::from_millis(300));
    for i in 0..10 {
        let host = format!("b{}.localhost", i / 2);
        if i % 2 == 0 {
            assert!(
                ingress
                    .publish("b", &host, 1, &dials[2..3], None)
                    .expect("b")
                    .contains("published")
            );
            assert_eq!(get(http, &host), Ok((200, "another app".into())));
        } else {
            assert!(ingress.remove("web", &host, 2).expect("b goes").contains("removed"));
            assert_eq!(get(http, &host).map(|r| r.0), Ok(404));
        }
    }
    ingress
        .publish("web", "a.localhost", 2, &dials[0..1], None)
        .expect("a switches");
    assert_eq!(get(http, "a.localhost"), Ok((200, "generation one".into())));
    reader.join().expect("reader");
    assert_eq!(
        ticks.load(Ordering::SeqCst),
        60,
        "the stream to A ran to its end across B's ten changes and A's switch"
    );

    // Drift: the route deleted by hand (or lost with a Caddy restarted without its saved
    // configuration) is put back by the repair round, from the upstream files.
    assert!(ingress.repair().is_empty(), "nothing drifted yet");
    let deleted =
        support::caddy_admin(&socket, "DELETE", "/id/pl-host.0123abcd.app.localhost").expect("delete by hand");
    assert_eq!(deleted.0, 200);
    assert_eq!(get(http, "app.localhost").map(|r| r.0), Ok(404));
    // While a publish or removal of the hostname holds its lock (here the test), the repair
    // leaves it to that: what it read before the publish would undo the publish.
    let held = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("upstreams/app.localhost/lock"))
        .expect("the hostname's lock");
    held.lock().expect("lock");
    assert!(ingress.repair().is_empty(), "a held hostname is left alone");
    assert_eq!(get(http, "app.localhost").map(|r| r.0), Ok(404));
    drop(held);
    assert_eq!(
        ingress.repair(),
        vec![(
            "web".to_owned(),
            "ingress route pl-host.0123abcd.app.localhost put back".to_owned()
        )]
    );
    assert_eq!(get(http, "app.localhost"), Ok((200, "generation two".into())));
    assert!(ingress.repair().is_empty());

    // A teardown removes the route and its upstream files; the other hostname stays.
    assert!(
        ingress
            .remove("web", "app.localhost", 3)
            .expect("teardown")
            .contains("removed")
    );
    assert_eq!(get(http, "app.localhost").map(|r| r.0), Ok(404));
    assert!(
        ingress
            .remove("web", "app.localhost", 3)
            .expect("again")
            .contains("no route")
    );
    let left: Vec<_> = std::fs::read_dir(dir.path().join("upstreams/app.localhost"))
        .expect("folder")
        .map(|e| e.expect("entry").file_name())
        .collect();
    let mut left: Vec<String> = left.into_iter().map(|n| n.to_string_lossy().into_owned()).collect();
    left.sort();
    assert_eq!(left, ["lock", "nodes"], "only the lock and the node's list stay");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("upstreams/app.localhost/nodes/0123abcd_n1")).expect("list"),
        "3 web\n",
        "the list is the fence: generation 3 removed it, no upstream left"
    );

    // Two nodes on one machine share its Caddy: a replica moves from n1 to n2 under load.
    // n2's publish adds its upstream beside n1's, n1's removal leaves n2's alone (the route
    // stays), and no request fails; the last node's removal takes the route away.
    let n2 = Ingress::new(
        &admin,
        vec![format!("127.0.0.1:{http}")],
        dir.path().join("upstreams"),
        "0123abcd_n2",
    )
    .expect("n2");
    ingress
        .publish("m", "moving.localhost", 1, &dials[0..1], None)
        .expect("on n1");
    assert_eq!(get(http, "moving.localhost"), Ok((200, "generation one".into())));
    let (failures, served) = under_load(http, "moving.localhost", || {
        let note = n2
            .publish("m", "moving.localhost", 2, &dials[1..2], None)
            .expect("on n2");
        assert!(note.contains("switched"), "the second node reloads nothing: {note}");
        let bodies: std::collections::BTreeSet<String> = (0..40)
            .filter_map(|_| get(http, "moving.localhost").ok().map(|r| r.1))
            .collect();
        assert_eq!(bodies.len(), 2, "both nodes' replicas answer: {bodies:?}");
        let note = ingress.remove("m", "moving.localhost", 2).expect("off n1");
        assert!(note.contains("kept for the other nodes"), "{note}");
    });
    assert_eq!(failures, 0, "requests failed during the move");
    assert!(served > 100);
    for _ in 0..10 {
        assert_eq!(get(http, "moving.localhost"), Ok((200, "generation two".into())));
    }
    assert!(
        n2.remove("m", "moving.localhost", 2)
            .expect("off n2")
            .contains("removed")
    );
    assert_eq!(get(http, "moving.localhost").map(|r| r.0), Ok(404));
    assert_eq!(get(http, "other.localhost"), Ok((200, "another app".into())));
    assert_eq!(
        ingress
            .publish("web", "bad host", 4, &dials[0..1], None)
            .expect_err("bad")
            .code,
        "hostname-invalid"
    );

    // Another control plane on this machine (its own id, the same node name): a hostname ours
    // publishes is refused to it, and its removal leaves our route alone.
    let theirs = Ingress::new(
        &admin,
        vec![format!("127.0.0.1:{http}")],
        dir.path().join("upstreams"),
        "89abcdef_n1",
    )
    .expect("another control plane");
    ingress
        .publish("web", "shared.localhost", 1, &dials[0..1], None)
        .expect("ours");
    let taken = theirs
        .publish("web", "shared.localhost", 5, &dials[2..3], None)
        .expect_err("a hostname of another control plane");
    assert_eq!(taken.code, "hostname-taken", "{}", taken.detail);
    assert!(taken.detail.contains("0123abcd"), "{}", taken.detail);
    assert_eq!(get(http, "shared.localhost"), Ok((200, "generation one".into())));
    let left = theirs.remove("web", "shared.localhost", 6).expect("their removal");
    assert!(left.contains("left to control plane 0123abcd"), "{left}");
    for _ in 0..5 {
        assert_eq!(get(http, "shared.localhost"), Ok((200, "generation one".into())));
    }
    assert!(
        ingress
            .remove("web", "shared.localhost", 2)
            .expect("ours goes")
            .contains("removed")
    );
    assert_eq!(get(http, "shared.localhost").map(|r| r.0), Ok(404));

    // A hostname spelled like a built-in route (the review's `fallback-404` replaced the
    // catch-all, and unknown hostnames got an empty 200): its route has an id of its own.
    ingress
        .publish("web", "fallback-404", 1, &dials[2..3], None)
        .expect("a hostname like the fallback's id");
    assert_eq!(get(http, "fallback-404"), Ok((200, "another app".into())));
    assert_eq!(
        get(http, "nobody-publishes.localhost").map(|r| r.0),
        Ok(404),
        "the catch-all stands"
    );
    let fallback =
        support::caddy_admin(&socket, "GET", &format!("/id/{}", pushleft_agent::ingress::FALLBACK)).expect("admin");
    assert!(fallback.1.contains("static_response"), "{fallback:?}");

    // Caddy's admin API is a unix socket in a folder only this user opens: a local user
    // (`nobody`) cannot reach it, not even with the folder above it open to all.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    assert_eq!(
        support::as_nobody(&["unix", &socket.display().to_string()]),
        "denied",
        "a local user reaches Caddy's admin API"
    );
    assert_eq!(
        support::as_nobody(&["tcp", &http.to_string()]),
        "404",
        "the same user reaches the ingress port (the test is not vacuous)"
    );
    // A folder opened to others by mistake: the agent stops using the socket, with a code.
    let folder = socket.parent().expect("folder");
    std::fs::set_permissions(folder, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    assert_eq!(
        ingress
            .publish("web", "app.localhost", 9, &dials[0..1], None)
            .expect_err("exposed")
            .code,
        "caddy-admin-exposed"
    );
    std::fs::set_permissions(folder, std::fs::Permissions::from_mode(0o700)).expect("chmod");
}

/// busybox httpd on a free loopback port serving `index` from `<dir>/www`: (port, process).
fn httpd(dir: &std::path::Path, index: &str) -> (u16, Child) {
    let www = dir.join("www");
    std::fs::create_dir_all(&www).expect("www");
    std::fs::write(www.join("index.html"), index).expect("index");
    let port = support::free_port();
    let child = Command::new("busybox")
        .args(["httpd", "-f", "-p", &format!("127.0.0.1:{port}"), "-h"])
        .arg(&www)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("httpd");
    (port, child)
}

fn der_of(pem: &str) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .expect("pem")
        .to_vec()
}

/// HTTPS with certificates people bring: a published hostname with a sealed certificate is
/// served over HTTPS with it (checked by a client that trusts only its CA), plain HTTP answers
/// a permanent redirect, HSTS only when asked; the key is in a 0600 file and nowhere in Caddy's
/// configuration; a new certificate replaces the old one (its files go); an unusable one (another
/// name, a key of another certificate) changes nothing; a route deleted by hand comes back;
/// back to plain HTTP, then a removal, leave nothing of it.
#[test]
fn brought_certificates_serve_https_and_redirect_plain_http() {
    use pushleft_agent::ingress::tls::TlsConfig;
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let (http, https) = (support::free_port(), support::free_port());
    let (socket, admin, caddy) = caddy(dir.path());
    let (port, httpd) = httpd(dir.path(), "generation one\n");
    let _kill = Kill(vec![caddy, httpd]);
    support::wait_port(port);
    let dial = vec![format!("127.0.0.1:{port}")];
    let identity = dir.path().join("age.key");
    let recipient = support::age_keygen(&identity);
    let certs = dir.path().join("tls");
    // One certificates server per Caddy: every agent sharing it says the same address.
    let certs_listen = format!("127.0.0.1:{}", support::free_port());
    let ingress = Ingress::new(
        &admin,
        vec![format!("127.0.0.1:{http}")],
        dir.path().join("upstreams"),
        "0123abcd_n1",
    )
    .expect("ingress")
    .with_tls(TlsConfig {
        listen: vec![format!("127.0.0.1:{https}")],
        dir: certs.clone(),
        identity: identity.clone(),
        certs_listen: certs_listen.clone(),
    })
    .expect("tls");
    let seal = |pem: &str| pushleft_secrets::encrypt(pem.as_bytes(), std::slice::from_ref(&recipient)).expect("seal");
    let sealed = |chain: &str, key: &str, hsts: bool| agent_proto::IngressTls {
        secret: "shop-cert".into(),
        cert: seal(chain),
        key: seal(key),
        hsts,
    };
    let host = "secure.shop.test";

    // Served over HTTPS with the brought certificate; plain HTTP redirects; no HSTS.
    let (ca1, chain1, key1) = tls_support::certificate(&["*.shop.test"]);
    let note = ingress
        .publish("shop", host, 1, &dial, Some(&sealed(&chain1, &key1, false)))
        .expect("publish over https");
    assert!(note.contains("over HTTPS"), "{note}");
    support::wait_port(https);
    let (status, text, leaf) = tls_support::get_tls(https, host, &ca1).expect("https");
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("generation one"), "{text}");
    assert_eq!(leaf, der_of(&chain1), "the brought certificate is the one shown");
    assert!(
        !text.to_ascii_lowercase().contains("strict-transport-security"),
        "{text}"
    );
    let plain = tls_support::head_plain(http, host);
    assert!(plain.starts_with("HTTP/1.1 308"), "{plain}");
    assert!(
        plain.contains(&format!("Location: https://{host}:{https}/path?q=1")),
        "{plain}"
    );
    // The key: a 0600 file, in no configuration Caddy keeps or answers.
    let config = support::caddy_admin(&socket, "GET", "/config/").expect("config").1;
    let key_body: String = key1.lines().nth(1).expect("key line").to_owned();
    assert!(
        !config.contains("PRIVATE KEY") && !config.contains(&key_body),
        "{config}"
    );
    let key_files: Vec<_> = std::fs::read_dir(certs.join(host).join("0123abcd_n1"))
        .expect("cert folder")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "key"))
        .collect();
    assert_eq!(key_files.len(), 1, "{key_files:?}");
    let mode = std::fs::metadata(&key_files[0]).expect("key").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    // Unusable certificates are refused before anything changes.
    let (_, other_chain, other_key) = tls_support::certificate(&["other.example"]);
    let f = ingress
        .publish("shop", host, 2, &dial, Some(&sealed(&other_chain, &other_key, false)))
        .expect_err("another name");
    assert_eq!(f.code, "tls-certificate-invalid");
    assert!(f.detail.contains("does not name secure.shop.test"), "{}", f.detail);
    let f = ingress
        .publish("shop", host, 2, &dial, Some(&sealed(&chain1, &other_key, false)))
        .expect_err("a key of another certificate");
    assert_eq!(f.code, "tls-certificate-invalid");
    assert!(!f.detail.contains("PRIVATE"), "{}", f.detail);
    assert_eq!(
        tls_support::get_tls(https, host, &ca1).expect("still").2,
        der_of(&chain1)
    );

    // A new certificate with HSTS: shown at once; the old files go. (It is a reload of
    // Caddy's configuration: see docs/agent.md, "HTTPS", for what a reload costs.)
    let (ca2, chain2, key2) = tls_support::certificate(&[host]);
    ingress
        .publish("shop", host, 2, &dial, Some(&sealed(&chain2, &key2, true)))
        .expect("renewed");
    let (status, text, leaf) = tls_support::get_tls(https, host, &ca2).expect("https after the change");
    assert_eq!((status, leaf == der_of(&chain2)), (200, true), "{text}");
    assert!(text.contains("Strict-Transport-Security: max-age=31536000"), "{text}");
    let files = std::fs::read_dir(certs.join(host).join("0123abcd_n1"))
        .expect("folder")
        .count();
    assert_eq!(files, 2, "one certificate and one key are kept");
    let serving = certs.join(host).join("0123abcd.serving.pem");
    let mode = std::fs::metadata(&serving).expect("serving.pem").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    // Drift: the HTTPS route deleted by hand is put back.
    let id = pushleft_agent::ingress::tls::https_route_id("0123abcd", host);
    assert_eq!(
        support::caddy_admin(&socket, "DELETE", &format!("/id/{id}"))
            .expect("delete")
            .0,
        200
    );
    assert_eq!(tls_support::get_tls(https, host, &ca2).expect("404 now").0, 404);
    let repaired = ingress.repair();
    assert_eq!(repaired.len(), 1, "{repaired:?}");
    assert_eq!(tls_support::get_tls(https, host, &ca2).expect("back").0, 200);

    // Plain HTTP again: served there, the HTTPS route, the certificate and its files gone.
    ingress.publish("shop", host, 3, &dial, None).expect("plain");
    assert_eq!(get(http, host).expect("plain").0, 200);
    assert!(
        tls_support::get_tls(https, host, &ca2).is_err()
            || tls_support::get_tls(https, host, &ca2).expect("tls").0 == 404
    );
    let config = support::caddy_admin(&socket, "GET", "/config/").expect("config").1;
    assert!(
        !config.contains("pl-cert.") && !config.contains("pl-certpolicy.") && !config.contains("pl-https."),
        "{config}"
    );
    assert!(!certs.join(host).join("0123abcd_n1").exists());

    // Another control plane's agent on the same Caddy (same node name) serves its own hostname
    // over HTTPS beside ours, with its own certificate; ours is refused to it, and its
    // removal leaves ours serving.
    ingress
        .publish("shop", host, 4, &dial, Some(&sealed(&chain2, &key2, false)))
        .expect("https again");
    let theirs = Ingress::new(
        &admin,
        vec![format!("127.0.0.1:{http}")],
        dir.path().join("upstreams"),
        "89abcdef_n1",
    )
    .expect("their ingress")
    .with_tls(TlsConfig {
        listen: vec![format!("127.0.0.1:{https}")],
        dir: certs.clone(),
        identity: identity.clone(),
        certs_listen: certs_listen.clone(),
    })
    .expect("tls");
    let other_host = "other.shop.test";
    let (ca3, chain3, key3) = tls_support::certificate(&["*.shop.test"]);
    assert_eq!(
        theirs
            .publish("theirs", host, 1, &dial, Some(&sealed(&chain3, &key3, false)))
            .expect_err("our hostname")
            .code,
        "hostname-taken"
    );
    theirs
        .publish("theirs", other_host, 1, &dial, Some(&sealed(&chain3, &key3, false)))
        .expect("their hostname");
    assert_eq!(tls_support::get_tls(https, other_host, &ca3).expect("theirs").0, 200);
    assert_eq!(tls_support::get_tls(https, host, &ca2).expect("ours").0, 200);
    theirs.remove("theirs", other_host, 2).expect("their removal");
    assert_eq!(tls_support::get_tls(https, host, &ca2).expect("ours still").0, 200);
    assert!(tls_support::get_tls(https, other_host, &ca3).is_err(), "theirs is gone");

    // The removal takes all of ours.
    ingress.remove("shop", host, 5).expect("remove");
    let config = support::caddy_admin(&socket, "GET", "/config/").expect("config").1;
    assert!(
        !config.contains("pl-cert.")
            && !config.contains("pl-certpolicy.")
            && !config.contains("pl-https.")
            && !config.contains("pl-host."),
        "{config}"
    );
    assert!(!certs.join(host).join("0123abcd_n1").exists());
}

/// ACME HTTP-01 challenges (`ingress/acme.rs`): a placed challenge is answered over plain HTTP
/// for a hostname not published yet and for one published (behind an HTTPS redirect too:
/// `host.rs`), without a reload for the second; other paths still reach the application; a
/// malformed token is refused before anything is written; another control plane sharing the
/// Caddy keeps its challenges in its own folder and route.
#[test]
fn acme_challenges_are_answered_for_published_and_unpublished_hostnames() {
    let dir = tempfile::tempdir().expect("tempdir");
    let http = support::free_port();
    let (socket, admin, caddy) = caddy(dir.path());
    let (port, httpd) = httpd(dir.path(), "the application\n");
    let _kill = Kill(vec![caddy, httpd]);
    support::wait_port(port);
    let ingress = |plane: &str| {
        Ingress::new(
            &admin,
            vec![format!("127.0.0.1:{http}")],
            dir.path().join(format!("upstreams-{plane}")),
            &format!("{plane}_n1"),
        )
        .expect("ingress")
    };
    let (ours, theirs) = (ingress("0123abcd"), ingress("4567cdef"));
    let token = |n: char| std::iter::repeat_n(n, 43).collect::<String>();
    let key = |t: &str| format!("{t}.{}", "Thumbprint_of-the-account-key-0123456789ab");
    let challenge =
        |host: &str, t: &str| support::get_host_path(http, host, &format!("/.well-known/acme-challenge/{t}"));

    // Not published: the control plane's own challenge route answers.
    let (t1, host) = (token('a'), "new.shop.test");
    let note = ours.place_challenge(host, &t1, &key(&t1)).expect("placed");
    assert!(note.contains("answered"), "{note}");
    assert_eq!(challenge(host, &t1).expect("answered"), (200, key(&t1)));
    // Another control plane's challenge goes to its own folder and route.
    let t2 = token('b');
    theirs
        .place_challenge("their.shop.test", &t2, &key(&t2))
        .expect("theirs");
    let config = support::caddy_admin(&socket, "GET", "/config/").expect("config").1;
    assert!(
        config.contains("pl-acme.0123abcd") && config.contains("pl-acme.4567cdef"),
        "{config}"
    );
    assert!(
        std::fs::read_dir(dir.path().join("upstreams-0123abcd/.acme/.well-known/acme-challenge"))
            .expect("folder")
            .flatten()
            .all(|e| e.file_name() != t2.as_str()),
        "their token is in their folder only"
    );

    // Published: the route's own handler answers first, and the application still answers.
    let dial = vec![format!("127.0.0.1:{port}")];
    ours.publish("shop", host, 1, &dial, None).expect("publish");
    assert_eq!(challenge(host, &t1).expect("answered"), (200, key(&t1)));
    let (status, body) = get(http, host).expect("the application");
    assert_eq!((status, body.contains("the application")), (200, true), "{body}");
    let before = support::caddy_admin(&socket, "GET", "/config/").expect("config").1;
    let t3 = token('c');
    ours.place_challenge(host, &t3, &key(&t3)).expect("placed again");
    assert_eq!(challenge(host, &t3).expect("answered"), (200, key(&t3)));
    assert_eq!(
        support::caddy_admin(&socket, "GET", "/config/").expect("config").1,
        before,
        "a challenge is a file: Caddy's configuration is unchanged"
    );
    // An unknown token on a published hostname goes to the application (its 404), not ours.
    assert_eq!(challenge(host, &token('d')).expect("asked").0, 404);

    // Refused before anything is written.
    for (t, k) in [
        ("../../etc/passwd".to_owned(), "x.y".to_owned()),
        (t1.clone(), format!("{}.{}", token('e'), "x".repeat(43))),
        ("short".to_owned(), "short.x".to_owned()),
    ] {
        let f = ours.place_challenge(host, &t, &k).expect_err("refused");
        assert_eq!(f.code, "acme-challenge-invalid", "{t}");
    }
}

/// Placements for several hostnames at once (the control plane enqueues one per hostname) all
/// succeed: the first adds the challenge route and the others find it, none is refused by
/// Caddy as a duplicate `@id`.
#[test]
fn acme_challenges_placed_side_by_side_add_one_route() {
    let dir = tempfile::tempdir().expect("tempdir");
    let http = support::free_port();
    let (socket, admin, caddy) = caddy(dir.path());
    let _kill = Kill(vec![caddy]);
    let ingress = Ingress::new(
        &admin,
        vec![format!("127.0.0.1:{http}")],
        dir.path().join("upstreams"),
        "0123abcd_n1",
    )
    .expect("ingress");
    let key = |t: &str| format!("{t}.{}", "Thumbprint_of-the-account-key-0123456789ab");
    let tokens: Vec<String> = "abcdefghijklmnop"
        .chars()
        .map(|c| std::iter::repeat_n(c, 43).collect())
        .collect();
    let start = std::sync::Barrier::new(tokens.len());
    std::thread::scope(|s| {
        let placed: Vec<_> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let (ingress, start, key) = (&ingress, &start, &key);
                s.spawn(move || {
                    start.wait();
                    ingress.place_challenge(&format!("h{i}.shop.test"), t, &key(t))
                })
            })
            .collect();
        for (i, p) in placed.into_iter().enumerate() {
            let outcome = p.join().expect("thread");
            assert!(outcome.is_ok(), "placement {i}: {outcome:?}");
        }
    });
    let config = support::caddy_admin(&socket, "GET", "/config/").expect("config").1;
    assert_eq!(config.matches("pl-acme.0123abcd").count(), 1, "{config}");
}

/// Ten hostnames published over HTTPS at once on a Caddy that has no certificate list yet:
/// each succeeds and each certificate entry is kept (making the list is one step under the
/// server lock; before, two publishes that both found it missing each made it, the second
/// dropping the first's entry, and that publish failed with `ingress-readback-mismatch`).
#[test]
fn https_publishes_side_by_side_each_keep_their_certificate() {
    use pushleft_agent::ingress::tls::TlsConfig;
    let dir = tempfile::tempdir().expect("tempdir");
    let (http, https) = (support::free_port(), support::free_port());
    let (socket, admin, caddy) = caddy(dir.path());
    let (port, httpd) = httpd(dir.path(), "side by side\n");
    let _kill = Kill(vec![caddy, httpd]);
    support::wait_port(port);
    let dial = vec![format!("127.0.0.1:{port}")];
    let identity = dir.path().join("age.key");
    let recipient = support::age_keygen(&identity);
    let ingress = Ingress::new(
        &admin,
        vec![format!("127.0.0.1:{http}")],
        dir.path().join("upstreams"),
        "0123abcd_n1",
    )
    .expect("ingress")
    .with_tls(TlsConfig {
        listen: vec![format!("127.0.0.1:{https}")],
        dir: dir.path().join("tls"),
        identity,
        certs_listen: format!("127.0.0.1:{}", support::free_port()),
    })
    .expect("tls");
    let seal = |pem: &str| pushleft_secrets::encrypt(pem.as_bytes(), std::slice::from_ref(&recipient)).expect("seal");
    let (ca, chain, key) = tls_support::certificate(&["*.shop.test"]);
    let sealed = agent_proto::IngressTls {
        secret: "shop-cert".into(),
        cert: seal(&chain),
        key: seal(&key),
        hsts: false,
    };
    let hosts: Vec<String> = (0..10).map(|i| format!("h{i}.shop.test")).collect();
    let start = std::sync::Barrier::new(hosts.len());
    std::thread::scope(|s| {
        let published: Vec<_> = hosts
            .iter()
            .map(|h| {
                let (ingress, start, dial, sealed) = (&ingress, &start, &dial, &sealed);
                s.spawn(move || {
                    start.wait();
                    ingress.publish("shop", h, 1, dial, Some(sealed))
                })
            })
            .collect();
        for (h, p) in hosts.iter().zip(published) {
            let outcome = p.join().expect("thread");
            assert!(outcome.is_ok(), "{h}: {outcome:?}");
        }
    });
    let config = support::caddy_admin(&socket, "GET", "/config/apps/tls/automation/policies")
        .expect("config")
        .1;
    let entries: serde_json::Value = serde_json::from_str(&config).expect("json");
    assert_eq!(entries.as_array().map(Vec::len), Some(hosts.len()), "{config}");
    support::wait_port(https);
    for h in &hosts {
        let (status, text, _) = tls_support::get_tls(https, h, &ca).expect("https");
        assert_eq!(status, 200, "{h}: {text}");
    }
}

/// How many of `host`'s slot files point at `dial`.
fn slots_at(dir: &std::path::Path, host: &str, dial: &str) -> usize {
    (0..12)
        .filter(|k| {
            std::fs::read_to_string(dir.join("upstreams").join(host).join(k.to_string()))
                .ok()
                .as_deref()
                == Some(dial)
        })
        .count()
}

#[test]
fn a_canary_shares_requests_by_weight_and_its_steps_and_switch_lose_none() {
    use pushleft_agent::ingress::Share;
    let dir = tempfile::tempdir().expect("tempdir");
    let http = support::free_port();
    let (_socket, admin, caddy) = caddy(dir.path());
    let mut children = vec![caddy];
    let mut dials = Vec::new();
    for text in ["generation one", "generation two"] {
        let (child, dial) = support::text_server(dir.path(), text);
        children.push(child);
        dials.push(dial);
    }
    let _kill = Kill(children);
    let ingress = Ingress::new(
        &admin,
        vec![format!("127.0.0.1:{http}")],
        dir.path().join("upstreams"),
        "0123abcd_n1",
    )
    .expect("ingress");
    let host = "canary.localhost";
    let count_two = |n: usize| {
        (0..n)
            .filter(|_| get(http, host).expect("request").1 == "generation two")
            .count()
    };

    // A canary with nothing published before is published whole.
    let note = ingress
        .publish_share("web", "first.localhost", 1, &dials[1..2], None, Share::Canary(10))
        .expect("first");
    assert!(note.contains("whole: no earlier release"), "{note}");

    ingress.publish("web", host, 1, &dials[0..1], None).expect("g1");
    support::wait_port(http);
    assert_eq!(count_two(20), 0);

    // 25%: 3 of the 12 slots, under load with no failed request.
    let mut note = String::new();
    let (failed, served) = under_load(http, "canary.localhost", || {
        note = ingress
            .publish_share("web", host, 2, &dials[1..2], None, Share::Canary(25))
            .expect("canary 25");
    });
    assert_eq!(failed, 0, "{served} served");
    assert!(
        note.contains("a canary at 25%") && note.contains("on 3 of 12 slot(s)"),
        "{note}"
    );
    assert_eq!(slots_at(dir.path(), host, &dials[1]), 3);
    assert_eq!(slots_at(dir.path(), host, &dials[0]), 9);
    // 200 requests at p = 0.25: 50 expected, and [25, 80] holds with overwhelming odds.
    let two = count_two(200);
    assert!((25..=80).contains(&two), "{two} of 200 to the canary at 25%");

    // The next step, a repaired replica's publish (the share stays), then the switch.
    ingress
        .publish_share("web", host, 2, &dials[1..2], None, Share::Canary(50))
        .expect("canary 50");
    assert_eq!(slots_at(dir.path(), host, &dials[1]), 6);
    let note = ingress
        .publish_share("web", host, 2, &dials[1..2], None, Share::Repair)
        .expect("repair");
    assert!(note.contains("a canary at 50%"), "{note}");
    assert_eq!(slots_at(dir.path(), host, &dials[1]), 6);
    let err = ingress
        .publish("web", host, 1, &dials[0..1], None)
        .expect_err("the old generation's publish is stale");
    assert_eq!(err.code, "stale-generation");
    let (failed, _) = under_load(http, "canary.localhost", || {
        ingress.publish("web", host, 2, &dials[1..2], None).expect("switch");
    });
    assert_eq!(failed, 0);
    assert_eq!(slots_at(dir.path(), host, &dials[1]), 12);
    assert_eq!(count_two(30), 30);

    // A canary of generation 3 keeps generation 2 as the old release; a rollback's generation
    // (published whole) takes every request back.
    ingress
        .publish_share("web", host, 3, &dials[0..1], None, Share::Canary(10))
        .expect("canary of 3");
    assert_eq!(slots_at(dir.path(), host, &dials[0]), 1);
    ingress.publish("web", host, 4, &dials[1..2], None).expect("back");
    assert_eq!(count_two(30), 30);
}

/// An upstream on loopback that answers every request `500` (at most 2,000 connections).
fn failing_upstream() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        for conn in listener.incoming().take(2_000) {
            let Ok(mut conn) = conn else { continue };
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(
                b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 6\r\nConnection: close\r\n\r\nbroken",
            );
        }
    });
    addr
}

#[test]
fn a_canary_measure_reports_the_new_release_s_errors_as_the_ingress_measured_them_and_the_gates_judge_it() {
    use pushleft_agent::ingress::Share;
    use state_schema::model::CanaryGate;
    use state_schema::rollout::advance::{GateVerdict, Measured, verdict};
    let dir = tempfile::tempdir().expect("tempdir");
    let http = support::free_port();
    let (socket, admin, caddy) = caddy(dir.path());
    let mut children = vec![caddy];
    let mut dials = Vec::new();
    for text in ["generation one", "generation two"] {
        let (child, dial) = support::text_server(dir.path(), text);
        children.push(child);
        dials.push(dial);
    }
    let _kill = Kill(children);
    let broken = failing_upstream();
    let ingress = Ingress::new(
        &admin,
        vec![format!("127.0.0.1:{http}")],
        dir.path().join("upstreams"),
        "0123abcd_n1",
    )
    .expect("ingress");
    let host = "gated.localhost";
    let gate = CanaryGate {
        max_error_percent: Some(5),
        max_p95_ms: None,
        min_requests: 10,
    };
    // What the control plane judges, from the agent's report.
    let judged = |m: agent_proto::CanaryMeasure| {
        verdict(
            &gate,
            &[Measured {
                requests: m.requests,
                errors: m.errors,
                p95_micros: m.p95_micros,
                logged: m.logged,
            }],
        )
    };
    let requests = |n: usize| {
        for _ in 0..n {
            let _ = get(http, host);
        }
    };
    ingress.publish("web", host, 1, &dials[0..1], None).expect("g1");
    support::wait_port(http);
    let (note, m) = ingress.measure_canary(host, 1).expect("measure");
    assert!(note.contains("no canary of generation 1") && m.requests == 0, "{note}");

    // A canary of a release that answers 500: half the requests fail; its measure says so,
    // the gate fails on it, and the measure changed nothing.
    ingress
        .publish_share("web", host, 2, std::slice::from_ref(&broken), None, Share::Canary(50))
        .expect("canary 50");
    let logger = support::caddy_admin(&socket, "GET", "/config/logging/logs/pl-proxy").expect("admin");
    assert!(logger.1.contains("http.handlers.reverse_proxy"), "{logger:?}");
    // The share is drawn at random per request: 80 at 50 % bring the canary 40 on average
    // and fewer than 10 about once in 10^11 runs (40 left about 1 run in 100 under 10).
    requests(80);
    std::thread::sleep(Duration::from_millis(300));
    let (note, m) = ingress.measure_canary(host, 2).expect("measure");
    assert!(m.logged && m.requests >= 10 && m.errors == m.requests, "{m:?} {note}");
    assert!(note.contains("since its 50% share"), "{note}");
    let v = judged(m);
    assert!(matches!(v, GateVerdict::Failed { .. }), "{v:?}");
    assert!(v.words().ends_with("over maxErrorPercent 5"), "{}", v.words());
    assert_eq!(slots_at(dir.path(), host, &broken), 6, "the shares stay as they were");

    // A healthy release passes the same gate.
    ingress.publish("web", host, 3, &dials[0..1], None).expect("back");
    ingress
        .publish_share("web", host, 4, &dials[1..2], None, Share::Canary(50))
        .expect("canary 50");
    requests(80);
    std::thread::sleep(Duration::from_millis(300));
    let (_, m) = ingress.measure_canary(host, 4).expect("measure");
    assert!(m.requests >= 10 && m.errors == 0, "{m:?}");
    assert!(
        judged(m).words().starts_with("gates passed: 0 of"),
        "{}",
        judged(m).words()
    );
    ingress
        .publish_share("web", host, 4, &dials[1..2], None, Share::Canary(90))
        .expect("the next share");
    assert_eq!(slots_at(dir.path(), host, &dials[1]), 11);
}
