//! The routes executor (rtnetlink): each environment gets a routing table and a rule priority
//! of its own on the node, both derived from its subnet's index in the pool (table and
//! priority `10000 + index`). The rule sends what comes from the environment's subnet to its
//! table, and the table holds only the subnet (on the environment's bridge) and the main
//! table's default route: traffic from the environment can reach its own subnet and the
//! default gateway, and no other network the host has routes to (a VPN, a management LAN).
//!
//! It reads the main table (for its default route) and never writes the main, local or
//! default tables; it writes only routes with its own protocol number in its own table, and
//! only the rule at its own priority; a rule at that priority that is not ours, or a route of
//! another protocol in our table, is refused and left alone. What it wrote is read back and
//! compared.

use crate::outcome::{Failure, permanent, retryable};
use futures_util::TryStreamExt;
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope};
use rtnetlink::packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use rtnetlink::{Handle, IpVersion, RouteMessageBuilder};
use std::net::{IpAddr, Ipv4Addr};

/// The protocol number on every route the agent writes (`ip route … proto 122`).
pub const PROTOCOL: u8 = 122;
/// Tables and priorities are `BASE + the subnet's index`.
pub const BASE: u32 = 10_000;

/// The Linux bridge of an environment's Docker network: named by the agent (`pl-` and ten hex
/// digits of the network name's SHA-256, to fit the kernel's 15 bytes), so routes can name it
/// without asking Docker.
pub fn bridge_name(network: &str) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(network.as_bytes());
    let hex = hex::encode(&d[..5]);
    format!("pl-{hex}")
}

/// An environment's routes through the mesh: the mesh's interface and the environment's
/// subnets on other nodes (`None`: none).
pub type Mesh<'a> = Option<(&'a str, &'a [String])>;

/// The subnet's address, length and index in the pool (`10.208.0.0/12` in /24s).
fn parse(subnet: &str) -> Result<(Ipv4Addr, u8, u32), Failure> {
    let bad = || permanent("subnet-invalid", format!("{subnet} is not a /24 of 10.208.0.0/12"));
    let (addr, len) = subnet.split_once('/').ok_or_else(bad)?;
    let addr: Ipv4Addr = addr.parse().map_err(|_| bad())?;
    let len: u8 = len.parse().map_err(|_| bad())?;
    let o = addr.octets();
    if len != 24 || o[0] != 10 || !(208..224).contains(&o[1]) || o[3] != 0 {
        return Err(bad());
    }
    Ok((addr, len, u32::from(o[1] - 208) * 256 + u32::from(o[2])))
}

fn netlink(code: &'static str, e: rtnetlink::Error) -> Failure {
    retryable(code, e.to_string())
}

fn table_of(r: &RouteMessage) -> u32 {
    r.attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(r.header.table))
}

/// A route as compared: (destination/len, gateway, output interface, protocol).
type Seen = (String, Option<Ipv4Addr>, Option<u32>, RouteProtocol);

fn seen(r: &RouteMessage) -> Seen {
    let mut dst = Ipv4Addr::UNSPECIFIED;
    let (mut gw, mut oif) = (None, None);
    for a in &r.attributes {
        match a {
            RouteAttribute::Destination(RouteAddress::Inet(d)) => dst = *d,
            RouteAttribute::Gateway(RouteAddress::Inet(g)) => gw = Some(*g),
            RouteAttribute::Oif(i) => oif = Some(*i),
            _ => {}
        }
    }
    (
        format!("{dst}/{}", r.header.destination_prefix_length),
        gw,
        oif,
        r.header.protocol,
    )
}

fn rule_of(r: &RuleMessage) -> (Option<u32>, Option<IpAddr>, u8, u32, bool) {
    let (mut prio, mut src) = (None, None);
    let mut table = u32::from(r.header.table);
    for a in &r.attributes {
        match a {
            RuleAttribute::Priority(p) => prio = Some(*p),
            RuleAttribute::Source(s) => src = Some(*s),
            RuleAttribute::Table(t) => table = *t,
            _ => {}
        }
    }
    (
        prio,
        src,
        r.header.src_len,
        table,
        r.header.action == RuleAction::ToTable,
    )
}

/// Routes for environments, over one netlink connection (made in the caller's network
/// namespace).
pub struct Routes {
    handle: Handle,
}

impl Routes {
    /// Opens a netlink connection in the current thread's network namespace; its driver runs on
    /// the current tokio runtime.
    pub fn connect() -> Result<Routes, Failure> {
        let (connection, handle, _) =
            rtnetlink::new_connection().map_err(|e| retryable("netlink-unavailable", e.to_string()))?;
        tokio::spawn(connection);
        Ok(Routes { handle })
    }

