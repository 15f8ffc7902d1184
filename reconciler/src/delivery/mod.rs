//! A layer of its own, between the agent API and the store: what a lease hands an agent
//! besides the task: the execution spec, built from the stored
//! spec of the job's own generation (never a newer commit's), the environment's subnet on that
//! node, and its secrets sealed to the node's own age recipient. Sealed copies are kept (by
//! node and ciphertext hash) so a value is decrypted once per node, not once per lease; the
//! plaintext exists only inside `pushleft_secrets::reseal`.

use crate::store::{Lease, Ledger, LedgerError};
use age::Identity;
use agent_proto::{
    ApplicationSpec, Execution, HealthSpec, IngressTls, NetworkSpec, SealedSecret, container_name, replica_name,
};
use sha2::{Digest, Sha256};
use state_schema::deployment::{DeploymentSpec, TlsSpec};
use state_schema::task::Task;
use std::collections::{BTreeMap, BTreeSet};

mod images;
mod ingress;
mod task;
mod volumes;

pub use images::ImageRules;
pub use task::wire_task;

/// What one lease call's executions are built from ([`Ledger::needed`]).
struct Needed {
    /// Each environment's current generation and its spec.
    specs: BTreeMap<String, (u64, DeploymentSpec)>,
    /// A rollback's generation and the generation whose containers it resumes, by environment.
    resumes: BTreeMap<String, (u64, u64)>,
    subnets: BTreeMap<String, String>,
    recipient: Option<String>,
}

/// What every execution of one lease call is built with: the node, its age recipient (when
/// enrolled), the control host's identities (to reseal with), whether the control plane issues
/// certificates, its id, and the time.
struct Lessee<'a> {
    node: &'a str,
    recipient: Option<&'a str>,
    control: &'a [Box<dyn Identity + Send + Sync>],
    issues_certificates: bool,
    control_plane: &'a str,
    now_ms: i64,
}

/// Which half of a volume move (`store::moves`) a backup or restore job is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MoveStep {
    /// On the volume's node: the role's replica removed, then its files saved.
    Out,
    /// On the target: the saved files restored into the next generation.
    In,
}

/// Why a leased job cannot be handed out. The job fails for good with this code (it would
/// fail the same way until the state or the control host's configuration changes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Undeliverable {
    pub code: &'static str,
    pub message: String,
}

fn undeliverable(code: &'static str, message: impl Into<String>) -> Undeliverable {
    Undeliverable {
        code,
        message: message.into(),
    }
}

fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

impl Ledger {
    /// The node's copy of a secret value, sealed now if it has none yet.
    async fn sealed_for(
        &self,
        node: &str,
        recipient: &str,
        ciphertext: &str,
        control: &[Box<dyn Identity + Send + Sync>],
        now_ms: i64,
    ) -> Result<Result<String, Undeliverable>, LedgerError> {
        let hash = sha256_hex(ciphertext);
        let kept = self.jobs().sealed_copy(node, &hash).await?;
        if let Some(sealed) = kept {
            return Ok(Ok(sealed));
        }
        if control.is_empty() {
            return Ok(Err(undeliverable(
                "no-control-identity",
                "the control host has no age identity (control.age_identity) to reseal secrets with",
            )));
        }
        let sealed = match pushleft_secrets::reseal(ciphertext, control, recipient) {
            Ok(s) => s,
            Err(e) => {
                return Ok(Err(undeliverable(
                    "secret-undeliverable",
                    format!("cannot reseal: {}", e.code()),
                )));
            }
        };
        self.jobs().keep_sealed(node, &hash, &sealed, now_ms).await?;
        Ok(Ok(sealed))
    }

