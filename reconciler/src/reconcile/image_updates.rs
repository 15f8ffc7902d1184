//! The image update watcher (`[image_updates]`, off by default; the leader's alone): on an
//! interval, for each image of the commit in force with an `imageUpdates` policy, the
//! registry's newest allowed tag and digest, the same decision as `pl image update`
//! (`state_schema::image_updates::decide`), written as a commit signed with the bot's key: on
//! `pl-image-update/<kind>/<name>` (moved when the update changes), or with `branch: applied`
//! on the applied branch itself, only forward from the commit in force. Its commits are then
//! judged like any other (the policy's `bots` limit the key to images).
//!
//! It never touches an image of an environment a rollback holds (a commit changing it would
//! end the hold and roll the image forward), a pinned one, or one no tag allows; it says why
//! in an event when what it says changes.

use super::{DaemonError, Reconciler};
use crate::store::now_ms;
use gix::ObjectId;
use state_repo::commit::Expect;
use state_repo::image_update::{Target, UpdateError, write};
use state_repo::source::{Rev, StateRepo};
use state_repo::trust::allowed_signers::wildcard_match;
use state_repo::trust::policy::BotRule;
use state_schema::image_updates::{Branch, Decision, decide, newest, repository_of};
use state_schema::state::images::{Updatable, updatable};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use zeroize::Zeroizing;

/// What the watcher last said of each image (`label` → event kind and detail): an event is
/// written when that changes, not every interval.
pub type Said = BTreeMap<String, (String, String)>;

/// One image's outcome in a look.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Looked {
    pub label: String,
    /// `image-update-written`, `image-update-held`, `image-update-not-allowed`,
    /// `image-update-deferred`, `image-update-failed`, or `` for nothing to say (current,
    /// pinned, no tag).
    pub kind: &'static str,
    pub detail: String,
}

impl Reconciler {
    /// One look at every image with a policy, for the applied branch's commit in force.
    pub async fn image_updates_pass(self: &Arc<Self>, said: &mut Said) -> Result<Vec<Looked>, DaemonError> {
        let Some(cfg) = self.config.image_updates.clone() else {
            return Ok(Vec::new());
        };
        let branch = self.config.source.branch.clone();
        let Some(in_force) = self.ledger.revisions().last_accepted(&branch).await? else {
            return Ok(Vec::new());
        };
        let held = self.ledger.deployments().held_environments(&branch).await?;
        let me = Arc::clone(self);
        let looked = tokio::task::spawn_blocking(move || me.look(&cfg, &branch, &in_force, &held))
            .await
            .map_err(|e| DaemonError::Join(e.to_string()))??;
        let now = now_ms();
        for l in &looked {
            let said_now = (l.kind.to_owned(), l.detail.clone());
            if said.get(&l.label) == Some(&said_now) {
                continue;
            }
            said.insert(l.label.clone(), said_now);
            if !l.kind.is_empty() {
                self.ledger.events().record(now, l.kind, &l.label, &l.detail).await?;
            }
            tracing::info!(image = %l.label, kind = l.kind, detail = %l.detail, "image update");
        }
        Ok(looked)
    }

    /// The blocking half: the state in force, the registries, the writes.
    fn look(
        &self,
        cfg: &crate::config::ImageUpdatesConfig,
        branch: &str,
        in_force: &str,
        held: &BTreeSet<String>,
    ) -> Result<Vec<Looked>, DaemonError> {
        let repo = self.repo()?;
        let base = repo.resolve(in_force)?;
        let state = state_repo::load::load(&repo, &Rev::Commit(base.clone()))?.state;
        let key = match state_repo::mirror::read_local_key(&cfg.signing_key) {
            Ok(k) if !k.is_encrypted() => k,
            _ => {
                return Ok(vec![failed(
                    "image-updates",
                    "signing-key-unreadable",
                    format!("{}: an unencrypted OpenSSH private key", cfg.signing_key.display()),
                )]);
            }
        };
        let mut credentials = HashMap::new();
        for (host, file) in &cfg.registry_auth {
            if let Ok(text) = std::fs::read_to_string(file) {
                credentials.insert(host.clone(), Zeroizing::new(text.trim().to_owned()));
            }
        }
        // Environments by project: a project's image reaches every one of them.
        let mut envs_of: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, env) in state.environments() {
            envs_of
                .entry(env.project.to_string())
                .or_default()
                .push(name.to_string());
        }
        let principals = self
            .signers
            .iter()
            .filter(|s| s.key.key_data() == key.public_key().key_data())
            .flat_map(|s| s.principals.clone())
            .collect();
        let mut look = Look {
            repo: &repo,
            key,
            credentials,
            held,
            envs_of,
            principals,
            bots: self.policy.as_ref().map(|p| p.bots.as_slice()).unwrap_or_default(),
            branch,
            base: base.id,
            applied_tip: base.id,
        };
        Ok(updatable(&state).iter().map(|o| look.one(o)).collect())
    }
}

