//! A certificate switch at the ingress loses nothing: against a real Caddy on loopback, while 8
//! loops each open a new TLS connection per request and an upgraded (WebSocket-like) stream
//! stays open over HTTPS, a hostname's certificate is replaced ten times. Every request is
//! answered, the stream runs on, each new certificate is the one shown from the next
//! handshake, and Caddy's configuration is not touched (the certificate is a file its
//! handshakes fetch, `ingress/tls.rs`). A certificates server that is asked without the
//! control plane's token, or for a file outside the folder, answers nothing; a serving file
//! removed by hand fails handshakes until the drift repair puts it back.

#[path = "support/streams.rs"]
mod streams;
mod support;
#[path = "support/tls.rs"]
mod tls_support;

use pushleft_agent::ingress::Ingress;
use pushleft_agent::ingress::tls::TlsConfig;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

const HOST: &str = "shop.test";

/// A TLS connection to `port` for `HOST` that trusts `ca`.
fn tls_connect(port: u16, ca: &str) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(c.expect("pem")).expect("root");
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(HOST).expect("name");
    let conn = rustls::ClientConnection::new(Arc::new(config), name).expect("client");
    let tcp = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    rustls::StreamOwned::new(conn, tcp)
}

#[test]
fn a_certificate_switch_fails_no_request_and_keeps_an_open_stream() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stop = Arc::new(AtomicBool::new(false));
    let up = streams::memory_upstream(Arc::clone(&stop));
    let (socket, admin, mut caddy) = support::caddy_with_admin(&dir.path().join("caddy"));
    let (http, https) = (support::free_port(), support::free_port());
    let identity = dir.path().join("age.key");
    let recipient = support::age_keygen(&identity);
    let certs = dir.path().join("tls");
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
        identity,
        certs_listen: format!("127.0.0.1:{}", support::free_port()),
    })
    .expect("tls");
    let seal = |pem: &str| pushleft_secrets::encrypt(pem.as_bytes(), std::slice::from_ref(&recipient)).expect("seal");
    // Two certificates from two CAs; the clients trust both, and say which one they were shown.
    let issued: Vec<(String, String, String)> = (0..2).map(|_| tls_support::certificate(&[HOST])).collect();
    let both = format!("{}{}", issued[0].0, issued[1].0);
    let der = |pem: &str| {
        use rustls::pki_types::pem::PemObject;
        rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
            .expect("der")
            .to_vec()
    };
    let dial = vec![format!("127.0.0.1:{up}")];
    let publish = |generation: u64, which: usize| {
        let (_, chain, key) = &issued[which];
        let sealed = agent_proto::IngressTls {
            secret: "shop-cert".into(),
            cert: seal(chain),
            key: seal(key),
            hsts: false,
        };
        ingress
            .publish("shop", HOST, generation, &dial, Some(&sealed))
            .expect("publish")
    };
    publish(1, 0);
    support::wait_port(https);
    let (status, _, leaf) = tls_support::get_tls(https, HOST, &both).expect("https");
    assert_eq!((status, leaf == der(&issued[0].1)), (200, true));
    let config_before = support::caddy_admin(&socket, "GET", "/config/").expect("config").1;

    // An upgraded stream over HTTPS, counted line by line (for at most 20 s).
    let mut stream = tls_connect(https, &both);
    stream
        .write_all(streams::upgrade_request(HOST).as_bytes())
        .expect("upgrade");
    let (ticks, reader) = streams::count_ticks(stream, 20, 400);

    // 8 loops, a new TLS connection per request, at most 2,000 requests each.
    let done = Arc::new(AtomicBool::new(false));
    let (failed, served) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let loops: Vec<_> = (0..8)
        .map(|_| {
            let (done, failed, served, ca) = (
                Arc::clone(&done),
                Arc::clone(&failed),
                Arc::clone(&served),
                both.clone(),
            );
            std::thread::spawn(move || {
                for _ in 0..2_000 {
                    if done.load(Ordering::Relaxed) {
                        break;
                    }
                    match tls_support::get_tls(https, HOST, &ca) {
                        Ok((200, _, _)) => served.fetch_add(1, Ordering::Relaxed),
                        other => {
                            eprintln!("failed request: {other:?}");
                            failed.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let ticks_at_start = ticks.load(Ordering::SeqCst);
    for switch in 0..10u64 {
        let which = usize::from(switch % 2 == 0);
        let note = publish(switch + 2, which);
        // The next handshake shows the new certificate.
        let (status, _, leaf) = tls_support::get_tls(https, HOST, &both).expect("after the switch");
        assert_eq!(
            (status, leaf == der(&issued[which].1)),
            (200, true),
            "switch {switch}: {note}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(300));
    done.store(true, Ordering::Relaxed);
    for l in loops {
        l.join().expect("loop");
    }
    let (failed, served) = (failed.load(Ordering::Relaxed), served.load(Ordering::Relaxed));
    eprintln!("{served} requests across 10 certificate switches, {failed} failed");
    assert_eq!(failed, 0, "requests failed across the certificate switches");
    assert!(served > 100, "the loops ran: {served}");
    // The stream ran on through all of it.
    let ticks_after = ticks.load(Ordering::SeqCst);
    assert!(
        ticks_after > ticks_at_start + 10,
        "the stream stopped: {ticks_at_start} then {ticks_after}"
    );
    // Nothing of Caddy's configuration changed: no reload.
    let config_after = support::caddy_admin(&socket, "GET", "/config/").expect("config").1;
    assert_eq!(config_before, config_after);

    // The certificates server: nothing without the node's token, nothing outside the folder.
    let listen: serde_json::Value = serde_json::from_str(
        &support::caddy_admin(&socket, "GET", "/config/apps/http/servers/pushleft-certs/listen")
            .expect("listen")
            .1,
    )
    .expect("json");
    let port: u16 = listen[0]
        .as_str()
        .and_then(|l| l.rsplit_once(':'))
        .and_then(|(_, p)| p.parse().ok())
        .expect("port");
    let token = std::fs::read_to_string(certs.join(".0123abcd.token")).expect("token");
    let ask = |path: &str| support::get_host_path(port, "127.0.0.1", path).map(|(s, _)| s);
    assert_eq!(ask(&format!("/{token}/{HOST}/0123abcd.serving.pem")).ok(), Some(200));
    for refused in [
        format!("/{HOST}/0123abcd.serving.pem"),
        format!("/{}/{HOST}/0123abcd.serving.pem", "0".repeat(64)),
        format!("/{token}/../age.key"),
        format!("/{token}/%2e%2e/age.key"),
    ] {
        assert_ne!(ask(&refused).ok(), Some(200), "{refused}");
    }

    // A hostname without a certificate file gets no certificate at all (and Caddy orders
    // none: the manager never says "not mine").
    let serving = certs.join(HOST).join("0123abcd.serving.pem");
    std::fs::remove_file(&serving).expect("rm");
    assert!(tls_support::get_tls(https, HOST, &both).is_err());
    // The drift repair puts it back.
    let repaired = ingress.repair();
    assert_eq!(repaired.len(), 1, "{repaired:?}");
    assert!(repaired[0].1.contains("certificate"), "{repaired:?}");
    assert_eq!(tls_support::get_tls(https, HOST, &both).expect("back").0, 200);

    stop.store(true, Ordering::Relaxed);
    // The stream's reader ends with the upstream or its deadline; nothing waits for it.
    drop(reader);
    let _ = caddy.kill();
    let _ = caddy.wait();
}
