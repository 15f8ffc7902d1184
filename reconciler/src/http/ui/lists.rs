//! The lists: judged commits with their verdicts and reasons, nodes with their capacity drawn
//! as bars and their mesh, and the merged event timeline, filtered by subject (an environment
//! or a node) and kind.

use super::actions::enc;
use super::charts::bar;
use super::render::{Screen, page, short, when};
use super::{App, Signed, failed, page_response, tip};
use crate::ops::now_ms;
use crate::ops::screens::{SCREEN_ROWS, TIMELINE_WINDOW};
use axum::extract::{Query, State};
use axum::response::Response;
use maud::{Markup, html};
use operator_proto::events::Event;
use serde::Deserialize;

#[derive(Deserialize)]
pub struct Before {
    before: Option<i64>,
}

/// Judged commits, newest first.
pub async fn revisions(State(ui): App, who: Signed, Query(q): Query<Before>) -> Response {
    let page_ = match ui.ops.revisions(None, q.before, SCREEN_ROWS).await {
        Ok(p) => p,
        Err(e) => return failed(&e),
    };
    let now = now_ms();
    let main = html! {
        h1 { "Revisions" }
        p { "Every commit the control plane judged, newest first: who signed it, and for a refusal, why." }
        form method="get" action="/ui/plan" class="filters" {
            label for="base" { "Plan from commit" }
            input id="base" name="base" maxlength="40" size="14" required;
            label for="head" { "to commit" }
            input id="head" name="head" maxlength="40" size="14" required;
            button type="submit" { "Show the plan" }
        }
        table {
            thead { tr {
                th scope="col" { "Commit" } th scope="col" { "Branch" } th scope="col" { "Verdict" }
                th scope="col" { "Signed by" } th scope="col" { "Reasons" } th scope="col" { "Seen" } th scope="col" { "Plan" }
            } }
            tbody {
                @for (i, r) in page_.revisions.iter().enumerate() {
                    tr {
                        td { code title=(r.sha) { (short(&r.sha)) } }
                        td { (r.branch) }
                        td { span class=(format!("state {}", if r.verdict.as_str() == "accepted" { "settled" } else { "failing" })) { (r.verdict.as_str()) } }
                        td { (r.principals.as_deref().unwrap_or("–")) }
                        td {
                            @if r.reasons.is_empty() { "–" }
                            @else { ul class="reasons" { @for why in &r.reasons { li { strong { (why.code) } ": " (why.message) } } } }
                        }
                        td { (when(r.seen_at_ms, now)) }
                        td {
                            @if let Some(before) = previous_accepted(&page_.revisions, i) {
                                a href=(format!("/ui/plan?base={}&head={}", before, r.sha)) { "from " (short(before)) }
                            }
                        }
                    }
                }
            }
        }
        @if let Some(next) = page_.next {
            p class="pager" { a rel="next" href=(format!("/ui/revisions?before={next}")) { "Older" } }
        }
    };
    page_response(page("Revisions", Screen::Revisions, Some(&who.viewer), tip(&ui), main))
}

/// The accepted commit of the same branch judged before row `i`'s (rows are newest first),
/// when row `i` was accepted too.
fn previous_accepted(rows: &[operator_proto::revisions::Revision], i: usize) -> Option<&str> {
    let r = rows.get(i)?;
    if r.verdict.as_str() != "accepted" {
        return None;
    }
    rows.iter()
        .skip(i + 1)
        .find(|o| o.branch == r.branch && o.verdict.as_str() == "accepted")
        .map(|o| o.sha.as_str())
}

#[derive(Deserialize)]
pub struct PlanQuery {
    #[serde(default)]
    base: String,
    #[serde(default)]
    head: String,
}

/// The plan between two accepted commits, as `pl plan` prints it.
pub async fn plan(State(ui): App, who: Signed, Query(q): Query<PlanQuery>) -> Response {
    let (base, head) = (q.base.trim(), q.head.trim());
    let planned = match ui.ops.plan_between(base, head).await {
        Ok(p) => p,
        Err(e) => return failed(&e),
    };
    let main = html! {
        h1 { "Plan from " code { (short(base)) } " to " code { (short(head)) } }
        p { "What changes between the two commits, as " code { "pl plan --base " (short(base)) " --head " (short(head)) } " prints it." }
        pre class="plan" {
            @for line in planned.text.lines() {
                span class=(line_class(line)) { (line) } "\n"
            }
        }
    };
    page_response(page("Plan", Screen::Revisions, Some(&who.viewer), tip(&ui), main))
}

/// A plan line's colour, from its first mark (what the terminal's colours say).
fn line_class(line: &str) -> &'static str {
    match line.trim_start().chars().next() {
        Some('+') => "ins",
        Some('-') => "del",
        Some('~') | Some('!') => "upd",
        Some('@') => "hunk",
        _ => "ctx",
    }
}

#[derive(Deserialize)]
pub struct After {
    after: Option<String>,
}

