//! The firewall executor (the `nftables` crate, through the `nft` program): one `inet` table
//! per environment, `pl_<environment>_<node>` (several nodes may share a machine), replaced
//! whole in one atomic batch, read back and compared in normalised form, with a generation
//! fence on disk so a stale retry never puts older rules back.
//!
//! What the table says, for the environment's subnet S (its Docker network on this node):
//! - inside S: ICMP, and to each replica only its web `port` and declared `ports`
//!   (`firewall/reach.rs`: sets the agent keeps up to date; the kernel's `br_netfilter` shows
//!   bridged traffic to this table, and an apply is refused when it is off);
//! - from S to the host: denied (replies to what the host opened excepted, and port 53 of S's
//!   gateway, UDP and TCP, where the agent answers the environment's service names);
//! - from S to another environment, to link-local (169.254.0.0/16, the metadata address) and
//!   to private ranges (10/8, 172.16/12, 192.168/16, 100.64/10, 127/8): denied;
//! - from S anywhere else (public egress): allowed;
//! - into S from anywhere but the host itself (the ingress proxy runs there): denied.
//!
//! Its base chains run at priority -10, before Docker's own filter rules: a drop here is final,
//! an accept leaves the packet to Docker's rules as before.

mod reach;
pub use reach::{BRIDGE_NF, MESH, OPEN, REACHABLE, Reachable};

use crate::outcome::{Failure, permanent, retryable};
use nftables::batch::Batch;
use nftables::expr::{CT, Expression, NamedExpression, Payload, PayloadField, Prefix};
use nftables::schema::{Chain, NfListObject, NfObject, Nftables, Rule, Table};
use nftables::stmt::{Match, Operator, Statement};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};
use std::borrow::Cow;
use std::path::{Path, PathBuf};

/// The chain whose presence marks a table as Pushleft's.
pub const MARKER: &str = "owned-by-pushleft";
/// Ranges an environment may not reach: link-local first (the metadata address), then private.
pub const DENIED: [(&str, u32); 6] = [
    ("169.254.0.0", 16),
    ("10.0.0.0", 8),
    ("172.16.0.0", 12),
    ("192.168.0.0", 16),
    ("100.64.0.0", 10),
    ("127.0.0.0", 8),
];

/// Runs `nft` (a path, or a wrapper that enters a network namespace) with a fence folder.
pub struct Firewall {
    pub nft: PathBuf,
    /// The control plane's id: part of every table's name.
    pub control_plane: String,
    /// This node's name: part of every table's name.
    pub node: String,
    /// Where each environment's generation fence lives.
    pub state_dir: PathBuf,
}

/// The environment's table on `node` of `control_plane`: named like its Docker network.
pub fn table_name(control_plane: &str, environment: &str, node: &str) -> String {
    agent_proto::host_object(control_plane, environment, node)
}

fn ip(field: &'static str) -> Expression<'static> {
    Expression::Named(NamedExpression::Payload(Payload::PayloadField(PayloadField {
        protocol: Cow::Borrowed("ip"),
        field: Cow::Borrowed(field),
    })))
}

fn prefix(addr: &str, len: u32) -> Expression<'static> {
    Expression::Named(NamedExpression::Prefix(Prefix {
        addr: Box::new(Expression::String(Cow::Owned(addr.to_owned()))),
        len,
    }))
}

fn is(left: Expression<'static>, right: Expression<'static>) -> Statement<'static> {
    Statement::Match(Match {
        left,
        right,
        op: Operator::EQ,
    })
}

fn established() -> Statement<'static> {
    Statement::Match(Match {
        left: Expression::Named(NamedExpression::CT(CT {
            key: Cow::Borrowed("state"),
            family: None,
            dir: None,
        })),
        right: Expression::List(vec![
            Expression::String(Cow::Borrowed("established")),
            Expression::String(Cow::Borrowed("related")),
        ]),
        op: Operator::IN,
    })
}

/// The subnet as (address, length).
fn parse_subnet(subnet: &str) -> Result<(String, u32), Failure> {
    let (addr, len) = subnet
        .split_once('/')
        .ok_or_else(|| permanent("subnet-invalid", format!("{subnet} is not a CIDR")))?;
    let len: u32 = len
        .parse()
        .ok()
        .filter(|l| *l <= 32)
        .ok_or_else(|| permanent("subnet-invalid", format!("{subnet} is not a CIDR")))?;
    addr.parse::<std::net::Ipv4Addr>()
        .map_err(|_| permanent("subnet-invalid", format!("{subnet} is not an IPv4 CIDR")))?;
    Ok((addr.to_owned(), len))
}

