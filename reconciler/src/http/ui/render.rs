//! The web view's shared pieces: the page around every screen (navigation, who is signed in,
//! the live marker), times in words, an environment's state in words, and small SVG bars.
//! Every value goes through maud's escaping; nothing here writes unescaped text.

use crate::config::Role;
use crate::ops::screens::EnvironmentRow;
use maud::{DOCTYPE, Markup, html};
use operator_proto::DeploymentStatus;

/// Who is looking, and the form token their posts carry.
pub struct Viewer {
    pub name: String,
    pub role: Role,
    /// The session's CSRF token (derived from its id; never stored).
    pub csrf: String,
}

impl Viewer {
    /// Whether this viewer may act (operator or admin).
    pub fn acts(&self) -> bool {
        self.role >= Role::Operator
    }
}

fn role_word(r: Role) -> &'static str {
    match r {
        Role::Viewer => "viewer",
        Role::Operator => "operator",
        Role::Admin => "admin",
    }
}

/// The screens the navigation names.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Screen {
    Overview,
    Revisions,
    Nodes,
    Events,
    Other,
}

/// A whole page: `main` is what a live update swaps.
pub fn page(title: &str, screen: Screen, viewer: Option<&Viewer>, after: i64, main: Markup) -> Markup {
    let nav = [
        (Screen::Overview, "/ui/", "Overview"),
        (Screen::Revisions, "/ui/revisions", "Revisions"),
        (Screen::Nodes, "/ui/nodes", "Nodes"),
        (Screen::Events, "/ui/events", "Events"),
    ];
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="referrer" content="no-referrer";
                title { (title) " · Pushleft" }
                link rel="stylesheet" href="/ui/assets/ui.css";
                script src="/ui/assets/ui.js" defer {}
            }
            body data-live=(if viewer.is_some() { "on" } else { "off" }) data-after=(after) {
                a class="skip" href="#main" { "Skip to content" }
                header {
                    span class="brand" { "Pushleft" }
                    @if let Some(v) = viewer {
                        nav aria-label="Screens" {
                            ul {
                                @for (s, href, label) in nav {
                                    li {
                                        @if s == screen {
                                            a href=(href) aria-current="page" { (label) }
                                        } @else {
                                            a href=(href) { (label) }
                                        }
                                    }
                                }
                            }
                        }
                        div class="who" {
                            span { "Signed in as " strong { (v.name) } " (" (role_word(v.role)) ")" }
                            form method="post" action="/ui/sign-out" {
                                input type="hidden" name="csrf" value=(v.csrf);
                                button type="submit" { "Sign out" }
                            }
                        }
                    }
                }
                p id="live" class="live" role="status" aria-live="polite" {
                    @if viewer.is_some() { "live updates need JavaScript; reload to refresh" }
                }
                main id="main" tabindex="-1" { (main) }
            }
        }
    }
}

/// A millisecond time as UTC, to the second.
pub fn utc(ms: i64) -> String {
    match time::OffsetDateTime::from_unix_timestamp(ms.div_euclid(1000)) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        ),
        Err(_) => "–".to_owned(),
    }
}

/// How long ago, in words a person reads at a glance.
pub fn ago(ms: i64, now: i64) -> String {
    let s = (now - ms).max(0) / 1000;
    match s {
        0..=59 => format!("{s} s ago"),
        60..=3599 => format!("{} min ago", s / 60),
        3600..=86_399 => format!("{} h ago", s / 3600),
        _ => format!("{} d ago", s / 86_400),
    }
}

/// A time as a `<time>` element: ago in words, the exact UTC on hover.
pub fn when(ms: i64, now: i64) -> Markup {
    html! { time title=(utc(ms)) { (ago(ms, now)) } }
}

/// A commit's short form.
pub fn short(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}

/// How an environment stands, as a class for its colour and words for people.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateWords {
    pub class: &'static str,
    pub words: String,
}