/// Declared nodes by name, a screen of them at a time.
pub async fn nodes(State(ui): App, who: Signed, Query(q): Query<After>) -> Response {
    let (nodes, next) = match ui.ops.nodes(q.after.as_deref(), SCREEN_ROWS).await {
        Ok(n) => (n.nodes, n.next),
        Err(e) => return failed(&e),
    };
    let now = now_ms();
    let main = html! {
        h1 { "Nodes" }
        table {
            thead { tr {
                th scope="col" { "Node" } th scope="col" { "Pool" } th scope="col" { "State" }
                th scope="col" { "CPU reserved" } th scope="col" { "Memory reserved" }
                th scope="col" { "Heartbeat" } th scope="col" { "Agent" } th scope="col" { "Replicas" } th scope="col" { "Mesh" }
            } }
            tbody {
                @for n in &nodes {
                    tr {
                        th scope="row" { a href=(format!("/ui/events?subject={}", enc(&n.name))) { (n.name) } }
                        td { (n.pool) }
                        td { (n.state.as_str()) }
                        td {
                            (bar(n.reserved_cpu_millis, n.cpu_millis, &format!("CPU {} of {} millicores reserved", n.reserved_cpu_millis, n.cpu_millis)))
                            " " (n.reserved_cpu_millis) " / " (n.cpu_millis) " m"
                        }
                        td {
                            (bar(n.reserved_memory_bytes, n.memory_bytes, &format!("memory {} of {} MiB reserved", n.reserved_memory_bytes >> 20, n.memory_bytes >> 20)))
                            " " (n.reserved_memory_bytes >> 20) " / " (n.memory_bytes >> 20) " MiB"
                        }
                        td { @match n.last_seen_ms { Some(t) => (when(t, now)), None => "never" } }
                        td {
                            (n.agent_version.as_deref().unwrap_or("–"))
                            // An agent behind this control plane is sent its older tasks until
                            // it is upgraded: said where an operator plans the upgrade.
                            @if n.older_agent {
                                " " span class="state degraded" { "older protocol " (n.agent_protocol.unwrap_or(0)) }
                            }
                        }
                        td { (n.running) " running of " (n.instances) }
                        td {
                            @match &n.mesh {
                                None => "–",
                                Some(m) => {
                                    ul class="links" {
                                        @for l in &m.links {
                                            li {
                                                (l.node) ": "
                                                @match l.last_handshake { Some(s) => { "handshake " (s) " s ago" } None => "no handshake" }
                                                @if m.down.contains(&l.node) { " " span class="state failing" { "down" } }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        @if let Some(n) = next {
            p class="pager" { a rel="next" href=(format!("/ui/nodes?after={}", enc(&n))) { "More" } }
        }
    };
    page_response(page("Nodes", Screen::Nodes, Some(&who.viewer), tip(&ui), main))
}

#[derive(Deserialize)]
pub struct EventsQuery {
    #[serde(default)]
    subject: String,
    #[serde(default)]
    kind: String,
    before: Option<i64>,
}

/// The merged timeline, newest first.
pub async fn events(State(ui): App, who: Signed, Query(q): Query<EventsQuery>) -> Response {
    let subject = Some(q.subject.trim()).filter(|s| !s.is_empty());
    let kind = Some(q.kind.trim()).filter(|s| !s.is_empty());
    let page_ = match ui.ops.timeline(q.before, kind, subject, SCREEN_ROWS).await {
        Ok(e) => e,
        Err(e) => return failed(&e),
    };
    let now = now_ms();
    let (events, next) = (page_.events, page_.older);
    let partial = next.is_some() && events.len() < SCREEN_ROWS as usize;
    let main = html! {
        h1 { "Events" }
        form method="get" action="/ui/events" class="filters" role="search" {
            label for="subject" { "Environment or node" }
            input id="subject" name="subject" value=(q.subject) maxlength="200";
            label for="kind" { "Kind" }
            input id="kind" name="kind" value=(q.kind) maxlength="100";
            button type="submit" { "Filter" }
        }
        (event_list(&events, now))
        @if partial {
            p { "This page looked at " (TIMELINE_WINDOW) " events; older ones are looked at page by page: follow Older." }
        }
        @if let Some(n) = next {
            p class="pager" { a rel="next" href=(format!("/ui/events?subject={}&kind={}&before={n}", enc(&q.subject), enc(&q.kind))) { "Older" } }
        }
    };
    page_response(page("Events", Screen::Events, Some(&who.viewer), tip(&ui), main))
}

/// Events as a list, newest first, each linking to the timeline of what it concerns.
pub fn event_list(events: &[Event], now: i64) -> Markup {
    html! {
        @if events.is_empty() { p { "No events." } }
        @else {
            ul class="events" {
                @for e in events {
                    li id=(format!("event-{}", e.id)) {
                        (when(e.at_ms, now)) " "
                        a class="kind" href=(format!("/ui/events?kind={}", enc(&e.kind))) { (e.kind) } " "
                        a class="subject" href=(format!("/ui/events?subject={}", enc(&e.subject))) { (e.subject) } " "
                        span class="detail" { (super::render::long_text(&e.detail)) }
                    }
                }
            }
        }
    }
}
