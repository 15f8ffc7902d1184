//! When a cron role runs: the times a five-field schedule fires (UTC, whole minutes, Vixie
//! cron's rules), and which scheduled time is due now. Pure: the reconciler passes the clock.
//!
//! Times are Unix seconds. Missed times collapse: [`CronSchedule::latest_in`] gives only the
//! newest time in a window, so a control plane that was down for ten scheduled times queues
//! one run, not ten.

use crate::values::{CRON_FIELDS, CronSchedule, cron_field_mask};

/// How far [`CronSchedule::latest_in`] and [`CronSchedule::next_after`] look: a schedule that
/// selects no real day (`0 0 30 2 *`) fires never, found within this bound.
const HORIZON_DAYS: i64 = 366 * 5;

/// What a schedule selects, field by field, as bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Masks {
    minute: u64,
    hour: u64,
    day: u64,
    month: u64,
    weekday: u64,
    /// Whether the day-of-month or the day-of-week field is `*`: then a day must match both;
    /// when both are restricted, either (Vixie cron).
    either_star: bool,
}

impl CronSchedule {
    fn masks(&self) -> Masks {
        let parts: Vec<&str> = self.as_str().split(' ').collect();
        // A `CronSchedule` was validated when it was made, so every field reads; an empty
        // mask (never) is the safe reading of anything else.
        let mask = |i: usize| {
            parts
                .get(i)
                .and_then(|p| cron_field_mask(p, CRON_FIELDS[i]).ok())
                .unwrap_or(0)
        };
        let weekday = mask(4);
        Masks {
            minute: mask(0),
            hour: mask(1),
            day: mask(2),
            month: mask(3),
            // 7 is Sunday too.
            weekday: (weekday | (weekday >> 7)) & 0x7f,
            either_star: parts.get(2).is_some_and(|p| p.starts_with('*'))
                || parts.get(4).is_some_and(|p| p.starts_with('*')),
        }
    }

    /// The newest time the schedule fires in `(after, now]`, if any.
    pub fn latest_in(&self, after: i64, now: i64) -> Option<i64> {
        let m = self.masks();
        let first_day = (after + 60)
            .div_euclid(86_400)
            .max(now.div_euclid(86_400) - HORIZON_DAYS);
        let mut day = now.div_euclid(86_400);
        while day >= first_day {
            if m.day_matches(day) {
                for hour in (0..24).rev().filter(|h| m.hour & (1 << h) != 0) {
                    for minute in (0..60).rev().filter(|mi| m.minute & (1 << mi) != 0) {
                        let t = day * 86_400 + hour * 3_600 + minute * 60;
                        if t <= after {
                            return None;
                        }
                        if t <= now {
                            return Some(t);
                        }
                    }
                }
            }
            day -= 1;
        }
        None
    }

    /// The first time the schedule fires after `t`, if within the horizon.
    pub fn next_after(&self, t: i64) -> Option<i64> {
        let m = self.masks();
        let first = t.div_euclid(86_400);
        for day in first..=first + HORIZON_DAYS {
            if !m.day_matches(day) {
                continue;
            }
            for hour in (0..24).filter(|h| m.hour & (1 << h) != 0) {
                for minute in (0..60).filter(|mi| m.minute & (1 << mi) != 0) {
                    let at = day * 86_400 + hour * 3_600 + minute * 60;
                    if at > t {
                        return Some(at);
                    }
                }
            }
        }
        None
    }
}

impl Masks {
    fn day_matches(&self, day: i64) -> bool {
        let (_, month, dom) = civil(day);
        if self.month & (1 << month) == 0 {
            return false;
        }
        // 1970-01-01 was a Thursday (4).
        let weekday = (day + 4).rem_euclid(7);
        let (by_day, by_weekday) = (self.day & (1 << dom) != 0, self.weekday & (1 << weekday) != 0);
        if self.either_star {
            by_day && by_weekday
        } else {
            by_day || by_weekday
        }
    }
}

/// The proleptic Gregorian date of a day counted from 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil(day: i64) -> (i64, u32, u32) {
    let z = day + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// A Unix time as `2026-11-30T18:05Z` (UTC, minutes), for events and `pl`.
