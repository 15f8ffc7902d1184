//! The reconcile loop: level-triggered and idempotent. Each pass reads the tracked branches,
//! judges every commit not yet judged (oldest first, each in its own transaction), tears down
//! the deployments of preview branches that are gone, and moves rollouts on. Hints (a watch
//! event, a webhook, `pl reconcile --now`) only make the next pass come sooner.

mod advance;
pub mod backups;
mod catchup;
pub mod certificates;
pub mod cron;
pub mod deploy;
pub mod domains;
pub mod drift;
pub mod image_updates;
pub mod mesh;
pub mod mesh_health;
pub mod placing;
pub mod rebuild;
pub mod rollback;
mod run;
mod scale;
pub mod volumes;
pub mod watch;

pub use run::{LEADERSHIP_CHECK, MAX_JUDGED_PER_PASS, SETTLE_DELAY, run_fetcher, run_loop, watch_local};

use crate::config::Config;
use crate::hub::Hub;
use crate::store::{Ledger, LedgerError, now_ms};
use gix::ObjectId;
use state_repo::source::{SourceError, StateRepo};
use state_repo::trust::allowed_signers::{self, AllowedSigner};
use state_repo::trust::policy::{self, Policy};
use state_schema::declared;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("{path}: {message}")]
    Trust { path: PathBuf, message: String },
    #[error("{0}")]
    Config(String),
    #[error("a blocking task failed: {0}")]
    Join(String),
}

/// Where branches come from.
pub enum Source {
    /// A local repository, read directly.
    Local(PathBuf),
    /// A bare clone of a remote; the branches are what its last fetch saw (`None` before the
    /// first fetch succeeds, when nothing may be torn down).
    Remote {
        url: String,
        dir: PathBuf,
        branches: Mutex<Option<Vec<(String, ObjectId)>>>,
    },
}

pub struct Reconciler {
    pub config: Arc<Config>,
    pub ledger: Arc<Ledger>,
    /// The signals to and from the other layers, and what the loop observed.
    pub hub: Arc<Hub>,
    pub source: Source,
    /// The repository, opened once (for a remote, after its first fetch made the cache).
    repo: Mutex<Option<Arc<StateRepo>>>,
    pub signers: Vec<AllowedSigner>,
    pub policy: Option<Policy>,
    previews: globset::GlobSet,
    /// The fleet as of the last re-placement (`Ledger::fleet_signature`).
    fleet_signature: Mutex<Option<String>>,
    /// The certificate issuer (`[certificates]`), and when the hostnames were last looked at.
    issuing: Option<certificates::Issuing>,
    certificates_checked_ms: std::sync::atomic::AtomicI64,
    /// Set when a re-placement against the fleet moved a rollout since the last certificate
    /// check (its serving nodes changed), or a domain was first proven.
    replaced_since_certificates: std::sync::atomic::AtomicBool,
    /// Custom domains' DNS checks, and when the next one is due (Unix ms).
    domains: domains::Checking,
    domains_due_ms: std::sync::atomic::AtomicI64,
    /// When the mesh's links are judged next (`mesh_health`).
    mesh_health_due_ms: std::sync::atomic::AtomicI64,
    /// When the volume sweep last ran.
    volumes_swept_ms: std::sync::atomic::AtomicI64,
    /// When the metrics' hourly counts were last pruned.
    tallies_pruned_ms: std::sync::atomic::AtomicI64,
    /// When drift was last looked at in full (`drift::FULL_CHECK_MS`).
    drift_checked_ms: std::sync::atomic::AtomicI64,
    /// What the mesh was last decided from (`Ledger::mesh_signature`): decided again only
    /// when that changes.
    mesh_seen: Mutex<String>,
    /// A rebuild's wait (`rebuild.rs`): until when (Unix ms), `rebuild::OFF`, or
    /// `rebuild::UNCHECKED` before the first pass.
    rebuild_until_ms: std::sync::atomic::AtomicI64,
}

/// What one pass did.
#[derive(Clone, Debug, Default)]
pub struct PassReport {
    pub judged: usize,
    pub accepted: usize,
    pub rejected: usize,
    pub jobs_queued: usize,
    pub teardowns: usize,
    pub advanced: usize,
    /// A branch stopped at the pass's limit of judged revisions: the next pass goes on at once.
    pub more: bool,
}