/// The rules of an environment's table, by chain, in order.
pub fn rules(subnet: &str) -> Result<Vec<(&'static str, Vec<Statement<'static>>)>, Failure> {
    let (addr, len) = parse_subnet(subnet)?;
    let s = || prefix(&addr, len);
    let mut out = vec![(
        "forward",
        vec![is(ip("daddr"), s()), established(), Statement::Accept(None)],
    )];
    // Inside S, and into S from its subnets on other nodes (the mesh): ICMP, and only the
    // declared ports of the addresses in the sets.
    out.extend(
        reach::inside(&addr, len, reach::From::Subnet)
            .into_iter()
            .map(|r| ("forward", r)),
    );
    out.extend(
        reach::inside(&addr, len, reach::From::Mesh)
            .into_iter()
            .map(|r| ("forward", r)),
    );
    // From S to its subnets on other nodes: their own tables say what they take.
    out.push((
        "forward",
        vec![
            is(ip("saddr"), s()),
            reach::in_set(ip("daddr"), MESH),
            Statement::Accept(None),
        ],
    ));
    for (a, l) in DENIED {
        out.push((
            "forward",
            vec![
                is(ip("saddr"), s()),
                is(ip("daddr"), prefix(a, l)),
                Statement::Drop(None),
            ],
        ));
    }
    out.push(("forward", vec![is(ip("saddr"), s()), Statement::Accept(None)]));
    out.push(("forward", vec![is(ip("daddr"), s()), Statement::Drop(None)]));
    out.push((
        "input",
        vec![is(ip("saddr"), s()), established(), Statement::Accept(None)],
    ));
    // Service names: the environment's containers ask the agent's name server on their own
    // gateway (`names/mod.rs`), over UDP or TCP; nothing else of the host.
    if let Some(gateway) = crate::names::gateway(subnet) {
        for protocol in ["udp", "tcp"] {
            out.push((
                "input",
                vec![
                    is(ip("saddr"), s()),
                    is(ip("daddr"), Expression::String(Cow::Owned(gateway.to_string()))),
                    is(
                        Expression::Named(NamedExpression::Payload(Payload::PayloadField(PayloadField {
                            protocol: Cow::Borrowed(protocol),
                            field: Cow::Borrowed("dport"),
                        }))),
                        Expression::Number(u32::from(crate::names::PORT)),
                    ),
                    Statement::Accept(None),
                ],
            ));
        }
    }
    out.push(("input", vec![is(ip("saddr"), s()), Statement::Drop(None)]));
    Ok(out)
}