fn failed(label: &str, code: &str, why: String) -> Looked {
    Looked {
        label: label.to_owned(),
        kind: "image-update-failed",
        detail: format!("{code}: {why}"),
    }
}

fn said(label: &str, kind: &'static str, detail: String) -> Looked {
    Looked {
        label: label.to_owned(),
        kind,
        detail,
    }
}

/// One look's setting: what it reads with, and where the applied branch's updates chain.
struct Look<'a> {
    repo: &'a StateRepo,
    key: ssh_key::PrivateKey,
    credentials: HashMap<String, Zeroizing<String>>,
    held: &'a BTreeSet<String>,
    envs_of: BTreeMap<String, Vec<String>>,
    /// The bot key's principals in the allowed-signers file.
    principals: Vec<String>,
    bots: &'a [BotRule],
    branch: &'a str,
    /// The commit in force, and the applied branch's tip as this look moved it.
    base: ObjectId,
    applied_tip: ObjectId,
}

impl Look<'_> {
    /// Whether the policy's `bots` let this key move `project`'s image: an applied-branch
    /// update it may not make would only be refused by the next pass, leaving the branch's
    /// head rejected. A key no bot rule names is not limited by them.
    fn may_move(&self, project: &str) -> bool {
        let mine: Vec<&BotRule> = self
            .bots
            .iter()
            .filter(|b| {
                self.principals
                    .iter()
                    .any(|p| b.principals.iter().any(|pat| wildcard_match(pat, p)))
            })
            .collect();
        mine.is_empty() || mine.iter().any(|b| b.may_update(project))
    }

    fn one(&mut self, o: &Updatable) -> Looked {
        let reaches: Vec<String> = match &o.environment {
            Some(e) => vec![e.clone()],
            None => self.envs_of.get(&o.project).cloned().unwrap_or_default(),
        };
        if let Some(h) = reaches.iter().find(|e| self.held.contains(*e)) {
            let why = format!("environment {h} is held by a rollback: left alone until `pl rollback {h} --release`");
            return said(&o.label, "image-update-held", why);
        }
        let (repository, _) = repository_of(&o.image);
        let found = match registry::pick(repository, &self.credentials, |tags| newest(&o.policy.pick, tags)) {
            Ok(f) => f,
            Err(e) => return failed(&o.label, e.code(), e.to_string()),
        };
        let newest_tag = found.as_ref().map(|(t, d)| (t.as_str(), d.as_str()));
        let (image, tag) = match decide(&o.policy, &o.image, newest_tag) {
            Decision::Update { image, tag } => (image, tag),
            Decision::Current | Decision::Pinned | Decision::NoTag => return said(&o.label, "", String::new()),
        };
        if o.policy.branch == Branch::Applied && !self.may_move(&o.project) {
            let why = format!(
                "{image}: the bot's key ({}) may not move project {}'s image under the policy's `bots`; nothing written",
                self.principals.join(","),
                o.project
            );
            return said(&o.label, "image-update-not-allowed", why);
        }
        self.write(o, &image, &tag)
    }

    fn write(&mut self, o: &Updatable, image: &str, tag: &str) -> Looked {
        let own = format!("pl-image-update/{}", o.label);
        let target = match o.policy.branch {
            Branch::Own => Target {
                branch: &own,
                parent: self.base,
                expect: Expect::Any,
            },
            // Only forward from the commit in force: a branch whose head moved past it (a push
            // not judged yet, or refused) waits for the next look.
            Branch::Applied => Target {
                branch: self.branch,
                parent: self.applied_tip,
                expect: Expect::At(self.applied_tip),
            },
        };
        match write(self.repo, o, (image, tag), &target, &self.key) {
            Ok((tip, _)) => {
                if o.policy.branch == Branch::Applied {
                    self.applied_tip = tip;
                }
                let what = format!("{image} on {} ({})", target.branch, &tip.to_string()[..12]);
                said(&o.label, "image-update-written", what)
            }
            Err(UpdateError::Commit(e)) if o.policy.branch == Branch::Applied => {
                let why = format!(
                    "{} is not at the commit in force ({e}); the next look tries again",
                    self.branch
                );
                said(&o.label, "image-update-deferred", why)
            }
            Err(e) => failed(&o.label, "image-update-failed", e.to_string()),
        }
    }
}

/// The watcher's loop: a look every `interval_seconds` while this daemon leads.
pub async fn run(r: Arc<Reconciler>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let Some(cfg) = r.config.image_updates.clone() else {
        return;
    };
    let every = std::time::Duration::from_secs(cfg.interval_seconds);
    let mut said = Said::new();
    loop {
        if r.hub.leader.load(Ordering::Relaxed)
            && let Err(e) = r.image_updates_pass(&mut said).await
        {
            tracing::warn!(error = %e, "image updates: the look failed");
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
        }
    }
}
