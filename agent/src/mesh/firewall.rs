//! The mesh's side of the firewall. Three parts, all naming this control plane and node:
//!
//! - the mesh's own table, `inet pl_<control plane>__mesh_<node>` (replaced whole, in one
//!   batch, like an environment's): nothing of the host is reached through the mesh's
//!   interface (input dropped); what comes in through it goes only to this node's
//!   environments' subnets; what goes out through it comes from an environment's own bridge
//!   with a source address in that environment's subnet (a container cannot borrow another
//!   environment's source address to pass the other end's checks);
//!   A `postrouting` NAT chain (priority 99, before Docker's 100) maps what leaves through
//!   the mesh to its own source address: the connection is then NATed already, so Docker's
//!   `MASQUERADE` of the environment's subnet (which would take the address of an interface
//!   that has none, and hide which environment spoke) leaves it alone;
//! - each environment's set `mesh` (its subnets on other nodes), which its own table uses to
//!   let it reach them and to take from them only what it takes from itself (`firewall/mod.rs`);
//! - one rule in Docker's `DOCKER-USER` chain (`ip filter`, where Docker leaves the user's
//!   rules), `iifname <mesh> accept`, because Docker's `FORWARD` policy drops what enters a
//!   bridge from anywhere but a published port: the rules above decide, this only lets their
//!   answer through. It carries the comment `pushleft mesh <control plane> <node>` and is the
//!   only rule of that chain the agent ever touches. Without that chain (Docker without
//!   iptables, or iptables-legacy) nothing is added: nothing of Docker's is in the way either,
//!   or (legacy) the mesh cannot pass Docker's rules, which `docs/agent.md` states.

use super::Mesh;
use crate::firewall::{FILTER_CHAINS, Firewall, MARKER, add_chains, open_table, run};
use crate::outcome::{Failure, permanent, retryable};
use agent_proto::mesh::{MeshSpec, mesh_table};
use nftables::batch::Batch;
use nftables::expr::{Expression, Meta, MetaKey, NamedExpression, Payload, PayloadField, Prefix};
use nftables::schema::{NfCmd, NfListObject, Rule, Table};
use nftables::stmt::{Match, Operator, Statement};
use nftables::types::{NfChainType, NfFamily, NfHook};
use std::borrow::Cow;

/// Docker's chain for the user's rules, in `ip filter`.
pub const DOCKER_USER: &str = "DOCKER-USER";

pub struct MeshFirewall<'a> {
    pub mesh: &'a Mesh,
}

fn meta(key: MetaKey, value: String) -> Statement<'static> {
    Statement::Match(Match {
        left: Expression::Named(NamedExpression::Meta(Meta { key })),
        right: Expression::String(Cow::Owned(value)),
        op: Operator::EQ,
    })
}

fn addr(field: &'static str, op: Operator, right: Expression<'static>) -> Statement<'static> {
    Statement::Match(Match {
        left: Expression::Named(NamedExpression::Payload(Payload::PayloadField(PayloadField {
            protocol: Cow::Borrowed("ip"),
            field: Cow::Borrowed(field),
        }))),
        right,
        op,
    })
}

fn subnet(s: &str) -> Result<Expression<'static>, Failure> {
    let bad = || permanent("mesh-spec-invalid", format!("{s} is not an IPv4 CIDR"));
    let (a, l) = s.split_once('/').ok_or_else(bad)?;
    a.parse::<std::net::Ipv4Addr>().map_err(|_| bad())?;
    Ok(Expression::Named(NamedExpression::Prefix(Prefix {
        addr: Box::new(Expression::String(Cow::Owned(a.to_owned()))),
        len: l.parse().ok().filter(|l| *l <= 32).ok_or_else(bad)?,
    })))
}

/// The mesh table's rules, by chain, in order (see the module's comment).
pub fn rules(
    control_plane: &str,
    node: &str,
    iface: &str,
    spec: &MeshSpec,
) -> Result<Vec<(&'static str, Vec<Statement<'static>>)>, Failure> {
    let mut out = vec![(
        "input",
        vec![meta(MetaKey::Iifname, iface.to_owned()), Statement::Drop(None)],
    )];
    if !spec.environments.is_empty() {
        let local = spec
            .environments
            .iter()
            .map(|e| subnet(&e.subnet))
            .collect::<Result<Vec<_>, _>>()?;
        out.push((
            "forward",
            vec![
                meta(MetaKey::Iifname, iface.to_owned()),
                addr(
                    "daddr",
                    Operator::EQ,
                    Expression::Named(NamedExpression::Set(local.into_iter().map(set_item).collect())),
                ),
                Statement::Accept(None),
            ],
        ));
    }
    out.push((
        "forward",
        vec![meta(MetaKey::Iifname, iface.to_owned()), Statement::Drop(None)],
    ));
    for e in &spec.environments {
        let bridge = crate::routes::bridge_name(&agent_proto::host_object(control_plane, &e.environment, node));
        out.push((
            "forward",
            vec![
                meta(MetaKey::Iifname, bridge),
                meta(MetaKey::Oifname, iface.to_owned()),
                addr("saddr", Operator::EQ, subnet(&e.subnet)?),
                Statement::Accept(None),
            ],
        ));
    }
    out.push((
        "forward",
        vec![meta(MetaKey::Oifname, iface.to_owned()), Statement::Drop(None)],
    ));
    out.push((
        "postrouting",
        vec![
            meta(MetaKey::Oifname, iface.to_owned()),
            Statement::SNAT(Some(nftables::stmt::NAT {
                addr: Some(Expression::Named(NamedExpression::Payload(Payload::PayloadField(
                    PayloadField {
                        protocol: Cow::Borrowed("ip"),
                        field: Cow::Borrowed("saddr"),
                    },
                )))),
                family: Some(nftables::stmt::NATFamily::IP),
                port: None,
                flags: None,
            })),
        ],
    ));
    Ok(out)
}

