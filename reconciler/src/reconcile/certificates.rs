//! Certificates for the hostnames the control plane serves, when `[certificates]` names an
//! issuer: each hostname of a current rollout that brings no certificate of its own (`tls` in
//! Git) gets one, renewed after two thirds of its lifetime, and a failure is retried with a
//! doubling backoff (1 min to 6 h), so a hostname that keeps failing cannot hammer its issuer.
//! An issuance queues the publishes that hand the certificate to every node serving the
//! hostname (`store::certificates`). Read, decide ([`due`], [`backoff_ms`], [`renew_after`]),
//! write; the issuer's key is sealed to the control host before it is written.

use crate::issuer::{Signed, Signer};
use crate::store::certificates::{CertificateRow, Issued, Rollout};
use crate::store::rows::JobState;
use crate::store::{Ledger, LedgerError};
use state_schema::deployment::DeploymentSpec;
use state_schema::domains::DomainState;
use state_schema::generations::Status;
use state_schema::rollout::{PUBLISH_STEP, Step};
use state_schema::task::Task;
use state_schema::values::Hostname;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A rollout's spec and generation once it has published its routes (done, or at its publish
/// step or past it): before that, its own publish hands out what is new.
fn published(r: &Rollout) -> Option<(DeploymentSpec, u64)> {
    let done =
        Status::parse(&r.status) == Some(Status::Done) || usize::try_from(r.step).is_ok_and(|s| s >= PUBLISH_STEP);
    let spec = serde_json::from_str::<DeploymentSpec>(&r.spec).ok()?;
    done.then(|| (spec, u64::try_from(r.generation).unwrap_or(0)))
}

/// The publishes that hand a certificate issued (the `issued`th time) to the nodes serving
/// `hostname` in rollout `r` (`rollout::republish_certificate`), once it has published.
fn republish_certificate(r: &Rollout, hostname: &str, issued: u32) -> Step {
    published(r).map_or_else(Vec::new, |(spec, generation)| {
        state_schema::rollout::republish_certificate(&spec, generation, hostname, issued)
    })
}

/// The publishes that route a first-proven domain in rollout `r`
/// (`rollout::republish_domain`), once it has published.
pub(super) fn republish_domain(r: &Rollout, hostname: &str) -> Step {
    published(r).map_or_else(Vec::new, |(spec, generation)| {
        state_schema::rollout::republish_domain(&spec, generation, hostname)
    })
}

/// Without a hint, how often the rollouts' hostnames are looked at.
pub const CHECK_EVERY_MS: i64 = 60_000;
/// The first retry after a failure; it doubles with each failure up to [`MAX_BACKOFF_MS`].
pub const FIRST_BACKOFF_MS: i64 = 60_000;
pub const MAX_BACKOFF_MS: i64 = 6 * 3_600_000;

/// When a certificate valid from `not_before` to `not_after` is renewed: after two thirds of
/// its lifetime (Let's Encrypt's advice; a 90-day certificate is renewed at day 60).
pub fn renew_after(not_before: i64, not_after: i64) -> i64 {
    not_before + (not_after - not_before).max(0) * 2 / 3
}

/// How long to wait after the `failures`-th failure in a row.
pub fn backoff_ms(failures: i64) -> i64 {
    let doublings = u32::try_from(failures.saturating_sub(1).clamp(0, 20)).unwrap_or(20);
    FIRST_BACKOFF_MS.saturating_mul(1_i64 << doublings).min(MAX_BACKOFF_MS)
}

/// Whether `hostname` needs a certificate issued now: it has none, or it is past its renewal
/// time; and it is not waiting out a failure's backoff.
pub fn due(row: Option<&CertificateRow>, now_ms: i64) -> bool {
    match row {
        None => true,
        Some(r) if now_ms < r.retry_at => false,
        Some(r) => r.chain.is_none() || now_ms >= r.renew_after,
    }
}

/// What issues a certificate: a signer that answers at once (the local CA), or an ACME CA,
/// whose orders run as tasks of their own (they take seconds, and wait on the nodes).
pub enum Issuer {
    Signer(Box<dyn Signer>),
    Acme(Arc<crate::acme::Acme>),
}

/// What issues, what an issued key is sealed to, and the ACME orders in flight.
pub struct Issuing {
    pub issuer: Issuer,
    /// The control host's own recipients (`control.age_identity`).
    pub control: Vec<String>,
    /// The hostnames whose order runs now (one order per hostname at a time).
    in_flight: Arc<Mutex<BTreeSet<String>>>,
    max_orders: usize,
}