    async fn routes_in(&self, table: u32) -> Result<Vec<RouteMessage>, Failure> {
        let all: Vec<RouteMessage> = self
            .handle
            .route()
            .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
            .execute()
            .try_collect()
            .await
            .map_err(|e| netlink("netlink-read-failed", e))?;
        Ok(all.into_iter().filter(|r| table_of(r) == table).collect())
    }

    async fn rules(&self) -> Result<Vec<RuleMessage>, Failure> {
        self.handle
            .rule()
            .get(IpVersion::V4)
            .execute()
            .try_collect()
            .await
            .map_err(|e| netlink("netlink-read-failed", e))
    }

    /// The netlink handle, for the mesh's link.
    pub(crate) fn handle(&self) -> &Handle {
        &self.handle
    }

    /// The index of the link named `name`, if there is one.
    pub(crate) async fn link_index(&self, name: &str) -> Result<Option<u32>, Failure> {
        let mut links = self.handle.link().get().match_name(name.to_owned()).execute();
        match links.try_next().await {
            Ok(Some(l)) => Ok(Some(l.header.index)),
            Ok(None) => Ok(None),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -19 => Ok(None),
            Err(e) => Err(netlink("netlink-read-failed", e)),
        }
    }

    /// What the environment's table should hold: its subnet on its bridge, its subnets on
    /// other nodes through the mesh's interface (`mesh`: the interface and those subnets),
    /// and the main table's default route.
    async fn wanted(&self, bridge: u32, addr: Ipv4Addr, len: u8, mesh: Mesh<'_>) -> Result<Vec<Seen>, Failure> {
        let mut out = vec![(
            format!("{addr}/{len}"),
            None,
            Some(bridge),
            RouteProtocol::Other(PROTOCOL),
        )];
        if let Some((iface, remote)) = mesh.filter(|(_, r)| !r.is_empty()) {
            let index = self.link_index(iface).await?.ok_or_else(|| {
                retryable(
                    "mesh-interface-missing",
                    format!("{iface} (the mesh) is not there: its routes wait for it"),
                )
            })?;
            for r in remote {
                let (a, l, _) = parse(r)?;
                out.push((format!("{a}/{l}"), None, Some(index), RouteProtocol::Other(PROTOCOL)));
            }
        }
        let main = self.routes_in(254).await?;
        if let Some(default) = main.iter().map(seen).find(|s| s.0 == "0.0.0.0/0" && s.1.is_some()) {
            out.push(("0.0.0.0/0".into(), default.1, default.2, RouteProtocol::Other(PROTOCOL)));
        }
        Ok(out)
    }

    /// Ensures the table and rule of the environment whose Docker network is `network` (see
    /// the module's rules), with its routes through the mesh.
    pub async fn ensure(&self, network: &str, subnet: &str, mesh: Mesh<'_>) -> Result<String, Failure> {
        let (addr, len, index) = parse(subnet)?;
        let (table, priority) = (BASE + index, BASE + index);
        let bridge_name = bridge_name(network);
        let bridge = self.link_index(&bridge_name).await?.ok_or_else(|| {
            retryable(
                "bridge-missing",
                format!("{bridge_name} (the environment's network) is not there yet"),
            )
        })?;
        // Refuse before writing anything.
        for r in self.rules().await? {
            let (p, src, src_len, t, _) = rule_of(&r);
            if p == Some(priority) && (src != Some(IpAddr::V4(addr)) || src_len != len || t != table) {
                return Err(permanent(
                    "foreign-rule",
                    format!("a rule at priority {priority} is not Pushleft's: left untouched"),
                ));
            }
        }
        let current = self.routes_in(table).await?;
        if let Some(r) = current
            .iter()
            .find(|r| r.header.protocol != RouteProtocol::Other(PROTOCOL))
        {
            return Err(permanent(
                "foreign-route",
                format!(
                    "table {table} holds a route that is not Pushleft's ({}): left untouched",
                    seen(r).0
                ),
            ));
        }
        let wanted = self.wanted(bridge, addr, len, mesh).await?;
        // Drop ours that are no longer wanted, add what is missing.
        for r in current {
            if !wanted.contains(&seen(&r)) {
                self.handle
                    .route()
                    .del(r)
                    .execute()
                    .await
                    .map_err(|e| netlink("route-delete-failed", e))?;
            }
        }
        let have: Vec<Seen> = self.routes_in(table).await?.iter().map(seen).collect();
        for (dst, gw, oif, _) in &wanted {
            if have.iter().any(|h| h.0 == *dst && h.1 == *gw && h.2 == *oif) {
                continue;
            }
            let (d, l) = dst.split_once('/').unwrap_or(("0.0.0.0", "0"));
            let mut b = RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(d.parse().unwrap_or(Ipv4Addr::UNSPECIFIED), l.parse().unwrap_or(0))
                .table_id(table)
                .protocol(RouteProtocol::Other(PROTOCOL));
            if let Some(g) = gw {
                b = b.gateway(*g);
            } else {
                b = b.scope(RouteScope::Link);
            }
            if let Some(i) = oif {
                b = b.output_interface(*i);
            }
            self.handle
                .route()
                .add(b.build())
                .replace()
                .execute()
                .await
                .map_err(|e| netlink("route-add-failed", e))?;
        }
        let has_rule = self.rules().await?.iter().any(|r| rule_of(r).0 == Some(priority));
        if !has_rule {
            self.handle
                .rule()
                .add()
                .v4()
                .source_prefix(addr, len)
                .table_id(table)
                .priority(priority)
                .action(RuleAction::ToTable)
                .execute()
                .await
                .map_err(|e| netlink("rule-add-failed", e))?;
        }
        self.verify(network, subnet, mesh).await?;
        Ok(format!("table {table} and rule {priority} for {subnet} read back"))
    }

