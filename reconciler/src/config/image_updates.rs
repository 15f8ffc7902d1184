//! `[image_updates]`: the daemon's image update watcher, off when absent. It writes signed
//! commits into the repository it reads, so it needs a local source (`source.path`); for a
//! remote source, run `pl image update` in CI, which can push.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageUpdatesConfig {
    /// The bot's SSH private key (unencrypted OpenSSH, only its owner may read it): its
    /// commits are signed with it, and the policy's `bots` limit what they may change.
    pub signing_key: PathBuf,
    /// Seconds between two looks at the registries (60 to 86,400; default 300).
    #[serde(default = "default_interval")]
    pub interval_seconds: u64,
    /// Registry credentials: `"host:port" = "/path/to/file"` holding `user:password` (a
    /// file only its owner may read).
    #[serde(default)]
    pub registry_auth: BTreeMap<String, PathBuf>,
}

fn default_interval() -> u64 {
    300
}

impl ImageUpdatesConfig {
    /// Why it cannot run with `source_is_local`, if it cannot.
    pub fn check(&self, source_is_local: bool) -> Result<(), String> {
        if !source_is_local {
            return Err("image_updates needs a local source (`source.path`): the daemon writes its commits there; for a remote source run `pl image update` in CI".into());
        }
        if !(60..=86_400).contains(&self.interval_seconds) {
            return Err("image_updates.interval_seconds must be 60 to 86400".into());
        }
        if self.registry_auth.len() > 64 {
            return Err("image_updates.registry_auth: at most 64 registries".into());
        }
        Ok(())
    }
}