pub fn utc_minute(t: i64) -> String {
    let (y, m, d) = civil(t.div_euclid(86_400));
    let s = t.rem_euclid(86_400);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}Z", s / 3_600, s % 3_600 / 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> CronSchedule {
        CronSchedule::parse(s).expect("valid")
    }

    /// 2026-11-30T18:00Z, a Monday.
    const MON_18: i64 = 1_796_061_600;

    #[test]
    fn dates_and_weekdays() {
        assert_eq!(utc_minute(0), "1970-01-01T00:00Z");
        assert_eq!(utc_minute(MON_18), "2026-11-30T18:00Z");
        assert_eq!(utc_minute(951_782_400), "2000-02-29T00:00Z");
        assert_eq!(utc_minute(MON_18 + 86_400 + 59), "2026-12-01T18:00Z");
    }

    #[test]
    fn next_times() {
        assert_eq!(c("*/15 * * * *").next_after(MON_18), Some(MON_18 + 900));
        assert_eq!(c("*/15 * * * *").next_after(MON_18 - 1), Some(MON_18));
        assert_eq!(c("5/20 * * * *").next_after(MON_18), Some(MON_18 + 300));
        assert_eq!(
            c("0 2 * * *").next_after(MON_18).map(utc_minute).as_deref(),
            Some("2026-12-01T02:00Z")
        );
        // Weekdays only: from Friday evening to Monday.
        let fri = MON_18 + 4 * 86_400;
        assert_eq!(
            c("0 9 * * mon-fri").next_after(fri).map(utc_minute).as_deref(),
            Some("2026-12-07T09:00Z")
        );
        // 7 is Sunday as 0 is.
        assert_eq!(
            c("0 9 * * 7").next_after(fri).map(utc_minute).as_deref(),
            Some("2026-12-06T09:00Z")
        );
        // Both day fields restricted: either matches (the 1st, or a Monday).
        assert_eq!(
            c("0 0 1 * mon").next_after(MON_18).map(utc_minute).as_deref(),
            Some("2026-12-01T00:00Z")
        );
        assert_eq!(
            c("0 0 1 * mon").next_after(MON_18 + 86_400).map(utc_minute).as_deref(),
            Some("2026-12-07T00:00Z")
        );
        // One field `*`: both must match (the 13th only when it is a Friday).
        assert_eq!(
            c("0 0 13 * fri").next_after(MON_18).map(utc_minute).as_deref(),
            Some("2026-12-04T00:00Z")
        );
        assert_eq!(
            c("0 0 13 * *").next_after(MON_18).map(utc_minute).as_deref(),
            Some("2026-12-13T00:00Z")
        );
        assert_eq!(
            c("0 0 29 feb *").next_after(MON_18).map(utc_minute).as_deref(),
            Some("2028-02-29T00:00Z")
        );
        assert_eq!(c("0 0 30 2 *").next_after(MON_18), None, "February 30th never comes");
    }

    #[test]
    fn missed_times_collapse_to_the_newest() {
        let hourly = c("0 * * * *");
        // Down from 18:00 to 23:30: five times missed, one is due, the newest.
        assert_eq!(
            hourly.latest_in(MON_18, MON_18 + 5 * 3_600 + 1_800),
            Some(MON_18 + 5 * 3_600)
        );
        assert_eq!(hourly.latest_in(MON_18, MON_18 + 3_599), None, "nothing new yet");
        assert_eq!(
            hourly.latest_in(MON_18 - 1, MON_18),
            Some(MON_18),
            "the window's end counts"
        );
        assert_eq!(hourly.latest_in(MON_18, MON_18), None, "its start does not");
        // Across days and a long outage, still one answer.
        let nightly = c("0 2 * * *");
        assert_eq!(
            nightly
                .latest_in(MON_18, MON_18 + 40 * 86_400)
                .map(utc_minute)
                .as_deref(),
            Some("2027-01-09T02:00Z")
        );
        assert_eq!(c("0 0 30 2 *").latest_in(0, MON_18), None);
    }

    #[test]
    fn every_minute_agrees_with_a_plain_scan() {
        // A brute-force check over eight days of minutes for a few schedules.
        for s in ["*/7 3-5 * * *", "0,30 */6 1,15 * *", "10 10 * * sun,wed", "* * * dec *"] {
            let cron = c(s);
            let m = cron.masks();
            let matches = |t: i64| {
                let day = t.div_euclid(86_400);
                let (h, mi) = (t.rem_euclid(86_400) / 3_600, t.rem_euclid(3_600) / 60);
                m.day_matches(day) && m.hour & (1 << h) != 0 && m.minute & (1 << mi) != 0
            };
            let mut t = MON_18 - 86_400;
            let mut expected = None;
            for minute in 0..8 * 1_440 {
                let at = MON_18 - 86_400 + minute * 60 + 60;
                if matches(at) {
                    expected = Some(at);
                    break;
                }
            }
            assert_eq!(cron.next_after(t), expected, "{s}");
            t += 8 * 86_400;
            let latest = (0..8 * 1_440)
                .map(|minute| t - minute * 60)
                .find(|&at| matches(at) && at > MON_18 - 86_400);
            assert_eq!(cron.latest_in(MON_18 - 86_400, t), latest, "{s}");
        }
    }
}
