//! Inside an environment, only declared ports: traffic between two containers of the
//! environment (bridged, which the kernel's `br_netfilter` hands to the table's `forward`
//! chain) passes only to an address and port in the table's set `reachable` (each replica's
//! web `port` and declared `ports`, from its `dev.pushleft.ports` label), to an address in the
//! set `open` (containers made before the label existed: every port, as before), or as ICMP.
//!
//! The sets' elements change with the replicas, not with the environment's generation: the
//! agent rewrites them (flush and add, one transaction) whenever the replicas it runs change,
//! and an apply of the table carries the current ones, so replacing the table never empties
//! them. The read-back compares rules, not elements.

use super::{Firewall, ip, is, prefix, table_name};
use crate::outcome::{Failure, permanent};
use nftables::batch::Batch;
use nftables::expr::{Expression, NamedExpression, Payload, PayloadField};
use nftables::schema::{Element, FlushObject, NfCmd, NfListObject, Set, SetType, SetTypeValue};
use nftables::stmt::{Match, Operator, Statement};
use nftables::types::NfFamily;
use std::borrow::Cow;
use std::collections::BTreeSet;
use std::net::Ipv4Addr;

/// The set of (address, port) other containers may reach.
pub const REACHABLE: &str = "reachable";
/// The set of addresses reachable on every port (containers without a ports label).
pub const OPEN: &str = "open";
/// Where the kernel says whether bridged IPv4 passes through netfilter.
pub const BRIDGE_NF: &str = "/proc/sys/net/bridge/bridge-nf-call-iptables";

/// The set of the environment's subnets on other nodes, reached through the mesh (kept by
/// the mesh executor, `mesh/firewall.rs`).
pub const MESH: &str = "mesh";

/// Where traffic into the environment's subnet comes from.
#[derive(Clone, Copy, Debug)]
pub enum From {
    /// Its own subnet on this node.
    Subnet,
    /// Its subnets on other nodes (the set [`MESH`]).
    Mesh,
}

/// What the environment's containers may reach of each other.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reachable {
    pub ports: BTreeSet<(Ipv4Addr, u16)>,
    pub open: BTreeSet<Ipv4Addr>,
}

fn field(protocol: &'static str, name: &'static str) -> Expression<'static> {
    Expression::Named(NamedExpression::Payload(Payload::PayloadField(PayloadField {
        protocol: Cow::Borrowed(protocol),
        field: Cow::Borrowed(name),
    })))
}

pub fn in_set(left: Expression<'static>, set: &'static str) -> Statement<'static> {
    Statement::Match(Match {
        left,
        right: Expression::String(Cow::Owned(format!("@{set}"))),
        op: Operator::EQ,
    })
}

/// The `forward` rules for traffic into S from `from` (S itself, or the set of the
/// environment's subnets on other nodes), in order (replies are accepted by the rule before
/// these).
pub fn inside(addr: &str, len: u32, from: From) -> Vec<Vec<Statement<'static>>> {
    let s = || prefix(addr, len);
    let source = || match from {
        From::Subnet => is(ip("saddr"), s()),
        From::Mesh => in_set(ip("saddr"), MESH),
    };
    let both = || vec![source(), is(ip("daddr"), s())];
    let with = |mut v: Vec<Statement<'static>>, extra: Vec<Statement<'static>>| {
        v.extend(extra);
        v
    };
    vec![
        with(
            both(),
            vec![
                is(
                    Expression::Named(NamedExpression::Meta(nftables::expr::Meta {
                        key: nftables::expr::MetaKey::L4proto,
                    })),
                    Expression::String(Cow::Borrowed("icmp")),
                ),
                Statement::Accept(None),
            ],
        ),
        with(
            both(),
            vec![
                in_set(
                    Expression::Named(NamedExpression::Concat(vec![ip("daddr"), field("tcp", "dport")])),
                    REACHABLE,
                ),
                Statement::Accept(None),
            ],
        ),
        with(
            both(),
            vec![
                in_set(
                    Expression::Named(NamedExpression::Concat(vec![ip("daddr"), field("udp", "dport")])),
                    REACHABLE,
                ),
                Statement::Accept(None),
            ],
        ),
        with(both(), vec![in_set(ip("daddr"), OPEN), Statement::Accept(None)]),
        with(both(), vec![Statement::Drop(None)]),
    ]
}

fn port_elements(r: &Reachable) -> Vec<Expression<'static>> {
    r.ports
        .iter()
        .map(|(a, p)| {
            Expression::Named(NamedExpression::Concat(vec![
                Expression::String(Cow::Owned(a.to_string())),
                Expression::Number(u32::from(*p)),
            ]))
        })
        .collect()
}

fn open_elements(r: &Reachable) -> Vec<Expression<'static>> {
    r.open
        .iter()
        .map(|a| Expression::String(Cow::Owned(a.to_string())))
        .collect()
}

