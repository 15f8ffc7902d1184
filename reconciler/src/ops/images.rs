//! `pl image gc`: the image store collected. The roots are what the ledger keeps (every
//! accepted revision's images of the store, every tracked branch's accepted documents, each
//! environment's current, retired and previous specs); the decision is `images::unreferenced`; removal happens only when asked, after the
//! same listing a dry run shows.

use super::{OpError, Ops};
use crate::images;
use operator_proto::images::{CollectImages, ImagesCollected, UnreferencedBlob};
use std::collections::BTreeSet;
use std::time::Duration;

impl Ops {
    pub async fn collect_images(&self, who: &str, ask: CollectImages) -> Result<ImagesCollected, OpError> {
        let Some(store) = self.images.clone() else {
            return Err(OpError::not_found(
                "images-not-configured",
                "this control plane keeps no images: add [images] to its configuration",
            ));
        };
        let texts = self
            .ledger
            .deployments()
            .texts_naming(agent_proto::images::STORE_HOST)
            .await
            .map_err(OpError::unavailable)?;
        let roots: BTreeSet<_> = texts.iter().flat_map(|t| images::named_in(t)).collect();
        let grace = Duration::from_secs(self.images_grace_hours * 3600);
        let delete = ask.delete;
        let listed = tokio::task::spawn_blocking(move || {
            let held = store.list()?;
            let (gone, young) = images::unreferenced(&held, &roots, |d| store.references(d), grace);
            if delete {
                for (d, _, _) in &gone {
                    store.remove(d)?;
                }
            }
            Ok::<_, images::store::StoreError>((gone, young, store.used(), store.quota))
        })
        .await
        .map_err(OpError::unavailable)?;
        let (gone, young, held_bytes, quota_bytes) = listed.map_err(OpError::unavailable)?;
        let bytes = gone.iter().map(|(_, b, _)| b).sum();
        if delete {
            tracing::info!(token = %who, blobs = gone.len(), bytes, "image store collected");
        }
        Ok(ImagesCollected {
            deleted: delete,
            blobs: gone
                .into_iter()
                .map(|(d, bytes, age)| UnreferencedBlob {
                    digest: d.to_string(),
                    bytes,
                    age_seconds: age.as_secs(),
                })
                .collect(),
            bytes,
            young,
            held_bytes,
            quota_bytes,
        })
    }
}

/// Whether the work `node` holds or is about to lease names the store's image `d` (the spec of
/// an environment with a queued or leased job on it): the agents' fetch of the store serves a
/// node only the images of its own work, and what their manifests reference (`images::grants`).
pub async fn node_may_fetch(
    ledger: &crate::store::Ledger,
    node: &str,
    d: &registry::oci::Digest,
) -> Result<bool, crate::store::LedgerError> {
    ledger.jobs().work_naming(node, &format!("@{d}")).await
}
