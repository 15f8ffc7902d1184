//! The closed set of typed tasks an agent executes. Each is safe to run twice (leases expire,
//! agents restart), and each has an idempotency key derived from what it is (never from when
//! it was made), so a replayed reconcile produces the same key and no second job.

use crate::values::{Hostname, Name};
use serde::{Deserialize, Serialize};

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What a canary step waits for before it runs (the pause of the share before it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Wait {
    /// This many seconds, or less if promoted.
    Seconds(u32),
    /// Until `pl rollout promote`.
    Promote,
}

/// Where a publish stands in a rolling rollout: with `out`, batch `batch`'s old replicas that
/// stop before their new ones start leave the routes (batches before it serve new replicas);
/// without, batch `batch`'s new replicas join the routes in place of its old ones. See
/// [`crate::rollout::rolled_upstreams`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rolled {
    pub batch: u32,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub out: bool,
}

impl Task {
    /// What its step waits for before it runs: a canary step's pause, or a promote; `None`:
    /// nothing (`rollout::advance::StepState::entering`).
    pub fn wait(&self) -> Option<Wait> {
        match self {
            Task::PublishIngress { wait, .. } | Task::MeasureCanary { wait, .. } => *wait,
            _ => None,
        }
    }

    /// The gates a canary measure is judged on.
    pub fn gate(&self) -> Option<&crate::model::CanaryGate> {
        match self {
            Task::MeasureCanary { gate, .. } => Some(gate),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "task", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Task {
    /// The environment's Docker network, nftables table and routes on the node, in that order,
    /// as a generation needs them: one job where there were three (`EnsureNetwork`,
    /// `ApplyFirewall`, `EnsureRoutes`, which a ledger written before may still hold), so a
    /// release over 50 nodes an environment writes, leases and completes a third of the
    /// infrastructure jobs it did.
    EnsureEnvironment { environment: Name, generation: u64 },
    /// The environment's Docker network on the node, as a generation needs it.
    EnsureNetwork { environment: Name, generation: u64 },
    /// The environment's nftables table on the node, as a generation needs it.
    ApplyFirewall { environment: Name, generation: u64 },
    /// The environment's routes on the node, as a generation needs it.
    EnsureRoutes { environment: Name, generation: u64 },
    /// One replica of a role at a generation, healthy. `repair` counts the times the control
    /// plane asked again because the replica's agent no longer reported it (removed by hand,
    /// say): each is a job of its own (`…:ensure#r<n>`), at the same generation.
    EnsureApplication {
        environment: Name,
        role: Name,
        instance: u32,
        generation: u64,
        spec_hash: String,
        #[serde(default, skip_serializing_if = "is_zero")]
        repair: u32,
    },
    /// A job or release role, once per generation.
    RunOnce {
        environment: Name,
        role: Name,
        generation: u64,
    },
    /// A cron role's run for one scheduled time (Unix seconds, a whole minute), queued by the
    /// reconciler when that time comes; the key names the time, so a time runs at most once.
    RunCron {
        environment: Name,
        role: Name,
        generation: u64,
        scheduled: i64,
    },
    /// Stop a replica of an older generation (after the new one is healthy).
    StopApplication {
        environment: Name,
        role: Name,
        instance: u32,
        generation: u64,
    },
    /// Remove a replica's containers and state (every generation of it), as part of the
    /// teardown generation `generation`.
    TeardownApplication {
        environment: Name,
        role: Name,
        instance: u32,
        generation: u64,
    },
    /// Route a hostname to a generation in the ingress.
    PublishIngress {
        environment: Name,
        hostname: Hostname,
        generation: u64,
        /// As for `EnsureApplication`: published again after a repaired replica came back
        /// (its address may have changed), a job of its own (`…:publish#r<n>`).
        #[serde(default, skip_serializing_if = "is_zero")]
        repair: u32,
        /// A canary step: this percent (1-99) of the hostname's requests go to the generation,
        /// the rest to the release the node published before. `None`: all of them.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        weight: Option<u8>,
        /// Not before the canary step ahead of it has waited its pause, or a `pl rollout
        /// promote` (its step waits in the deployment's row). Never sent to the agent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait: Option<Wait>,
        /// A publish between a rolling rollout's batches: which replicas, new and old, the
        /// routes hold (the control plane lists them in the execution). Never sent as such.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rolled: Option<Rolled>,
    },
    /// Measure what the ingress saw of the canary at `weight` percent since the node's share
    /// began (its own step, after the share's pause, before the next share): the control plane
    /// judges `gate` on every ingress node's measure together. Changes nothing on the node.
    MeasureCanary {
        environment: Name,
        hostname: Hostname,
        generation: u64,
        weight: u8,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait: Option<Wait>,
        gate: crate::model::CanaryGate,
    },
    /// Take a hostname's route out of the ingress (first step of any teardown).
    RemoveIngress {
        environment: Name,
        hostname: Hostname,
        generation: u64,
    },
    /// Remove the environment's routes, nftables table and network from the node (the last
    /// step of a teardown, after its containers are gone).
    RemoveNetwork { environment: Name, generation: u64 },
    /// Remove an environment's volume at `generation` (its own generation: a restore makes the
    /// next) from the node, once the retention that started at `released_at` (the teardown's
    /// time, Unix ms) is over or an admin asked. A later teardown is another job.
    RemoveVolume {
        environment: Name,
        volume: Name,
        generation: u64,
        released_at: i64,
    },
    /// Answer an ACME HTTP-01 challenge for a hostname the node serves: the ingress serves
    /// `key_authorization` at `/.well-known/acme-challenge/<token>` (public by design: it is
    /// what the CA reads). Queued by the control plane's ACME issuer to every node serving the
    /// hostname, at the generation of the rollout that serves it.
    PlaceAcmeChallenge {
        environment: Name,
        hostname: Hostname,
        generation: u64,
        token: String,
        key_authorization: String,
    },
    /// Back up a volume into the environment's repository, for one scheduled time (Unix
    /// seconds) or, `on_demand`, for an operator's request made at that second. Queued on the
    /// volume's node; `generation` is the deployment's whose spec says how.
    BackupVolume {
        environment: Name,
        volume: Name,
        generation: u64,
        scheduled: i64,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        on_demand: bool,
        /// The first half of a move (`pl volume move`, asked at `scheduled`): the role's
        /// replica is removed first and stays down, and the volume's files are saved whatever
        /// the backup's `command` (nothing writes them now).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        moving: bool,
    },
    /// A restore drill: the volume's newest snapshot restored into a scratch copy on its node,
    /// where the backup's `verify.command` must succeed; for a scheduled time (Unix seconds)
    /// or, `on_demand`, an operator's request made at that second.
    VerifyBackup {
        environment: Name,
        volume: Name,
        generation: u64,
        scheduled: i64,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        on_demand: bool,
    },
    /// Restore a snapshot of the volume into its generation `to` (new and empty: a restore
    /// never writes into data that exists), on the volume's node. Once it succeeded the
    /// volume is at `to`, and its role is placed again on it.
    RestoreVolume {
        environment: Name,
        volume: Name,
        generation: u64,
        to: u64,
        snapshot: String,
        /// When it was asked for (Unix ms): a failed restore can be asked for again.
        asked_at: i64,
        /// The second half of a move: the snapshot holds the volume's files (saved with its
        /// role stopped), restored on the node the volume moves to.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        moved: bool,
    },
}

impl Task {
    /// What the job is, as a stable key: `app:<env>/<role>/<instance>:g<generation>:ensure`.
    pub fn idempotency_key(&self) -> String {
        match self {
            Task::EnsureEnvironment {
                environment,
                generation,
            } => format!("env:{environment}:g{generation}:ensure"),
            Task::EnsureNetwork {
                environment,
                generation,
            } => format!("net:{environment}:g{generation}:ensure"),
            Task::ApplyFirewall {
                environment,
                generation,
            } => format!("fw:{environment}:g{generation}:apply"),
            Task::EnsureRoutes {
                environment,
                generation,
            } => format!("routes:{environment}:g{generation}:ensure"),
            Task::RemoveNetwork {
                environment,
                generation,
            } => format!("net:{environment}:g{generation}:remove"),
            Task::EnsureApplication {
                environment,
                role,
                instance,
                generation,
                repair: 0,
                ..
            } => format!("app:{environment}/{role}/{instance}:g{generation}:ensure"),
            Task::EnsureApplication {
                environment,
                role,
                instance,
                generation,
                repair,
                ..
            } => format!("app:{environment}/{role}/{instance}:g{generation}:ensure#r{repair}"),
            Task::RunOnce {
                environment,
                role,
                generation,
            } => format!("once:{environment}/{role}:g{generation}:run"),
            Task::RunCron {
                environment,
                role,
                scheduled,
                ..
            } => format!("{}t{scheduled}:run", cron_key_prefix(environment, role)),
            Task::StopApplication {
                environment,
                role,
                instance,
                generation,
            } => format!("app:{environment}/{role}/{instance}:g{generation}:stop"),
            Task::TeardownApplication {
                environment,
                role,
                instance,
                generation,
            } => format!("app:{environment}/{role}/{instance}:g{generation}:teardown"),
            Task::PublishIngress {
                environment,
                hostname,
                generation,
                repair: 0,
                weight: None,
                rolled: Some(Rolled { batch, out }),
                ..
            } => format!(
                "ingress:{environment}/{hostname}:g{generation}:publish/b{batch}{}",
                if *out { "-out" } else { "" }
            ),
            Task::PublishIngress {
                environment,
                hostname,
                generation,
                repair: 0,
                weight: None,
                ..
            } => format!("ingress:{environment}/{hostname}:g{generation}:publish"),
            Task::PublishIngress {
                environment,
                hostname,
                generation,
                repair: 0,
                weight: Some(w),
                ..
            } => format!("ingress:{environment}/{hostname}:g{generation}:publish/w{w}"),
            Task::PublishIngress {
                environment,
                hostname,
                generation,
                repair,
                ..
            } => format!("ingress:{environment}/{hostname}:g{generation}:publish#r{repair}"),
            Task::MeasureCanary {
                environment,
                hostname,
                generation,
                weight,
                ..
            } => format!("ingress:{environment}/{hostname}:g{generation}:measure/w{weight}"),
            Task::RemoveIngress {
                environment,
                hostname,
                generation,
            } => format!("ingress:{environment}/{hostname}:g{generation}:remove"),
            Task::RemoveVolume {
                environment,
                volume,
                generation,
                released_at,
            } => format!("vol:{environment}/{volume}:v{generation}:t{released_at}:remove"),
            // The token is the CA's, new for each order: one job per challenge and node.
            Task::PlaceAcmeChallenge {
                environment,
                hostname,
                token,
                ..
            } => format!("acme:{environment}/{hostname}:{token}:place"),
            Task::BackupVolume {
                environment,
                volume,
                scheduled,
                on_demand,
                moving,
                ..
            } => format!(
                "{}{}{scheduled}:save",
                backup_key_prefix(environment, volume),
                match (*moving, *on_demand) {
                    (true, _) => "move",
                    (false, true) => "now",
                    (false, false) => "t",
                }
            ),
            // A move's restore says so (`m`): a new generation of its environment does not
            // cancel it (see `MOVE_KEYS`).
            Task::RestoreVolume {
                environment,
                volume,
                to,
                asked_at,
                moved,
                ..
            } => format!(
                "vol:{environment}/{volume}:v{to}:{}{asked_at}:restore",
                if *moved { "m" } else { "t" }
            ),
            Task::VerifyBackup {
                environment,
                volume,
                scheduled,
                on_demand,
                ..
            } => format!(
                "{}{}{scheduled}:verify",
                drill_key_prefix(environment, volume),
                if *on_demand { "now" } else { "t" }
            ),
        }
    }

    /// The generation of its environment's deployment a task serves.
    pub fn generation(&self) -> u64 {
        match self {
            Task::EnsureEnvironment { generation, .. }
            | Task::EnsureNetwork { generation, .. }
            | Task::ApplyFirewall { generation, .. }
            | Task::EnsureRoutes { generation, .. }
            | Task::RemoveNetwork { generation, .. }
            | Task::EnsureApplication { generation, .. }
            | Task::RunOnce { generation, .. }
            | Task::RunCron { generation, .. }
            | Task::StopApplication { generation, .. }
            | Task::TeardownApplication { generation, .. }
            | Task::PublishIngress { generation, .. }
            | Task::MeasureCanary { generation, .. }
            | Task::RemoveIngress { generation, .. }
            | Task::RemoveVolume { generation, .. }
            | Task::PlaceAcmeChallenge { generation, .. }
            | Task::BackupVolume { generation, .. }
            | Task::VerifyBackup { generation, .. }
            | Task::RestoreVolume { generation, .. } => *generation,
        }
    }

    /// The environment a task belongs to.
    pub fn environment(&self) -> &Name {
        match self {
            Task::EnsureEnvironment { environment, .. }
            | Task::EnsureNetwork { environment, .. }
            | Task::ApplyFirewall { environment, .. }
            | Task::EnsureRoutes { environment, .. }
            | Task::RemoveNetwork { environment, .. }
            | Task::EnsureApplication { environment, .. }
            | Task::RunOnce { environment, .. }
            | Task::RunCron { environment, .. }
            | Task::StopApplication { environment, .. }
            | Task::TeardownApplication { environment, .. }
            | Task::PublishIngress { environment, .. }
            | Task::MeasureCanary { environment, .. }
            | Task::RemoveIngress { environment, .. }
            | Task::RemoveVolume { environment, .. }
            | Task::PlaceAcmeChallenge { environment, .. }
            | Task::BackupVolume { environment, .. }
            | Task::VerifyBackup { environment, .. }
            | Task::RestoreVolume { environment, .. } => environment,
        }
    }
}

/// What every cron run's key of a role starts with (whatever the generation: a rollout at the
/// scheduled minute does not run the time twice).
pub fn cron_key_prefix(environment: &Name, role: &Name) -> String {
    format!("cron:{environment}/{role}:")
}

/// What every backup's key of a volume starts with (whatever the generation).
pub fn backup_key_prefix(environment: &Name, volume: &Name) -> String {
    format!("backup:{environment}/{volume}:")
}

/// What every restore drill's key of a volume starts with (whatever the generation).
pub fn drill_key_prefix(environment: &Name, volume: &Name) -> String {
    format!("drill:{environment}/{volume}:")
}

/// The environment and volume a restore drill's key names: `drill:<env>/<volume>:…`.
pub fn drill_of_key(key: &str) -> Option<(&str, &str)> {
    let rest = key.strip_prefix("drill:")?;
    let (env, rest) = rest.split_once('/')?;
    let (volume, _) = rest.split_once(':')?;
    Some((env, volume))
}

/// Whether a backup's key is a move's first half (`backup:<env>/<volume>:move<s>:save`).
pub fn is_move_key(key: &str) -> bool {
    backup_of_key(key).is_some() && key.contains(":move")
}

/// The environment and volume a backup's key names: `backup:<env>/<volume>:…`.
pub fn backup_of_key(key: &str) -> Option<(&str, &str)> {
    let rest = key.strip_prefix("backup:")?;
    let (env, rest) = rest.split_once('/')?;
    let (volume, _) = rest.split_once(':')?;
    Some((env, volume))
}

/// The environment, volume and new generation a restore's key names:
/// `vol:<env>/<volume>:v<to>:t<asked>:restore`.
pub fn restore_of_key(key: &str) -> Option<(&str, &str, u64)> {
    let rest = key.strip_prefix("vol:")?.split('@').next()?.strip_suffix(":restore")?;
    let (env, rest) = rest.split_once('/')?;
    let (volume, rest) = rest.split_once(":v")?;
    let (to, _) = rest.split_once(":t").or_else(|| rest.split_once(":m"))?;
    Some((env, volume, to.parse().ok()?))
}

/// SQL `LIKE` patterns of a volume move's jobs (its backup, its restore): they belong to the
/// move, not to a generation, so a new generation of the environment does not cancel them.
pub const MOVE_KEYS: [&str; 2] = ["backup:%:move%", "vol:%:m%:restore%"];

/// Whether `s` can be a restic snapshot id: 8 to 64 lowercase hex digits.
pub fn is_snapshot_id(s: &str) -> bool {
    (8..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> Name {
        Name::new(s).expect("valid")
    }

    #[test]
    fn a_backup_key_names_its_volume_and_its_time_and_says_who_asked() {
        let backup = |on_demand, moving| Task::BackupVolume {
            environment: n("shop"),
            volume: n("pgdata"),
            generation: 4,
            scheduled: 1_800_000_000,
            on_demand,
            moving,
        };
        let t = |on_demand| backup(on_demand, false);
        assert_eq!(t(false).idempotency_key(), "backup:shop/pgdata:t1800000000:save");
        assert_eq!(t(true).idempotency_key(), "backup:shop/pgdata:now1800000000:save");
        assert_eq!(backup_of_key(&t(true).idempotency_key()), Some(("shop", "pgdata")));
        // A move's first half is a backup of its own kind: its key says so.
        let moving = backup(true, true);
        assert_eq!(moving.idempotency_key(), "backup:shop/pgdata:move1800000000:save");
        assert!(is_move_key(&moving.idempotency_key()) && !is_move_key(&t(true).idempotency_key()));
        assert!(!is_move_key("vol:shop/movies:v2:t1:restore"));
        assert_eq!(backup_of_key("vol:shop/pgdata:v1:t1:remove"), None);
        let drill = |on_demand| Task::VerifyBackup {
            environment: n("shop"),
            volume: n("pgdata"),
            generation: 4,
            scheduled: 1_800_000_000,
            on_demand,
        };
        assert_eq!(drill(false).idempotency_key(), "drill:shop/pgdata:t1800000000:verify");
        assert_eq!(drill(true).idempotency_key(), "drill:shop/pgdata:now1800000000:verify");
        assert_eq!(drill_of_key(&drill(true).idempotency_key()), Some(("shop", "pgdata")));
        assert_eq!(backup_of_key(&drill(true).idempotency_key()), None, "not a backup");
        assert_eq!(drill_of_key(&t(true).idempotency_key()), None);
        let restore = |moved| Task::RestoreVolume {
            environment: n("shop"),
            volume: n("pgdata"),
            generation: 4,
            to: 3,
            snapshot: "0123abcd".into(),
            asked_at: 17,
            moved,
        };
        assert_eq!(restore(false).idempotency_key(), "vol:shop/pgdata:v3:t17:restore");
        assert_eq!(
            restore_of_key("vol:shop/pgdata:v3:t17:restore@n1"),
            Some(("shop", "pgdata", 3))
        );
        assert_eq!(restore_of_key("vol:shop/pgdata:v3:t9:remove@n1"), None);
        // A move's restore says so, and is read the same.
        assert_eq!(restore(true).idempotency_key(), "vol:shop/pgdata:v3:m17:restore");
        assert_eq!(
            restore_of_key("vol:shop/pgdata:v3:m17:restore@n2"),
            Some(("shop", "pgdata", 3))
        );
        assert!(is_snapshot_id("0123abcd") && !is_snapshot_id("0123ABCD") && !is_snapshot_id("latest"));
    }

    #[test]
    fn keys_are_what_the_job_is() {
        let t = Task::EnsureApplication {
            environment: n("api-production"),
            role: n("web"),
            instance: 0,
            generation: 3,
            spec_hash: "sha256:ab".into(),
            repair: 0,
        };
        assert_eq!(t.idempotency_key(), "app:api-production/web/0:g3:ensure");
        // A replay builds the task afresh from what it is (not a clone): the same key. A spec
        // hash is not part of what the job is; the generation is.
        let replayed = Task::EnsureApplication {
            environment: n("api-production"),
            role: n("web"),
            instance: 0,
            generation: 3,
            spec_hash: "sha256:cd".into(),
            repair: 0,
        };
        assert_eq!(
            t.idempotency_key(),
            replayed.idempotency_key(),
            "a replay gives the same key"
        );
        let next = Task::EnsureApplication {
            environment: n("api-production"),
            role: n("web"),
            instance: 0,
            generation: 4,
            spec_hash: "sha256:ab".into(),
            repair: 0,
        };
        assert_ne!(
            t.idempotency_key(),
            next.idempotency_key(),
            "another generation is another job"
        );
        let json = serde_json::to_string(&t).expect("json");
        assert!(json.starts_with("{\"task\":\"ensure-application\""), "{json}");
        assert_eq!(serde_json::from_str::<Task>(&json).expect("round trip"), t);
        // The same document with a valid name decodes, so the refusal below is the name's.
        let good = "{\"task\":\"ensure-network\",\"environment\":\"api\",\"generation\":1}";
        assert!(serde_json::from_str::<Task>(good).is_ok(), "{good}");
        let bad = good.replace("\"api\"", "\"Bad Name\"");
        assert!(
            serde_json::from_str::<Task>(&bad).is_err(),
            "names are validated on the way in"
        );
        assert!(
            serde_json::from_str::<Task>("{\"task\":\"format-disk\"}").is_err(),
            "the set is closed"
        );
    }
}