fn set_item(e: Expression<'static>) -> nftables::expr::SetItem<'static> {
    nftables::expr::SetItem::Element(e)
}

impl MeshFirewall<'_> {
    fn firewall(&self) -> Firewall {
        Firewall {
            nft: self.mesh.nft.clone(),
            control_plane: self.mesh.control_plane.clone(),
            node: self.mesh.node.clone(),
            state_dir: self.mesh.state_dir.clone(),
        }
    }

    fn table(&self) -> String {
        mesh_table(&self.mesh.control_plane, &self.mesh.node)
    }

    /// The comment that marks our rule in Docker's chain.
    fn comment(&self) -> String {
        format!("pushleft mesh {} {}", self.mesh.control_plane, self.mesh.node)
    }

    /// `nft -j ARGS` as JSON; `None` when the object does not exist.
    fn list(&self, args: &[&str]) -> Result<Option<serde_json::Value>, Failure> {
        let o = std::process::Command::new(&self.mesh.nft)
            .arg("-j")
            .args(args)
            .output()
            .map_err(|e| retryable("nft-unavailable", e.to_string()))?;
        if !o.status.success() {
            let err = String::from_utf8_lossy(&o.stderr);
            if err.contains("No such file or directory") || err.contains("does not exist") {
                return Ok(None);
            }
            return Err(retryable("nft-unavailable", err.trim().to_owned()));
        }
        serde_json::from_slice(&o.stdout)
            .map(Some)
            .map_err(|e| retryable("nft-unavailable", e.to_string()))
    }

    /// Objects of kind `kind` in a listing.
    fn objects<'v>(listing: &'v serde_json::Value, kind: &str) -> Vec<&'v serde_json::Value> {
        listing["nftables"]
            .as_array()
            .map(|a| a.iter().filter_map(|o| o.get(kind)).collect())
            .unwrap_or_default()
    }

    /// The handles of our rules in Docker's chain; `None` when there is no such chain.
    fn docker_user_rules(&self) -> Result<Option<Vec<u64>>, Failure> {
        let Some(listing) = self.list(&["list", "chain", "ip", "filter", DOCKER_USER])? else {
            return Ok(None);
        };
        let ours = self.comment();
        Ok(Some(
            Self::objects(&listing, "rule")
                .into_iter()
                .filter(|r| r["comment"].as_str() == Some(ours.as_str()))
                .filter_map(|r| r["handle"].as_u64())
                .collect(),
        ))
    }

    fn docker_rule(&self, handle: Option<u32>) -> NfListObject<'static> {
        NfListObject::Rule(Rule {
            family: NfFamily::IP,
            table: Cow::Borrowed("filter"),
            chain: Cow::Borrowed(DOCKER_USER),
            // A delete names the rule by its handle alone.
            expr: Cow::Owned(match handle {
                Some(_) => Vec::new(),
                None => vec![meta(MetaKey::Iifname, self.mesh.interface()), Statement::Accept(None)],
            }),
            handle,
            comment: Some(Cow::Owned(self.comment())),
            ..Rule::default()
        })
    }

    /// Whether a table of that name exists and is not ours.
    fn foreign(&self, table: &str) -> Result<bool, Failure> {
        Ok(match self.list(&["list", "table", "inet", table])? {
            None => false,
            Some(l) => !Self::objects(&l, "chain")
                .iter()
                .any(|c| c["name"].as_str() == Some(MARKER)),
        })
    }

    /// Whether the mesh's table is there and ours.
    pub fn present(&self) -> bool {
        matches!(self.list(&["list", "table", "inet", &self.table()]), Ok(Some(l))
            if Self::objects(&l, "chain").iter().any(|c| c["name"].as_str() == Some(MARKER)))
    }

    /// Applies the three parts for `spec`, and empties the mesh set of each environment the
    /// previous spec had and this one has not.
    pub fn apply(&self, spec: &MeshSpec, previous: Option<&MeshSpec>) -> Result<(), Failure> {
        let table = self.table();
        if self.foreign(&table)? {
            return Err(permanent(
                "foreign-table",
                format!("an nftables table inet {table} exists and is not Pushleft's: left untouched"),
            ));
        }
        let iface = self.mesh.interface();
        let wanted = rules(&self.mesh.control_plane, &self.mesh.node, &iface, spec)?;
        let mut batch = Batch::new();
        open_table(&mut batch, &table);
        add_chains(
            &mut batch,
            &table,
            &[
                FILTER_CHAINS[0],
                FILTER_CHAINS[1],
                ("postrouting", NfHook::Postrouting, NfChainType::NAT, 99),
            ],
            &wanted,
        );
        if let Some(ours) = self.docker_user_rules()?
            && ours.is_empty()
        {
            batch.add_cmd(NfCmd::Insert(self.docker_rule(None)));
        }
        run(&self.mesh.nft, batch)?;
        let fw = self.firewall();
        for e in &spec.environments {
            fw.set_mesh(&e.environment, &e.remote)?;
        }
        for gone in previous
            .iter()
            .flat_map(|p| &p.environments)
            .filter(|g| !spec.environments.iter().any(|e| e.environment == g.environment))
        {
            fw.set_mesh(&gone.environment, &[])?;
        }
        Ok(())
    }

    /// Removes the mesh's table and our rule in Docker's chain, and empties the mesh set of
    /// each environment `applied` had; gone is done.
    pub fn remove(&self, applied: Option<&MeshSpec>) -> Result<(), Failure> {
        let table = self.table();
        if self.foreign(&table)? {
            return Err(permanent(
                "foreign-table",
                format!("an nftables table inet {table} exists and is not Pushleft's: left untouched"),
            ));
        }
        let mut batch = Batch::new();
        let mut any = false;
        if self.list(&["list", "table", "inet", &table])?.is_some() {
            batch.delete(NfListObject::Table(Table {
                family: NfFamily::INet,
                name: Cow::Owned(table),
                ..Table::default()
            }));
            any = true;
        }
        for h in self.docker_user_rules()?.unwrap_or_default() {
            batch.delete(self.docker_rule(u32::try_from(h).ok()));
            any = true;
        }
        if any {
            run(&self.mesh.nft, batch)?;
        }
        let fw = self.firewall();
        for e in applied.iter().flat_map(|p| &p.environments) {
            fw.set_mesh(&e.environment, &[])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_proto::mesh::MeshEnvironment;

    #[test]
    fn the_mesh_takes_in_only_to_local_environments_and_lets_out_only_their_own_sources() {
        let spec = MeshSpec {
            environments: vec![MeshEnvironment {
                environment: "api".into(),
                subnet: "10.208.1.0/24".into(),
                remote: vec!["10.208.2.0/24".into()],
                names: Vec::new(),
            }],
            ..MeshSpec::default()
        };
        let r = rules("0123abcd", "n1", "plwx", &spec).expect("rules");
        let text: Vec<(&str, String)> = r
            .iter()
            .map(|(c, e)| (*c, serde_json::to_string(e).expect("json")))
            .collect();
        // Nothing of the host through the mesh.
        assert_eq!(text[0].0, "input");
        assert!(
            text[0].1.contains("plwx") && text[0].1.contains("drop"),
            "{}",
            text[0].1
        );
        // In: to this node's environments only, then nothing else.
        let forward: Vec<&String> = text.iter().filter(|(c, _)| *c == "forward").map(|(_, t)| t).collect();
        assert!(forward[0].contains("10.208.1.0") && forward[0].contains("accept"));
        assert!(forward[1].contains("iifname") && forward[1].contains("drop"));
        // Out: from the environment's own bridge with its own source, then nothing else.
        let bridge = crate::routes::bridge_name(&agent_proto::host_object("0123abcd", "api", "n1"));
        assert!(
            forward[2].contains(&bridge) && forward[2].contains("saddr") && forward[2].contains("10.208.1.0"),
            "{}",
            forward[2]
        );
        assert!(forward[3].contains("oifname") && forward[3].contains("drop"));
        assert_eq!(forward.len(), 4);
        // What leaves keeps its source (Docker's masquerade passes it by).
        let nat = &text.iter().find(|(c, _)| *c == "postrouting").expect("nat").1;
        assert!(nat.contains("snat") && nat.contains("saddr"), "{nat}");
        let bad = MeshSpec {
            environments: vec![MeshEnvironment {
                environment: "api".into(),
                subnet: "10.208.1.0".into(),
                remote: vec![],
                names: Vec::new(),
            }],
            ..MeshSpec::default()
        };
        assert_eq!(
            rules("0123abcd", "n1", "plwx", &bad).expect_err("bad").code,
            "mesh-spec-invalid"
        );
    }
}