/// Reads the trust files: the allowed signers and, when configured, the signing policy. The
/// reconcile layer judges commits with them; the agent API hands their image rules to nodes.
pub fn read_trust(config: &Config) -> Result<(Vec<AllowedSigner>, Option<Policy>), DaemonError> {
    let trust = |path: &PathBuf, message: String| DaemonError::Trust {
        path: path.clone(),
        message,
    };
    let text = crate::config::read_small(&config.trust.allowed_signers)
        .map_err(|e| trust(&config.trust.allowed_signers, e))?;
    let signers = allowed_signers::parse(&text).map_err(|e| trust(&config.trust.allowed_signers, e.to_string()))?;
    let policy = match &config.trust.policy {
        Some(p) => {
            let text = crate::config::read_small(p).map_err(|e| trust(p, e))?;
            Some(policy::parse(&text).map_err(|e| trust(p, e.to_string()))?)
        }
        None => None,
    };
    Ok((signers, policy))
}

impl Reconciler {
    /// Reads the trust files and builds the reconcile layer's state. The ledger is connected
    /// already.
    pub fn new(config: Arc<Config>, ledger: Arc<Ledger>, hub: Arc<Hub>) -> Result<Reconciler, DaemonError> {
        let (signers, policy) = read_trust(&config)?;
        let mut globs = globset::GlobSetBuilder::new();
        for p in &config.source.preview_branches {
            globs.add(globset::Glob::new(p).map_err(|e| DaemonError::Config(format!("preview_branches: `{p}`: {e}")))?);
        }
        let previews = globs
            .build()
            .map_err(|e| DaemonError::Config(format!("preview_branches: {e}")))?;
        let source = match (&config.source.path, &config.source.url, &config.source.cache_dir) {
            (Some(p), _, _) => Source::Local(p.clone()),
            (None, Some(url), Some(dir)) => Source::Remote {
                url: url.clone(),
                dir: dir.clone(),
                branches: Mutex::new(None),
            },
            _ => {
                return Err(DaemonError::Config(
                    "source: set `path`, or `url` with `cache_dir`".into(),
                ));
            }
        };
        let issuing = match (
            &config.certificates,
            config
                .certificates
                .as_ref()
                .and_then(|c| c.identity.as_ref())
                .or(config.control.age_identity.as_ref()),
        ) {
            (Some(c), Some(identity)) => {
                let control = pushleft_secrets::own_recipients(identity).map_err(|e| {
                    DaemonError::Config(format!(
                        "certificates: the age identity {}: {} (issued keys are sealed to its X25519 recipient)",
                        identity.display(),
                        e.code()
                    ))
                })?;
                let issuer = match c.issuer {
                    crate::config::IssuerKind::Local => certificates::Issuer::Signer(Box::new(
                        crate::issuer::LocalCa::open_or_create(
                            &c.local_ca_cert,
                            &c.local_ca_key,
                            &c.local_suffix,
                            c.lifetime_hours,
                        )
                        .map_err(|e| DaemonError::Config(e.to_string()))?,
                    )),
                    crate::config::IssuerKind::Acme => {
                        certificates::Issuer::Acme(Arc::new(crate::acme::Acme::new(acme_settings(&c.acme)?)))
                    }
                };
                Some(certificates::Issuing::new(issuer, control, c.acme.max_orders))
            }
            _ => None,
        };
        Ok(Reconciler {
            issuing,
            certificates_checked_ms: std::sync::atomic::AtomicI64::new(0),
            replaced_since_certificates: std::sync::atomic::AtomicBool::new(false),
            domains: domains::Checking::new(
                config.domains.resolver.as_ref(),
                config.domains.pending_recheck_seconds,
                config.domains.recheck_seconds,
            )
            .map_err(|e| DaemonError::Config(format!("domains: {e}")))?,
            domains_due_ms: std::sync::atomic::AtomicI64::new(0),
            mesh_health_due_ms: std::sync::atomic::AtomicI64::new(0),
            volumes_swept_ms: std::sync::atomic::AtomicI64::new(0),
            tallies_pruned_ms: std::sync::atomic::AtomicI64::new(0),
            drift_checked_ms: std::sync::atomic::AtomicI64::new(0),
            mesh_seen: Mutex::new(String::new()),
            rebuild_until_ms: std::sync::atomic::AtomicI64::new(rebuild::UNCHECKED),
            config,
            ledger,
            hub,
            source,
            signers,
            policy,
            previews,
            fleet_signature: Mutex::new(None),
            repo: Mutex::new(None),
        })
    }

