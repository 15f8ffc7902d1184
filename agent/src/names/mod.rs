//! Service names: inside an environment, each role is reachable by `<role>` and by
//! `<role>.<environment>.internal`, resolving to that role's replicas of its live generation
//! on this node. This module is the pure part: which replicas a name stands for, and the
//! answer to one DNS query; `names/server.rs` runs the servers.
//!
//! How a container asks: Docker's embedded resolver (127.0.0.11 in every container on a
//! user-defined network) answers container names itself and forwards every other name to the
//! servers of the container's `dns` setting. The agent sets that to the environment network's
//! gateway, where a server of its own answers for that environment alone: the environment is
//! known by the address the query reached, so another environment's names never resolve (its
//! containers ask their own gateway, and the firewall lets them reach no other).
//!
//! Why not Docker's network aliases: an alias is fixed when the container joins the network,
//! so a name would resolve to a replica before it is healthy and to both generations during a
//! rollout; the answer here changes the moment the agent has judged a replica healthy.
//!
//! What a name stands for: replicas (not runs) that are running and that this agent judged
//! healthy (its `ensure` succeeded; those found running when the agent starts count as
//! judged), of the role's newest generation among those. So during a rollout the name moves to
//! the new generation when its first replica is healthy here, and never to a replica still
//! starting.

pub mod server;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;

/// The suffix of fully qualified service names: `<role>.<environment>.internal` (`.internal`
/// is reserved for private use, so it never collides with a public name).
pub const DOMAIN: &str = "internal";
/// The port name servers listen on (the firewall opens it on each environment's gateway).
pub const PORT: u16 = 53;
/// How long an answer may be cached: replicas change with every rollout.
pub const TTL: u32 = 1;
/// Most addresses in one answer (a UDP answer stays far below 512 bytes).
pub const MAX_ANSWERS: usize = 16;
/// Largest query read.
pub const MAX_QUERY: usize = 4096;

/// A replica of ours the engine reports: what a name may stand for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replica {
    pub environment: String,
    pub role: String,
    pub generation: u64,
    pub container: String,
    pub address: Ipv4Addr,
}

/// One environment's names: each role with at least one replica to answer with, and its
/// addresses (sorted).
pub type EnvNames = BTreeMap<String, Vec<Ipv4Addr>>;

/// The names of every environment, from the running replicas and those judged healthy.
pub fn table(running: &[Replica], healthy: &HashSet<String>) -> HashMap<String, EnvNames> {
    let mut newest: HashMap<(&str, &str), u64> = HashMap::new();
    let judged: Vec<&Replica> = running.iter().filter(|r| healthy.contains(&r.container)).collect();
    for r in &judged {
        let g = newest.entry((&r.environment, &r.role)).or_insert(r.generation);
        *g = (*g).max(r.generation);
    }
    let mut out: HashMap<String, EnvNames> = HashMap::new();
    for r in judged {
        if newest.get(&(r.environment.as_str(), r.role.as_str())) == Some(&r.generation) {
            let addresses = out
                .entry(r.environment.clone())
                .or_default()
                .entry(r.role.clone())
                .or_default();
            addresses.push(r.address);
            addresses.sort();
        }
    }
    out
}

/// What a queried name is, for the server of `environment`.
#[derive(Debug, PartialEq, Eq)]
enum Asked<'a> {
    /// `<role>` or `<role>.<environment>.internal`.
    Role(&'a str),
    /// Another name under `.internal` (another environment's, or nothing): not found.
    Internal,
    /// A name of the world outside: not ours to answer.
    Elsewhere,
}

fn asked<'a>(name: &'a str, environment: &str) -> Asked<'a> {
    let name = name.strip_suffix('.').unwrap_or(name);
    let labels: Vec<&str> = name.split('.').collect();
    match labels.as_slice() {
        [role] if !role.is_empty() => Asked::Role(role),
        [role, env, d] if *env == environment && *d == DOMAIN => Asked::Role(role),
        [.., d] if *d == DOMAIN => Asked::Internal,
        _ => Asked::Elsewhere,
    }
}

