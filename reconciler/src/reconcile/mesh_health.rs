//! Mesh health, judged purely from what the agents said of their links (each peer's last
//! handshake, read from the node's WireGuard device) and when they applied their meshes. Every
//! link sends keepalives (`mesh.rs`), so WireGuard handshakes on it at least every two
//! minutes; a link whose last handshake is older than WireGuard's own session limit (180 s)
//! carries nothing any more: it is down. A peer that has never handshaken is connecting for
//! that long after its node applied the mesh naming it, then down. A change of a link's state
//! is an event (`mesh-link-down`, `mesh-link-up`) once; `/metrics` serves every link's state.
//! Handshake times are the agent's clock against the control plane's: the fleet's clocks agree
//! already (its certificates live for hours), and the limit leaves a minute of margin over
//! the two minutes a healthy link can go between handshakes.

use crate::hub::{MAX_NAMED_LINKS, MeshLinks};
use crate::store::mesh::MeshRow;
use crate::store::{Ledger, LedgerError};
use agent_proto::mesh::{MeshLink, MeshSpec};

/// How old a link's last handshake may be before it is down (WireGuard's REJECT_AFTER_TIME:
/// no session outlives it).
pub const LINK_DOWN_AFTER_MS: i64 = 180_000;

/// How often the links are judged.
pub const CHECK_EVERY_MS: i64 = 5_000;

/// A link's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkState {
    Up,
    /// Never handshaken yet, within the limit of the mesh being applied.
    Connecting,
    Down,
}

impl LinkState {
    pub fn as_str(self) -> &'static str {
        match self {
            LinkState::Up => "up",
            LinkState::Connecting => "connecting",
            LinkState::Down => "down",
        }
    }
}

/// One link of one node, as judged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub node: String,
    pub peer: String,
    pub state: LinkState,
    /// Unix seconds, as the agent said.
    pub last_handshake: Option<u64>,
}

/// Each link of one node's decided mesh, judged at `now_ms`.
pub fn judge(row: &MeshRow, now_ms: i64) -> Vec<Link> {
    let Ok(spec) = serde_json::from_str::<MeshSpec>(&row.spec) else {
        return Vec::new();
    };
    let said: Vec<MeshLink> = serde_json::from_str(&row.links).unwrap_or_default();
    // The newest mesh is not applied yet, or was only just: a peer may not have met it yet.
    let settling = row.applied < row.generation || now_ms - row.applied_at < LINK_DOWN_AFTER_MS;
    spec.peers
        .iter()
        .map(|p| {
            let last = said.iter().find(|l| l.node == p.node).and_then(|l| l.last_handshake);
            let state = match last {
                Some(t) if now_ms - (t as i64).saturating_mul(1000) <= LINK_DOWN_AFTER_MS => LinkState::Up,
                None if settling => LinkState::Connecting,
                _ => LinkState::Down,
            };
            Link {
                node: row.node.clone(),
                peer: p.node.clone(),
                state,
                last_handshake: last,
            }
        })
        .collect()
}

/// What one judgment found: every link, each node whose down links changed (with them now, a
/// JSON list), and an event (kind, subject, detail) per link that went down or came back up.
pub type Judgment = (Vec<Link>, Vec<(String, String)>, Vec<(String, String, String)>);

