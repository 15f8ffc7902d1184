//! Upstreams and upgraded streams for the ingress tests and benches: an upstream on loopback
//! that answers from memory, and a reader that counts an upgraded stream's lines.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The request that upgrades a connection to a WebSocket-like stream for `host`.
pub fn upgrade_request(host: &str) -> String {
    format!(
        "GET /stream HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
}

/// Counts the `tick` lines `stream` carries, on a thread of its own, until it ends, `secs`
/// pass or `most` lines were read.
pub fn count_ticks(
    stream: impl Read + Send + 'static,
    secs: u64,
    most: usize,
) -> (Arc<AtomicUsize>, std::thread::JoinHandle<()>) {
    let lines = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&lines);
    let reader = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let mut r = BufReader::new(stream);
        let mut line = String::new();
        while Instant::now() < deadline && counted.load(Ordering::SeqCst) < most {
            line.clear();
            match r.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) if line.starts_with("tick") => {
                    counted.fetch_add(1, Ordering::SeqCst);
                }
                Ok(_) => {}
            }
        }
    });
    (lines, reader)
}

/// An upstream on loopback answering every request head of a keep-alive connection with
/// `200 ok` from memory, or an upgrade with `101` and a `tick` line every 50 ms (at most 400);
/// it stops accepting when `stop` is set.
pub fn memory_upstream(stop: Arc<AtomicBool>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let Ok(mut c) = conn else { continue };
            std::thread::spawn(move || {
                let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
                let mut buf = [0u8; 4096];
                let mut seen = Vec::new();
                loop {
                    let Ok(n) = c.read(&mut buf) else { return };
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&seen[..end]).to_ascii_lowercase();
                        seen.drain(..end + 4);
                        if head.contains("upgrade: websocket") {
                            let _ = c.write_all(
                                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
                            );
                            for i in 0..400 {
                                if c.write_all(format!("tick {i}\n").as_bytes()).is_err() {
                                    return;
                                }
                                std::thread::sleep(Duration::from_millis(50));
                            }
                            return;
                        }
                        if c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
                            .is_err()
                        {
                            return;
                        }
                    }
                }
            });
        }
    });
    port
}
