//! The API under load and abuse, against `pl-reconciler run` as a real process: a flood of idle
//! connections with the open-file limit at systemd's default does not stop the daemon, many
//! event streams of one viewer do not delay a commit, streams past their limit are refused with
//! `429 too-many-streams`, and an unconfigured webhook is answered before its body is read.
//! Every connection goes to loopback; every loop is bounded in count and time.

#[path = "support/daemon.rs"]
mod daemon_support;
#[path = "support/repo.rs"]
mod repo_support;

use daemon_support::{Daemon, config, free_port, setup};
use reconciler::store::Ledger;
use reconciler::store::now_ms;
use repo_support::{Repo, environment, project};
use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Waits (at most `within`) until node n1 can lease a job; returns how long that took.
async fn leasable_within(ledger: &Ledger, within: Duration) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < within {
        if !ledger
            .jobs()
            .lease("n1", 1, 30_000, now_ms())
            .await
            .expect("lease")
            .is_empty()
        {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

struct World {
    _dir: tempfile::TempDir,
    repo: Repo,
    daemon: Daemon,
    ledger: Ledger,
    viewer: String,
    operator: String,
}

async fn world(extra: &str, nofile: Option<u64>) -> World {
    world_with(extra, nofile, 2).await
}

async fn world_with(extra: &str, nofile: Option<u64>, interval_seconds: u64) -> World {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    std::fs::write(dir.path().join("allowed_signers"), &repo.signers).expect("signers");
    repo.write("projects/api.yaml", &project("api", 1));
    repo.commit("pool and project", true);
    let s = setup(dir.path());
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let port = free_port();
    let cfg = config(&s, "d", &repo.dir, &url, port, "");
    // Limits go in the [api] table, which `config` writes last.
    let text = std::fs::read_to_string(&cfg).expect("config");
    let text = text.replace("[api]\n", &format!("[api]\n{extra}")).replace(
        "interval_seconds = 2\n",
        &format!("interval_seconds = {interval_seconds}\n"),
    );
    std::fs::write(&cfg, text).expect("config");
    let mut daemon = Daemon::start_with(&s, &cfg, port, nofile);
    daemon.wait_ready(Duration::from_secs(20));
    let ledger = Ledger::connect(&url, 2).await.expect("ledger");
    World {
        _dir: dir,
        repo,
        daemon,
        ledger,
        viewer: s.viewer,
        operator: s.operator,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_the_last_pass_values_and_cost_no_query() {
    // Passes only on a hint: the interval is an hour.
    let w = world_with("", None, 3600).await;
    w.repo
        .write("envs/api-production.yaml", &environment("api-production", "api"));
    w.repo.commit("environment", true);
    // The watch applies the commit; the passes its hints cause are over within a second or two.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !w
        .daemon
        .get("/metrics", None)
        .1
        .contains("pushleft_revisions_total{verdict=\"accepted\"} 2")
    {
        assert!(Instant::now() < deadline, "the watch applied the commit");
        std::thread::sleep(Duration::from_millis(50));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leased = leasable_within(&w.ledger, Duration::from_secs(1)).await;
    assert!(leased.is_some());
    // The lease happened after the last pass: a scrape still shows the pass's values, however
    // often it is asked (an unauthenticated flood of scrapes runs no query).
    for _ in 0..50 {
        let (code, m) = w.daemon.get("/metrics", None);
        assert_eq!(code, 200);
        assert!(m.contains("pushleft_jobs{state=\"leased\"} 0"), "{m}");
    }
    // A pass (asked for by an operator) refreshes them.
    let op = format!("Bearer {}", w.operator);
    assert_eq!(
        w.daemon.post("/v1/reconcile", &[("authorization", op.as_str())], b"").0,
        202
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, m) = w.daemon.get("/metrics", None);
        if m.contains("pushleft_jobs{state=\"leased\"} 1") {
            break;
        }
        assert!(Instant::now() < deadline, "the next pass refreshes the metrics: {m}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_connections_does_not_stop_the_daemon() {
    let w = world("", Some(1024)).await;
    // 1,100 TCP connections that never start TLS, held open: more than the daemon's 1,024
    // file descriptors.
    let addr = format!("127.0.0.1:{}", w.daemon.port);
    let mut held = Vec::with_capacity(1100);
    for _ in 0..1100 {
        match TcpStream::connect_timeout(&addr.parse().expect("addr"), Duration::from_secs(2)) {
            Ok(c) => held.push(c),
            Err(_) => break, // the backlog is full: the flood is as large as it gets
        }
    }
    assert!(held.len() >= 1000, "only {} connections were opened", held.len());
    let flooded = Instant::now();
    // While they are still held, /readyz answers again within 20 s...
    let mut ready = None;
    while flooded.elapsed() < Duration::from_secs(20) {
        if w.daemon.get("/readyz", None).0 == 200 {
            ready = Some(flooded.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let ready = ready.expect("/readyz answers within 20 s of the flood");
    // ...and a new commit is still applied.
    w.repo
        .write("envs/api-production.yaml", &environment("api-production", "api"));
    w.repo.commit("environment", true);
    let applied = leasable_within(&w.ledger, Duration::from_secs(20)).await;
    eprintln!(
        "flood: {} idle connections; /readyz again after {ready:?}; commit leasable after {applied:?}",
        held.len()
    );
    assert!(applied.is_some(), "a commit is applied during the flood");
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_streams_of_one_viewer_do_not_delay_a_commit() {
    let w = world("max_streams = 100\nmax_streams_per_token = 60\n", None).await;
    let mut streams = Vec::new();
    for _ in 0..60 {
        let (code, reader) = w.daemon.stream("/v1/events/stream", &w.viewer);
        assert_eq!(code, 200);
        streams.push(reader.expect("a stream"));
    }
    // The 61st stream of the same token is refused, before it costs anything.
    let (code, _) = w.daemon.stream("/v1/events/stream", &w.viewer);
    assert_eq!(code, 429);
    let (status, body) = {
        let r = w
            .daemon
            .agent()
            .get(&w.daemon.url("/v1/events/stream"))
            .header("authorization", &format!("Bearer {}", w.viewer))
            .call()
            .expect("answered");
        let status = r.status().as_u16();
        (status, r.into_body().read_to_string().unwrap_or_default())
    };
    assert_eq!(status, 429);
    assert!(body.contains("\"too-many-streams\""), "{body}");

    w.repo
        .write("envs/api-production.yaml", &environment("api-production", "api"));
    w.repo.commit("environment", true);
    let applied = leasable_within(&w.ledger, Duration::from_secs(10))
        .await
        .expect("the commit is applied");
    eprintln!("60 open streams: commit leasable after {applied:?}");
    assert!(applied < Duration::from_millis(1500), "{applied:?}");
    // Every stream receives the new events (read in parallel, each bounded by its timeout).
    let readers: Vec<_> = streams
        .into_iter()
        .map(|mut r| {
            std::thread::spawn(move || {
                let mut line = String::new();
                loop {
                    line.clear();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return false;
                    }
                    if line.starts_with("event: revision-accepted") {
                        return true;
                    }
                }
            })
        })
        .collect();
    let got = readers
        .into_iter()
        .map(|h| h.join().unwrap_or(false))
        .filter(|ok| *ok)
        .count();
    // Streams start at cursor 0, so each sees the first commit's event at least.
    assert_eq!(got, 60);
    // Closing them frees their places.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (code, _) = w.daemon.stream("/v1/events/stream", &w.viewer);
        if code == 200 || Instant::now() > deadline {
            assert_eq!(code, 200, "places are freed when streams close");
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A raw TLS connection to the daemon, trusting its CA.
fn tls_connect(dir: &std::path::Path, port: u16) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    use rustls::pki_types::pem::PemObject;
    let ca = rustls::pki_types::CertificateDer::from_pem_file(dir.join("tls/ca.crt")).expect("ca");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca).expect("root");
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).expect("client");
    let tcp = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    rustls::StreamOwned::new(conn, tcp)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfigured_webhook_answers_before_the_body() {
    let w = world("", None).await;
    let dir = w.repo.dir.parent().expect("dir").to_owned();
    // Headers announce 900 KB; not a byte of it is sent. The answer must come anyway.
    for path in ["/v1/webhooks/github", "/v1/webhooks/bitbucket"] {
        let mut tls = tls_connect(&dir, w.daemon.port);
        let started = Instant::now();
        write!(
            tls,
            "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 900000\r\n\r\n"
        )
        .expect("headers");
        tls.flush().expect("flush");
        let mut buf = [0u8; 512];
        let n = tls.read(&mut buf).expect("an answer within 5 s, body or not");
        let head = String::from_utf8_lossy(&buf[..n]).into_owned();
        assert!(head.starts_with("HTTP/1.1 404"), "{path}: {head}");
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_sends_no_request_is_closed() {
    let w = world("", None).await;
    let dir = w.repo.dir.parent().expect("dir").to_owned();
    // TLS completes, then nothing: the header timeout (10 s) closes the connection, so held
    // connections cannot keep the daemon's places.
    let mut tls = tls_connect(&dir, w.daemon.port);
    tls.sock
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let started = Instant::now();
    tls.conn.complete_io(&mut tls.sock).expect("handshake");
    let mut buf = [0u8; 64];
    let n = tls.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "the server closes an idle connection instead of answering");
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(15), "closed after {waited:?}");
    // After one request on a kept-alive connection, the same holds for the next one.
    let mut tls = tls_connect(&dir, w.daemon.port);
    tls.sock
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    write!(tls, "GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n").expect("request");
    let n = tls.read(&mut buf).expect("an answer");
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let started = Instant::now();
    let mut rest = Vec::new();
    let _ = tls.read_to_end(&mut rest);
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(15),
        "an idle kept-alive connection closed after {waited:?}"
    );
}