/// Every node's links judged at `now_ms`, and what changed since the last judgment.
pub fn changes(rows: &[MeshRow], now_ms: i64) -> Judgment {
    let (mut all, mut changed, mut events) = (Vec::new(), Vec::new(), Vec::new());
    for row in rows {
        let links = judge(row, now_ms);
        let before: Vec<String> = serde_json::from_str(&row.down).unwrap_or_default();
        let mut down: Vec<String> = links
            .iter()
            .filter(|l| l.state == LinkState::Down)
            .map(|l| l.peer.clone())
            .collect();
        down.sort();
        for l in links
            .iter()
            .filter(|l| l.state == LinkState::Down && !before.contains(&l.peer))
        {
            events.push((
                "mesh-link-down".to_owned(),
                l.node.clone(),
                match l.last_handshake {
                    Some(t) => format!(
                        "the link from {} to {} is down: its last handshake was {} s ago",
                        l.node,
                        l.peer,
                        (now_ms / 1000).saturating_sub(t as i64)
                    ),
                    None => format!(
                        "the link from {} to {} is down: no handshake since the mesh was applied (does UDP reach the peer's mesh port?)",
                        l.node, l.peer
                    ),
                },
            ));
        }
        for peer in before.iter().filter(|p| !down.contains(p)) {
            // Back up, or gone from the mesh (its peer left): either way no longer down.
            let detail = if links.iter().any(|l| &l.peer == peer) {
                format!("the link from {} to {peer} is up again", row.node)
            } else {
                format!("the link from {} to {peer} left the mesh", row.node)
            };
            events.push(("mesh-link-up".to_owned(), row.node.clone(), detail));
        }
        if down != before {
            changed.push((
                row.node.clone(),
                serde_json::to_string(&down).unwrap_or_else(|_| "[]".into()),
            ));
        }
        all.extend(links);
    }
    (all, changed, events)
}

/// How many nodes' meshes the judgment reads at a time.
const PAGE: i64 = 256;

/// Judges every link, a page of nodes at a time, records what changed (with its events), and
/// returns the links counted by state with those not up named (bounded: ten thousand nodes
/// have about two million links).
pub async fn check(ledger: &Ledger, now_ms: i64) -> Result<MeshLinks, LedgerError> {
    let mut sum = MeshLinks::default();
    let mut after: Option<String> = None;
    loop {
        let rows = ledger.nodes().meshes_page(after.as_deref(), PAGE, true).await?;
        let (links, changed, events) = changes(&rows, now_ms);
        ledger.nodes().write_mesh_health(&changed, &events, now_ms).await?;
        tally(&mut sum, &links);
        match rows.last() {
            Some(last) if rows.len() == PAGE as usize => after = Some(last.node.clone()),
            _ => break,
        }
    }
    // Down links before those still connecting, then the bound.
    sum.not_up.sort_by_key(|(_, _, down)| !down);
    sum.not_up.truncate(MAX_NAMED_LINKS);
    Ok(sum)
}