impl Issuing {
    pub fn new(issuer: Issuer, control: Vec<String>, max_orders: usize) -> Issuing {
        Issuing {
            issuer,
            control,
            in_flight: Arc::default(),
            max_orders: max_orders.max(1),
        }
    }
}

/// A hostname a current rollout serves without a certificate of its own.
#[derive(Clone)]
struct Wanted {
    hostname: Hostname,
    spec: DeploymentSpec,
    generation: u64,
}

/// The hostnames of current rollouts that bring no certificate, less the Domains not proven at
/// their last check (`verified`: the Domains that are): no certificate is ordered for a name
/// whose owner has not shown it points here. A hostname is in one environment only
/// (validation refuses a conflict).
fn wanted(rollouts: Vec<crate::store::certificates::Rollout>, verified: &BTreeSet<String>) -> BTreeMap<String, Wanted> {
    let mut out = BTreeMap::new();
    for r in rollouts {
        let Ok(spec) = serde_json::from_str::<DeploymentSpec>(&r.spec) else {
            continue;
        };
        let generation = u64::try_from(r.generation).unwrap_or(0);
        let wants = |h: &&Hostname| {
            spec.certificate(h.as_str()).is_none()
                && (spec.domain(h.as_str()).is_none() || verified.contains(h.as_str()))
        };
        for h in spec.hostnames.iter().filter(wants) {
            out.insert(
                h.to_string(),
                Wanted {
                    hostname: h.clone(),
                    spec: spec.clone(),
                    generation,
                },
            );
        }
    }
    out
}

/// Issues every certificate that is due; returns how many were issued now (ACME orders
/// started now finish later, each in a task of its own).
pub async fn issue_due(
    ledger: &Arc<Ledger>,
    hub: &Arc<crate::hub::Hub>,
    issuing: &Issuing,
    now_ms: i64,
) -> Result<usize, LedgerError> {
    let verified = ledger
        .domains()
        .domains()
        .await?
        .into_iter()
        .filter(|d| DomainState::parse(&d.state) == DomainState::Verified)
        .map(|d| d.hostname)
        .collect();
    let wanted = wanted(ledger.certificates().rollouts().await?, &verified);
    issue_wanted(ledger, hub, issuing, wanted, now_ms).await
}

/// [`issue_due`] for the hostnames `wanted` names.
async fn issue_wanted(
    ledger: &Arc<Ledger>,
    hub: &Arc<crate::hub::Hub>,
    issuing: &Issuing,
    wanted: BTreeMap<String, Wanted>,
    now_ms: i64,
) -> Result<usize, LedgerError> {
    let rows: BTreeMap<String, CertificateRow> = ledger
        .certificates()
        .certificates()
        .await?
        .into_iter()
        .map(|r| (r.hostname.clone(), r))
        .collect();
    let mut issued = 0;
    for (hostname, w) in wanted {
        let row = rows.get(&hostname);
        if !due(row, now_ms) {
            continue;
        }
        let failures = row.map_or(0, |r| r.failures);
        match &issuing.issuer {
            Issuer::Signer(ca) => {
                let signed = ca.sign(&hostname).map_err(|e| e.to_string());
                issued += keep(ledger, &issuing.control, ca.issuer(), &w, failures, signed, now_ms).await?;
            }
            Issuer::Acme(acme) => {
                // Nowhere served yet: no node could answer the challenge.
                if w.spec.ingress_nodes.is_empty() {
                    continue;
                }
                let Ok(mut flying) = issuing.in_flight.lock() else {
                    continue;
                };
                if flying.contains(&hostname) || flying.len() >= issuing.max_orders {
                    continue;
                }
                flying.insert(hostname.clone());
                drop(flying);
                let order = Order {
                    ledger: Arc::clone(ledger),
                    hub: Arc::clone(hub),
                    acme: Arc::clone(acme),
                    control: issuing.control.clone(),
                    _flying: Flying {
                        hostname: hostname.clone(),
                        in_flight: Arc::clone(&issuing.in_flight),
                    },
                    wanted: w,
                    failures,
                };
                let run = tokio::spawn(order.run());
                // A panic is kept as a failure, with its backoff, like any other: never an
                // order retried at once.
                let ledger = Arc::clone(ledger);
                tokio::spawn(async move {
                    if run.await.is_err_and(|e| e.is_panic()) {
                        let why = "the order stopped on an internal error (see the daemon's log)";
                        let now = crate::store::now_ms();
                        let _ = ledger
                            .certificates()
                            .certificate_failed(&hostname, "acme", why, now + backoff_ms(failures + 1), now)
                            .await;
                    }
                });
            }
        }
    }
    refresh_gauges(ledger, hub).await?;
    Ok(issued)
}

