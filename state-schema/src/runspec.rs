//! What one role of an environment runs, flattened from the project, the environment's
//! overrides and the secrets it names: the part of a deployment's spec that a lease turns into
//! an agent's execution spec, stored with each generation so a job always runs the release it
//! was made for (never a newer commit's). Secrets stay age ciphertext here; the control plane
//! reseals them to a node's own key when it hands the job out.

use crate::model::{Kind, Spec, Workload};
use crate::state::State;
use crate::values::Name;
use crate::values::SmallMap;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// A role as it runs: everything an agent needs, and nothing it must look up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RoleSpec {
    /// `web`, `worker`, `service`, `cron`, `job` or `release`.
    pub kind: String,
    /// The image, pinned by digest (validation requires it).
    pub image: String,
    /// The image's signatures from the tree (`image-signatures/`), armored, in file order; empty
    /// is left out, so specs without any keep their hashes. Part of the spec, so a signature
    /// added after a refusal rolls a new generation that is checked again, and a rollback
    /// carries the signatures its generation was checked with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_signatures: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Shared by the roles of one deployment (a copy per role was 12 MB at 10,000 deployments).
    #[serde(default, skip_serializing_if = "is_empty")]
    pub env: Arc<SmallMap<String, String>>,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub pids: u32,
    /// The port a web role listens on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// A web role's health path and its deadline in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<(String, u32)>,
    /// A cron role's schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// Secret files by key (`/run/secrets/<KEY>`): ASCII-armoured age ciphertext, as in Git.
    #[serde(default, skip_serializing_if = "is_empty")]
    pub secrets: Arc<SmallMap<String, String>>,
    /// The role's `logs`: bytes a file and files its container's log keeps on the node;
    /// `None` for the defaults (so specs without it keep their hashes, and so their generation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<(u64, u32)>,
    /// The ports it serves inside the environment besides `port` (sorted); empty is left out,
    /// so specs without it keep their hashes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
    /// Its volumes, mounted in every container it runs; empty is left out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeSpec>,
    /// `rollout.watchSeconds`: how long a new release's replicas are watched after the switch;
    /// `None` (not watched) is left out, so specs without it keep their hashes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch_seconds: Option<u32>,
    /// A web role's canary (`rollout.steps`): the shares of requests its new release gets
    /// before the switch; empty (the switch at once) is left out, so specs keep their hashes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub canary: Vec<crate::model::CanaryStep>,
    /// The canary's gates (`rollout.gates`); `None` is left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_gate: Option<crate::model::CanaryGate>,
    /// `strategy: rolling`: its replicas are replaced in batches; `None` is left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling: Option<crate::model::Rolling>,
}

/// A volume as a role's containers mount it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSpec {
    pub name: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    pub retain_days: u32,
    /// Which of the volume's generations the role mounts: 1, and one more with each restore
    /// (a restore fills a new, empty generation and keeps the old one). Placement sets it from
    /// the control plane's volume rows; absent when 1, so specs keep their hashes.
    #[serde(default = "first_generation", skip_serializing_if = "is_first_generation")]
    pub generation: u64,
    /// Its scheduled backup; absent from the stored form when unset, so specs without one
    /// keep their hashes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupPlan>,
}

/// When and how a volume is backed up (the repository is the environment's).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupPlan {
    /// Five cron fields, UTC.
    pub schedule: String,
    pub keep: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// What loads a restored dump in the role's container (its standard input).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<Vec<String>>,
    /// Its restore drill; absent from the stored form when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<VerifyPlan>,
}

/// When a restore drill runs, and the command that proves the restored copy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyPlan {
    /// Five cron fields, UTC.
    pub schedule: String,
    pub command: Vec<String>,
}

fn first_generation() -> u64 {
    1
}

fn is_first_generation(g: &u64) -> bool {
    *g == 1
}

fn is_empty(m: &Arc<SmallMap<String, String>>) -> bool {
    m.is_empty()
}

impl RoleSpec {
    /// Whether the role serves HTTP through the ingress.
    pub fn is_web(&self) -> bool {
        self.kind == "web"
    }

    /// The log bound a container of this role gets: bytes a file, files.
    pub fn log_limits(&self) -> (u64, u32) {
        self.logs.unwrap_or((
            crate::parse::defaults::LOG_MAX_BYTES,
            crate::parse::defaults::LOG_MAX_FILES,
        ))
    }
}