/// Adds `links` to `sum`: each counted by its state, and each not up named while fewer than
/// [`MAX_NAMED_LINKS`] of its state are (so the down ones are all there for `check` to put
/// first, up to the bound).
pub fn tally(sum: &mut MeshLinks, links: &[Link]) {
    for l in links {
        let (count, down) = match l.state {
            LinkState::Up => {
                sum.up += 1;
                continue;
            }
            LinkState::Connecting => (&mut sum.connecting, false),
            LinkState::Down => (&mut sum.down, true),
        };
        if (*count as usize) < MAX_NAMED_LINKS {
            sum.not_up.push((l.node.clone(), l.peer.clone(), down));
        }
        *count += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(peers: &[&str], links: &str, generation: i64, applied: i64, applied_at: i64, down: &str) -> MeshRow {
        let spec = MeshSpec {
            peers: peers
                .iter()
                .map(|p| agent_proto::mesh::MeshPeer {
                    node: (*p).into(),
                    public_key: String::new(),
                    endpoint: None,
                    keepalive: Some(25),
                    subnets: Vec::new(),
                })
                .collect(),
            ..MeshSpec::default()
        };
        MeshRow {
            node: "n1".into(),
            generation,
            hash: String::new(),
            spec: serde_json::to_string(&spec).expect("json"),
            applied,
            links: links.into(),
            applied_at,
            down: down.into(),
        }
    }

    const NOW: i64 = 1_000_000_000;

    #[test]
    fn a_link_is_up_within_the_session_limit_connecting_at_first_then_down() {
        let fresh = format!(r#"[{{"node":"n2","lastHandshake":{}}}]"#, NOW / 1000 - 170);
        let stale = format!(r#"[{{"node":"n2","lastHandshake":{}}}]"#, NOW / 1000 - 190);
        let state = |r: &MeshRow| judge(r, NOW)[0].state;
        assert_eq!(state(&row(&["n2"], &fresh, 3, 3, 0, "[]")), LinkState::Up);
        assert_eq!(state(&row(&["n2"], &stale, 3, 3, 0, "[]")), LinkState::Down);
        // Never: connecting while the mesh is being applied or just was, then down.
        assert_eq!(state(&row(&["n2"], "[]", 4, 3, 0, "[]")), LinkState::Connecting);
        assert_eq!(
            state(&row(&["n2"], "[]", 3, 3, NOW - 60_000, "[]")),
            LinkState::Connecting
        );
        assert_eq!(state(&row(&["n2"], "[]", 3, 3, NOW - 200_000, "[]")), LinkState::Down);
        // A stale handshake is down even while a newer mesh settles: it had its session.
        assert_eq!(state(&row(&["n2"], &stale, 4, 3, NOW, "[]")), LinkState::Down);
    }

    #[test]
    fn a_change_of_state_is_one_event_and_one_write() {
        let stale = format!(r#"[{{"node":"n2","lastHandshake":{}}}]"#, NOW / 1000 - 400);
        let (links, changed, events) = changes(&[row(&["n2", "n3"], &stale, 3, 3, 0, "[]")], NOW);
        assert_eq!(links.len(), 2);
        assert_eq!(changed, [("n1".to_owned(), r#"["n2","n3"]"#.to_owned())]);
        assert_eq!(events.len(), 2);
        assert!(events[0].2.contains("400 s ago"), "{events:?}");
        assert!(events[1].2.contains("no handshake"), "{events:?}");
        // Judged again, nothing new: nothing written, no event.
        let (_, changed, events) = changes(&[row(&["n2", "n3"], &stale, 3, 3, 0, r#"["n2","n3"]"#)], NOW);
        assert!(changed.is_empty() && events.is_empty(), "{changed:?} {events:?}");
        // n2 handshakes again; n3 left the mesh.
        let fresh = format!(r#"[{{"node":"n2","lastHandshake":{}}}]"#, NOW / 1000 - 5);
        let (_, changed, events) = changes(&[row(&["n2"], &fresh, 4, 4, 0, r#"["n2","n3"]"#)], NOW);
        assert_eq!(changed, [("n1".to_owned(), "[]".to_owned())]);
        let details: Vec<&str> = events.iter().map(|e| e.2.as_str()).collect();
        assert_eq!(
            details,
            [
                "the link from n1 to n2 is up again",
                "the link from n1 to n3 left the mesh"
            ]
        );
        assert!(events.iter().all(|e| e.0 == "mesh-link-up"));
    }

    #[test]
    fn links_are_counted_and_only_those_not_up_named_within_the_bound() {
        let link = |peer: usize, state| Link {
            node: "n1".into(),
            peer: format!("p{peer}"),
            state,
            last_handshake: None,
        };
        let mut links: Vec<Link> = (0..3).map(|i| link(100_000 + i, LinkState::Up)).collect();
        links.extend((0..MAX_NAMED_LINKS + 5).map(|i| link(i, LinkState::Connecting)));
        links.push(link(9_999, LinkState::Down));
        let mut sum = MeshLinks::default();
        tally(&mut sum, &links);
        assert_eq!((sum.up, sum.connecting, sum.down), (3, MAX_NAMED_LINKS as u64 + 5, 1));
        // The down link is named though the connecting ones filled their share first.
        assert_eq!(sum.not_up.len(), MAX_NAMED_LINKS + 1);
        assert!(sum.not_up.contains(&("n1".into(), "p9999".into(), true)));
        assert!(
            !sum.not_up.iter().any(|(_, p, _)| p.starts_with("p10000")),
            "up links are not named"
        );
        assert!(
            !sum.not_up
                .iter()
                .any(|(_, p, down)| !down && p == &format!("p{}", MAX_NAMED_LINKS))
        );
    }
}