/// An environment's state in words, from what its agents report (never from what was asked).
pub fn state_words(row: &EnvironmentRow) -> StateWords {
    let d = &row.deployment;
    let words = |class, words: String| StateWords { class, words };
    if let Some(h) = d.hold.as_ref().filter(|h| !h.released) {
        // What the hold asked is said as asked until the agents report it done.
        let words_now = if d.generation < h.generation as i64 {
            format!(
                "rolling back: generation {} will run generation {}'s release again (asked by {})",
                h.generation, h.to, h.by
            )
        } else if d.status == DeploymentStatus::Done && d.running == d.replicas {
            format!(
                "held by a rollback: generation {} runs generation {}'s release again (asked by {}); differs from Git",
                h.generation, h.to, h.by
            )
        } else {
            format!(
                "rolling back to generation {}'s release as generation {} (asked by {}): {} of {} replicas running",
                h.to, h.generation, h.by, d.running, d.replicas
            )
        };
        return words("held", words_now);
    }
    if d.action == operator_proto::deployments::Action::Teardown {
        return match d.status {
            DeploymentStatus::Done => words("settled", "torn down".into()),
            DeploymentStatus::Failed => words("failing", "teardown failing".into()),
            DeploymentStatus::InProgress => words("rolling", "tearing down".into()),
        };
    }
    match d.status {
        DeploymentStatus::Failed => {
            let why = row
                .failure
                .as_ref()
                .map(|(key, reason)| format!(": {} (job {key})", first_line(reason, 160)))
                .unwrap_or_default();
            let serving = if d.stale > 0 {
                format!("; {} replicas of an earlier generation still serve", d.stale)
            } else {
                String::new()
            };
            words("failing", format!("failing{why}{serving}"))
        }
        DeploymentStatus::InProgress => {
            let canary = d.canary.as_ref().map(|c| {
                if c.waits_for_promote {
                    format!(", canary at {}%, waiting for a promote", c.weight)
                } else {
                    format!(", canary at {}%, next step on its own", c.weight)
                }
            });
            words(
                "rolling",
                format!(
                    "rolling out generation {} (step {}){}; {} of {} replicas running",
                    d.generation,
                    d.step,
                    canary.unwrap_or_default(),
                    d.running,
                    d.replicas
                ),
            )
        }
        DeploymentStatus::Done if d.running < d.replicas => words(
            "degraded",
            format!("degraded: {} of {} replicas running", d.running, d.replicas),
        ),
        DeploymentStatus::Done if d.stale > 0 => {
            words("rolling", format!("in sync, {} old replicas still to stop", d.stale))
        }
        DeploymentStatus::Done if !d.waiting.is_empty() => {
            words("degraded", format!("{} replicas waiting for room", d.waiting.len()))
        }
        DeploymentStatus::Done => words("settled", "in sync".into()),
    }
}

/// A text's first line, at most `max` characters (an ellipsis says there is more).
pub fn first_line(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or_default();
    let mut out: String = line.chars().take(max).collect();
    if out.len() < line.len() || text.lines().nth(1).is_some() {
        out.push('…');
    }
    out
}

/// A text that may run long (a job's reason with its output, an event's detail): its first
/// line, and the whole in a disclosure.
pub fn long_text(text: &str) -> Markup {
    let first = first_line(text, 200);
    html! {
        @if first.ends_with('…') {
            details class="long" {
                summary { (first) }
                pre { (text) }
            }
        } @else {
            (text)
        }
    }
}

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

/// Commit-to-live times as bars, one per release (oldest on the left), each labelled with its
/// generation and seconds; the same figures as a list for readers of text.
pub fn live_times(times: &[(i64, i64)]) -> Markup {
    let most = times.iter().map(|(_, ms)| *ms).max().unwrap_or(1).max(1) as f64;
    let width = 40 * times.len().max(1) + 10;
    let label = format!(
        "Seconds from commit to live, per release: {}",
        times
            .iter()
            .map(|(g, ms)| format!("generation {g}: {:.1} s", *ms as f64 / 1000.0))
            .collect::<Vec<_>>()
            .join(", ")
    );
    html! {
        svg class="chart" width=(width) height="140" viewBox=(format!("0 0 {width} 140")) role="img" aria-label=(label) {
            @for (i, (g, ms)) in times.iter().enumerate() {
                @let h = ((*ms as f64 / most) * 90.0).round().max(1.0);
                @let x = 10 + i * 40;
                rect class="bar-used" x=(x) y=(112.0 - h) width="28" height=(h) {}
                text x=(x + 14) y=(108.0 - h) text-anchor="middle" class="chart-value" { (format!("{:.1}", *ms as f64 / 1000.0)) }
                text x=(x + 14) y="128" text-anchor="middle" class="chart-label" { "g" (g) }
            }
        }
    }
}

