//! `GET /v1/fleet?limit=N` in pages of one snapshot, as Kubernetes pages a list with a
//! `continue` token: re-placement decides on the whole fleet at one moment, so pages read at
//! different moments (a node lost between two of them) would add up to a fleet that never
//! was. The first page takes the snapshot and keeps it under a random cursor for
//! [`KEPT_FOR`]; the next pages are slices of it. At most [`KEPT`] snapshots are kept (the
//! oldest goes first), each bounded by `MAX_FLEET_DEPLOYMENTS`: what a viewer can make the
//! daemon hold is bounded. A cursor gone (expired, pushed out, a restart) is refused with
//! `fleet-cursor-unknown`: the caller starts again.

use super::{Answer, Kind, OpError, Ops};
use state_schema::replacement::{Snapshot, SnapshotPage};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The most running deployments a page holds (`limit` is clamped to it).
pub const MAX_FLEET_PAGE: u32 = 1_000;
/// How long a snapshot is kept for its next pages.
pub const KEPT_FOR: Duration = Duration::from_secs(60);
/// How many snapshots are kept at once.
pub const KEPT: usize = 4;
/// The longest cursor read: an id of 16 hex digits, a dot, an offset.
const MAX_CURSOR_LEN: usize = 40;

/// The snapshots kept for their next pages.
#[derive(Default)]
pub struct FleetCursors {
    kept: Mutex<Vec<Kept>>,
}

struct Kept {
    id: String,
    made: Instant,
    snapshot: Arc<Snapshot>,
}

impl FleetCursors {
    fn keep(&self, id: &str, snapshot: Arc<Snapshot>) {
        let Ok(mut kept) = self.kept.lock() else { return };
        kept.retain(|k| k.made.elapsed() < KEPT_FOR);
        if kept.len() >= KEPT {
            kept.remove(0);
        }
        kept.push(Kept {
            id: id.to_owned(),
            made: Instant::now(),
            snapshot,
        });
    }

    fn find(&self, id: &str) -> Option<Arc<Snapshot>> {
        let kept = self.kept.lock().ok()?;
        kept.iter()
            .find(|k| k.id == id && k.made.elapsed() < KEPT_FOR)
            .map(|k| Arc::clone(&k.snapshot))
    }
}

fn unknown() -> OpError {
    OpError::new(
        Kind::NotFound,
        "fleet-cursor-unknown",
        format!(
            "no snapshot is kept under this cursor (each is kept {} s, {KEPT} at most): ask for the first page again",
            KEPT_FOR.as_secs()
        ),
    )
}

/// A cursor read: the snapshot's id and the offset of the page's first deployment.
fn parse(cursor: &str) -> Result<(&str, usize), OpError> {
    let malformed = || OpError::malformed("cursor is the `next` of the page before");
    if cursor.len() > MAX_CURSOR_LEN {
        return Err(malformed());
    }
    let (id, from) = cursor.split_once('.').ok_or_else(malformed)?;
    if id.len() != 16 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(malformed());
    }
    Ok((id, from.parse().map_err(|_| malformed())?))
}

impl Ops {
    /// `GET /v1/fleet?limit=N[&cursor=C]`: one page of the live fleet's snapshot (above).
    pub async fn fleet_page(&self, cursor: Option<&str>, limit: u32) -> Answer<SnapshotPage> {
        let limit = limit.clamp(1, MAX_FLEET_PAGE) as usize;
        let (id, from, snapshot) = match cursor {
            Some(c) => {
                let (id, from) = parse(c)?;
                let snapshot = self.fleet_cursors.find(id).ok_or_else(unknown)?;
                (id.to_owned(), from, snapshot)
            }
            None => {
                let mut bytes = [0u8; 8];
                getrandom::fill(&mut bytes)
                    .map_err(|e| OpError::new(Kind::Unavailable, "random-unavailable", e.to_string()))?;
                (hex::encode(bytes), 0, Arc::new(self.fleet().await?))
            }
        };
        let all = &snapshot.running;
        if from > all.len() {
            return Err(OpError::malformed("cursor is past the snapshot's end"));
        }
        let to = (from + limit).min(all.len());
        let mut page = Snapshot {
            at_ms: snapshot.at_ms,
            lost_after_ms: snapshot.lost_after_ms,
            running: all[from..to].to_vec(),
            ..Snapshot::default()
        };
        if from == 0 {
            page.nodes = snapshot.nodes.clone();
            page.pins = snapshot.pins.clone();
            page.held = snapshot.held.clone();
        }
        let next = (to < all.len()).then(|| format!("{id}.{to}"));
        if next.is_some() && cursor.is_none() {
            self.fleet_cursors.keep(&id, Arc::clone(&snapshot));
        }
        Ok(SnapshotPage { snapshot: page, next })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_are_read_strictly() {
        assert_eq!(parse("0123456789abcdef.200").ok(), Some(("0123456789abcdef", 200)));
        for bad in [
            "",
            "0123456789abcdef",
            "0123456789abcde.1",
            "0123456789abcdeg.1",
            "0123456789abcdef.-1",
            "0123456789abcdef.1&x=2",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(parse(&format!("0123456789abcdef.{}", "9".repeat(30))).is_err());
    }

    #[test]
    fn kept_snapshots_are_bounded_and_found_by_id() {
        let c = FleetCursors::default();
        for i in 0..KEPT + 2 {
            c.keep(&format!("{i:016x}"), Arc::new(Snapshot::default()));
        }
        assert!(c.find(&format!("{:016x}", 0)).is_none(), "the oldest went first");
        assert!(c.find(&format!("{:016x}", KEPT + 1)).is_some());
        assert_eq!(c.kept.lock().map(|k| k.len()).unwrap_or(0), KEPT);
    }
}