/// A table's base chains: (name, hook, type, priority).
pub type BaseChain = (&'static str, NfHook, NfChainType, i32);

/// An environment's base chains: filters at priority -10, before Docker's.
pub const FILTER_CHAINS: [BaseChain; 2] = [
    ("forward", NfHook::Forward, NfChainType::Filter, -10),
    ("input", NfHook::Input, NfChainType::Filter, -10),
];

/// Starts replacing `table` whole: added, deleted and added again in one transaction (so it
/// is replaced whether it existed or not, and no packet ever sees half of it), with the marker
/// chain that makes it ours.
pub fn open_table(batch: &mut Batch<'static>, table: &str) {
    let t = Table {
        family: NfFamily::INet,
        name: Cow::Owned(table.to_owned()),
        ..Table::default()
    };
    batch.add(NfListObject::Table(t.clone()));
    batch.delete(NfListObject::Table(t.clone()));
    batch.add(NfListObject::Table(t));
    batch.add(NfListObject::Chain(Chain {
        family: NfFamily::INet,
        table: Cow::Owned(table.to_owned()),
        name: Cow::Borrowed(MARKER),
        ..Chain::default()
    }));
}

/// Adds `table`'s base chains (accepting by default) and its rules, by chain, in order.
pub fn add_chains(
    batch: &mut Batch<'static>,
    table: &str,
    chains: &[BaseChain],
    rules: &[(&'static str, Vec<Statement<'static>>)],
) {
    for (name, hook, kind, prio) in chains {
        batch.add(NfListObject::Chain(Chain {
            family: NfFamily::INet,
            table: Cow::Owned(table.to_owned()),
            name: Cow::Borrowed(name),
            _type: Some(*kind),
            hook: Some(*hook),
            prio: Some(*prio),
            policy: Some(NfChainPolicy::Accept),
            ..Chain::default()
        }));
    }
    for (chain, expr) in rules {
        batch.add(NfListObject::Rule(Rule {
            family: NfFamily::INet,
            table: Cow::Owned(table.to_owned()),
            chain: Cow::Borrowed(chain),
            expr: Cow::Owned(expr.clone()),
            ..Rule::default()
        }));
    }
}

/// Runs a batch through `nft`, in one transaction.
pub fn run(nft: &Path, batch: Batch<'static>) -> Result<(), Failure> {
    nftables::helper::apply_ruleset_with_args(&batch.to_nftables(), Some(nft), nftables::helper::DEFAULT_ARGS)
        .map_err(|e| nft_error("nft-apply-failed", e))
}

fn nft_error(code: &'static str, e: nftables::helper::NftablesError) -> Failure {
    match &e {
        nftables::helper::NftablesError::NftFailed { stderr, .. } => retryable(code, stderr.trim().to_owned()),
        _ => retryable(code, e.to_string()),
    }
}

impl Firewall {
    fn fence(&self, environment: &str) -> PathBuf {
        self.state_dir
            .join("firewall")
            .join(format!("{environment}.generation"))
    }

    /// The fence: the newest generation applied or removed, and the subnet while the table
    /// should exist (`<generation> <subnet>`; a removed one holds the generation alone).
    fn fenced(&self, environment: &str) -> (u64, Option<String>) {
        let text = std::fs::read_to_string(self.fence(environment)).unwrap_or_default();
        let mut parts = text.split_whitespace();
        let g = parts.next().and_then(|g| g.parse().ok()).unwrap_or(0);
        (g, parts.next().map(str::to_owned))
    }

    fn fenced_at(&self, environment: &str) -> u64 {
        self.fenced(environment).0
    }

    /// Records `generation` as the newest applied (with its subnet) or removed, atomically (a
    /// new file renamed over).
    fn set_fence(&self, environment: &str, generation: u64, subnet: Option<&str>) -> Result<(), Failure> {
        let path = self.fence(environment);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| retryable("fence-write-failed", e.to_string()))?;
        }
        let tmp = path.with_extension("new");
        let text = match subnet {
            Some(s) => format!("{generation} {s}"),
            None => generation.to_string(),
        };
        std::fs::write(&tmp, text).map_err(|e| retryable("fence-write-failed", e.to_string()))?;
        std::fs::rename(&tmp, &path).map_err(|e| retryable("fence-write-failed", e.to_string()))
    }

    /// Drift: every table the fences say should exist is read back; one that differs (a rule
    /// deleted by hand) is applied again at its generation. Returns (environment, what).
    pub fn repair(&self, reach: &std::collections::HashMap<String, Reachable>) -> Vec<(String, String)> {
        let Ok(dir) = std::fs::read_dir(self.state_dir.join("firewall")) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(env) = name.strip_suffix(".generation") else {
                continue;
            };
            let (generation, Some(subnet)) = self.fenced(env) else {
                continue;
            };
            if self.matches(env, &subnet).unwrap_or(true) {
                continue;
            }
            let r = reach.get(env).cloned().unwrap_or_default();
            match self.apply(env, &subnet, generation, &r) {
                Ok(_) => out.push((
                    env.to_owned(),
                    format!(
                        "firewall table {} re-applied",
                        table_name(&self.control_plane, env, &self.node)
                    ),
                )),
                Err(f) => tracing::warn!(environment = %env, code = f.code, "cannot repair the firewall table"),
            }
        }
        out
    }

    /// The table as the kernel holds it, or `None` when there is none.
    fn read(&self, table: &str) -> Result<Option<Nftables<'static>>, Failure> {
        match nftables::helper::get_current_ruleset_with_args(Some(&self.nft), ["list", "table", "inet", table]) {
            Ok(r) => Ok(Some(r)),
            Err(nftables::helper::NftablesError::NftFailed { stderr, .. })
                if stderr.contains("No such file or directory") || stderr.contains("does not exist") =>
            {
                Ok(None)
            }
            Err(e) => Err(nft_error("nft-unavailable", e)),
        }
    }

    fn chains_and_rules(current: &Nftables<'static>) -> (Vec<String>, Vec<(String, serde_json::Value)>) {
        let mut chains = Vec::new();
        let mut rules = Vec::new();
        for o in current.objects.iter() {
            match o {
                NfObject::ListObject(NfListObject::Chain(c)) => chains.push(c.name.to_string()),
                NfObject::ListObject(NfListObject::Rule(r)) => {
                    rules.push((r.chain.to_string(), serde_json::to_value(&r.expr).unwrap_or_default()));
                }
                _ => {}
            }
        }
        (chains, rules)
    }

    /// Applies the environment's table for `generation` (see the module's rules), its sets
    /// holding `reachable`.
    pub fn apply(
        &self,
        environment: &str,
        subnet: &str,
        generation: u64,
        reachable: &Reachable,
    ) -> Result<String, Failure> {
        reach::bridged_traffic_filtered()?;
        let fenced = self.fenced_at(environment);
        if fenced > generation {
            return Err(permanent(
                "stale-generation",
                format!("generation {fenced} of the firewall is applied already; {generation} is older"),
            ));
        }
        let table = table_name(&self.control_plane, environment, &self.node);
        if let Some(current) = self.read(&table)? {
            let (chains, _) = Firewall::chains_and_rules(&current);
            if !chains.iter().any(|c| c == MARKER) {
                return Err(permanent(
                    "foreign-table",
                    format!("an nftables table inet {table} exists and is not Pushleft's: left untouched"),
                ));
            }
        }
        let wanted = rules(subnet)?;
        let mut batch = Batch::new();
        open_table(&mut batch, &table);
        for set in reach::sets(&table, reachable) {
            batch.add(set);
        }
        batch.add(reach::mesh_set(
            &table,
            &crate::mesh::remote_subnets(&self.state_dir, environment),
        ));
        add_chains(&mut batch, &table, &FILTER_CHAINS, &wanted);
        run(&self.nft, batch)?;
        self.verify(&table, &wanted)?;
        self.set_fence(environment, generation, Some(subnet))?;
        Ok(format!(
            "{table} applied for generation {generation}, {} rules read back",
            wanted.len()
        ))
    }

    /// Reads the table back and compares it, in normalised form (chains, then each rule's
    /// statements as JSON, handles left out), with what was meant.
    pub fn verify(&self, table: &str, wanted: &[(&'static str, Vec<Statement<'static>>)]) -> Result<(), Failure> {
        let current = self.read(table)?.ok_or_else(|| {
            permanent(
                "firewall-readback-mismatch",
                format!("{table} is not there after applying it"),
            )
        })?;
        let (mut chains, got) = Firewall::chains_and_rules(&current);
        chains.sort();
        let mut expected_chains = vec!["forward".to_owned(), "input".to_owned(), MARKER.to_owned()];
        expected_chains.sort();
        let expected: Vec<(String, serde_json::Value)> = wanted
            .iter()
            .map(|(c, e)| ((*c).to_owned(), serde_json::to_value(e).unwrap_or_default()))
            .collect();
        if chains != expected_chains || got != expected {
            return Err(permanent(
                "firewall-readback-mismatch",
                format!("{table} reads back otherwise: chains {chains:?}, {} rules", got.len()),
            ));
        }
        Ok(())
    }

    /// Whether the environment's table is what `subnet` says (drift: a rule deleted by hand).
    pub fn matches(&self, environment: &str, subnet: &str) -> Result<bool, Failure> {
        let wanted = rules(subnet)?;
        Ok(self
            .verify(&table_name(&self.control_plane, environment, &self.node), &wanted)
            .is_ok())
    }

    /// Removes the environment's table if it is ours (gone already is done), and fences
    /// `generation` so no older apply can bring it back.
    pub fn remove(&self, environment: &str, generation: u64) -> Result<String, Failure> {
        let table = table_name(&self.control_plane, environment, &self.node);
        let note = match self.read(&table)? {
            None => format!("{table} already gone"),
            Some(current) => {
                let (chains, _) = Firewall::chains_and_rules(&current);
                if !chains.iter().any(|c| c == MARKER) {
                    return Err(permanent(
                        "foreign-table",
                        format!("an nftables table inet {table} exists and is not Pushleft's: left untouched"),
                    ));
                }
                let mut batch = Batch::new();
                batch.delete(NfListObject::Table(Table {
                    family: NfFamily::INet,
                    name: Cow::Owned(table.clone()),
                    ..Table::default()
                }));
                run(&self.nft, batch)?;
                format!("{table} removed")
            }
        };
        self.set_fence(environment, generation.max(self.fenced_at(environment)), None)?;
        Ok(note)
    }
}

/// The `nft` of this host, or of the network namespace a wrapper enters.
pub fn default_nft() -> PathBuf {
    Path::new("nft").to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_deny_metadata_and_private_ranges_before_public_egress() {
        let r = rules("10.208.3.0/24").expect("rules");
        let json = serde_json::to_string(&r.iter().map(|(c, e)| (c, e)).collect::<Vec<_>>()).expect("json");
        let metadata = json.find("169.254.0.0").expect("metadata");
        let egress = json.rfind("\"accept\"").expect("accept");
        assert!(metadata < egress);
        assert_eq!(r.iter().filter(|(c, _)| *c == "input").count(), 4);
        // The host is reached only at the gateway, on the service names' port (UDP and TCP).
        let input = serde_json::to_string(&r.iter().filter(|(c, _)| *c == "input").collect::<Vec<_>>()).expect("json");
        assert!(
            input.contains("\"10.208.3.1\"") && input.contains("\"dport\"") && input.contains("53"),
            "{input}"
        );
        assert_eq!(rules("10.208.3.0").expect_err("no length").code, "subnet-invalid");
        assert_eq!(rules("fe80::/64").expect_err("v6").code, "subnet-invalid");
    }
}
