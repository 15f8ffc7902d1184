//! A hostname's publish, as a lease hands it to an ingress node: the routes to its replicas on
//! the node (between a rolling rollout's batches, new and old ones), its certificate sealed to
//! the node (brought in Git, or issued by the control plane), and held back while a custom
//! domain's ownership was never proven.

use super::{Lessee, Undeliverable, moves_on};
use crate::store::{Ledger, LedgerError};
use agent_proto::{Execution, IngressSpec, NetworkSpec, OlderReplica, Upstream, replica_name};
use state_schema::deployment::DeploymentSpec;
use state_schema::task::Rolled;

impl Ledger {
    /// The publish of `hostname` at `generation` (`rolled`: between a rolling rollout's
    /// batches) of `env`, whose spec is `spec`, on `at.node`.
    pub(super) async fn ingress_execution(
        &self,
        at: &Lessee<'_>,
        env: &str,
        spec: &DeploymentSpec,
        network: NetworkSpec,
        (hostname, generation, rolled): (&str, u64, Option<Rolled>),
    ) -> Result<Result<Execution, Undeliverable>, LedgerError> {
        let tls = match spec.certificate(hostname) {
            None if !at.issues_certificates => None,
            None => match self
                .issued_tls(at.node, at.recipient, hostname, at.control, at.now_ms)
                .await?
            {
                Ok(t) => t,
                Err(e) => return Ok(Err(e)),
            },
            Some(t) => match self.sealed_tls(at.node, at.recipient, t, at.control, at.now_ms).await? {
                Ok(t) => Some(t),
                Err(e) => return Ok(Err(e)),
            },
        };
        let upstreams = match rolled {
            // Between a rolling rollout's batches: new and old replicas.
            Some(r) => state_schema::rolling::rolled_upstreams(spec, &self.jobs().retired_of(env).await?, at.node, r)
                .into_iter()
                .map(|u| Upstream {
                    container: replica_name(
                        at.control_plane,
                        env,
                        u.role.as_str(),
                        u.instance,
                        moves_on(spec, u.role.as_str(), u.instance, at.node),
                        generation,
                    ),
                    port: u.port,
                    older: u.older.then(|| OlderReplica {
                        role: u.role.to_string(),
                        instance: u.instance,
                    }),
                })
                .collect(),
            None => spec
                .instances
                .iter()
                .filter(|i| i.node.as_str() == at.node)
                .filter_map(|i| {
                    let port = spec.roles.get(&i.role).filter(|r| r.is_web())?.port?;
                    Some(Upstream {
                        container: replica_name(at.control_plane, env, i.role.as_str(), i.index, i.moves, generation),
                        port,
                        older: None,
                    })
                })
                .collect(),
        };
        // A Domain is routed once its ownership was ever proven.
        let held = spec.domain(hostname).is_some() && !self.domains().domain_ever_verified(hostname).await?;
        Ok(Ok(Execution::Ingress(IngressSpec {
            environment: env.to_owned(),
            hostname: hostname.to_owned(),
            generation,
            upstreams,
            network,
            tls: if held { None } else { tls },
            held,
        })))
    }
}