    fn is_tracked(&self, branch: &str) -> bool {
        branch == self.config.source.branch || self.is_preview(branch)
    }

    pub(crate) fn is_preview(&self, branch: &str) -> bool {
        branch != self.config.source.branch && self.previews.is_match(branch)
    }

    /// The tracked branches now, or `None` when they cannot be known yet (a remote before its
    /// first fetch).
    fn branches(&self) -> Result<Option<Vec<(String, ObjectId)>>, DaemonError> {
        let all = match &self.source {
            Source::Local(_) => self.repo()?.branches()?,
            Source::Remote { branches, .. } => match branches.lock().map(|b| b.clone()) {
                Ok(Some(b)) => b,
                _ => return Ok(None),
            },
        };
        Ok(Some(all.into_iter().filter(|(b, _)| self.is_tracked(b)).collect()))
    }

    fn repo_dir(&self) -> &std::path::Path {
        match &self.source {
            Source::Local(p) => p,
            Source::Remote { dir, .. } => dir,
        }
    }

    /// The repository, opened on first use and kept: gix reads refs afresh each time and finds
    /// packs a fetch adds, so one handle serves every pass.
    pub(crate) fn repo(&self) -> Result<Arc<StateRepo>, DaemonError> {
        let mut slot = self
            .repo
            .lock()
            .map_err(|_| DaemonError::Join("the repository lock was poisoned".into()))?;
        if let Some(r) = &*slot {
            return Ok(Arc::clone(r));
        }
        let r = Arc::new(StateRepo::open(self.repo_dir())?);
        // A folder that is not (yet) a repository is not kept: a remote's cache becomes one
        // with its first fetch.
        if r.git_dir().is_some() {
            *slot = Some(Arc::clone(&r));
        }
        Ok(r)
    }

    /// One level-triggered pass. Safe to run at any time, any number of times: everything it
    /// writes is keyed by what it is, so a replay writes nothing. A branch whose judging fails
    /// (a Git error on that branch alone) is logged and skipped; the pass goes on with the
    /// other branches, preview expiry, lease expiry and advance. Only a ledger error fails
    /// the pass, since nothing after it could be written either.
    /// This one judges every pending revision; the daemon's loop uses [`Self::pass_bounded`].
    pub async fn pass(self: &Arc<Self>) -> Result<PassReport, DaemonError> {
        self.pass_within(usize::MAX).await
    }

    /// A pass that judges at most [`MAX_JUDGED_PER_PASS`] revisions per branch, so that a long
    /// backlog (a burst of pushes, a restart after hours) never holds the loop: settles,
    /// sweeps and readiness go on between its slices, and the report says whether more waits.
    pub async fn pass_bounded(self: &Arc<Self>) -> Result<PassReport, DaemonError> {
        self.pass_within(MAX_JUDGED_PER_PASS).await
    }

    async fn pass_within(self: &Arc<Self>, limit: usize) -> Result<PassReport, DaemonError> {
        use tracing::Instrument;
        let n = self.hub.passes.load(Ordering::Relaxed) + 1;
        self.pass_now(limit)
            .instrument(tracing::info_span!("pass", pass = n))
            .await
    }

