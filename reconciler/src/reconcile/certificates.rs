//! Certificates for the hostnames the control plane serves, when `[certificates]` names an
//! issuer: each hostname of a current rollout that brings no certificate of its own (`tls` in
//! Git) gets one, renewed after two thirds of its lifetime, and a failure is retried with a
//! doubling backoff (1 min to 6 h), so a hostname that keeps failing cannot hammer its issuer.
//! An issuance queues the publishes that hand the certificate to every node serving the
//! hostname (`store::certificates`). Read, decide ([`due`], [`backoff_ms`], [`renew_after`]),
//! write; the issuer's key is sealed to the control host before it is written.

use crate::issuer::LocalCa;
use crate::store::certificates::{CertificateRow, Issued};
use crate::store::{Ledger, LedgerError};
use state_schema::deployment::DeploymentSpec;
use std::collections::BTreeMap;

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

/// What issues, and what an issued key is sealed to.
pub struct Issuing {
    pub ca: LocalCa,
    /// The control host's own recipients (`control.age_identity`).
    pub control: Vec<String>,
}

/// The hostnames of current rollouts that bring no certificate: hostname → (spec, generation,
/// whether the rollout has published its routes: done, or at its publish step or past it). A hostname is in one environment only (validation refuses a
/// conflict).
fn wanted(rollouts: Vec<crate::store::certificates::Rollout>) -> BTreeMap<String, (DeploymentSpec, u64, bool)> {
    let mut out = BTreeMap::new();
    for r in rollouts {
        let Ok(spec) = serde_json::from_str::<DeploymentSpec>(&r.spec) else {
            continue;
        };
        let generation = u64::try_from(r.generation).unwrap_or(0);
        let done =
            r.status == "done" || usize::try_from(r.step).is_ok_and(|s| s >= state_schema::rollout::PUBLISH_STEP);
        for h in spec.hostnames.iter().filter(|h| spec.certificate(h.as_str()).is_none()) {
            out.insert(h.to_string(), (spec.clone(), generation, done));
        }
    }
    out
}

/// Issues every certificate that is due; returns how many were issued.
pub async fn issue_due(
    ledger: &Ledger,
    hub: &crate::hub::Hub,
    issuing: &Issuing,
    now_ms: i64,
) -> Result<usize, LedgerError> {
    let rows: BTreeMap<String, CertificateRow> = ledger
        .certificates()
        .await?
        .into_iter()
        .map(|r| (r.hostname.clone(), r))
        .collect();
    let mut issued = 0;
    for (hostname, (spec, generation, done)) in wanted(ledger.rollouts().await?) {
        let row = rows.get(&hostname);
        if !due(row, now_ms) {
            continue;
        }
        let signed = issuing.ca.sign(&hostname).map_err(|e| e.to_string()).and_then(|s| {
            pushleft_secrets::encrypt(s.key.as_bytes(), &issuing.control)
                .map(|sealed| (s, sealed))
                .map_err(|e| format!("sealing the key: {}", e.code()))
        });
        match signed {
            Ok((s, key_sealed)) => {
                let queued = ledger
                    .store_certificate(
                        &Issued {
                            hostname: &hostname,
                            issuer: "local",
                            chain: &s.chain,
                            key_sealed: &key_sealed,
                            not_before: s.not_before_ms,
                            not_after: s.not_after_ms,
                            renew_after: renew_after(s.not_before_ms, s.not_after_ms),
                        },
                        &spec,
                        generation,
                        done,
                        now_ms,
                    )
                    .await?;
                tracing::info!(hostname = %hostname, issuer = "local", not_after_ms = s.not_after_ms, publishes = queued, "certificate issued");
                issued += 1;
            }
            Err(why) => {
                let failures = row.map_or(0, |r| r.failures) + 1;
                let retry_at = now_ms + backoff_ms(failures);
                tracing::warn!(hostname = %hostname, failures, retry_at_ms = retry_at, reason = %why, "certificate not issued");
                ledger
                    .certificate_failed(&hostname, "local", &why, retry_at, now_ms)
                    .await?;
            }
        }
    }
    // What `/metrics` shows: every row as it stands now.
    let gauges = ledger
        .certificates()
        .await?
        .into_iter()
        .map(|r| (r.hostname, if r.chain.is_some() { r.not_after } else { 0 }, r.failures))
        .collect();
    if let Ok(mut g) = hub.certificates.lock() {
        *g = gauges;
    }
    Ok(issued)
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
        }
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
