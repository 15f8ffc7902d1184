//! The fleet's releases: commit-to-live per day over the last week, drawn and tabled, and the
//! slowest releases by name, each linking to its environment.

use super::charts::fleet_to_live;
use super::render::{Screen, page, utc};
use super::{App, Signed, failed, page_response, tip};
use crate::ops::releases::{DAYS, MOST_RELEASES, SLOWEST};
use axum::extract::State;
use axum::response::Response;
use maud::html;

fn secs(ms: i64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

/// Commit to live across the fleet.
pub async fn page_of(State(ui): App, who: Signed) -> Response {
    let f = match ui.ops.fleet_to_live().await {
        Ok(f) => f,
        Err(e) => return failed(&e),
    };
    let releases: usize = f.days.iter().map(|d| d.releases).sum();
    let main = html! {
        h1 { "Releases" }
        p {
            "Commit to live across the fleet, per UTC day over the last " (DAYS) " days: from the pass "
            "that judged a signed commit to every replica of its release running with its routes "
            "published, as the agents reported it. Rollbacks are not releases."
        }
        @if f.capped {
            p class="notice" { "Only the newest " (MOST_RELEASES) " releases are counted: the oldest days are partial." }
        }
        @if releases == 0 {
            p { "No release went live in these days." }
        } @else {
            (fleet_to_live(&f))
            table {
                caption { "Per day: the bars are the median, the lighter bars behind them the 95th percentile." }
                thead { tr {
                    th scope="col" { "Day (UTC)" } th scope="col" { "Releases" } th scope="col" { "Median" }
                    th scope="col" { "95th percentile" } th scope="col" { "Slowest" }
                } }
                tbody {
                    @for d in &f.days {
                        tr {
                            td { (utc(d.start_ms).chars().take(10).collect::<String>()) }
                            td { (d.releases) }
                            @if d.releases == 0 { td { "–" } td { "–" } td { "–" } }
                            @else { td { (secs(d.p50_ms)) } td { (secs(d.p95_ms)) } td { (secs(d.max_ms)) } }
                        }
                    }
                }
            }
            h2 { "Slowest releases" }
            p { "At most " (SLOWEST) ", slowest first." }
            table {
                thead { tr { th scope="col" { "Environment" } th scope="col" { "Generation" } th scope="col" { "Commit to live" } } }
                tbody {
                    @for (env, generation, ms) in &f.slowest {
                        tr {
                            td { a href=(format!("/ui/environments/{}", super::actions::enc(env))) { (env) } }
                            td { (generation) }
                            td { (secs(*ms)) }
                        }
                    }
                }
            }
        }
    };
    page_response(page("Releases", Screen::Releases, Some(&who.viewer), tip(&ui), main))
}