/// The mesh set's elements: subnets as prefixes.
pub fn mesh_elements(subnets: &[String]) -> Vec<Expression<'static>> {
    subnets
        .iter()
        .filter_map(|s| {
            let (a, l) = s.split_once('/')?;
            Some(prefix(a, l.parse().ok()?))
        })
        .collect()
}

/// The mesh's set with `subnets`, as an object of a batch that makes the table.
pub fn mesh_set(table: &str, subnets: &[String]) -> NfListObject<'static> {
    let elem = mesh_elements(subnets);
    NfListObject::Set(Box::new(Set {
        family: NfFamily::INet,
        table: Cow::Owned(table.to_owned()),
        name: Cow::Borrowed(MESH),
        handle: None,
        set_type: SetTypeValue::Single(SetType::Ipv4Addr),
        policy: None,
        flags: Some(std::collections::HashSet::from([nftables::schema::SetFlag::Interval])),
        elem: (!elem.is_empty()).then(|| Cow::Owned(elem)),
        timeout: None,
        gc_interval: None,
        size: None,
        comment: None,
    }))
}

/// The two sets, with `r`'s elements, as objects of a batch that makes the table.
pub fn sets(table: &str, r: &Reachable) -> [NfListObject<'static>; 2] {
    let set = |name: &'static str, set_type, elem: Vec<Expression<'static>>| {
        NfListObject::Set(Box::new(Set {
            family: NfFamily::INet,
            table: Cow::Owned(table.to_owned()),
            name: Cow::Borrowed(name),
            handle: None,
            set_type,
            policy: None,
            flags: None,
            elem: (!elem.is_empty()).then(|| Cow::Owned(elem)),
            timeout: None,
            gc_interval: None,
            size: None,
            comment: None,
        }))
    };
    [
        set(
            REACHABLE,
            SetTypeValue::Concatenated(Cow::Borrowed(&[SetType::Ipv4Addr, SetType::InetService])),
            port_elements(r),
        ),
        set(OPEN, SetTypeValue::Single(SetType::Ipv4Addr), open_elements(r)),
    ]
}

/// Refuses when bridged traffic would pass the table unseen (the rules above would then
/// enforce nothing): `br_netfilter` absent, or its IPv4 switch off and not ours to turn on.
pub fn bridged_traffic_filtered() -> Result<(), Failure> {
    match std::fs::read_to_string(BRIDGE_NF) {
        Ok(v) if v.trim() == "1" => Ok(()),
        Ok(_) => std::fs::write(BRIDGE_NF, "1\n").map_err(|e| {
            permanent(
                "bridge-filtering-off",
                format!("{BRIDGE_NF} is 0 and cannot be set ({e}): traffic between containers would pass unfiltered"),
            )
        }),
        Err(_) => Err(permanent(
            "bridge-filtering-off",
            format!("{BRIDGE_NF} is missing: load the br_netfilter module (Docker does when it starts)"),
        )),
    }
}

impl Firewall {
    /// Rewrites some of the environment's sets in one transaction: each emptied, then given
    /// its elements. A table that is not there yet, or not ours, is left alone (its apply
    /// carries the elements).
    fn rewrite_sets(
        &self,
        environment: &str,
        sets: Vec<(NfListObject<'static>, Vec<Expression<'static>>)>,
    ) -> Result<(), Failure> {
        let table = table_name(&self.control_plane, environment, &self.node);
        let Some(current) = self.read(&table)? else {
            return Ok(());
        };
        let (chains, _) = Firewall::chains_and_rules(&current);
        if !chains.iter().any(|c| c == super::MARKER) {
            return Ok(());
        }
        let mut batch = Batch::new();
        for (set, elem) in sets {
            let NfListObject::Set(s) = set else { continue };
            let name = s.name.clone();
            batch.add_cmd(NfCmd::Flush(FlushObject::Set(s)));
            if !elem.is_empty() {
                batch.add(NfListObject::Element(Element {
                    family: NfFamily::INet,
                    table: Cow::Owned(table.clone()),
                    name,
                    elem: Cow::Owned(elem),
                }));
            }
        }
        super::run(&self.nft, batch)
    }

    /// Rewrites the environment's mesh set to `subnets`.
    pub fn set_mesh(&self, environment: &str, subnets: &[String]) -> Result<(), Failure> {
        let table = table_name(&self.control_plane, environment, &self.node);
        self.rewrite_sets(environment, vec![(mesh_set(&table, &[]), mesh_elements(subnets))])
    }

    /// Rewrites the environment's reachable and open sets to `r`.
    pub fn set_reachable(&self, environment: &str, r: &Reachable) -> Result<(), Failure> {
        let table = table_name(&self.control_plane, environment, &self.node);
        let [reachable, open] = sets(&table, &Reachable::default());
        self.rewrite_sets(
            environment,
            vec![(reachable, port_elements(r)), (open, open_elements(r))],
        )
    }
}
