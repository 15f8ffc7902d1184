//! The closed set of tasks a lease carries, as the agent receives them, and the executor
//! (capability) each needs. The control plane's own task type (`state_schema::task::Task`,
//! with its validated names and idempotency keys) maps onto this one in one exhaustive
//! function of the reconciler; the agent `match`es on it. A task this agent does not know is a
//! decode error, reported with a code, never a default.

use serde::{Deserialize, Serialize};

/// An executor a node may run, and offer in its heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Capability {
    /// Containers (bollard).
    Docker,
    /// Per-environment nftables tables.
    Nftables,
    /// Per-environment routing tables and rules (rtnetlink).
    Routes,
    /// Caddy routes.
    Ingress,
}

impl Capability {
    pub const ALL: [Capability; 4] = [
        Capability::Docker,
        Capability::Ingress,
        Capability::Nftables,
        Capability::Routes,
    ];

    /// Its name on the wire and in the agent's configuration.
    pub fn name(self) -> &'static str {
        match self {
            Capability::Docker => "docker",
            Capability::Nftables => "nftables",
            Capability::Routes => "routes",
            Capability::Ingress => "ingress",
        }
    }
}

impl std::fmt::Display for Capability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a leased job is to do. Names are the control plane's (environment and role labels,
/// hostnames), already validated there; what the task runs with is in its `Execution`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "task",
    rename_all = "kebab-case",
    rename_all_fields = "camelCase",
    deny_unknown_fields
)]
pub enum Task {
    /// The environment's network, nftables table and routes on the node, in that order, as a
    /// generation needs them (one job for what were the three below, which a control plane may
    /// still lease from jobs queued before it was upgraded).
    EnsureEnvironment { environment: String, generation: u64 },
    /// The environment's network on the node, as a generation needs it.
    EnsureNetwork { environment: String, generation: u64 },
    /// The environment's nftables table on the node.
    ApplyFirewall { environment: String, generation: u64 },
    /// The environment's routes on the node.
    EnsureRoutes { environment: String, generation: u64 },
    /// One replica of a role at a generation, healthy (`repair`: the times it was asked again).
    EnsureApplication {
        environment: String,
        role: String,
        instance: u32,
        generation: u64,
        spec_hash: String,
        #[serde(default)]
        repair: u32,
    },
    /// A job or release role, once per generation.
    RunOnce {
        environment: String,
        role: String,
        generation: u64,
    },
    /// A cron role's run for one scheduled time (Unix seconds).
    RunCron {
        environment: String,
        role: String,
        generation: u64,
        scheduled: i64,
    },
    /// Stop a replica of an older generation.
    StopApplication {
        environment: String,
        role: String,
        instance: u32,
        generation: u64,
    },
    /// Remove a replica's containers and state, for teardown generation `generation`.
    TeardownApplication {
        environment: String,
        role: String,
        instance: u32,
        generation: u64,
    },
    /// Route a hostname to a generation: all of its requests, or at a canary step `weight`
    /// percent (1-99) of them, the rest staying with the release published before.
    PublishIngress {
        environment: String,
        hostname: String,
        generation: u64,
        #[serde(default)]
        repair: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        weight: Option<u8>,
    },
    /// Measure what the ingress saw of generation `generation`'s canary of a hostname since
    /// this node's share began: its round trips, those that failed, their p95 (the control
    /// plane judges the gates on every node's measure; nothing changes here).
    MeasureCanary {
        environment: String,
        hostname: String,
        generation: u64,
    },
    /// Take a hostname's route out.
    RemoveIngress {
        environment: String,
        hostname: String,
        generation: u64,
    },
    /// Remove the environment's routes, table and network from the node.
    RemoveNetwork { environment: String, generation: u64 },
    /// Remove the environment's volume at `generation` (only ours; never one in use).
    RemoveVolume {
        environment: String,
        volume: String,
        generation: u64,
    },
    /// Serve an ACME HTTP-01 challenge's key authorization for a hostname.
    PlaceAcmeChallenge {
        environment: String,
        hostname: String,
        generation: u64,
        token: String,
        key_authorization: String,
    },
    /// Restore `snapshot` into the volume's new, empty generation `to`.
    RestoreVolume {
        environment: String,
        volume: String,
        generation: u64,
        to: u64,
        snapshot: String,
    },
    /// Back up the environment's volume into its repository (the execution says how).
    BackupVolume {
        environment: String,
        volume: String,
        generation: u64,
        scheduled: i64,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        on_demand: bool,
    },
    /// A restore drill of the environment's volume: its newest snapshot restored into a
    /// scratch copy, the backup's `verify.command` run on it (the execution says how).
    VerifyBackup {
        environment: String,
        volume: String,
        generation: u64,
        scheduled: i64,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        on_demand: bool,
    },
}

