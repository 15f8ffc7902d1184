//! Custom domains' ownership checks (`Domain` documents): the rows follow the Domains of the
//! current rollouts, and each due one is looked up through the configured resolver
//! (`[domains] resolver`: `"system"` or named servers; unset, nothing is looked up): its `_pushleft-challenge` TXT record or its
//! CNAME. Pending domains are looked at again every `pending_recheck_seconds`, proven ones
//! every `recheck_seconds`. Read (rows, DNS), decide (`state_schema::domains`), write
//! (`store::domains`): a first proof routes the domain on its nodes; a domain that stops
//! proving itself is `failing` (an event; still routed, and served with its certificate until
//! that expires, but none is ordered for it).

use crate::config::ResolverSetting;
use crate::store::domains::DomainRow;
use crate::store::{Ledger, LedgerError};
use hickory_resolver::Resolver;
use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::{RData, RecordType};
use state_schema::domains::{self, Answer, DomainState};
use state_schema::model::Verification;
use std::time::Duration;

/// Longest wait for one DNS answer.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);
/// Most domains looked up in one pass (the rest wait for the next).
pub const MAX_PER_PASS: usize = 32;
/// Most TXT strings read from one answer.
const MAX_TXT: usize = 16;

/// The resolver (none configured: no lookup is made) and how often domains are looked at.
pub struct Checking {
    resolver: Option<Resolver<TokioRuntimeProvider>>,
    pending_ms: i64,
    verified_ms: i64,
}

/// Why a domain is not looked up when `[domains] resolver` is unset.
pub const NO_RESOLVER: &str = "no [domains] resolver is configured";

impl Checking {
    /// `setting` `None`: no lookups (Domains stay pending, saying why).
    pub fn new(
        setting: Option<&ResolverSetting>,
        pending_seconds: u64,
        recheck_seconds: u64,
    ) -> Result<Checking, String> {
        let mut opts = ResolverOpts::default();
        opts.timeout = LOOKUP_TIMEOUT;
        opts.attempts = 1;
        // Every check asks afresh: a record just made counts at once.
        opts.cache_size = 0;
        let builder = match setting {
            None => None,
            Some(ResolverSetting::System(_)) => {
                Some(Resolver::builder_tokio().map_err(|e| format!("the system's resolver: {e}"))?)
            }
            Some(ResolverSetting::Servers(servers)) => {
                let servers = servers
                    .iter()
                    .map(|a| {
                        let mut s = NameServerConfig::udp_and_tcp(a.ip());
                        let on_port = |mut c: ConnectionConfig| {
                            c.port = a.port();
                            c
                        };
                        s.connections = vec![on_port(ConnectionConfig::udp()), on_port(ConnectionConfig::tcp())];
                        s
                    })
                    .collect();
                Some(Resolver::builder_with_config(
                    ResolverConfig::from_name_servers(servers),
                    TokioRuntimeProvider::default(),
                ))
            }
        };
        let resolver = builder
            .map(|b| b.with_options(opts).build())
            .transpose()
            .map_err(|e| format!("the resolver: {e}"))?;
        Ok(Checking {
            resolver,
            pending_ms: i64::try_from(pending_seconds.saturating_mul(1000)).unwrap_or(i64::MAX),
            verified_ms: i64::try_from(recheck_seconds.saturating_mul(1000)).unwrap_or(i64::MAX),
        })
    }

    /// What the resolver answers for the record `method` needs.
    async fn ask(&self, method: Verification, hostname: &str) -> Answer {
        let (name, kind) = match method {
            Verification::Txt => (domains::txt_name(hostname), RecordType::TXT),
            Verification::Cname => (hostname.to_owned(), RecordType::CNAME),
        };
        let Some(resolver) = &self.resolver else {
            return Answer::Unanswered(NO_RESOLVER.to_owned());
        };
        let fqdn = format!("{name}.");
        match resolver.lookup(fqdn.as_str(), kind).await {
            Ok(lookup) => {
                let records = lookup.answers();
                match method {
                    Verification::Txt => Answer::Txt(
                        records
                            .iter()
                            .filter_map(|r| match &r.data {
                                RData::TXT(t) => Some(
                                    t.txt_data
                                        .iter()
                                        .map(|b| String::from_utf8_lossy(b).into_owned())
                                        .collect::<String>(),
                                ),
                                _ => None,
                            })
                            .take(MAX_TXT)
                            .collect(),
                    ),
                    Verification::Cname => Answer::Cname(records.iter().find_map(|r| match &r.data {
                        RData::CNAME(c) => Some(c.0.to_ascii()),
                        _ => None,
                    })),
                }
            }
            Err(e) if e.is_no_records_found() || e.is_nx_domain() => match method {
                Verification::Txt => Answer::Txt(Vec::new()),
                Verification::Cname => Answer::Cname(None),
            },
            Err(e) => Answer::Unanswered(e.to_string()),
        }
    }
}