    /// Reads the table and rule back and compares them with what they should be.
    pub async fn verify(&self, network: &str, subnet: &str, mesh: Mesh<'_>) -> Result<(), Failure> {
        let (addr, len, index) = parse(subnet)?;
        let (table, priority) = (BASE + index, BASE + index);
        let bridge = self
            .link_index(&bridge_name(network))
            .await?
            .ok_or_else(|| permanent("routes-readback-mismatch", "the bridge is gone"))?;
        let mut wanted = self.wanted(bridge, addr, len, mesh).await?;
        let mut got: Vec<Seen> = self.routes_in(table).await?.iter().map(seen).collect();
        wanted.sort_by(|a, b| a.0.cmp(&b.0));
        got.sort_by(|a, b| a.0.cmp(&b.0));
        let rules: Vec<_> = self
            .rules()
            .await?
            .iter()
            .map(rule_of)
            .filter(|r| r.0 == Some(priority))
            .collect();
        if got != wanted || rules != [(Some(priority), Some(IpAddr::V4(addr)), len, table, true)] {
            return Err(permanent(
                "routes-readback-mismatch",
                format!(
                    "table {table} or rule {priority} reads back otherwise: {} routes, {} rules",
                    got.len(),
                    rules.len()
                ),
            ));
        }
        Ok(())
    }

    /// Removes the environment's rule and the routes of ours in its table; gone is done.
    pub async fn remove(&self, subnet: &str) -> Result<String, Failure> {
        let (addr, len, index) = parse(subnet)?;
        let (table, priority) = (BASE + index, BASE + index);
        for r in self.rules().await? {
            let (p, src, src_len, t, _) = rule_of(&r);
            if p == Some(priority) {
                if src != Some(IpAddr::V4(addr)) || src_len != len || t != table {
                    return Err(permanent(
                        "foreign-rule",
                        format!("a rule at priority {priority} is not Pushleft's: left untouched"),
                    ));
                }
                self.handle
                    .rule()
                    .del(r)
                    .execute()
                    .await
                    .map_err(|e| netlink("rule-delete-failed", e))?;
            }
        }
        let mut n = 0;
        for r in self.routes_in(table).await? {
            if r.header.protocol == RouteProtocol::Other(PROTOCOL) {
                self.handle
                    .route()
                    .del(r)
                    .execute()
                    .await
                    .map_err(|e| netlink("route-delete-failed", e))?;
                n += 1;
            }
        }
        Ok(format!("rule {priority} and {n} routes of table {table} removed"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnets_map_to_their_own_table_and_bridge_names_fit() {
        assert_eq!(parse("10.208.0.0/24").expect("first").2, 0);
        assert_eq!(parse("10.223.255.0/24").expect("last").2, 4095);
        assert_eq!(parse("10.224.0.0/24").expect_err("outside").code, "subnet-invalid");
        assert_eq!(parse("10.208.1.0/25").expect_err("length").code, "subnet-invalid");
        let b = bridge_name("a-very-long-environment-name-indeed");
        assert!(b.len() <= 15, "{b}");
        assert_ne!(bridge_name("a"), bridge_name("b"));
    }
}