/// An ACME token as RFC 8555 makes it: base64url, at least 128 bits (22 characters), and here
/// at most 128 characters. It becomes a file name on the node.
pub fn is_acme_token(s: &str) -> bool {
    (22..=128).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A DNS label as the control plane's names are: 1 to 63 of `a-z`, `0-9` and `-`, not
/// starting or ending with `-`. Names become host objects' names and file names on the node.
pub fn is_label(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn check_hostname(hostname: &str) -> Result<(), String> {
    if hostname.len() <= 253 && hostname.split('.').all(is_label) {
        Ok(())
    } else {
        Err(format!("the hostname {hostname:?} is not one"))
    }
}

impl Task {
    /// Its names are what the control plane's names always are (labels; a hostname of labels,
    /// 253 characters at most): the agent makes host objects and files from them.
    pub fn check(&self) -> Result<(), String> {
        let label = |what: &str, s: &str| {
            if is_label(s) {
                Ok(())
            } else {
                Err(format!("the {what} {s:?} is not a label"))
            }
        };
        label("environment", self.environment())?;
        match self {
            Task::EnsureApplication { role, .. }
            | Task::RunOnce { role, .. }
            | Task::RunCron { role, .. }
            | Task::StopApplication { role, .. }
            | Task::TeardownApplication { role, .. } => label("role", role),
            Task::RemoveVolume { volume, .. }
            | Task::BackupVolume { volume, .. }
            | Task::VerifyBackup { volume, .. } => label("volume", volume),
            Task::RestoreVolume { volume, snapshot, .. } => {
                label("volume", volume)?;
                if (8..=64).contains(&snapshot.len())
                    && snapshot
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                {
                    Ok(())
                } else {
                    Err("the snapshot id is not one".to_owned())
                }
            }
            Task::PublishIngress { weight: Some(w), .. } if !(1..=99).contains(w) => {
                Err(format!("the canary weight {w} is not 1-99"))
            }
            Task::PublishIngress { hostname, .. }
            | Task::MeasureCanary { hostname, .. }
            | Task::RemoveIngress { hostname, .. } => check_hostname(hostname),
            Task::PlaceAcmeChallenge {
                hostname,
                token,
                key_authorization,
                ..
            } => {
                check_hostname(hostname)?;
                // `<token>.<base64url SHA-256 thumbprint of the account key>` (RFC 8555 8.1).
                let fine = is_acme_token(token)
                    && key_authorization
                        .split_once('.')
                        .is_some_and(|(t, thumb)| t == token && thumb.len() == 43 && is_acme_token(thumb));
                if fine {
                    Ok(())
                } else {
                    Err("the ACME token or key authorization is not one".to_owned())
                }
            }
            Task::EnsureEnvironment { .. }
            | Task::EnsureNetwork { .. }
            | Task::ApplyFirewall { .. }
            | Task::EnsureRoutes { .. }
            | Task::RemoveNetwork { .. } => Ok(()),
        }
    }

    /// Its name on the wire (`ensure-application`, …).
    pub fn kind(&self) -> &'static str {
        match self {
            Task::EnsureEnvironment { .. } => "ensure-environment",
            Task::EnsureNetwork { .. } => "ensure-network",
            Task::ApplyFirewall { .. } => "apply-firewall",
            Task::EnsureRoutes { .. } => "ensure-routes",
            Task::EnsureApplication { .. } => "ensure-application",
            Task::RunOnce { .. } => "run-once",
            Task::RunCron { .. } => "run-cron",
            Task::StopApplication { .. } => "stop-application",
            Task::TeardownApplication { .. } => "teardown-application",
            Task::PublishIngress { .. } => "publish-ingress",
            Task::MeasureCanary { .. } => "measure-canary",
            Task::RemoveIngress { .. } => "remove-ingress",
            Task::RemoveNetwork { .. } => "remove-network",
            Task::RemoveVolume { .. } => "remove-volume",
            Task::PlaceAcmeChallenge { .. } => "place-acme-challenge",
            Task::BackupVolume { .. } => "backup-volume",
            Task::VerifyBackup { .. } => "verify-backup",
            Task::RestoreVolume { .. } => "restore-volume",
        }
    }

    /// The executors it runs on, every one of them (an environment's set-up needs the engine's
    /// network, the firewall and the routes).
    pub fn needs(&self) -> &'static [Capability] {
        match self {
            Task::EnsureEnvironment { .. } => &[Capability::Docker, Capability::Nftables, Capability::Routes],
            Task::ApplyFirewall { .. } => &[Capability::Nftables],
            Task::EnsureRoutes { .. } => &[Capability::Routes],
            Task::PublishIngress { .. }
            | Task::MeasureCanary { .. }
            | Task::RemoveIngress { .. }
            | Task::PlaceAcmeChallenge { .. } => &[Capability::Ingress],
            Task::EnsureNetwork { .. }
            | Task::EnsureApplication { .. }
            | Task::RunOnce { .. }
            | Task::RunCron { .. }
            | Task::StopApplication { .. }
            | Task::TeardownApplication { .. }
            | Task::RemoveNetwork { .. }
            | Task::RemoveVolume { .. }
            | Task::BackupVolume { .. }
            | Task::VerifyBackup { .. }
            | Task::RestoreVolume { .. } => &[Capability::Docker],
        }
    }

    /// The environment it belongs to.
    pub fn environment(&self) -> &str {
        match self {
            Task::EnsureEnvironment { environment, .. }
            | Task::EnsureNetwork { environment, .. }
            | Task::ApplyFirewall { environment, .. }
            | Task::EnsureRoutes { environment, .. }
            | Task::EnsureApplication { environment, .. }
            | Task::RunOnce { environment, .. }
            | Task::RunCron { environment, .. }
            | Task::StopApplication { environment, .. }
            | Task::TeardownApplication { environment, .. }
            | Task::PublishIngress { environment, .. }
            | Task::MeasureCanary { environment, .. }
            | Task::RemoveIngress { environment, .. }
            | Task::RemoveNetwork { environment, .. }
            | Task::RemoveVolume { environment, .. }
            | Task::PlaceAcmeChallenge { environment, .. }
            | Task::BackupVolume { environment, .. }
            | Task::VerifyBackup { environment, .. }
            | Task::RestoreVolume { environment, .. } => environment,
        }
    }

    /// The generation of its environment's deployment it serves.
    pub fn generation(&self) -> u64 {
        match self {
            Task::EnsureEnvironment { generation, .. }
            | Task::EnsureNetwork { generation, .. }
            | Task::ApplyFirewall { generation, .. }
            | Task::EnsureRoutes { generation, .. }
            | Task::EnsureApplication { generation, .. }
            | Task::RunOnce { generation, .. }
            | Task::RunCron { generation, .. }
            | Task::StopApplication { generation, .. }
            | Task::TeardownApplication { generation, .. }
            | Task::PublishIngress { generation, .. }
            | Task::MeasureCanary { generation, .. }
            | Task::RemoveIngress { generation, .. }
            | Task::RemoveNetwork { generation, .. }
            | Task::RemoveVolume { generation, .. }
            | Task::PlaceAcmeChallenge { generation, .. }
            | Task::BackupVolume { generation, .. }
            | Task::VerifyBackup { generation, .. }
            | Task::RestoreVolume { generation, .. } => *generation,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_keep_their_wire_names_and_refuse_what_they_do_not_know() {
        let t = Task::EnsureApplication {
            environment: "api-production".into(),
            role: "web".into(),
            instance: 2,
            generation: 7,
            spec_hash: "abc".into(),
            repair: 0,
        };
        let json = serde_json::to_string(&t).expect("json");
        assert_eq!(
            json,
            r#"{"task":"ensure-application","environment":"api-production","role":"web","instance":2,"generation":7,"specHash":"abc","repair":0}"#
        );
        assert_eq!(serde_json::from_str::<Task>(&json).expect("back"), t);
        assert_eq!(
            (t.kind(), t.needs(), t.environment(), t.generation()),
            ("ensure-application", &[Capability::Docker][..], "api-production", 7)
        );
        for (bad, why) in [
            (
                r#"{"task":"ensure-network","environment":"../etc","generation":1}"#,
                "environment",
            ),
            (
                r#"{"task":"stop-application","environment":"e","role":"Web","instance":0,"generation":1}"#,
                "role",
            ),
            (
                r#"{"task":"remove-ingress","environment":"e","hostname":"a..b","generation":1}"#,
                "hostname",
            ),
        ] {
            let t: Task = serde_json::from_str(bad).expect("decodes");
            assert!(t.check().is_err_and(|e| e.contains(why)), "{bad}");
        }
        assert_eq!(t.check(), Ok(()));
        for bad in [
            r#"{"task":"format-disk","environment":"e","generation":1}"#,
            r#"{"task":"ensure-network","environment":"e","generation":1,"extra":true}"#,
            r#"{"task":"ensure-network","environment":"e"}"#,
            r#"{"task":"ensure-network","environment":"e","generation":-1}"#,
        ] {
            assert!(serde_json::from_str::<Task>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn each_task_needs_its_executors_and_capabilities_have_their_names() {
        assert_eq!(
            Task::ApplyFirewall {
                environment: "e".into(),
                generation: 1
            }
            .needs(),
            [Capability::Nftables]
        );
        let set_up = Task::EnsureEnvironment {
            environment: "e".into(),
            generation: 1,
        };
        assert_eq!(
            set_up.needs(),
            [Capability::Docker, Capability::Nftables, Capability::Routes]
        );
        assert_eq!(
            serde_json::to_string(&set_up).expect("json"),
            r#"{"task":"ensure-environment","environment":"e","generation":1}"#
        );
        let names: Vec<&str> = Capability::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(names, crate::FULL_CAPABILITIES);
        for c in Capability::ALL {
            assert_eq!(serde_json::to_string(&c).expect("json"), format!("\"{c}\""));
        }
    }
}
