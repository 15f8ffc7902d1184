//! The overview (every environment: the commit in force, what its agents report running, its
//! state in words; filtered, searched and paged) and one environment in detail.

use super::actions::{Action, button, enc};
use super::charts::bar;
use super::render::{Screen, StateWords, page, short, state_words, when};
use super::{App, Signed, failed, page_response, tip};
use crate::ops::now_ms;
use crate::ops::screens::{EnvironmentDetail, EnvironmentRow, StateFilter};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use maud::{Markup, html};
use serde::Deserialize;

#[derive(Deserialize)]
pub struct OverviewQuery {
    #[serde(default)]
    q: String,
    #[serde(default)]
    state: String,
    after: Option<String>,
}

fn state_cell(w: &StateWords) -> Markup {
    html! { span class=(format!("state {}", w.class)) { (w.words) } }
}

/// The overview: a page of environments.
pub async fn overview(State(ui): App, who: Signed, Query(q): Query<OverviewQuery>) -> Response {
    let Some(state) = StateFilter::parse(&q.state) else {
        return super::refusal_page(
            StatusCode::BAD_REQUEST,
            "malformed-request",
            "state is any, failing, rolling-out, held or settled",
            Some(&who.viewer),
        );
    };
    let status = match ui.ops.summary().await {
        Ok(s) => s,
        Err(e) => return failed(&e),
    };
    let listed = match ui.ops.overview(&q.q, state, q.after.as_deref()).await {
        Ok(p) => p,
        Err(e) => return failed(&e),
    };
    let now = now_ms();
    let main = html! {
        h1 { "Environments" }
        p class="summary" {
            "Branch " strong { (status.branch) } ", commit in force "
            @match &status.in_force {
                Some(sha) => code { (short(sha)) },
                None => "none yet",
            }
            ". This replica " (if status.leader { "leads" } else { "follows (reads only)" })
            "; last pass " (status.last_pass_ms_ago / 1000) " s ago."
        }
        form method="get" action="/ui/" class="filters" role="search" {
            label for="q" { "Name holds" }
            input id="q" name="q" type="search" value=(q.q) maxlength="100";
            label for="state" { "State" }
            select id="state" name="state" {
                @for s in StateFilter::ALL {
                    option value=(s.as_str()) selected[s == state] { (s.as_str()) }
                }
            }
            button type="submit" { "Filter" }
        }
        @if listed.rows.is_empty() {
            p { "No environment matches." }
        } @else {
            table class="environments" {
                caption { "Each environment's generation in force against what its agents report running" }
                thead { tr {
                    th scope="col" { "Environment" }
                    th scope="col" { "State" }
                    th scope="col" { "Generation" }
                    th scope="col" { "Running" }
                    th scope="col" { "Commit" }
                    th scope="col" { "Signed by" }
                    th scope="col" { "Changed" }
                } }
                tbody {
                    @for r in &listed.rows { (overview_row(r, now)) }
                }
            }
        }
        @if let Some(next) = &listed.next {
            p class="pager" {
                a rel="next" href=(format!("/ui/?q={}&state={}&after={}", enc(&q.q), state.as_str(), enc(next))) { "Next page" }
            }
        }
    };
    page_response(page(
        "Environments",
        Screen::Overview,
        Some(&who.viewer),
        tip(&ui),
        main,
    ))
}

fn overview_row(r: &EnvironmentRow, now: i64) -> Markup {
    let d = &r.deployment;
    html! {
        tr {
            th scope="row" { a href=(format!("/ui/environments/{}", enc(&d.environment))) { (d.environment) } }
            td { (state_cell(&state_words(r))) }
            td { (d.generation) }
            td {
                (d.running) " of " (d.replicas)
                @if d.stale > 0 { ", " (d.stale) " stale" }
            }
            td { @if let Some(sha) = &r.revision { code { (short(sha)) } } }
            td { (r.signer.as_deref().unwrap_or("–")) }
            td { (when(d.updated_at_ms, now)) }
        }
    }
}