    /// What `leases` need read, and only that: a removal needs nothing, a network its
    /// subnet, a container or route its generation's spec, the rollback it resumes and the
    /// node's recipient too.
    async fn needed(&self, node: &str, leases: &[Lease]) -> Result<Needed, LedgerError> {
        let (mut need_spec, mut need_subnet) = (BTreeSet::new(), BTreeSet::new());
        for l in leases {
            let env = l.task.environment().to_string();
            match &l.task {
                Task::StopApplication { .. }
                | Task::TeardownApplication { .. }
                | Task::RemoveIngress { .. }
                | Task::MeasureCanary { .. }
                | Task::RemoveVolume { .. } => {}
                Task::EnsureEnvironment { .. }
                | Task::EnsureNetwork { .. }
                | Task::ApplyFirewall { .. }
                | Task::EnsureRoutes { .. }
                | Task::RemoveNetwork { .. } => {
                    need_subnet.insert(env);
                }
                _ => {
                    need_subnet.insert(env.clone());
                    need_spec.insert(env);
                }
            }
        }
        let (specs, resumes) = self.jobs().specs_for(&need_spec).await?;
        let subnets = self.jobs().subnets_of(node, &need_subnet).await?;
        let recipient: Option<String> = if need_spec.is_empty() {
            None
        } else {
            self.jobs().age_recipient(node).await?
        };
        Ok(Needed {
            specs,
            resumes,
            subnets,
            recipient,
        })
    }

    /// The execution spec of each of `leases` (all `node`'s), in order. A hostname's publish
    /// looks for a certificate of the control plane's only when it `issues_certificates`;
    /// every container's image carries what `images` asks of it.
    pub async fn executions(
        &self,
        node: &str,
        leases: &[Lease],
        (control, issues_certificates, images): (&[Box<dyn Identity + Send + Sync>], bool, &ImageRules),
        now_ms: i64,
    ) -> Result<Vec<Result<Execution, Undeliverable>>, LedgerError> {
        let Needed {
            specs,
            resumes,
            subnets,
            recipient,
        } = self.needed(node, leases).await?;
        let cp = self.control_plane().await?;
        let mut out = Vec::with_capacity(leases.len());
        for l in leases {
            let env = l.task.environment().to_string();
            let network = || -> Result<NetworkSpec, Undeliverable> {
                let subnet = subnets
                    .get(&env)
                    .cloned()
                    .ok_or_else(|| undeliverable("no-subnet", format!("no subnet for {env} on {node}")))?;
                Ok(NetworkSpec {
                    environment: env.clone(),
                    network: agent_proto::host_object(&cp, &env, node),
                    subnet,
                })
            };
            let spec_of = |generation: u64| -> Result<&DeploymentSpec, Undeliverable> {
                match specs.get(&env) {
                    Some((g, spec)) if *g == generation => Ok(spec),
                    Some(_) => Err(undeliverable(
                        "stale-generation",
                        format!("{env} has moved past generation {generation}"),
                    )),
                    None => Err(undeliverable("no-deployment", format!("no deployment holds {env}"))),
                }
            };
            let built: Result<Execution, Undeliverable> = match &l.task {
                Task::EnsureEnvironment { .. }
                | Task::EnsureNetwork { .. }
                | Task::ApplyFirewall { .. }
                | Task::EnsureRoutes { .. } => network().map(Execution::Network),
                Task::RemoveNetwork { .. } => Ok(network().map_or(Execution::Removal, Execution::Network)),
                Task::StopApplication { .. }
                | Task::TeardownApplication { .. }
                | Task::RemoveIngress { .. }
                | Task::MeasureCanary { .. }
                | Task::RemoveVolume { .. }
                | Task::PlaceAcmeChallenge { .. } => Ok(Execution::Removal),
                Task::PublishIngress {
                    hostname,
                    generation,
                    rolled,
                    ..
                } => match (spec_of(*generation), network()) {
                    (Ok(spec), Ok(network)) => {
                        let at = Lessee {
                            node,
                            recipient: recipient.as_deref(),
                            control,
                            issues_certificates,
                            control_plane: &cp,
                            now_ms,
                        };
                        let route = (hostname.as_str(), *generation, *rolled);
                        self.ingress_execution(&at, &env, spec, network, route).await?
                    }
                    (Err(e), _) | (_, Err(e)) => Err(e),
                },
                Task::EnsureApplication {
                    role,
                    instance,
                    generation,
                    spec_hash,
                    ..
                } => {
                    let mut built = self
                        .application(
                            node,
                            recipient.as_deref(),
                            spec_of(*generation),
                            network(),
                            (role.as_str(), Some(*instance), *generation, spec_hash.as_str()),
                            control,
                            now_ms,
                        )
                        .await?;
                    // A rollback's replica resumes the previous release's container, kept
                    // paused on its node (made afresh when it is gone).
                    if let (Ok(Execution::Application(a)), Some((g, to))) = (&mut built, resumes.get(&env))
                        && *g == *generation
                    {
                        // Placement keeps a replica's move count across generations, so the
                        // one it resumes on this node was named with the same count.
                        let moves = spec_of(*generation).map_or(0, |s| moves_on(s, role.as_str(), *instance, node));
                        a.resume = Some(replica_name(&cp, &env, role.as_str(), *instance, moves, *to));
                    }
                    built
                }
                Task::BackupVolume { volume, .. } | Task::RestoreVolume { volume, .. } => {
                    // Whatever generation is current: a backup queued before a rollout saves
                    // the volume as the new generation's spec says. A restore fills its own
                    // new volume generation.
                    let (into, moving) = match &l.task {
                        Task::RestoreVolume { to, moved, .. } => (Some(*to), (*moved).then_some(MoveStep::In)),
                        Task::BackupVolume { moving, .. } => (None, (*moving).then_some(MoveStep::Out)),
                        _ => (None, None),
                    };
                    match specs.get(&env) {
                        Some((g, spec)) => {
                            self.backup_execution(
                                node,
                                recipient.as_deref(),
                                (*g, spec),
                                (volume.as_str(), into, moving),
                                control,
                                now_ms,
                            )
                            .await?
                        }
                        None => Err(undeliverable("no-deployment", format!("no deployment holds {env}"))),
                    }
                }
                Task::VerifyBackup { volume, .. } => match specs.get(&env) {
                    Some((g, spec)) => {
                        self.drill_execution(node, recipient.as_deref(), (*g, spec), volume.as_str(), control, now_ms)
                            .await?
                    }
                    None => Err(undeliverable("no-deployment", format!("no deployment holds {env}"))),
                },
                Task::RunOnce { role, generation, .. } | Task::RunCron { role, generation, .. } => {
                    self.application(
                        node,
                        recipient.as_deref(),
                        spec_of(*generation),
                        network(),
                        (role.as_str(), None, *generation, ""),
                        control,
                        now_ms,
                    )
                    .await?
                }
            };
            let mut built = built;
            if let Ok(x) = &mut built {
                images.attach(x, specs.get(&env).map(|(_, s)| s), now_ms);
            }
            out.push(built);
        }
        Ok(out)
    }