    async fn pass_now(self: &Arc<Self>, limit: usize) -> Result<PassReport, DaemonError> {
        let started = Instant::now();
        let mut report = PassReport::default();
        self.rebuild_begin().await?;
        self.judge_branches(limit, &mut report).await?;
        report.advanced += self.rebuild_end().await?;
        for branch in self.ledger.expire_previews(now_ms()).await? {
            tracing::info!(branch = %branch, "preview expired: tearing down its environments");
            report.teardowns += 1;
        }
        // The applied branch's node pools, as this pass's commits left them (read once: the
        // revocations and the mesh both follow them).
        let pools = self.ledger.applied_pools(&self.config.source.branch).await?;
        // A node retired in Git loses every certificate at once.
        let revoked = self
            .ledger
            .nodes()
            .revoke_retired(&declared::retired(&pools), now_ms())
            .await?;
        if revoked > 0 {
            self.hub.revocations.fetch_add(1, Ordering::Relaxed);
            tracing::info!(certificates = revoked, "revoked the certificates of retired nodes");
        }
        // Releases whose watch a heartbeat failed are rolled back (asked here, started below
        // with the rollbacks operators asked for, and the holds they released).
        let watched = self.ledger.watch_tick(now_ms()).await?;
        if watched > 0 {
            tracing::warn!(rollbacks = watched, "a release failed its watch: rolled back");
        }
        let rolled = match self.rollbacks().await {
            Ok(n) => n,
            Err(DaemonError::Ledger(e)) => return Err(DaemonError::Ledger(e)),
            Err(e) => {
                tracing::warn!(error = %e, "cannot plan a released hold now; the next pass retries");
                0
            }
        };
        // Repairs another daemon recorded, or a crash left unpublished: the settle looks.
        self.hub.repairs_recorded.store(true, Ordering::Relaxed);
        report.advanced = self.settle().await? + rolled;
        self.refresh_meshes(&pools).await?;
        // Replicas their agents no longer report (removed by hand): asked for again.
        let repairs = self
            .ledger
            .repair_missing(now_ms(), &self.hub.drift_suspected, &self.drift_checked_ms)
            .await?;
        if repairs > 0 {
            tracing::info!(repairs, "replicas missing from their nodes: asked again");
            report.advanced += repairs;
        }
        self.due_work(&mut report).await?;
        let wrote = report.judged + report.teardowns + report.advanced > 0;
        self.hub.refresh_counts(&self.ledger, wrote).await;
        self.hub.metrics.observe(started.elapsed());
        self.hub.last_tick_ms.store(now_ms(), Ordering::Relaxed);
        self.hub.passes.fetch_add(1, Ordering::Relaxed);
        if wrote {
            self.hub.wrote.notify_waiters();
            self.hub.jobs.notify_waiters();
        }
        Ok(report)
    }

    /// Each tracked branch caught up to its head (the applied branch first), then the
    /// deployments of preview branches that no longer exist torn down.
    async fn judge_branches(self: &Arc<Self>, limit: usize, report: &mut PassReport) -> Result<(), DaemonError> {
        let me = Arc::clone(self);
        let branches = tokio::task::spawn_blocking(move || me.branches())
            .await
            .map_err(|e| DaemonError::Join(e.to_string()))??;
        if let Some(branches) = &branches {
            // The applied branch first, then previews in name order: a preview is derived
            // under the applied branch's accepted state, so it must see that state as of this
            // pass; and a replay judges in the same order, so the ledger's rows come out alike.
            let mut order: Vec<&(String, ObjectId)> = branches.iter().collect();
            order.sort_by_key(|(b, _)| *b != self.config.source.branch);
            for (branch, head) in order {
                if report.more {
                    // The applied branch is not caught up: previews wait for the next pass,
                    // since each is judged under the applied branch's accepted state.
                    break;
                }
                match self.catch_up(branch, *head, limit, report).await {
                    Ok(()) => {}
                    Err(DaemonError::Ledger(e)) => return Err(DaemonError::Ledger(e)),
                    Err(e) => {
                        self.hub.metrics.tick_errors.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(branch = %branch, head = %head, error = %e, "cannot judge this branch now; the other branches go on");
                    }
                }
            }
            // Preview branches with live deployments that no longer exist: tear them down.
            // (`branches` holds only tracked ones, so this also covers a branch no longer
            // matching `preview_branches`.) The applied branch is never torn down this way.
            for branch in self.ledger.revisions().deployed_branches().await? {
                if branch != self.config.source.branch && !branches.iter().any(|(b, _)| *b == branch) {
                    let applied = self.ledger.teardown_branch(&branch, now_ms()).await?;
                    report.teardowns += applied.teardowns.len();
                    if !applied.teardowns.is_empty() {
                        tracing::info!(branch = %branch, teardowns = applied.teardowns.len(), "branch gone: tearing down its environments");
                    }
                }
            }
        }
        Ok(())
    }