/// Keeps what an issuance came to: the certificate (its key sealed to the control host) and
/// the publishes that deliver it, or the failure with its backoff. Returns 1 when issued.
async fn keep(
    ledger: &Ledger,
    control: &[String],
    issuer: &str,
    w: &Wanted,
    failures: i64,
    signed: Result<Signed, String>,
    now_ms: i64,
) -> Result<usize, LedgerError> {
    let hostname = w.hostname.as_str();
    let sealed = signed.and_then(|s| {
        pushleft_secrets::encrypt(s.key.as_bytes(), control)
            .map(|sealed| (s, sealed))
            .map_err(|e| format!("sealing the key: {}", e.code()))
    });
    match sealed {
        Ok((s, key_sealed)) => {
            let queued = ledger
                .certificates()
                .store_certificate(
                    &Issued {
                        hostname,
                        issuer,
                        chain: &s.chain,
                        key_sealed: &key_sealed,
                        not_before: s.not_before_ms,
                        not_after: s.not_after_ms,
                        renew_after: renew_after(s.not_before_ms, s.not_after_ms),
                    },
                    w.spec.environment.as_str(),
                    now_ms,
                    republish_certificate,
                )
                .await?;
            tracing::info!(hostname = %hostname, issuer, not_after_ms = s.not_after_ms, publishes = queued, "certificate issued");
            Ok(1)
        }
        Err(why) => {
            let failures = failures + 1;
            let retry_at = now_ms + backoff_ms(failures);
            tracing::warn!(hostname = %hostname, issuer, failures, retry_at_ms = retry_at, reason = %why, "certificate not issued");
            ledger
                .certificates()
                .certificate_failed(hostname, issuer, &why, retry_at, now_ms)
                .await?;
            Ok(0)
        }
    }
}

/// What `/metrics` shows: every row as it stands now.
async fn refresh_gauges(ledger: &Ledger, hub: &crate::hub::Hub) -> Result<(), LedgerError> {
    let gauges = ledger
        .certificates()
        .certificates()
        .await?
        .into_iter()
        .map(|r| (r.hostname, if r.chain.is_some() { r.not_after } else { 0 }, r.failures))
        .collect();
    if let Ok(mut g) = hub.certificates.lock() {
        *g = gauges;
    }
    Ok(())
}

/// Longest wait for every serving node to answer a challenge.
pub const PLACE_TIMEOUT: Duration = Duration::from_secs(60);

/// One ACME order, run as a task of its own.
struct Order {
    ledger: Arc<Ledger>,
    hub: Arc<crate::hub::Hub>,
    acme: Arc<crate::acme::Acme>,
    control: Vec<String>,
    _flying: Flying,
    wanted: Wanted,
    failures: i64,
}

/// A hostname's place among the orders in flight, given up when its order ends however it
/// ends (a panic included).
struct Flying {
    hostname: String,
    in_flight: Arc<Mutex<BTreeSet<String>>>,
}

impl Drop for Flying {
    fn drop(&mut self) {
        if let Ok(mut f) = self.in_flight.lock() {
            f.remove(&self.hostname);
        }
    }
}

impl Order {
    async fn run(self) {
        let hostname = self.wanted.hostname.to_string();
        let span = tracing::info_span!("acme_order", hostname = %hostname);
        let signed = tracing::Instrument::instrument(self.acme.order(&hostname, &self), span)
            .await
            .map_err(|e| e.to_string());
        let kept = keep(
            &self.ledger,
            &self.control,
            "acme",
            &self.wanted,
            self.failures,
            signed,
            crate::store::now_ms(),
        )
        .await;
        if let Err(e) = kept.and(refresh_gauges(&self.ledger, &self.hub).await) {
            tracing::error!(hostname = %hostname, error = %e, "the order's outcome was not kept; it is retried at the next check");
        }
        self.hub.jobs.notify_waiters();
    }
}