    /// A hostname's certificate and key, sealed to the node like a secret (kept sealed per node).
    async fn sealed_tls(
        &self,
        node: &str,
        recipient: Option<&str>,
        tls: &TlsSpec,
        control: &[Box<dyn Identity + Send + Sync>],
        now_ms: i64,
    ) -> Result<Result<IngressTls, Undeliverable>, LedgerError> {
        let Some(recipient) = recipient else {
            return Ok(Err(undeliverable("node-not-enrolled", "the node has no age recipient")));
        };
        let cert = match self.sealed_for(node, recipient, &tls.cert, control, now_ms).await? {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        let key = match self.sealed_for(node, recipient, &tls.key, control, now_ms).await? {
            Ok(k) => k,
            Err(e) => return Ok(Err(e)),
        };
        Ok(Ok(IngressTls {
            secret: tls.secret.to_string(),
            cert,
            key,
            hsts: tls.hsts,
        }))
    }

    /// The certificate the control plane issued for `hostname`, sealed to the node: the chain
    /// encrypted to it, the key resealed from the control host's copy. `None` when it issued
    /// none yet (the hostname is served over plain HTTP until the issuance publishes
    /// it again).
    async fn issued_tls(
        &self,
        node: &str,
        recipient: Option<&str>,
        hostname: &str,
        control: &[Box<dyn Identity + Send + Sync>],
        now_ms: i64,
    ) -> Result<Result<Option<IngressTls>, Undeliverable>, LedgerError> {
        let Some(row) = self.certificates().certificate(hostname).await? else {
            return Ok(Ok(None));
        };
        let (Some(chain), Some(key_sealed)) = (row.chain, row.key_sealed) else {
            return Ok(Ok(None));
        };
        let Some(recipient) = recipient else {
            return Ok(Err(undeliverable("node-not-enrolled", "the node has no age recipient")));
        };
        let cert = match pushleft_secrets::encrypt(chain.as_bytes(), &[recipient.to_owned()]) {
            Ok(c) => c,
            Err(e) => {
                return Ok(Err(undeliverable(
                    "secret-undeliverable",
                    format!("cannot seal: {}", e.code()),
                )));
            }
        };
        let key = match self.sealed_for(node, recipient, &key_sealed, control, now_ms).await? {
            Ok(k) => k,
            Err(e) => return Ok(Err(e)),
        };
        Ok(Ok(Some(IngressTls {
            secret: format!("the {} issuer's certificate of {hostname}", row.issuer),
            cert,
            key,
            hsts: false,
        })))
    }

    #[allow(clippy::too_many_arguments)]
    async fn application(
        &self,
        node: &str,
        recipient: Option<&str>,
        spec: Result<&DeploymentSpec, Undeliverable>,
        network: Result<NetworkSpec, Undeliverable>,
        (role, instance, generation, spec_hash): (&str, Option<u32>, u64, &str),
        control: &[Box<dyn Identity + Send + Sync>],
        now_ms: i64,
    ) -> Result<Result<Execution, Undeliverable>, LedgerError> {
        let (spec, network) = match (spec, network) {
            (Ok(s), Ok(n)) => (s, n),
            (Err(e), _) | (_, Err(e)) => return Ok(Err(e)),
        };
        let Some(r) = spec.roles.iter().find(|(n, _)| n.as_str() == role).map(|(_, r)| r) else {
            return Ok(Err(undeliverable(
                "no-role-spec",
                format!("the stored spec of {} has no role {role}", spec.environment),
            )));
        };
        let mut secrets = Vec::with_capacity(r.secrets.len());
        if !r.secrets.is_empty() {
            let Some(recipient) = recipient else {
                return Ok(Err(undeliverable("node-not-enrolled", "the node has no age recipient")));
            };
            for (key, ciphertext) in r.secrets.iter() {
                match self.sealed_for(node, recipient, ciphertext, control, now_ms).await? {
                    Ok(sealed) => secrets.push(SealedSecret {
                        key: key.clone(),
                        sealed,
                    }),
                    Err(e) => return Ok(Err(e)),
                }
            }
        }
        let environment = spec.environment.to_string();
        let (log_max_bytes, log_max_files) = r.log_limits();
        // Each volume at the generation this deployment generation was placed with (a
        // restore's new one rolls a new deployment generation that mounts it).
        let volumes = r
            .volumes
            .iter()
            .map(|v| agent_proto::VolumeMount {
                volume: v.name.clone(),
                generation: v.generation,
                path: v.path.clone(),
                load: v.backup.as_ref().and_then(|b| b.restore.clone()),
            })
            .collect();
        Ok(Ok(Execution::Application(Box::new(ApplicationSpec {
            resume: None,
            image_trust: None,
            log_max_bytes,
            log_max_files,
            container: match instance {
                Some(i) => replica_name(
                    &self.control_plane().await?,
                    &environment,
                    role,
                    i,
                    moves_on(spec, role, i, node),
                    generation,
                ),
                None => container_name(&self.control_plane().await?, &environment, role, None, generation),
            },
            deployment: spec.project.to_string(),
            environment,
            role: role.to_owned(),
            role_kind: r.kind.clone(),
            instance,
            generation,
            spec_hash: spec_hash.to_owned(),
            image: r.image.clone(),
            command: r.command.clone(),
            env: r.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            cpu_millis: r.cpu_millis,
            memory_bytes: r.memory_bytes,
            pids: r.pids,
            port: r.port,
            ports: r.ports.clone(),
            health: r.health.as_ref().map(|(path, timeout_seconds)| HealthSpec {
                path: path.clone(),
                timeout_seconds: *timeout_seconds,
            }),
            network,
            secrets,
            volumes,
        }))))
    }
}

/// How often replica `index` of `role` on `node` moved (its container's name says so): 0 when
/// `spec` places no such replica there.
fn moves_on(spec: &DeploymentSpec, role: &str, index: u32, node: &str) -> u32 {
    spec.instances
        .iter()
        .find(|i| i.role.as_str() == role && i.index == index && i.node.as_str() == node)
        .map_or(0, |i| i.moves)
}

#[cfg(test)]
mod tests {
    use super::*;
    use state_schema::values::{Hostname, Name};