    /// What comes due with time or with accepted commits: custom domains' lookups, hostnames'
    /// certificates, volumes past their retention, cron roles and volume backups.
    async fn due_work(&self, report: &mut PassReport) -> Result<(), DaemonError> {
        // Custom domains: looked up when commits were accepted and whenever one is due.
        let now = now_ms();
        if report.accepted > 0 || now >= self.domains_due_ms.load(Ordering::Relaxed) {
            let (proven, next) = domains::check_due(&self.ledger, &self.domains, now).await?;
            self.domains_due_ms.store(next, Ordering::Relaxed);
            if proven {
                // Its certificate can be ordered now, and its publishes were queued.
                self.replaced_since_certificates.store(true, Ordering::Relaxed);
                report.advanced += 1;
            }
        }
        // Certificates of the hostnames served: looked at when commits were accepted (new
        // hostnames), after a re-placement against the fleet (it names the nodes that answer
        // ACME challenges), and otherwise every minute (renewals, retries).
        if let Some(issuing) = &self.issuing {
            let now = now_ms();
            let last = self.certificates_checked_ms.load(Ordering::Relaxed);
            let replaced = self.replaced_since_certificates.swap(false, Ordering::Relaxed);
            if report.accepted > 0 || replaced || now - last >= certificates::CHECK_EVERY_MS {
                self.certificates_checked_ms.store(now, Ordering::Relaxed);
                let issued = certificates::issue_due(&self.ledger, &self.hub, issuing, now).await?;
                report.advanced += issued;
            }
        }
        // Volumes whose retention is over: removed on their nodes, then forgotten.
        let now = now_ms();
        if now - self.volumes_swept_ms.load(Ordering::Relaxed) >= volumes::SWEEP_EVERY_MS {
            let swept = volumes::sweep(&self.ledger, now).await?;
            // While removals are under way the next pass looks again (to forget them).
            let next = if swept.pending > 0 { 0 } else { now };
            self.volumes_swept_ms.store(next, Ordering::Relaxed);
            report.advanced += swept.forgotten;
        }
        // The metrics' hourly counts past their week: deleted once an hour (totals stay).
        if now - self.tallies_pruned_ms.load(Ordering::Relaxed) >= 3_600_000 {
            self.tallies_pruned_ms.store(now, Ordering::Relaxed);
            let forgotten = self.ledger.events().forget_old_hours(now).await?;
            if forgotten > 0 {
                tracing::debug!(forgotten, "hourly counts past their week deleted");
            }
        }
        // Cron roles whose time has come (at most one run per role and time).
        let cron = self.ledger.cron_tick(now_ms()).await?;
        if !cron.queued.is_empty() || !cron.skipped.is_empty() {
            tracing::info!(
                queued = cron.queued.len(),
                skipped = cron.skipped.len(),
                "cron roles due"
            );
            report.advanced += cron.queued.len() + cron.skipped.len();
        }
        // Volume backups whose time has come (at most one per volume and time).
        let backups = self.ledger.backup_tick(now_ms()).await?;
        if !backups.queued.is_empty() || !backups.skipped.is_empty() {
            tracing::info!(
                queued = backups.queued.len(),
                skipped = backups.skipped.len(),
                "volume backups due"
            );
            report.advanced += backups.queued.len() + backups.skipped.len();
        }
        Ok(())
    }

    /// The ledger-only part of a pass: expired leases back to the queue, rollouts advanced,
    /// and re-placement when the fleet changed. What agents' completions wake (often, under
    /// load), without reading Git. Returns how many deployments moved on or were re-placed.
    pub async fn settle(&self) -> Result<usize, DaemonError> {
        use tracing::Instrument;
        self.settle_now().instrument(tracing::debug_span!("settle")).await
    }