/// One environment in detail.
pub async fn environment(State(ui): App, who: Signed, Path(name): Path<String>) -> Response {
    let detail = match ui.ops.environment_detail(&name).await {
        Ok(d) => d,
        Err(e) => return failed(&e),
    };
    let main = environment_main(&detail, &who.viewer);
    page_response(page(&name, Screen::Other, Some(&who.viewer), tip(&ui), main))
}

fn environment_main(x: &EnvironmentDetail, v: &super::render::Viewer) -> Markup {
    let now = now_ms();
    let d = &x.row.deployment;
    let env = d.environment.as_str();
    let words = state_words(&x.row);
    let held = d.hold.as_ref().is_some_and(|h| !h.released);
    html! {
        h1 { "Environment " (env) }
        p class="summary" { (state_cell(&words)) }
        dl class="facts" {
            dt { "Generation" } dd { (d.generation) " (" (d.status.as_str()) ", step " (d.step) ")" }
            dt { "Commit" } dd { @if let Some(sha) = &x.row.revision { code { (sha) } } @else { "–" } }
            dt { "Signed by" } dd { (x.row.signer.as_deref().unwrap_or("–")) }
            dt { "Running" } dd { (d.running) " of " (d.replicas) " placed (" (d.asked()) " asked)" }
            dt { "Previous generation" } dd { @if d.previous_generation > 0 { (d.previous_generation) } @else { "none" } }
            dt { "Changed" } dd { (when(d.updated_at_ms, now)) }
        }
        @if v.acts() {
            section aria-labelledby="actions" {
                h2 id="actions" { "Actions" }
                p class="actions" {
                    @if held { (button(v, Action::Release, env, None)) }
                    @else if d.previous_generation > 0 { (button(v, Action::Rollback, env, None)) }
                    @if d.canary.as_ref().is_some_and(|c| c.waits_for_promote) { (button(v, Action::Promote, env, None)) }
                    @if d.status == operator_proto::DeploymentStatus::InProgress { (button(v, Action::Abort, env, None)) }
                    (button(v, Action::Reconcile, env, None))
                }
            }
        }
        @if let Some(c) = &d.canary {
            section aria-labelledby="rollout" {
                h2 id="rollout" { "Rollout" }
                p { "Canary: " (c.weight) "% of requests on generation " (d.generation) "." }
                (bar(u64::from(c.weight), 100, &format!("canary share {}%", c.weight)))
            }
        }
        @if !x.measures.is_empty() {
            section aria-labelledby="measures" {
                h2 id="measures" { "Canary steps" }
                p { "Generation " (d.generation) "'s canary, per step its gates judged: the share of requests it had, and what the ingresses measured of them." }
                (super::charts::measures_chart(&x.measures))
            }
        }
        (replicas_and_history(x, v, now))
        (volumes_hostnames_events(x, v, now))
    }
}

/// The roles the generation places, each once.
fn roles_of(x: &EnvironmentDetail) -> Vec<&str> {
    let mut roles: Vec<&str> = x.replicas.iter().map(|r| r.role.as_str()).collect();
    roles.sort_unstable();
    roles.dedup();
    roles
}

