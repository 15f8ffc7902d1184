//! The row formats the ledger writes and reads back, which the layers above share: job keys
//! (a repair's, a scale's revision), an environment's subnet on a node, a stored spec's
//! placement, stored generations, and the bound on a job's attempts.

/// A generation as the ledger stores it.
pub(crate) fn g(generation: u64) -> i64 {
    i64::try_from(generation).unwrap_or(i64::MAX)
}

/// A stored generation back as a number.
pub(crate) fn gen_u64(g: i64) -> u64 {
    u64::try_from(g).unwrap_or(0)
}

/// Where a job stands, as the `jobs.state` column spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum JobState {
    Queued,
    Leased,
    Succeeded,
    /// Failed for good (a permanent failure).
    Failed,
    /// Out of attempts.
    Dead,
    /// A newer generation started first.
    Cancelled,
}

impl JobState {
    pub const ALL: [JobState; 6] = [
        JobState::Queued,
        JobState::Leased,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Dead,
        JobState::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Leased => "leased",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Dead => "dead",
            JobState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<JobState> {
        JobState::ALL.into_iter().find(|j| j.as_str() == s)
    }

    /// Not ended yet: queued or leased.
    pub fn pending(self) -> bool {
        matches!(self, JobState::Queued | JobState::Leased)
    }

    /// Ended without success, for good.
    pub fn broken(self) -> bool {
        matches!(self, JobState::Failed | JobState::Dead)
    }
}

/// How many attempts a job gets before it is dead.
pub const MAX_ATTEMPTS: u32 = 5;

/// The subnet pool environments' networks are cut from: `10.208.0.0/12` in /24s, 4,096 per
/// node. Outside Docker's default pools (172.17.0.0/16 and up, 192.168.0.0/16).
pub const SUBNET_POOL_SIZE: i64 = 4096;

/// The `idx`-th /24 of the subnet pool.
pub fn subnet(idx: i64) -> String {
    let i = idx.clamp(0, SUBNET_POOL_SIZE - 1);
    format!("10.{}.{}.0/24", 208 + i / 256, i % 256)
}

/// The index in the pool of a /24 written as [`subnet`] writes it; `None` for anything else.
pub fn subnet_index(cidr: &str) -> Option<i64> {
    let (addr, len) = cidr.split_once('/')?;
    let o = addr.parse::<std::net::Ipv4Addr>().ok()?.octets();
    (len == "24" && o[0] == 10 && (208..224).contains(&o[1]) && o[3] == 0)
        .then(|| i64::from(o[1] - 208) * 256 + i64::from(o[2]))
}

/// The part of a stored spec that drift and the deployments view read: where each replica is
/// placed (parsed without the rest of the spec).
#[derive(serde::Deserialize)]
pub struct Placed {
    #[serde(default)]
    pub instances: Vec<state_schema::deployment::Instance>,
    /// Replicas wanted per long-running role, placed or not.
    #[serde(default)]
    pub replicas: std::collections::BTreeMap<String, u32>,
}

/// The revision of a scale's job key, `…@<node>#r<revision>` ([`super::JobRow::scaled`]);
/// `None` for any other job (a drift repair's `#r<n>` comes before the node).
pub fn scaled_revision(key: &str) -> Option<i64> {
    let (_, tail) = key.rsplit_once('@')?;
    let (_, revision) = tail.split_once("#r")?;
    revision.parse().ok()
}

/// Whether a job key is an environment's set-up on a node, `env:<env>:g<n>:ensure@<node>`, or
/// one of the three an older agent gets instead (network, firewall, routes): what the replicas
/// queued held with it wait for (`release_set_up_in`).
pub fn sets_up(key: &str) -> bool {
    let what = key.rsplit_once('@').map_or(key, |(what, _)| what);
    match what.split_once(':') {
        Some(("env" | "net" | "routes", _)) => what.ends_with(":ensure"),
        Some(("fw", _)) => what.ends_with(":apply"),
        _ => false,
    }
}

/// Whether a job key is a repair of a replica (`…:ensure#r<n>@node`).
pub fn is_repair(key: &str) -> bool {
    key.starts_with("app:") && key.contains(":ensure#r")
}

/// The environment and role of an ensure's job key (a repair's too),
/// `app:<env>/<role>/<i>:g<generation>:ensure[#r<n>]@<node>`.
pub fn ensured_role(key: &str) -> Option<(&str, &str)> {
    let rest = key.strip_prefix("app:")?;
    let (what, _) = rest.rsplit_once('@')?;
    if !(what.ends_with(":ensure") || what.contains(":ensure#r")) {
        return None;
    }
    let (environment, rest) = what.split_once('/')?;
    let (role, _) = rest.split_once('/')?;
    Some((environment, role))
}

/// The environment, generation, repair number and node of a repair's job key,
/// `app:<env>/<role>/<i>:g<generation>:ensure#r<n>@<node>`.
pub fn repair_of(key: &str) -> Option<(&str, u64, u32, &str)> {
    let rest = key.strip_prefix("app:")?;
    let (environment, rest) = rest.split_once('/')?;
    let (rest, node) = rest.rsplit_once('@')?;
    let (rest, repair) = rest.rsplit_once(":ensure#r")?;
    let (_, generation) = rest.rsplit_once(":g")?;
    Some((environment, generation.parse().ok()?, repair.parse().ok()?, node))
}

#[cfg(test)]
mod tests {
    use super::JobState;

    #[test]
    fn an_ensure_key_names_its_role() {
        use super::ensured_role;
        assert_eq!(ensured_role("app:e-1/db/0:g3:ensure@n1"), Some(("e-1", "db")));
        assert_eq!(ensured_role("app:e-1/db/0:g3:ensure#r2@n1"), Some(("e-1", "db")));
        assert_eq!(ensured_role("app:e-1/db/0:g3:stop@n1"), None);
        assert_eq!(ensured_role("net:e-1:g3:ensure@n1"), None);
    }

    #[test]
    fn job_states_read_back_as_written_and_nothing_else_reads() {
        for s in JobState::ALL {
            assert_eq!(JobState::parse(s.as_str()), Some(s));
        }
        assert_eq!(JobState::parse("Queued"), None);
        let pending: Vec<_> = JobState::ALL.into_iter().filter(|s| s.pending()).collect();
        let broken: Vec<_> = JobState::ALL.into_iter().filter(|s| s.broken()).collect();
        assert_eq!(pending, [JobState::Queued, JobState::Leased]);
        assert_eq!(broken, [JobState::Failed, JobState::Dead]);
    }
}