/// What the server does with one packet.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// Send these bytes back.
    Answer(Vec<u8>),
    /// Not ours: pass the packet to the host's resolver and its reply back.
    Forward,
    /// Not a query (or not one we can read): say nothing.
    Drop,
}

/// The reply of `environment`'s server to one packet, given its names.
pub fn reply(packet: &[u8], environment: &str, names: Option<&EnvNames>) -> Reply {
    if packet.len() > MAX_QUERY {
        return Reply::Drop;
    }
    let Ok(query) = Message::from_vec(packet) else {
        return Reply::Drop;
    };
    if query.metadata.message_type != MessageType::Query || query.metadata.op_code != OpCode::Query {
        return Reply::Drop;
    }
    let [question] = query.queries.as_slice() else {
        return Reply::Drop;
    };
    let lower = question.name().to_lowercase().to_ascii();
    let mut response = Message::response(query.metadata.id, OpCode::Query);
    response.metadata.recursion_desired = query.metadata.recursion_desired;
    response.metadata.recursion_available = true;
    response.add_query(question.clone());
    match asked(&lower, environment) {
        Asked::Elsewhere => return Reply::Forward,
        Asked::Internal => {
            response.metadata.authoritative = true;
            response.metadata.response_code = ResponseCode::NXDomain;
        }
        Asked::Role(role) => {
            response.metadata.authoritative = true;
            match names.and_then(|n| n.get(role)) {
                None => response.metadata.response_code = ResponseCode::NXDomain,
                // Known: A records; any other type has none (IPv4 only).
                Some(addresses) if question.query_type() == RecordType::A => {
                    let name: Name = question.name().clone();
                    for a in addresses.iter().take(MAX_ANSWERS) {
                        response.add_answer(Record::from_rdata(name.clone(), TTL, RData::A(A(*a))));
                    }
                }
                Some(_) => {}
            }
        }
    }
    match response.to_vec() {
        Ok(bytes) => Reply::Answer(bytes),
        Err(_) => Reply::Drop,
    }
}

/// The gateway of an environment network's subnet (`a.b.c.0/24` → `a.b.c.1`), where its name
/// server listens: the network is made with that gateway.
pub fn gateway(subnet: &str) -> Option<Ipv4Addr> {
    let (addr, len) = subnet.split_once('/')?;
    let len: u32 = len.parse().ok().filter(|l| *l <= 30)?;
    let base = u32::from(addr.parse::<Ipv4Addr>().ok()?);
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    Some(Ipv4Addr::from((base & mask) + 1))
}