/// Replicas per node with health, generations with their commits, recent jobs.
fn replicas_and_history(x: &EnvironmentDetail, v: &super::render::Viewer, now: i64) -> Markup {
    let d = &x.row.deployment;
    html! {
        section aria-labelledby="replicas" {
            h2 id="replicas" { "Replicas" }
            @if v.acts() {
                p class="logs" {
                    @for role in roles_of(x) {
                        a href=(format!("/ui/environments/{}/logs/{}", enc(&d.environment), enc(role))) { "Logs of " (role) }
                        " "
                    }
                }
            }
            table {
                thead { tr { th scope="col" { "Role" } th scope="col" { "Replica" } th scope="col" { "Node" } th scope="col" { "Health" } } }
                tbody {
                    @for r in &x.replicas {
                        tr {
                            td { (r.role) } td { (r.index) } td { (r.node) }
                            td { @if r.running { span class="state settled" { "running, healthy" } } @else { span class="state failing" { "not reported running" } } }
                        }
                    }
                    @for w in &d.waiting {
                        tr { td { (w.role) } td { (w.index) } td { "–" } td { span class="state degraded" { "waiting: " (w.reason) } } }
                    }
                }
            }
        }
        @if !x.to_live.is_empty() {
            section aria-labelledby="to-live" {
                h2 id="to-live" { "Commit to live" }
                p { "Seconds from each release's commit being judged to its last replica serving it." }
                (super::charts::live_times(&x.to_live))
            }
        }
        section aria-labelledby="generations" {
            h2 id="generations" { "Generations" }
            table {
                thead { tr { th scope="col" { "Generation" } th scope="col" { "Action" } th scope="col" { "Commit" } th scope="col" { "Signed by" } th scope="col" { "Made" } th scope="col" { "Outcome" } } }
                tbody {
                    @for g in &x.generations {
                        tr {
                            td { (g.generation) } td { (g.action) }
                            td { @if let Some(s) = &g.sha { code { (short(s)) } } }
                            td { (g.signer.as_deref().unwrap_or("–")) }
                            td { (when(g.created_at_ms, now)) }
                            td { @if g.generation == d.generation { (d.status.as_str()) } @else { "replaced" } }
                        }
                    }
                }
            }
        }
        section aria-labelledby="jobs" {
            h2 id="jobs" { "Recent jobs" }
            table {
                thead { tr { th scope="col" { "Job" } th scope="col" { "Node" } th scope="col" { "State" } th scope="col" { "Reason" } } }
                tbody {
                    @for j in &x.jobs {
                        tr { td { code { (j.key) } } td { (j.target_node) } td { (j.state.as_str()) } td { (super::render::long_text(j.reason.as_deref().unwrap_or(""))) } }
                    }
                }
            }
        }
    }
}

/// Volumes with their backups, hostnames with their certificates, the environment's events.
fn volumes_hostnames_events(x: &EnvironmentDetail, v: &super::render::Viewer, now: i64) -> Markup {
    let env = x.row.deployment.environment.as_str();
    html! {
        @if !x.volumes.is_empty() {
            section aria-labelledby="volumes" {
                h2 id="volumes" { "Volumes" }
                table {
                    thead { tr { th scope="col" { "Volume" } th scope="col" { "Node" } th scope="col" { "Last backup" } th scope="col" { "Last proven restore" } th scope="col" {} } }
                    tbody {
                        @for vol in &x.volumes {
                            tr {
                                td { (vol.volume) } td { (vol.node) }
                                td { @if let Some(b) = x.backups.backups.iter().find(|b| b.volume == vol.volume) { (b.status.as_str()) ", " (when(b.finished_at_ms, now)) } @else { "none" } }
                                td { @if let Some(p) = x.backups.proven.iter().find(|p| p.volume == vol.volume) { (when(p.at_ms, now)) } @else { "none" } }
                                td { (button(v, Action::Backup, env, Some(&vol.volume))) }
                            }
                        }
                    }
                }
            }
        }
        @if !x.domains.is_empty() {
            section aria-labelledby="hostnames" {
                h2 id="hostnames" { "Hostnames" }
                table {
                    thead { tr { th scope="col" { "Hostname" } th scope="col" { "State" } th scope="col" { "Certificate" } } }
                    tbody {
                        @for dm in &x.domains {
                            tr {
                                td { (dm.hostname) } td { (dm.state.as_str()) }
                                td { @match dm.certificate.as_ref().and_then(|c| c.issued.as_ref()) {
                                    Some(i) => { "expires " (super::render::utc(i.not_after_ms)) }
                                    None => "–",
                                } }
                            }
                        }
                    }
                }
            }
        }
        section aria-labelledby="events" {
            h2 id="events" { "Events" }
            (super::lists::event_list(&x.events, now))
            p { a href=(format!("/ui/events?subject={}", enc(env))) { "All events of " (env) } }
        }
    }
}