    #[test]
    fn every_task_reaches_the_wire_under_its_own_name_with_its_fields() {
        let (env, role) = (
            Name::new("api-production").expect("name"),
            Name::new("web").expect("name"),
        );
        let host = Hostname::new("api.example.com").expect("host");
        let all = [
            Task::EnsureNetwork {
                environment: env.clone(),
                generation: 3,
            },
            Task::ApplyFirewall {
                environment: env.clone(),
                generation: 3,
            },
            Task::EnsureRoutes {
                environment: env.clone(),
                generation: 3,
            },
            Task::EnsureApplication {
                environment: env.clone(),
                role: role.clone(),
                instance: 2,
                generation: 3,
                spec_hash: "h".into(),
                repair: 1,
            },
            Task::RunOnce {
                environment: env.clone(),
                role: role.clone(),
                generation: 3,
            },
            Task::RunCron {
                environment: env.clone(),
                role: role.clone(),
                generation: 3,
                scheduled: 60,
            },
            Task::StopApplication {
                environment: env.clone(),
                role: role.clone(),
                instance: 2,
                generation: 3,
            },
            Task::TeardownApplication {
                environment: env.clone(),
                role: role.clone(),
                instance: 2,
                generation: 3,
            },
            Task::PublishIngress {
                environment: env.clone(),
                hostname: host.clone(),
                generation: 3,
                repair: 1,
                weight: Some(10),
                wait: None,
                rolled: None,
            },
            Task::MeasureCanary {
                environment: env.clone(),
                hostname: host.clone(),
                generation: 3,
                weight: 10,
                wait: Some(state_schema::task::Wait::Promote),
                gate: state_schema::model::CanaryGate {
                    max_error_percent: Some(5),
                    max_p95_ms: None,
                    min_requests: 20,
                },
            },
            Task::RemoveIngress {
                environment: env.clone(),
                hostname: host.clone(),
                generation: 3,
            },
            Task::RemoveNetwork {
                environment: env.clone(),
                generation: 3,
            },
            Task::RemoveVolume {
                environment: env.clone(),
                volume: Name::new("pgdata").expect("name"),
                generation: 3,
                released_at: 1_700_000_000_000,
            },
            Task::PlaceAcmeChallenge {
                environment: env.clone(),
                hostname: host.clone(),
                generation: 3,
                token: "t".repeat(43),
                key_authorization: format!("{}.{}", "t".repeat(43), "k".repeat(43)),
            },
            Task::BackupVolume {
                environment: env.clone(),
                volume: Name::new("pgdata").expect("name"),
                generation: 3,
                scheduled: 1_800_000_000,
                on_demand: true,
                moving: true,
            },
            Task::RestoreVolume {
                environment: env.clone(),
                volume: Name::new("pgdata").expect("name"),
                generation: 3,
                to: 2,
                snapshot: "0123abcd".into(),
                asked_at: 1_800_000_000_000,
                moved: true,
            },
            Task::VerifyBackup {
                environment: env.clone(),
                volume: Name::new("pgdata").expect("name"),
                generation: 3,
                scheduled: 1_800_000_000,
                on_demand: false,
            },
        ];
        for task in &all {
            let wire = wire_task(task);
            let row = serde_json::to_value(task).expect("row");
            assert_eq!(Some(wire.kind()), row["task"].as_str(), "{task:?}");
            assert_eq!((wire.environment(), wire.generation()), ("api-production", 3));
            assert_eq!(wire.check(), Ok(()));
            // What the agent decodes is what was sent.
            let json = serde_json::to_string(&wire).expect("json");
            assert_eq!(serde_json::from_str::<agent_proto::Task>(&json).expect("decodes"), wire);
        }
        assert!(matches!(
            wire_task(&all[3]),
            agent_proto::Task::EnsureApplication { instance: 2, repair: 1, ref role, ref spec_hash, .. } if role == "web" && spec_hash == "h"
        ));
        assert!(matches!(
            wire_task(&all[8]),
            agent_proto::Task::PublishIngress { ref hostname, repair: 1, .. } if hostname == "api.example.com"
        ));
        assert!(matches!(
            wire_task(&all[9]),
            agent_proto::Task::MeasureCanary { ref hostname, generation: 3, .. } if hostname == "api.example.com"
        ));
    }
}