/// Whether `address` is inside `subnet` (`a.b.c.0/24`): a server answers only its own
/// environment's containers, whatever reaches its address.
pub fn within(subnet: &str, address: Ipv4Addr) -> bool {
    let Some((base, len)) = subnet
        .split_once('/')
        .and_then(|(a, l)| Some((a.parse::<Ipv4Addr>().ok()?, l.parse::<u32>().ok().filter(|l| *l <= 32)?)))
    else {
        return false;
    };
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    u32::from(base) & mask == u32::from(address) & mask
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;

    fn replica(env: &str, role: &str, g: u64, n: u8) -> Replica {
        Replica {
            environment: env.into(),
            role: role.into(),
            generation: g,
            container: format!("{env}-{role}-g{g}-{n}"),
            address: Ipv4Addr::new(10, 208, 0, n),
        }
    }

    fn ask(name: &str, t: RecordType) -> Vec<u8> {
        let mut m = Message::query();
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_ascii(name).expect("name"), t));
        m.to_vec().expect("bytes")
    }

    fn answered(reply: Reply) -> Message {
        match reply {
            Reply::Answer(b) => Message::from_vec(&b).expect("message"),
            other => panic!("not an answer: {other:?}"),
        }
    }

    #[test]
    fn a_name_is_the_newest_judged_generation_only() {
        let running = vec![
            replica("shop", "db", 1, 2),
            replica("shop", "web", 1, 3),
            replica("shop", "web", 1, 4),
            replica("shop", "web", 2, 5),
            replica("shop", "web", 2, 6),
            replica("blog", "db", 1, 7),
        ];
        // g2's second replica is still starting: the name is g2's first only.
        let judged: HashSet<String> = running
            .iter()
            .map(|r| r.container.clone())
            .filter(|c| !c.ends_with("g2-6"))
            .collect();
        let t = table(&running, &judged);
        assert_eq!(t["shop"]["web"], vec![Ipv4Addr::new(10, 208, 0, 5)]);
        assert_eq!(t["shop"]["db"], vec![Ipv4Addr::new(10, 208, 0, 2)]);
        assert_eq!(t["blog"].len(), 1);
        // Before g2 is judged at all, the name stays on g1.
        let g1: HashSet<String> = running
            .iter()
            .map(|r| r.container.clone())
            .filter(|c| !c.contains("-g2-"))
            .collect();
        assert_eq!(
            table(&running, &g1)["shop"]["web"],
            vec![Ipv4Addr::new(10, 208, 0, 3), Ipv4Addr::new(10, 208, 0, 4)]
        );
        assert!(table(&running, &HashSet::new()).is_empty());
    }

    #[test]
    fn queries_are_answered_for_their_environment_alone() {
        let names: EnvNames = [("db".to_owned(), vec![Ipv4Addr::new(10, 208, 0, 2)])].into();
        for name in ["db", "DB.", "db.shop.internal."] {
            let m = answered(reply(&ask(name, RecordType::A), "shop", Some(&names)));
            assert_eq!(m.metadata.response_code, ResponseCode::NoError, "{name}");
            assert!(m.metadata.authoritative);
            assert_eq!(m.answers.len(), 1, "{name}");
            assert_eq!(m.answers[0].data, RData::A(A(Ipv4Addr::new(10, 208, 0, 2))));
            assert_eq!(m.answers[0].ttl, TTL);
        }
        // Another environment's name, an unknown role, the same role asked of another
        // environment's server: not found.
        for (name, env) in [("db.blog.internal", "shop"), ("cache", "shop"), ("db", "blog")] {
            let names = (env == "shop").then_some(&names);
            let m = answered(reply(&ask(name, RecordType::A), env, names));
            assert_eq!(m.metadata.response_code, ResponseCode::NXDomain, "{name} at {env}");
            assert!(m.answers.is_empty());
        }
        // A known name has no IPv6 address.
        let m = answered(reply(&ask("db", RecordType::AAAA), "shop", Some(&names)));
        assert_eq!((m.metadata.response_code, m.answers.len()), (ResponseCode::NoError, 0));
        // The world's names go to the host's resolver; garbage gets nothing.
        assert_eq!(
            reply(&ask("example.com", RecordType::A), "shop", Some(&names)),
            Reply::Forward
        );
        assert_eq!(reply(b"\x00\x01garbage", "shop", Some(&names)), Reply::Drop);
        assert_eq!(reply(&vec![0; MAX_QUERY + 1], "shop", Some(&names)), Reply::Drop);
    }

    #[test]
    fn answers_are_bounded() {
        let many: Vec<Ipv4Addr> = (1..=40).map(|n| Ipv4Addr::new(10, 208, 0, n)).collect();
        let names: EnvNames = [("web".to_owned(), many)].into();
        let m = answered(reply(&ask("web", RecordType::A), "shop", Some(&names)));
        assert_eq!(m.answers.len(), MAX_ANSWERS);
    }

    #[test]
    fn the_gateway_is_the_subnets_first_address() {
        assert_eq!(gateway("10.208.3.0/24"), Some(Ipv4Addr::new(10, 208, 3, 1)));
        assert_eq!(gateway("10.208.3.77/24"), Some(Ipv4Addr::new(10, 208, 3, 1)));
        assert_eq!(gateway("10.208.3.0/31"), None);
        assert_eq!(gateway("nonsense"), None);
        assert!(within("10.208.3.0/24", Ipv4Addr::new(10, 208, 3, 9)));
        assert!(!within("10.208.3.0/24", Ipv4Addr::new(10, 208, 4, 9)));
        assert!(!within("garbage", Ipv4Addr::new(10, 208, 3, 9)));
    }
}
