//! Bench (a binary): a canary step's switch latency, from the weight change asked to the
//! moment the next request is shared by the new weights, through the agent's ingress
//! (`Ingress::publish_share`: slot files renamed, read back; Caddy reads them on each request)
//! against the same weight change made the way a proxy's configuration usually carries
//! weights: the route's upstreams rewritten through Caddy's admin API (a configuration
//! reload), in the same Caddy, in the same run. The weights cycle 10, 50, 90 %; a request loop
//! runs all along (bounded in count and time) and counts failed requests; after each canary
//! step 120 requests measure the share the canary got.
//!
//! `cargo bench -p pushleft-agent --bench canary` (needs Caddy ≥ 2.8 and busybox on `PATH`:
//! `PATH=/opt/pushleft-tools/bin:$PATH`; `-- --rounds N`, default 30).

#[path = "../tests/support/mod.rs"]
mod support;

use pushleft_agent::ingress::{Ingress, Share};
use serde_json::json;
use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

struct Kill(Vec<Child>);
impl Drop for Kill {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds: usize = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let dir = tempfile::tempdir().expect("tempdir");
    let http = support::free_port();
    let (_socket, admin, caddy) = support::caddy_with_admin(dir.path());
    let mut children = vec![caddy];
    let mut dials = Vec::new();
    for text in ["old", "new"] {
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
    let (files, reload) = ("files.localhost", "reload.localhost");
    for host in [files, reload] {
        ingress.publish("web", host, 1, &dials[0..1], None).expect("publish");
    }
    support::wait_port(http);
    let reload_upstreams = format!(
        "/id/{}/handle/0/upstreams",
        pushleft_agent::ingress::route_id("0123abcd", reload)
    );

    // Requests all along, to both hostnames: bounded in count and time.
    let stop = Arc::new(AtomicBool::new(false));
    let (served, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let loops: Vec<_> = [files, reload]
        .into_iter()
        .map(|host| {
            let (stop, served, failed) = (Arc::clone(&stop), Arc::clone(&served), Arc::clone(&failed));
            std::thread::spawn(move || {
                let started = Instant::now();
                for _ in 0..200_000 {
                    if stop.load(Ordering::Relaxed) || started.elapsed() > Duration::from_secs(600) {
                        break;
                    }
                    match support::get_host(http, host) {
                        Ok((200, _)) => served.fetch_add(1, Ordering::Relaxed),
                        _ => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();

    let weights = [10u8, 50, 90];
    let (mut by_files, mut by_reload) = (Vec::new(), Vec::new());
    let mut shares: Vec<(u8, f64)> = Vec::new();
    let (failed_files, failed_reload) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    for round in 0..rounds {
        let w = weights[round % weights.len()];
        let before = failed.load(Ordering::Relaxed);
        let t = Instant::now();
        ingress
            .publish_share("web", files, 2, &dials[1..2], None, Share::Canary(w))
            .expect("canary step");
        by_files.push(t.elapsed());
        let new = (0..120)
            .filter(|_| support::get_host(http, files).is_ok_and(|(_, body)| body == "new"))
            .count();
        shares.push((w, new as f64 / 120.0));
        failed_files.fetch_add(failed.load(Ordering::Relaxed) - before, Ordering::Relaxed);

        // The same weights as the route's own upstreams: 12 dials, a reload of Caddy.
        let k = (usize::from(w) * 12 + 50) / 100;
        let upstreams: Vec<_> = (0..12)
            .map(|i| json!({"dial": if i < k { &dials[1] } else { &dials[0] }}))
            .collect();
        let before = failed.load(Ordering::Relaxed);
        let t = Instant::now();
        ingress
            .admin()
            .call("PATCH", &reload_upstreams, Some(&json!(upstreams)))
            .expect("reload");
        by_reload.push(t.elapsed());
        std::thread::sleep(Duration::from_millis(200));
        failed_reload.fetch_add(failed.load(Ordering::Relaxed) - before, Ordering::Relaxed);
    }
    stop.store(true, Ordering::Relaxed);
    for l in loops {
        l.join().expect("loop");
    }
    by_files.sort();
    by_reload.sort();
    let (f50, f95) = (percentile(&by_files, 0.5), percentile(&by_files, 0.95));
    let (r50, r95) = (percentile(&by_reload, 0.5), percentile(&by_reload, 0.95));
    println!("canary step switch, {rounds} steps each (weights 10/50/90 %), one Caddy:");
    println!(
        "  slot files (pushleft):     p50 {:.1} ms, p95 {:.1} ms, failed requests meanwhile {}",
        ms(f50),
        ms(f95),
        failed_files.load(Ordering::Relaxed)
    );
    println!(
        "  admin API reload (inline): p50 {:.1} ms, p95 {:.1} ms, failed requests meanwhile {}",
        ms(r50),
        ms(r95),
        failed_reload.load(Ordering::Relaxed)
    );
    println!("  ratio (reload / files, p50): {:.1}x", ms(r50) / ms(f50).max(0.001));
    for w in weights {
        let got: Vec<f64> = shares.iter().filter(|(x, _)| *x == w).map(|(_, s)| *s).collect();
        let mean = got.iter().sum::<f64>() / got.len().max(1) as f64;
        println!(
            "  weight {w}%: the canary answered {:.1}% of 120 requests after the step (mean)",
            mean * 100.0
        );
    }
    println!("  requests served in all: {}", served.load(Ordering::Relaxed));
}
