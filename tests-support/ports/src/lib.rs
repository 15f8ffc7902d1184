//! A loopback port for a test's listener, from one counter per process.
//!
//! Chosen below Linux's ephemeral range (32768 to 60999), where `bind(0)` hands ports out and
//! where every outgoing connection takes its source port: a port `bind(0)` had just returned
//! was taken by a connection before Caddy could bind it (CI, `agent/tests/ingress.rs`). A crate
//! rather than a file the test support includes: a test binary that includes two support
//! files would hold two counters and hand one port out twice (CI, `agent/tests/acme.rs`).

use std::sync::atomic::{AtomicU32, Ordering};

static NEXT: AtomicU32 = AtomicU32::new(0);
/// The lowest port handed out.
const LOW: u32 = 20_000;
/// How many ports above [`LOW`] are used (up to 31,999, below the ephemeral range).
const SPAN: u32 = 12_000;
/// A step prime to [`SPAN`]: successive ports are spread over the span, and every port of the
/// span comes once before any comes twice.
const STEP: u32 = 7_919;

/// A port on 127.0.0.1 that no listener held a moment ago and that this process has not
/// handed out before (until 12,000 have been). Processes start at different places (their
/// ids), and a port something already listens on is skipped.
pub fn free_port() -> u16 {
    let seed = seed();
    // Bounded: at most 2,000 tries, then a port from the kernel.
    for _ in 0..2_000 {
        let port = port_at(seed, NEXT.fetch_add(1, Ordering::Relaxed));
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

fn seed() -> u32 {
    std::process::id().wrapping_mul(2_654_435_761) % SPAN
}

/// The `n`th port of a process whose walk starts at `seed`.
fn port_at(seed: u32, n: u32) -> u16 {
    let offset = (u64::from(seed) + u64::from(n % SPAN) * u64::from(STEP)) % u64::from(SPAN);
    // LOW + SPAN - 1 < 65,536.
    u16::try_from(u64::from(LOW) + offset).unwrap_or(u16::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_walk_covers_the_span_once_below_the_ephemeral_range() {
        let walk: std::collections::BTreeSet<u16> = (0..SPAN).map(|n| port_at(seed(), n)).collect();
        assert_eq!(walk.len(), SPAN as usize, "a port came twice before the span was used");
        assert_eq!(walk.first(), Some(&20_000));
        assert_eq!(walk.last(), Some(&31_999));
    }

    #[test]
    fn handed_out_once_and_a_port_in_use_skipped() {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..200 {
            assert!(seen.insert(free_port()), "a port handed out twice");
        }
        // Something listens on the port the next call would hand out: it is skipped.
        let next = port_at(seed(), NEXT.load(Ordering::Relaxed));
        let _held = std::net::TcpListener::bind(("127.0.0.1", next)).expect("bind");
        assert_ne!(free_port(), next);
    }
}
