//! `[images]`: the control plane's own image store, off when absent. `pl image push` sends
//! images to it over the operator API (a distribution endpoint under `/v2/`), and nodes pull
//! them through their agent's mutual-TLS connection, so no registry is needed.

use serde::Deserialize;
use std::path::PathBuf;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImagesConfig {
    /// The store's folder (blobs by digest, uploads in progress); this control plane's alone.
    pub dir: PathBuf,
    /// The most the store may hold on disk, uploads in progress included (default 20 GiB); a
    /// push past it is refused with `image-quota-exceeded`.
    #[serde(default = "default_quota")]
    pub quota_bytes: u64,
    /// The largest one blob may be (default 4 GiB, at most the quota).
    #[serde(default = "default_max_blob")]
    pub max_blob_bytes: u64,
    /// How long a blob no revision, rollback or kept generation references stays before
    /// `pl image gc` may remove it (hours, 1 to 720; default 24): a push comes before the
    /// commit that names it.
    #[serde(default = "default_grace")]
    pub gc_grace_hours: u64,
}

fn default_quota() -> u64 {
    20 << 30
}

fn default_max_blob() -> u64 {
    4 << 30
}

fn default_grace() -> u64 {
    24
}

impl ImagesConfig {
    pub fn check(&self) -> Result<(), String> {
        if self.quota_bytes < (1 << 20) {
            return Err("images.quota_bytes must be at least 1 MiB".into());
        }
        if self.max_blob_bytes == 0 || self.max_blob_bytes > self.quota_bytes {
            return Err("images.max_blob_bytes must be 1 to images.quota_bytes".into());
        }
        if !(1..=720).contains(&self.gc_grace_hours) {
            return Err("images.gc_grace_hours must be 1 to 720".into());
        }
        Ok(())
    }
}