/// The Domains of the current rollouts: (hostname, environment, method), by hostname, with
/// each one's environment's own hostname (the `cname` target).
fn wanted(rollouts: &[crate::store::certificates::Rollout]) -> Vec<(String, String, String, Option<String>)> {
    let mut out = Vec::new();
    for r in rollouts {
        let Ok(spec) = serde_json::from_str::<state_schema::deployment::DeploymentSpec>(&r.spec) else {
            continue;
        };
        let own = spec.own_hostname().map(|h| h.to_string());
        for (h, v) in &spec.domains {
            let method = if *v == Verification::Txt { "txt" } else { "cname" };
            out.push((h.to_string(), r.environment.clone(), method.to_owned(), own.clone()));
        }
    }
    out.sort();
    out
}

/// Looks up every due domain and keeps what it proved. Returns (whether a domain was proven
/// for the first time, when the next one is due).
pub async fn check_due(ledger: &Ledger, checking: &Checking, now_ms: i64) -> Result<(bool, i64), LedgerError> {
    let rollouts = ledger.domains().rollouts_with_domains().await?;
    let wanted = wanted(&rollouts);
    let rows: Vec<(String, String, String)> = wanted
        .iter()
        .map(|(h, e, m, _)| (h.clone(), e.clone(), m.clone()))
        .collect();
    ledger
        .domains()
        .sync_domains(&rows, now_ms, checking.resolver.is_none().then_some(NO_RESOLVER))
        .await?;
    // Nothing to ask (no resolver configured): no lookup and no write until that changes.
    if checking.resolver.is_none() {
        return Ok((false, i64::MAX));
    }
    let control_plane = ledger.control_plane().await?;
    let due: Vec<_> = ledger
        .domains()
        .domains()
        .await?
        .into_iter()
        .filter(|d| d.next_check_at <= now_ms)
        .take(MAX_PER_PASS)
        .collect();
    let answers =
        futures_util::future::join_all(due.iter().map(|d| checking.ask(method_of(&d.method), &d.hostname))).await;
    let mut first_proof = false;
    for (d, answer) in due.iter().zip(answers) {
        let own = wanted
            .iter()
            .find(|(h, ..)| h == &d.hostname)
            .and_then(|(.., o)| o.as_deref());
        first_proof |= keep_check(ledger, checking, d, &answer, (control_plane.as_str(), own), now_ms).await?;
    }
    let next_due = ledger
        .domains()
        .domains()
        .await?
        .iter()
        .map(|d| d.next_check_at)
        .min()
        .unwrap_or(i64::MAX);
    Ok((first_proof, next_due))
}

/// How a domain row's method is proven (`cname`, else `txt`).
fn method_of(method: &str) -> Verification {
    if method == "cname" {
        Verification::Cname
    } else {
        Verification::Txt
    }
}

/// Judges one domain's `answer` (`domains::judge`, then `domains::next_state`) and keeps the
/// outcome with its event. Whether it was proven for the first time.
async fn keep_check(
    ledger: &Ledger,
    checking: &Checking,
    d: &DomainRow,
    answer: &Answer,
    (control_plane, own): (&str, Option<&str>),
    now_ms: i64,
) -> Result<bool, LedgerError> {
    let judged = domains::judge(method_of(&d.method), control_plane, &d.hostname, own, answer);
    let answered = !matches!(answer, Answer::Unanswered(_));
    let before = DomainState::parse(&d.state);
    let after = domains::next_state(
        before,
        d.ever_verified == 1,
        judged.as_ref().map(|_| ()).map_err(|_| ()),
        answered,
    );
    let (seen, reason) = match &judged {
        Ok(seen) => (Some(seen.as_str()), None),
        Err(why) => (None, Some(why.as_str())),
    };
    let event = match (before, after) {
        (b, a) if b == a => None,
        (_, DomainState::Verified) => Some(("domain-verified", seen.unwrap_or_default().to_owned())),
        (_, DomainState::Failing) => Some((
            "domain-failing",
            format!(
                "{}; it keeps its certificate until that expires, and no new one is ordered",
                reason.unwrap_or_default()
            ),
        )),
        (_, DomainState::Pending) => None,
    };
    let next = now_ms
        + if after == DomainState::Verified {
            checking.verified_ms
        } else {
            checking.pending_ms
        };
    tracing::info!(hostname = %d.hostname, method = %d.method, state = after.as_str(), reason = reason.unwrap_or(""), "domain checked");
    ledger
        .domains()
        .domain_checked(
            &crate::store::domains::Checked {
                hostname: &d.hostname,
                state: after,
                seen,
                reason,
                next_check_at: next,
                event,
            },
            now_ms,
            super::certificates::republish_domain,
        )
        .await?;
    Ok(after == DomainState::Verified && d.ever_verified == 0)
}
