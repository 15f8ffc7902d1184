//! The web view's pictures, plain SVG drawn on the server: a used-of-total bar, each release's
//! commit-to-live, the fleet's commit-to-live per day, and a canary's shares and measures.
//! Each says its figures in words too (its label, and a list or table beside it), for readers
//! of text; every value goes through maud's escaping.

use crate::ops::releases::FleetToLive;
use crate::ops::screens::CanaryMeasure;
use maud::{Markup, html};

/// A used-of-total bar as SVG, with its numbers in words beside it for readers of text.
pub fn bar(used: u64, total: u64, label: &str) -> Markup {
    let share = if total == 0 {
        0.0
    } else {
        (used as f64 / total as f64).min(1.0)
    };
    let width = (share * 120.0).round();
    let class = if share > 0.9 { "bar-full" } else { "bar-used" };
    html! {
        svg class="bar" width="120" height="12" viewBox="0 0 120 12" role="img" aria-label=(label) {
            rect class="bar-track" x="0" y="0" width="120" height="12" {}
            rect class=(class) x="0" y="0" width=(width) height="12" {}
        }
    }
}

/// Seconds, as a chart labels them.
fn secs(ms: i64) -> String {
    format!("{:.1}", ms as f64 / 1000.0)
}

/// Commit-to-live times as bars, one per release (oldest on the left), each labelled with its
/// generation and seconds.
pub fn live_times(times: &[(i64, i64)]) -> Markup {
    let most = times.iter().map(|(_, ms)| *ms).max().unwrap_or(1).max(1) as f64;
    let width = 40 * times.len().max(1) + 10;
    let label = format!(
        "Seconds from commit to live, per release: {}",
        times
            .iter()
            .map(|(g, ms)| format!("generation {g}: {} s", secs(*ms)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    html! {
        svg class="chart" width=(width) height="140" viewBox=(format!("0 0 {width} 140")) role="img" aria-label=(label) {
            @for (i, (g, ms)) in times.iter().enumerate() {
                @let h = ((*ms as f64 / most) * 90.0).round().max(1.0);
                @let x = 10 + i * 40;
                rect class="bar-used" x=(x) y=(112.0 - h) width="28" height=(h) {}
                text x=(x + 14) y=(108.0 - h) text-anchor="middle" class="chart-value" { (secs(*ms)) }
                text x=(x + 14) y="128" text-anchor="middle" class="chart-label" { "g" (g) }
            }
        }
    }
}

/// The fleet's commit-to-live per UTC day, oldest on the left: each day's median as a bar and
/// its 95th percentile as a lighter bar behind it, labelled with the p95 in seconds and the
/// day's releases; a day without releases draws nothing.
pub fn fleet_to_live(f: &FleetToLive) -> Markup {
    let most = f.days.iter().map(|d| d.p95_ms).max().unwrap_or(1).max(1) as f64;
    let width = 70 * f.days.len().max(1) + 10;
    let day = |start_ms: i64| super::render::utc(start_ms).chars().take(10).collect::<String>();
    let label = format!(
        "Seconds from commit to live across the fleet, per day: {}",
        f.days
            .iter()
            .map(|d| if d.releases == 0 {
                format!("{}: no release", day(d.start_ms))
            } else {
                format!(
                    "{}: {} releases, median {} s, p95 {} s",
                    day(d.start_ms),
                    d.releases,
                    secs(d.p50_ms),
                    secs(d.p95_ms)
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    );
    html! {
        svg class="chart" width=(width) height="160" viewBox=(format!("0 0 {width} 160")) role="img" aria-label=(label) {
            @for (i, d) in f.days.iter().enumerate() {
                @let x = 10 + i * 70;
                @if d.releases > 0 {
                    @let p95 = ((d.p95_ms as f64 / most) * 90.0).round().max(1.0);
                    @let p50 = ((d.p50_ms as f64 / most) * 90.0).round().max(1.0);
                    rect class="bar-track" x=(x) y=(112.0 - p95) width="50" height=(p95) {}
                    rect class="bar-used" x=(x + 10) y=(112.0 - p50) width="30" height=(p50) {}
                    text x=(x + 25) y=(108.0 - p95) text-anchor="middle" class="chart-value" { (secs(d.p95_ms)) }
                }
                text x=(x + 25) y="128" text-anchor="middle" class="chart-label" { (day(d.start_ms).get(5..).unwrap_or_default()) }
                text x=(x + 25) y="144" text-anchor="middle" class="chart-label" { (d.releases) " rel." }
            }
        }
    }
}

/// A canary's measured steps: per step, the share of the requests the new release had (a
/// bar on a 0–100 % scale) beside the share of those that failed (the scale's top is 10 % or
/// the worst step's; a step past 5 % is drawn as failing), each labelled, and the figures in
/// words in the picture's label and a list.
pub fn measures_chart(steps: &[CanaryMeasure]) -> Markup {
    let failed = |s: &CanaryMeasure| {
        if s.requests > 0 {
            s.errors as f64 * 100.0 / s.requests as f64
        } else {
            0.0
        }
    };
    let share = |s: &CanaryMeasure| s.share.map_or("share unknown".to_owned(), |w| format!("share {w} %"));
    let words = |s: &CanaryMeasure| {
        let p95 = s
            .p95_micros
            .map_or("no p95".to_owned(), |p| format!("p95 {:.1} ms", p as f64 / 1000.0));
        format!(
            "step {} ({}): {} of {} requests failed ({:.1} %), {p95}",
            s.step,
            share(s),
            s.errors,
            s.requests,
            failed(s)
        )
    };
    let top = steps.iter().map(failed).fold(10.0_f64, f64::max);
    let width = 90 * steps.len().max(1) + 10;
    let label = steps.iter().map(words).collect::<Vec<_>>().join("; ");
    html! {
        p class="legend" {
            svg width="12" height="12" aria-hidden="true" { rect class="bar-share" width="12" height="12" {} }
            " share of requests to the new release "
            svg width="12" height="12" aria-hidden="true" { rect class="bar-used" width="12" height="12" {} }
            " requests that failed"
        }
        svg class="chart" width=(width) height="140" viewBox=(format!("0 0 {width} 140")) role="img" aria-label=(format!("Canary steps, their shares and failed requests: {label}")) {
            @for (i, st) in steps.iter().enumerate() {
                @let x = 10 + i * 90;
                @let w = f64::from(st.share.unwrap_or(0));
                @let hs = (w / 100.0 * 90.0).round().max(1.0);
                @let hf = (failed(st) / top * 90.0).round().max(1.0);
                rect class="bar-share" x=(x) y=(112.0 - hs) width="34" height=(hs) {}
                text x=(x + 17) y=(108.0 - hs) text-anchor="middle" class="chart-value" { (format!("{w:.0} %")) }
                rect class=(if failed(st) > 5.0 { "bar-full" } else { "bar-used" }) x=(x + 38) y=(112.0 - hf) width="34" height=(hf) {}
                text x=(x + 55) y=(108.0 - hf) text-anchor="middle" class="chart-value" { (format!("{:.1} %", failed(st))) }
                text x=(x + 36) y="128" text-anchor="middle" class="chart-label" { "step " (st.step) }
            }
        }
        ul class="reasons" { @for st in steps { li { (words(st)) } } }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::releases::Day;

    #[test]
    fn a_canarys_steps_are_drawn_with_their_shares_and_said() {
        let steps = [
            CanaryMeasure {
                step: 2,
                share: Some(10),
                requests: 40,
                errors: 9,
                p95_micros: Some(12_000),
            },
            CanaryMeasure {
                step: 4,
                share: Some(50),
                requests: 0,
                errors: 0,
                p95_micros: None,
            },
        ];
        let html = measures_chart(&steps).into_string();
        assert!(
            html.contains("step 2 (share 10 %): 9 of 40 requests failed (22.5 %), p95 12.0 ms"),
            "{html}"
        );
        assert!(
            html.contains("step 4 (share 50 %): 0 of 0 requests failed (0.0 %), no p95"),
            "{html}"
        );
        assert!(
            html.contains("class=\"bar-full\""),
            "a failing step is drawn as failing: {html}"
        );
        // The shares on their own scale: 50 % is 45 of the 90 pixels.
        assert!(
            html.contains("class=\"bar-share\" x=\"100\" y=\"67\" width=\"34\" height=\"45\""),
            "{html}"
        );
        assert!(html.contains(">50 %<"), "{html}");
    }

    #[test]
    fn the_fleets_days_are_drawn_and_said() {
        let day = |i: i64, releases, p50_ms, p95_ms| Day {
            start_ms: i * 86_400_000,
            releases,
            p50_ms,
            p95_ms,
            max_ms: p95_ms,
        };
        let f = FleetToLive {
            days: vec![day(20_000, 0, 0, 0), day(20_001, 12, 3_000, 40_000)],
            slowest: vec![],
            capped: false,
        };
        let html = fleet_to_live(&f).into_string();
        assert!(html.contains("2024-10-04: no release"), "{html}");
        assert!(
            html.contains("2024-10-05: 12 releases, median 3.0 s, p95 40.0 s"),
            "{html}"
        );
        // A day without releases draws no bar: one track and one median bar in all.
        assert_eq!(html.matches("class=\"bar-track\"").count(), 1, "{html}");
        assert_eq!(html.matches("class=\"bar-used\"").count(), 1, "{html}");
    }
}
