//! Bench (a binary): TLS handshakes per second and their latency through the agent's ingress
//! (Caddy configured by `Ingress::publish` with a brought certificate: the HTTPS server of
//! ours, the route whose upstream is a `{file.*}` slot) against the same Caddy binary serving
//! the same certificate and upstream from a configuration written by hand (one server, one
//! route, a fixed dial): the floor. 100 concurrent clients, each opening a new connection per
//! request (a full handshake, no resumption), a bounded number of requests and time; the two
//! alternate, rounds times, in the same run. The upstream is a loopback server that answers
//! from memory, so the figures are the proxies'.
//!
//! `cargo bench -p pushleft-agent --bench ingress_tls` (needs Caddy ≥ 2.8 on `PATH`:
//! `PATH=/opt/pushleft-tools/bin:$PATH`; `-- --rounds N`, default 3, `--seconds S`, default 5).

#[path = "../tests/support/streams.rs"]
mod streams;
#[path = "../tests/support/mod.rs"]
mod support;
#[path = "../tests/support/tls.rs"]
mod tls_support;

use pushleft_agent::ingress::Ingress;
use pushleft_agent::ingress::tls::TlsConfig;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const CLIENTS: usize = 100;
const HOST: &str = "bench.shop.test";

struct Run {
    per_second: f64,
    p50: Duration,
    p99: Duration,
    failed: usize,
}

/// `CLIENTS` threads, each a new TLS connection per request, for `seconds` (at most 100,000
/// requests in all).
fn load(port: u16, ca: &str, seconds: u64) -> Run {
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let threads: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (stop, ca) = (Arc::clone(&stop), ca.to_owned());
            std::thread::spawn(move || {
                let mut took = Vec::new();
                let mut failed = 0usize;
                for _ in 0..1_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let t = Instant::now();
                    match tls_support::get_tls(port, HOST, &ca) {
                        Ok((200, _, _)) => took.push(t.elapsed()),
                        _ => failed += 1,
                    }
                }
                (took, failed)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(seconds));
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    let mut failed = 0;
    for t in threads {
        let (took, f) = t.join().expect("client");
        all.extend(took);
        failed += f;
    }
    let elapsed = started.elapsed();
    all.sort();
    let at = |q: f64| {
        all.get(((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    Run {
        per_second: all.len() as f64 / elapsed.as_secs_f64(),
        p50: at(0.50),
        p99: at(0.99),
        failed,
    }
}

fn main() {
    let mut rounds = 3usize;
    let mut seconds = 5u64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => rounds = args.next().and_then(|v| v.parse().ok()).unwrap_or(rounds),
            "--seconds" => seconds = args.next().and_then(|v| v.parse().ok()).unwrap_or(seconds),
            _ => {}
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let stop = Arc::new(AtomicBool::new(false));
    let up = streams::memory_upstream(Arc::clone(&stop));
    // One certificate for both: a CA and a leaf for the hostname.
    let ca_key = rcgen::KeyPair::generate().expect("ca key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("ca");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).expect("ca");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().expect("key");
    let leaf = rcgen::CertificateParams::new(vec![HOST.to_owned()])
        .expect("leaf")
        .signed_by(&key, &issuer)
        .expect("signed");
    let ca = ca_cert.pem();

    // The ingress: Caddy configured by the agent's own code.
    let ours = dir.path().join("ours");
    let (_socket, admin, mut a) = support::caddy_with_admin(&ours);
    let identity = ours.join("age.key");
    let recipient = support::age_keygen(&identity);
    let (http_a, https_a) = (support::free_port(), support::free_port());
    let ingress = Ingress::new(
        &admin,
        vec![format!("127.0.0.1:{http_a}")],
        ours.join("upstreams"),
        "0123abcd_n1",
    )
    .expect("ingress")
    .with_tls(TlsConfig {
        listen: vec![format!("127.0.0.1:{https_a}")],
        dir: ours.join("tls"),
        identity,
        certs_listen: format!("127.0.0.1:{}", support::free_port()),
    })
    .expect("tls");
    let seal = |pem: &str| pushleft_secrets::encrypt(pem.as_bytes(), std::slice::from_ref(&recipient)).expect("seal");
    let sealed = agent_proto::IngressTls {
        secret: "bench".into(),
        cert: seal(&leaf.pem()),
        key: seal(&key.serialize_pem()),
        hsts: false,
    };
    ingress
        .publish("bench", HOST, 1, &[format!("127.0.0.1:{up}")], Some(&sealed))
        .expect("publish");
    support::wait_port(https_a);

    // The floor: the same Caddy binary, the same certificate files and upstream, by hand.
    let direct = dir.path().join("direct");
    std::fs::create_dir_all(&direct).expect("direct");
    let (crt, pem_key) = (direct.join("leaf.crt"), direct.join("leaf.key"));
    std::fs::write(&crt, leaf.pem()).expect("crt");
    std::fs::write(&pem_key, key.serialize_pem()).expect("key");
    let https_b = support::free_port();
    let config = serde_json::json!({
        "admin": {"disabled": true},
        "apps": {
            "tls": {"certificates": {"load_files": [{"certificate": crt, "key": pem_key}]}},
            "http": {"servers": {"direct": {
                "listen": [format!("127.0.0.1:{https_b}")],
                "routes": [{"match": [{"host": [HOST]}], "handle": [{"handler": "reverse_proxy", "upstreams": [{"dial": format!("127.0.0.1:{up}")}]}], "terminal": true}],
                "tls_connection_policies": [{}],
                "automatic_https": {"disable": true},
            }}},
        },
    });
    let mut b = support::spawn_caddy(&direct, &config.to_string());
    support::wait_port(https_b);
    assert_eq!(tls_support::get_tls(https_a, HOST, &ca).expect("ours").0, 200);
    assert_eq!(tls_support::get_tls(https_b, HOST, &ca).expect("direct").0, 200);

    println!(
        "{CLIENTS} clients, a new TLS connection per request, {seconds} s per sample, {rounds} rounds alternating:"
    );
    println!(
        "| round | through the ingress: handshakes/s | p50 | p99 | Caddy alone: handshakes/s | p50 | p99 | ratio | failed |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in 1..=rounds {
        // Alternate which goes first, so a machine that slows down mid-run weighs on both.
        let (x, y) = if r % 2 == 1 {
            let x = load(https_a, &ca, seconds);
            (x, load(https_b, &ca, seconds))
        } else {
            let y = load(https_b, &ca, seconds);
            (load(https_a, &ca, seconds), y)
        };
        println!(
            "| {r} | {:.0} | {:.1} ms | {:.1} ms | {:.0} | {:.1} ms | {:.1} ms | {:.2} | {} / {} |",
            x.per_second,
            x.p50.as_secs_f64() * 1e3,
            x.p99.as_secs_f64() * 1e3,
            y.per_second,
            y.p50.as_secs_f64() * 1e3,
            y.p99.as_secs_f64() * 1e3,
            x.per_second / y.per_second.max(1e-9),
            x.failed,
            y.failed
        );
    }
    stop.store(true, Ordering::Relaxed);
    for c in [&mut a, &mut b] {
        let _ = c.kill();
        let _ = c.wait();
    }
}
