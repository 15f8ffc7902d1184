//! How often each node beats. The control plane derives an interval from the fleet's size, so
//! the whole fleet's heartbeats stay under a ceiling a second however many nodes there are
//! (Nomad's rate-scaled heartbeat TTL), tells each node its own with a stagger so beats spread
//! over time instead of arriving together (after a control-plane restart too), and gives a
//! node told a longer interval than the thresholds' the difference as extra silence before it
//! is quiet, unhealthy or lost: the liveness thresholds ([`super::Liveness`]) count the silence
//! past the beat it was told to expect. An agent beats at the longer of its own interval and
//! the one it was told. Pure: the caller counts the fleet and draws the stagger.

/// The interval the liveness thresholds (60 s eligible, 90 s unhealthy, the lost setting) were
/// set for: the agent's default. A node told a longer one gets the difference as grace.
pub const BASE_INTERVAL_MS: i64 = 10_000;
/// The longest mean interval a node is told, whatever the fleet and the ceiling.
pub const MAX_INTERVAL_MS: i64 = 600_000;

/// The mean interval for `nodes` nodes: at least `min_ms`, and long enough that the fleet's
/// beats stay at or under `per_second` (a ceiling of 0 is taken as 1), at most
/// [`MAX_INTERVAL_MS`].
pub fn mean_interval_ms(nodes: u64, per_second: u32, min_ms: i64) -> i64 {
    let scaled = nodes.saturating_mul(1000).div_ceil(u64::from(per_second.max(1)));
    i64::try_from(scaled)
        .unwrap_or(i64::MAX)
        .max(min_ms)
        .clamp(0, MAX_INTERVAL_MS)
}

/// The interval one node is told: the mean stretched by `stagger` (in `[0, 1)`, drawn per beat)
/// over `[1, 1.5)` times the mean. Never shorter than the mean, so the fleet's rate stays under
/// the ceiling; spread, so a fleet that beat together (all reconnecting after a restart) drifts
/// apart within a few beats.
pub fn told_interval_ms(mean_ms: i64, stagger: f64) -> i64 {
    let stretch = 1.0 + 0.5 * stagger.clamp(0.0, 0.999);
    // At most 1.5 times MAX_INTERVAL_MS: exact in an f64.
    (mean_ms as f64 * stretch) as i64
}

/// The extra silence a node told `told_ms` gets before each liveness step.
pub fn grace_ms(told_ms: i64) -> i64 {
    (told_ms - BASE_INTERVAL_MS).max(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::{LOST_AFTER_MS, Liveness};

    #[test]
    fn a_small_fleet_beats_at_the_minimum() {
        assert_eq!(mean_interval_ms(1, 50, 10_000), 10_000);
        assert_eq!(mean_interval_ms(500, 50, 10_000), 10_000);
        assert_eq!(mean_interval_ms(0, 50, 10_000), 10_000);
        // No floor: the agents' own intervals are longer.
        assert_eq!(mean_interval_ms(5, 50, 0), 100);
        assert_eq!(mean_interval_ms(500, 50, 0), 10_000);
    }

    #[test]
    fn a_large_fleet_stays_under_the_ceiling() {
        // 10,000 nodes at 50 a second: 200 s each (Nomad's figure for the same ceiling).
        assert_eq!(mean_interval_ms(10_000, 50, 10_000), 200_000);
        assert_eq!(mean_interval_ms(10_000, 500, 10_000), 20_000);
        for nodes in [1u64, 99, 1_000, 5_001, 10_000, 40_000] {
            for per_second in [1u32, 7, 50, 200] {
                let mean = mean_interval_ms(nodes, per_second, 0);
                let told_min = told_interval_ms(mean, 0.0);
                if mean < MAX_INTERVAL_MS {
                    // Every node beating at its shortest told interval: at most the ceiling.
                    assert!(nodes as f64 * 1000.0 / told_min as f64 <= f64::from(per_second) + 1e-9);
                }
            }
        }
        assert_eq!(mean_interval_ms(u64::MAX, 1, 10_000), MAX_INTERVAL_MS);
        assert_eq!(mean_interval_ms(10, 0, 0), 10_000, "a ceiling of 0 is 1");
    }

    #[test]
    fn told_intervals_spread_over_half_the_mean() {
        assert_eq!(told_interval_ms(200_000, 0.0), 200_000);
        assert_eq!(told_interval_ms(200_000, 0.5), 250_000);
        assert!(told_interval_ms(200_000, 1.0) < 300_000);
        assert_eq!(told_interval_ms(200_000, -3.0), 200_000);
    }

    #[test]
    fn a_node_beating_as_told_is_never_unhealthy_nor_lost() {
        // Silent for its whole told interval and a few seconds of network: still ready.
        for told in [10_000, 25_000, 200_000, 299_999, 900_000] {
            let seen = 1_000_000;
            let now = seen + told + 5_000;
            let credited = seen + grace_ms(told);
            assert_eq!(
                Liveness::of(Some(credited), now, LOST_AFTER_MS),
                Liveness::Ready,
                "{told}"
            );
            // Past the beat it was told to expect, the usual steps follow.
            let late = seen + told + 95_000;
            assert_eq!(Liveness::of(Some(credited), late, LOST_AFTER_MS), Liveness::Unhealthy);
            let gone = seen + told + LOST_AFTER_MS;
            assert_eq!(Liveness::of(Some(credited), gone, LOST_AFTER_MS), Liveness::Lost);
        }
    }
}