/// A canary's measured steps: per step, the share of its requests that failed as a bar (the
/// scale's top is 10 % or the worst step's), with the figures in words beside each bar and in
/// the picture's label.
pub fn measures_chart(steps: &[crate::store::rollouts::StepMeasured]) -> Markup {
    let pct = |s: &crate::store::rollouts::StepMeasured| {
        if s.requests > 0 {
            s.errors as f64 * 100.0 / s.requests as f64
        } else {
            0.0
        }
    };
    let words = |s: &crate::store::rollouts::StepMeasured| {
        let p95 = s
            .p95_micros
            .map_or("no p95".to_owned(), |p| format!("p95 {:.1} ms", p as f64 / 1000.0));
        format!(
            "step {}: {} of {} requests failed ({:.1} %), {p95}",
            s.step,
            s.errors,
            s.requests,
            pct(s)
        )
    };
    let top = steps.iter().map(pct).fold(10.0_f64, f64::max);
    let width = 60 * steps.len().max(1) + 10;
    let label = steps.iter().map(words).collect::<Vec<_>>().join("; ");
    html! {
        svg class="chart" width=(width) height="140" viewBox=(format!("0 0 {width} 140")) role="img" aria-label=(format!("Failed requests per canary step: {label}")) {
            @for (i, st) in steps.iter().enumerate() {
                @let h = (pct(st) / top * 90.0).round().max(1.0);
                @let x = 10 + i * 60;
                rect class=(if pct(st) > 5.0 { "bar-full" } else { "bar-used" }) x=(x) y=(112.0 - h) width="40" height=(h) {}
                text x=(x + 20) y=(108.0 - h) text-anchor="middle" class="chart-value" { (format!("{:.1} %", pct(st))) }
                text x=(x + 20) y="128" text-anchor="middle" class="chart-label" { "step " (st.step) }
            }
        }
        ul class="reasons" { @for st in steps { li { (words(st)) } } }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_words_and_utc() {
        assert_eq!(ago(0, 59_000), "59 s ago");
        assert_eq!(ago(0, 7_200_000), "2 h ago");
        assert_eq!(utc(86_400_000), "1970-01-02 00:00:00 UTC");
    }

    #[test]
    fn long_text_keeps_its_first_line() {
        assert_eq!(first_line("a: b\nmore", 100), "a: b…");
        assert_eq!(first_line("abcdef", 3), "abc…");
        assert_eq!(first_line("short", 100), "short");
        let html = long_text("code: what\n<b>output</b>").into_string();
        assert!(html.contains("<details") && html.contains("&lt;b&gt;output"), "{html}");
    }

    #[test]
    fn a_canarys_steps_are_drawn_and_said() {
        let steps = [
            crate::store::rollouts::StepMeasured {
                step: 2,
                requests: 40,
                errors: 9,
                p95_micros: Some(12_000),
            },
            crate::store::rollouts::StepMeasured {
                step: 4,
                requests: 0,
                errors: 0,
                p95_micros: None,
            },
        ];
        let html = measures_chart(&steps).into_string();
        assert!(
            html.contains("step 2: 9 of 40 requests failed (22.5 %), p95 12.0 ms"),
            "{html}"
        );
        assert!(
            html.contains("step 4: 0 of 0 requests failed (0.0 %), no p95"),
            "{html}"
        );
        assert!(
            html.contains("class=\"bar-full\""),
            "a failing step is drawn as failing: {html}"
        );
    }

    #[test]
    fn values_are_escaped() {
        let v = Viewer {
            name: "<script>alert(1)</script>".into(),
            role: Role::Viewer,
            csrf: "\"><img src=x>".into(),
        };
        let html = page("t", Screen::Overview, Some(&v), 0, html! { "x" }).into_string();
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(!html.contains("\"><img"), "{html}");
    }
}
