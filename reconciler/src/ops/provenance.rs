//! `GET /v1/environments/{name}/provenance`: each running replica's chain from what runs to
//! who allowed it, from what the ledger holds: the node's last heartbeat (the image the
//! container was made from and who signed it, as the node verified) and the revision that made
//! the replica's generation (its commit and that commit's signer). Reads only.

use super::{Answer, OpError, Ops, now_ms};
use operator_proto::provenance::{Provenance, ReplicaProvenance};
use std::collections::BTreeMap;

impl Ops {
    /// The environment's provenance; `environment-unknown` when no deployment holds it.
    pub async fn provenance(&self, environment: &str) -> Answer<Provenance> {
        if self.ledger.views().deployment(environment, now_ms()).await?.is_none() {
            return Err(OpError::not_found(
                "environment-unknown",
                format!("no deployment of environment {environment} (see `pl status`)"),
            ));
        }
        // Reports older than a lost node's silence are no longer known to be true.
        let observed = self
            .ledger
            .nodes()
            .observed_replicas(now_ms() - self.lost_after_ms)
            .await?;
        let mut replicas: Vec<(String, agent_proto::RunningInstance)> = observed
            .into_iter()
            .flat_map(|(node, list)| list.into_iter().map(move |r| (node.clone(), r)))
            .filter(|(_, r)| r.environment == environment)
            .collect();
        replicas.sort_by(|a, b| (&a.0, &a.1.role, a.1.instance).cmp(&(&b.0, &b.1.role, b.1.instance)));
        let mut generations: Vec<i64> = replicas
            .iter()
            .filter_map(|(_, r)| i64::try_from(r.generation).ok())
            .collect();
        generations.sort_unstable();
        generations.dedup();
        let commits: BTreeMap<i64, _> = self
            .ledger
            .revisions()
            .generation_commits(environment, &generations)
            .await?
            .into_iter()
            .map(|c| (c.generation, c))
            .collect();
        let replicas = replicas
            .into_iter()
            .map(|(node, r)| {
                let commit = i64::try_from(r.generation).ok().and_then(|g| commits.get(&g));
                let signed = r.image_signed.as_ref();
                ReplicaProvenance {
                    node,
                    role: r.role.clone(),
                    instance: r.instance,
                    generation: r.generation,
                    healthy: r.healthy,
                    image: r.image.clone(),
                    image_signer: signed.map(|s| s.principal.clone()),
                    image_fingerprint: signed.map(|s| s.fingerprint.clone()),
                    image_verified_at_ms: signed.map(|s| s.verified_at_ms),
                    commit: commit.map(|c| c.sha.clone()),
                    commit_signer: commit.and_then(|c| c.principals.clone()),
                    commit_fingerprint: commit.and_then(|c| c.fingerprint.clone()),
                    commit_seen_at_ms: commit.map(|c| c.seen_at),
                }
            })
            .collect();
        Ok(Provenance {
            environment: environment.to_owned(),
            replicas,
        })
    }
}