/// Every role of an environment's project, as it runs there; empty when the project is
/// missing (validation reports that).
pub fn role_specs(
    state: &State,
    project: &Name,
    env_vars: &SmallMap<String, String>,
    image: &str,
) -> SmallMap<Name, RoleSpec> {
    let Some(p) = state.project(project.as_str()) else {
        return SmallMap::new();
    };
    let mut vars = p.env.clone();
    vars.extend(env_vars.iter().map(|(k, v)| (k.clone(), v.clone())));
    // Secret keys of every secret the project names; a later secret's key wins, in the
    // project's order (validation keeps names unique).
    let mut secrets = SmallMap::new();
    for s in &p.secrets {
        if let Some(Spec::Secret(secret)) = state.get(Kind::Secret, s.as_str()).map(|l| &l.object.spec) {
            for (k, v) in &secret.data {
                secrets.insert(k.clone(), v.armored().to_owned());
            }
        }
    }
    let (vars, secrets) = (Arc::new(vars), Arc::new(secrets));
    let signatures = image
        .rsplit_once('@')
        .map(|(_, digest)| state.image_signatures(digest))
        .unwrap_or_default();
    p.roles
        .iter()
        .map(|(name, r)| {
            let (port, health, schedule) = match &r.workload {
                Workload::Web { port, health, .. } => {
                    (Some(*port), Some((health.path.clone(), health.timeout_seconds)), None)
                }
                Workload::Cron { schedule } => (None, None, Some(schedule.as_str().to_owned())),
                _ => (None, None, None),
            };
            let spec = RoleSpec {
                kind: r.workload.kind_name().to_owned(),
                image: image.to_owned(),
                image_signatures: signatures.clone(),
                command: r.command.clone(),
                env: Arc::clone(&vars),
                cpu_millis: r.resources.cpu.millis(),
                memory_bytes: r.resources.memory.bytes(),
                pids: r.resources.pids,
                port,
                health,
                schedule,
                secrets: Arc::clone(&secrets),
                logs: r.logs.as_ref().map(|l| (l.max_size.bytes(), l.max_files)),
                ports: r.ports.clone(),
                watch_seconds: r.rollout.as_ref().map(|p| p.watch_seconds).filter(|s| *s > 0),
                canary: r.rollout.as_ref().map(|p| p.steps.clone()).unwrap_or_default(),
                canary_gate: r.rollout.as_ref().and_then(|p| p.gates),
                rolling: r.rollout.as_ref().and_then(|p| p.rolling),
                volumes: r
                    .volumes
                    .iter()
                    .map(|v| VolumeSpec {
                        name: v.name.as_str().to_owned(),
                        path: v.path.clone(),
                        size_bytes: v.size.map(|s| s.bytes()),
                        retain_days: v.retain_days,
                        generation: 1,
                        backup: v.backup.as_ref().map(|b| BackupPlan {
                            schedule: b.schedule.as_str().to_owned(),
                            keep: b.keep,
                            command: b.command.clone(),
                            restore: b.restore.clone(),
                            verify: b.verify.as_ref().map(|v| VerifyPlan {
                                schedule: v.schedule.as_str().to_owned(),
                                command: v.command.clone(),
                            }),
                        }),
                    })
                    .collect(),
            };
            (name.clone(), spec)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state_with(roles: &str) -> State {
        state_with_files(roles, Vec::new())
    }

    fn state_with_files(roles: &str, more: Vec<crate::parse::ParsedFile>) -> State {
        let text = format!(
            "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: api}}\nspec:\n  image: registry.example.invalid/api@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n  roles:\n{roles}"
        );
        let files: Vec<_> = [
            crate::parse::parse_file(
                "pushleft.yaml",
                b"apiVersion: pushleft.dev/v1alpha1\nkind: Repository\nmetadata: {name: t}\nspec: {baseDomain: example.com}\n",
            ),
            crate::parse::parse_file("project.yaml", text.as_bytes()),
        ]
        .into_iter()
        .chain(more)
        .collect();
        let loaded = crate::state::assemble(files, Vec::new());
        assert!(loaded.is_valid(), "{:?}", loaded.diagnostics);
        loaded.state
    }

    #[test]
    fn declared_ports_reach_the_role_spec_sorted_and_none_changes_nothing() {
        let project = Name::new("api").expect("name");
        let with = state_with("    cache: {kind: worker, ports: [6380, 6379]}\n    web: {kind: web, ports: [9090]}\n");
        let specs = role_specs(&with, &project, &SmallMap::new(), "img");
        let cache = specs.get(&Name::new("cache").expect("name")).expect("cache");
        assert_eq!(cache.ports, [6379, 6380]);
        assert_eq!(specs.get(&Name::new("web").expect("name")).expect("web").ports, [9090]);
        // Without `ports`, the serialized spec has no such field: hashes (and so generations)
        // of roles that never declared ports stay as they were.
        let without = state_with("    cache: {kind: worker}\n");
        let specs = role_specs(&without, &project, &SmallMap::new(), "img");
        let json = serde_json::to_string(specs.get(&Name::new("cache").expect("name")).expect("cache")).expect("json");
        assert!(!json.contains("ports"), "{json}");
    }

    #[test]
    fn a_role_carries_its_image_signatures_and_none_changes_nothing() {
        let hex = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let image = format!("registry.example.invalid/api@sha256:{hex}");
        let block = "-----BEGIN SSH SIGNATURE-----\nU1NIU0lH\n-----END SSH SIGNATURE-----\n";
        let sig = crate::parse::parse_file(&format!("image-signatures/sha256-{hex}.sig"), block.as_bytes());
        let other = crate::parse::parse_file(
            &format!("image-signatures/sha256-{}.sig", "f".repeat(64)),
            block.as_bytes(),
        );
        let project = Name::new("api").expect("name");
        let signed = state_with_files("    web: {kind: worker}\n", vec![sig, other]);
        let specs = role_specs(&signed, &project, &SmallMap::new(), &image);
        assert_eq!(
            specs
                .get(&Name::new("web").expect("name"))
                .expect("web")
                .image_signatures,
            [block]
        );
        // Another image's signature is not this one's; no signature, no field.
        let specs = role_specs(
            &signed,
            &project,
            &SmallMap::new(),
            "registry.example.invalid/x@sha256:00",
        );
        let json = serde_json::to_string(specs.get(&Name::new("web").expect("name")).expect("web")).expect("json");
        assert!(!json.contains("imageSignatures"), "{json}");
    }
}