/// The challenge goes to every node serving the hostname as a `place-acme-challenge` job;
/// placed when every one succeeded (each checks its own Caddy answers it).
impl crate::acme::Challenges for Order {
    fn place<'a>(&'a self, token: &'a str, key_authorization: &'a str) -> crate::acme::Placing<'a> {
        Box::pin(async move {
            let w = &self.wanted;
            let tasks: Vec<(Task, String)> = w
                .spec
                .ingress_nodes
                .iter()
                .map(|node| {
                    let task = Task::PlaceAcmeChallenge {
                        environment: w.spec.environment.clone(),
                        hostname: w.hostname.clone(),
                        generation: w.generation,
                        token: token.to_owned(),
                        key_authorization: key_authorization.to_owned(),
                    };
                    (task, node.to_string())
                })
                .collect();
            let keys = self
                .ledger
                .certificates()
                .enqueue_tasks(&tasks, crate::store::now_ms())
                .await
                .map_err(|e| e.to_string())?;
            self.hub.jobs.notify_waiters();
            let deadline = tokio::time::Instant::now() + PLACE_TIMEOUT;
            loop {
                let outcomes = self
                    .ledger
                    .certificates()
                    .job_outcomes(&keys)
                    .await
                    .map_err(|e| e.to_string())?;
                if let Some(bad) = outcomes
                    .iter()
                    .find(|o| o.state.broken() || o.state == JobState::Cancelled)
                {
                    return Err(format!(
                        "node {}: {}",
                        bad.target_node,
                        bad.detail.as_deref().unwrap_or(bad.state.as_str())
                    ));
                }
                if outcomes.len() == keys.len() && outcomes.iter().all(|o| o.state == JobState::Succeeded) {
                    return Ok(());
                }
                if tokio::time::Instant::now() >= deadline {
                    let waiting: Vec<String> = outcomes
                        .iter()
                        .filter(|o| o.state != JobState::Succeeded)
                        .map(|o| format!("{} ({})", o.target_node, o.state.as_str()))
                        .collect();
                    return Err(format!(
                        "not answered within {} s by {}",
                        PLACE_TIMEOUT.as_secs(),
                        waiting.join(", ")
                    ));
                }
                // One small indexed read; the nodes answer within tens of milliseconds.
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(chain: bool, renew_after: i64, retry_at: i64) -> CertificateRow {
        CertificateRow {
            hostname: "a.example.com".into(),
            issuer: "local".into(),
            chain: chain.then(|| "pem".into()),
            key_sealed: chain.then(|| "sealed".into()),
            not_before: 0,
            not_after: 0,
            renew_after,
            issued: 1,
            failures: 0,
            retry_at,
            last_error: None,
            issued_at: 0,
        }
    }

    async fn first(ledger: &Ledger) -> CertificateRow {
        ledger
            .certificates()
            .certificates()
            .await
            .expect("rows")
            .into_iter()
            .next()
            .expect("a row")
    }

    /// Fails while `failing` is set, then signs with a real local CA.
    struct Flaky {
        failing: std::sync::atomic::AtomicBool,
        ca: crate::issuer::LocalCa,
    }

    impl Signer for std::sync::Arc<Flaky> {
        fn issuer(&self) -> &'static str {
            "local"
        }
        fn sign(&self, hostname: &str) -> Result<crate::issuer::Signed, crate::issuer::IssueError> {
            if self.failing.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(crate::issuer::IssueError::Name {
                    hostname: hostname.to_owned(),
                    message: "the issuer is down".into(),
                });
            }
            self.ca.sign(hostname)
        }
    }

    #[tokio::test]
    async fn a_failed_issuance_backs_off_then_issues_and_renews_on_the_ledger() {
        use std::sync::atomic::Ordering;
        let dir = tempfile::tempdir().expect("tempdir");
        let (ledger, _) = Ledger::sqlite_in(dir.path()).await;
        let ledger = Arc::new(ledger);
        let hub = Arc::new(crate::hub::Hub::default());
        let control = age::x25519::Identity::generate();
        let ca = crate::issuer::LocalCa::open_or_create(
            &dir.path().join("ca.crt"),
            &dir.path().join("ca.key"),
            ".localhost",
            24,
        )
        .expect("ca");
        let flaky = std::sync::Arc::new(Flaky {
            failing: std::sync::atomic::AtomicBool::new(true),
            ca,
        });
        let issuing = Issuing::new(
            Issuer::Signer(Box::new(std::sync::Arc::clone(&flaky))),
            vec![control.to_public().to_string()],
            1,
        );
        let spec: DeploymentSpec = serde_json::from_value(serde_json::json!({
            "environment": "shop-production", "project": "shop", "instances": [], "release": [],
            "hostnames": ["shop.example.com"], "nodes": ["n1"], "ingress_nodes": ["n1"],
        }))
        .expect("spec");
        let wanted = || {
            BTreeMap::from([(
                "shop.example.com".to_owned(),
                Wanted {
                    hostname: Hostname::new("shop.example.com").expect("hostname"),
                    spec: spec.clone(),
                    generation: 3,
                },
            )])
        };

        // Down: nothing issued; the failure, its reason and when to try again are kept.
        let t0 = 1_000_000;
        assert_eq!(
            issue_wanted(&ledger, &hub, &issuing, wanted(), t0).await.expect("pass"),
            0
        );
        let r = first(&ledger).await;
        assert_eq!(
            (r.chain.is_none(), r.failures, r.retry_at),
            (true, 1, t0 + FIRST_BACKOFF_MS)
        );
        assert!(
            r.last_error
                .as_deref()
                .is_some_and(|e| e.contains("the issuer is down")),
            "{r:?}"
        );
        assert_eq!(
            *hub.certificates.lock().expect("gauges"),
            [("shop.example.com".to_owned(), 0, 1)]
        );
        // Within the backoff nothing is asked of the issuer, up or not.
        flaky.failing.store(false, Ordering::Relaxed);
        assert_eq!(
            issue_wanted(&ledger, &hub, &issuing, wanted(), t0 + 1_000)
                .await
                .expect("pass"),
            0
        );
        assert_eq!(first(&ledger).await.failures, 1);

        // After it: issued, the failures cleared, the key sealed to the control host.
        let t1 = t0 + FIRST_BACKOFF_MS;
        assert_eq!(
            issue_wanted(&ledger, &hub, &issuing, wanted(), t1).await.expect("pass"),
            1
        );
        let r = first(&ledger).await;
        assert_eq!((r.issued, r.failures, r.retry_at), (1, 0, 0));
        assert!(r.chain.as_deref().is_some_and(|c| c.contains("BEGIN CERTIFICATE")));
        let sealed = r.key_sealed.clone().expect("key");
        assert!(!sealed.contains("PRIVATE KEY"), "sealed at rest");
        let ids: Vec<Box<dyn age::Identity + Send + Sync>> = vec![Box::new(control.clone())];
        let key = pushleft_secrets::decrypt(&sealed, &ids).expect("the control host opens it");
        assert!(String::from_utf8_lossy(&key).contains("PRIVATE KEY"));
        // Not due again until its renewal time; a failed renewal keeps the certificate.
        assert_eq!(
            issue_wanted(&ledger, &hub, &issuing, wanted(), t1 + 1_000)
                .await
                .expect("pass"),
            0
        );
        flaky.failing.store(true, Ordering::Relaxed);
        assert_eq!(
            issue_wanted(&ledger, &hub, &issuing, wanted(), r.renew_after)
                .await
                .expect("pass"),
            0
        );
        let failed = first(&ledger).await;
        assert_eq!(
            (failed.failures, failed.chain.is_some()),
            (1, true),
            "kept, and served until it expires"
        );
        flaky.failing.store(false, Ordering::Relaxed);
        let later = failed.retry_at;
        assert_eq!(
            issue_wanted(&ledger, &hub, &issuing, wanted(), later)
                .await
                .expect("pass"),
            1
        );
        let renewed = first(&ledger).await;
        assert_eq!((renewed.issued, renewed.failures), (2, 0));
        assert_ne!(renewed.chain, r.chain, "a new certificate");
        let kinds: Vec<String> = sqlx::query_scalar("SELECT kind FROM events ORDER BY id")
            .fetch_all(&ledger.pool)
            .await
            .expect("events");
        assert_eq!(
            kinds,
            [
                "certificate-failed",
                "certificate-issued",
                "certificate-failed",
                "certificate-issued"
            ]
        );
    }

    #[test]
    fn renewal_comes_after_two_thirds_and_failures_back_off() {
        assert_eq!(renew_after(0, 90), 60);
        assert!(due(None, 0));
        assert!(!due(Some(&row(true, 100, 0)), 99));
        assert!(due(Some(&row(true, 100, 0)), 100));
        assert!(!due(Some(&row(false, 0, 500)), 499), "waits out its backoff");
        assert!(due(Some(&row(false, 0, 500)), 500));
        assert_eq!(backoff_ms(1), 60_000);
        assert_eq!(backoff_ms(2), 120_000);
        assert_eq!(backoff_ms(100), MAX_BACKOFF_MS);
    }
}
