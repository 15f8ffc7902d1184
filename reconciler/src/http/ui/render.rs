//! The web view's shared pieces: the page around every screen (navigation, who is signed in,
//! the live marker), times in words and an environment's state in words (pictures are in
//! `charts`).
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
    Releases,
    Other,
}

/// A whole page: `main` is what a live update swaps.
pub fn page(title: &str, screen: Screen, viewer: Option<&Viewer>, after: i64, main: Markup) -> Markup {
    let nav = [
        (Screen::Overview, "/ui/", "Overview"),
        (Screen::Revisions, "/ui/revisions", "Revisions"),
        (Screen::Nodes, "/ui/nodes", "Nodes"),
        (Screen::Events, "/ui/events", "Events"),
        (Screen::Releases, "/ui/releases", "Releases"),
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
