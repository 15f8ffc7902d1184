//! The node's certificate renewed before it expires. A certificate lives
//! `control.node_cert_hours` (24 by default); at two thirds of its life the agent makes a new
//! key, has the control plane sign it over mutual TLS with the current certificate, writes the
//! new files to the enrolment folder and switches its client to them: without this a node
//! was cut off when its first certificate ended, a day after enrolment.
//!
//! The files are replaced whole and in an order a crash cannot break: the new key, certificate
//! and CA are written beside the old ones as `*.new` (0600, synced), then renamed over them;
//! `finish_interrupted` completes a renewal a crash cut between two renames, before the folder
//! is read at start.

use crate::client::AgentClient;
use crate::folder::{CA, CERT, KEY};
use anyhow::{Context, Result, anyhow};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long after a failed renewal the next is tried (the certificate's last third leaves
/// hours).
pub const RETRY: Duration = Duration::from_secs(60);
/// The longest the loop sleeps between two looks (a clock changed, a certificate replaced by
/// hand).
pub const LOOK_AT_MOST: Duration = Duration::from_secs(600);

/// A certificate's validity, in ms since the epoch: (not before, not after).
pub fn validity(pem: &[u8]) -> Result<(i64, i64)> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem).map_err(|e| anyhow!("the node's certificate: {e}"))?;
    let cert = block.parse_x509().map_err(|e| anyhow!("the node's certificate: {e}"))?;
    let v = cert.validity();
    Ok((v.not_before.timestamp() * 1000, v.not_after.timestamp() * 1000))
}

/// When a certificate valid from `not_before` to `not_after` is renewed: at two thirds of its
/// life.
pub fn due_at(not_before: i64, not_after: i64) -> i64 {
    not_before + (not_after - not_before).max(0) * 2 / 3
}

fn fresh(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.new"))
}

/// Completes a renewal a crash interrupted: the `*.new` files are whole once any was renamed
/// (all were written and synced first), so every one still there is renamed into place.
pub fn finish_interrupted(dir: &Path) -> Result<()> {
    if !fresh(dir, CERT).exists() {
        // Written last and renamed last: without it, no rename had begun; a stray new key or CA
        // (a crash while writing) is not used.
        for name in [KEY, CA] {
            let _ = std::fs::remove_file(fresh(dir, name));
        }
        return Ok(());
    }
    for name in [KEY, CA, CERT] {
        let new = fresh(dir, name);
        if new.exists() {
            std::fs::rename(&new, dir.join(name)).with_context(|| format!("finishing {}", new.display()))?;
        }
    }
    tracing::info!(dir = %dir.display(), "an interrupted certificate renewal finished");
    Ok(())
}

/// Renews now: a new key and signing request for `node`, the control plane's certificate for
/// it, the enrolment folder's files replaced, and `client` switched to them. Returns when the
/// new certificate expires.
pub fn renew(client: &AgentClient, node: &str, dir: &Path) -> Result<i64> {
    let (key, csr) = crate::enroll::signing_request(node)?;
    let answer = client.renew_certificate(&csr).map_err(|e| anyhow!("renewing: {e}"))?;
    let key_pem = key.serialize_pem();
    for (name, bytes) in [
        (KEY, key_pem.as_bytes()),
        (CA, answer.ca.as_bytes()),
        (CERT, answer.certificate.as_bytes()),
    ] {
        let path = fresh(dir, name);
        let _ = std::fs::remove_file(&path);
        pushleft_secrets::write_private(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    for name in [KEY, CA, CERT] {
        std::fs::rename(fresh(dir, name), dir.join(name)).with_context(|| format!("replacing {name}"))?;
    }
    client
        .switch(answer.certificate.as_bytes(), key_pem.as_bytes(), answer.ca.as_bytes())
        .map_err(|e| anyhow!("using the new certificate: {e}"))?;
    Ok(answer.not_after_ms)
}

/// How long to wait before the next look, with the certificate's validity and now.
pub fn wait(not_before: i64, not_after: i64, now: i64) -> Duration {
    let due = due_at(not_before, not_after);
    Duration::from_millis(u64::try_from(due - now).unwrap_or(0)).min(LOOK_AT_MOST)
}

/// Renews the certificate in `dir` whenever it is due, for as long as the agent runs.
pub async fn run(client: std::sync::Arc<AgentClient>, node: String, dir: PathBuf) {
    loop {
        let now = now_ms();
        let pause = match std::fs::read(dir.join(CERT))
            .map_err(anyhow::Error::from)
            .and_then(|p| validity(&p))
        {
            Ok((from, to)) if now >= due_at(from, to) => {
                let (c, n, d) = (std::sync::Arc::clone(&client), node.clone(), dir.clone());
                match tokio::task::spawn_blocking(move || renew(&c, &n, &d)).await {
                    Ok(Ok(until)) => {
                        tracing::info!(node = %node, not_after_ms = until, "certificate renewed");
                        Duration::ZERO
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(node = %node, error = %e, retry_in_s = RETRY.as_secs(), "cannot renew the certificate");
                        RETRY
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the renewal did not finish");
                        RETRY
                    }
                }
            }
            Ok((from, to)) => wait(from, to, now),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the node's certificate");
                RETRY
            }
        };
        tokio::time::sleep(pause.max(Duration::from_millis(100))).await;
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_is_renewed_at_two_thirds_of_its_life() {
        let h = 3_600_000;
        assert_eq!(due_at(0, 24 * h), 16 * h);
        assert_eq!(
            wait(0, 24 * h, 15 * h),
            Duration::from_secs(600),
            "at most ten minutes a look"
        );
        assert_eq!(wait(0, 24 * h, 16 * h - 1_000), Duration::from_secs(1));
        assert_eq!(wait(0, 24 * h, 20 * h), Duration::ZERO, "due: now");
    }

    #[test]
    fn an_interrupted_renewal_is_finished_and_a_half_written_one_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        for (name, text) in [(KEY, "old key"), (CA, "old ca"), (CERT, "old cert")] {
            std::fs::write(d.join(name), text).expect("write");
        }
        // Cut after the key was renamed: the certificate and CA are still `.new`.
        std::fs::write(d.join(KEY), "new key").expect("key");
        std::fs::write(fresh(d, CA), "new ca").expect("ca");
        std::fs::write(fresh(d, CERT), "new cert").expect("cert");
        finish_interrupted(d).expect("finish");
        for (name, text) in [(KEY, "new key"), (CA, "new ca"), (CERT, "new cert")] {
            assert_eq!(std::fs::read_to_string(d.join(name)).expect("read"), text);
        }
        // Cut while writing (no new certificate yet): the old files stay in use.
        std::fs::write(fresh(d, KEY), "half").expect("key");
        finish_interrupted(d).expect("finish");
        assert_eq!(std::fs::read_to_string(d.join(KEY)).expect("read"), "new key");
        assert!(!fresh(d, KEY).exists());
    }
}
