//! The fleet's commit-to-live over days, for the web view's picture: every release live on
//! every replica in the window, per UTC day (how many, the median, the 95th percentile, the
//! slowest), and the slowest releases by name (the ledger sorts those). Reads only; the
//! grouping is pure.

use super::{Answer, Ops, now_ms};

/// Days the picture covers, today included.
pub const DAYS: u32 = 7;
/// The most releases read for it (the newest): past this, the page says the oldest days are
/// partial.
pub const MOST_RELEASES: u32 = 50_000;
/// The slowest releases listed by name.
pub const SLOWEST: usize = 10;
const DAY_MS: i64 = 86_400_000;

/// One UTC day's releases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Day {
    /// Midnight UTC, in ms since the epoch.
    pub start_ms: i64,
    pub releases: usize,
    /// Commit to live, in ms (0 for a day with none).
    pub p50_ms: i64,
    pub p95_ms: i64,
    pub max_ms: i64,
}

/// The picture over [`DAYS`] days, oldest day first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetToLive {
    pub days: Vec<Day>,
    /// The slowest releases of the window: environment, generation, ms, slowest first.
    pub slowest: Vec<(String, i64, i64)>,
    /// [`MOST_RELEASES`] were read: older releases of the window were left out.
    pub capped: bool,
}

impl Ops {
    /// The fleet's releases live in the last [`DAYS`] days, per day.
    pub async fn fleet_to_live(&self) -> Answer<FleetToLive> {
        let now = now_ms();
        let first_day = now - now.rem_euclid(DAY_MS) - i64::from(DAYS - 1) * DAY_MS;
        let times = self
            .ledger
            .deployments()
            .live_times_since(first_day, MOST_RELEASES)
            .await?;
        let slowest = self
            .ledger
            .deployments()
            .slowest_since(first_day, SLOWEST as u32)
            .await?
            .into_iter()
            .map(|r| (r.environment, r.generation, (r.live_at - r.made_at).max(0)))
            .collect();
        Ok(FleetToLive {
            capped: times.len() == MOST_RELEASES as usize,
            days: by_day(&times, first_day),
            slowest,
        })
    }
}

/// Groups releases, (live at, ms from commit to live), by the UTC day they went live, from
/// `first_day` (a midnight) for [`DAYS`] days.
pub fn by_day(times: &[(i64, i64)], first_day: i64) -> Vec<Day> {
    let mut per_day: Vec<Vec<i64>> = vec![Vec::new(); DAYS as usize];
    for (live_at, ms) in times {
        let i = (live_at - first_day).div_euclid(DAY_MS);
        if let Some(day) = usize::try_from(i).ok().and_then(|i| per_day.get_mut(i)) {
            day.push((*ms).max(0));
        }
    }
    per_day
        .into_iter()
        .enumerate()
        .map(|(i, mut ms)| {
            ms.sort_unstable();
            Day {
                start_ms: first_day + i as i64 * DAY_MS,
                releases: ms.len(),
                p50_ms: quantile(&ms, 50),
                p95_ms: quantile(&ms, 95),
                max_ms: ms.last().copied().unwrap_or(0),
            }
        })
        .collect()
}

/// The nearest-rank `pct` percentile of sorted `ms` (0 for none).
fn quantile(ms: &[i64], pct: usize) -> i64 {
    if ms.is_empty() {
        return 0;
    }
    let rank = (pct * ms.len()).div_ceil(100).max(1);
    ms[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(_env: &str, _generation: i64, made_at: i64, live_at: i64) -> (i64, i64) {
        (live_at, live_at - made_at)
    }

    #[test]
    fn releases_group_by_the_day_they_went_live() {
        let first = 10 * DAY_MS;
        let releases = [
            // Day 0: 1 s, 2 s, 30 s; day 6: 4 s; one before the window and one after it.
            r("a", 1, first + 1_000, first + 2_000),
            r("b", 1, first + 3_000, first + 5_000),
            r("c", 2, first + 10_000, first + 40_000),
            r("a", 2, first + 6 * DAY_MS, first + 6 * DAY_MS + 4_000),
            r("old", 1, first - 9_000, first - 1),
            r("late", 1, first + 7 * DAY_MS, first + 7 * DAY_MS + 1),
        ];
        let days = by_day(&releases, first);
        assert_eq!(days.len(), 7);
        assert_eq!(
            days[0],
            Day {
                start_ms: first,
                releases: 3,
                p50_ms: 2_000,
                p95_ms: 30_000,
                max_ms: 30_000
            }
        );
        assert_eq!(days[1].releases, 0);
        assert_eq!((days[6].releases, days[6].p95_ms), (1, 4_000));
        // Outside the window: counted nowhere.
        assert_eq!(days.iter().map(|d| d.releases).sum::<usize>(), 4);
    }

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let ms: Vec<i64> = (1..=100).collect();
        assert_eq!((quantile(&ms, 50), quantile(&ms, 95)), (50, 95));
        assert_eq!(quantile(&[7], 95), 7);
        assert_eq!(quantile(&[], 50), 0);
    }
}