    async fn settle_now(&self) -> Result<usize, DaemonError> {
        self.ledger.jobs().expire(now_ms()).await?;
        // A repaired replica's routes, published again (its address may have changed): looked
        // at when a completion here recorded one, and in every full pass.
        if self.hub.repairs_recorded.swap(false, Ordering::Relaxed) {
            self.ledger.republish_repaired(now_ms()).await?;
        }
        let mut advanced = self.ledger.advance(now_ms(), &self.hub.watching).await?;
        // The fleet changes without commits (nodes fall silent, come back, free room): what
        // runs is re-placed against it, level-triggered like everything else.
        let branch = &self.config.source.branch;
        let signature = self
            .ledger
            .fleet_signature(branch, now_ms(), self.config.control.lost_after_ms())
            .await?;
        let unchanged = self
            .fleet_signature
            .lock()
            .is_ok_and(|s| s.as_deref() == Some(signature.as_str()));
        let moved = if unchanged {
            crate::reconcile::deploy::Applied::default()
        } else {
            // A node lost or back is an event (webhooks take `node-lost`), once each.
            let (lost, back) = self
                .ledger
                .nodes()
                .announce_lost(now_ms(), self.config.control.lost_after_ms())
                .await?;
            if !lost.is_empty() || !back.is_empty() {
                tracing::warn!(lost = ?lost, back = ?back, "nodes lost or back");
            }
            let moved = self
                .ledger
                .replace(branch, now_ms(), self.config.control.lost_after_ms())
                .await?;
            // What the re-placement wrote changes the signature; take it afresh.
            let after = self
                .ledger
                .fleet_signature(branch, now_ms(), self.config.control.lost_after_ms())
                .await?;
            if let Ok(mut s) = self.fleet_signature.lock() {
                *s = Some(after);
            }
            moved
        };
        advanced += moved.rollouts.len() + moved.scales.len();
        if !moved.rollouts.is_empty() || !moved.scales.is_empty() {
            self.replaced_since_certificates.store(true, Ordering::Relaxed);
            tracing::info!(
                moved = moved.rollouts.len(),
                scaled = moved.scales.len(),
                "re-placed against the fleet"
            );
        }
        Ok(advanced)
    }

    /// Fetches the remote (no-op for a local source) and records its branches.
    pub async fn fetch(self: &Arc<Self>) -> Result<bool, state_repo::remote::FetchError> {
        let Source::Remote { url, dir, .. } = &self.source else {
            return Ok(false);
        };
        let (url, dir) = (url.clone(), dir.clone());
        let fetched = tokio::task::spawn_blocking(move || state_repo::remote::fetch(&url, &dir))
            .await
            .map_err(|e| state_repo::remote::FetchError {
                url: String::new(),
                message: e.to_string(),
            })??;
        if let Source::Remote { branches, .. } = &self.source
            && let Ok(mut b) = branches.lock()
        {
            let changed = b.as_ref() != Some(&fetched);
            *b = Some(fetched);
            return Ok(changed);
        }
        Ok(false)
    }
}

/// The ACME issuer's settings from `[certificates.acme]`: the EAB key read (and checked
/// private) at start, so a bad one stops the daemon with its reason rather than every order.
fn acme_settings(c: &crate::config::AcmeConfig) -> Result<crate::acme::AcmeSettings, DaemonError> {
    use base64::Engine;
    let eab = match (&c.eab_kid, &c.eab_hmac_key_file) {
        (Some(kid), Some(file)) => {
            pushleft_secrets::check_private_file(file)
                .map_err(|m| DaemonError::Config(format!("certificates.acme.eab_hmac_key_file: {m}")))?;
            let text = zeroize::Zeroizing::new(std::fs::read_to_string(file).map_err(|e| {
                DaemonError::Config(format!("certificates.acme.eab_hmac_key_file {}: {e}", file.display()))
            })?);
            let key = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(text.trim().trim_end_matches('='))
                .map_err(|_| {
                    DaemonError::Config(format!(
                        "certificates.acme.eab_hmac_key_file {}: not a base64url key",
                        file.display()
                    ))
                })?;
            Some((kid.clone(), zeroize::Zeroizing::new(key)))
        }
        _ => None,
    };
    Ok(crate::acme::AcmeSettings {
        directory: c.directory_url().to_owned(),
        contact: c.contact.clone(),
        eab,
        ca_root: c.ca_root.clone(),
        account_dir: c.account_dir.clone(),
    })
}
