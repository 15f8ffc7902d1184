//! The ingress's files beside Caddy: each hostname's folder under the upstreams root, every
//! node's list in it (its fence, its environment and its upstreams), the slot files Caddy reads
//! (the union of the lists, rewritten under the hostname's lock), what a node serves over HTTPS
//! (`tls/<node>`), and the locks that give a publish, a removal and a repair their turn.

use super::Ingress;
use super::canary::{Canary, Shares};
use crate::outcome::{Failure, permanent, retryable};
use std::path::{Path, PathBuf};

/// What one node has a hostname served with over HTTPS, kept beside its list
/// (`<upstreams>/<hostname>/tls/<node>`: `<digest> <hsts 0|1>`), so drift repair can rebuild
/// the routes without the lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Served {
    pub(super) digest: String,
    pub(super) hsts: bool,
}

/// What one node's list says: the generation it last published or removed (its fence), the
/// environment that did, and its upstreams (none once removed). During a canary of the
/// generation, `dials` are the old release's and `canary` the new one's, after a
/// `canary <weight>` line.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct NodeList {
    pub(super) generation: u64,
    pub(super) environment: String,
    pub(super) dials: Vec<String>,
    pub(super) canary: Option<Canary>,
}

impl NodeList {
    pub(super) fn parse(text: &str) -> NodeList {
        let mut lines = text.lines();
        let mut head = lines.next().unwrap_or_default().split_whitespace();
        let mut list = NodeList {
            generation: head.next().and_then(|g| g.parse().ok()).unwrap_or(0),
            environment: head.next().unwrap_or_default().to_owned(),
            ..NodeList::default()
        };
        for l in lines.filter(|l| !l.is_empty()) {
            match (l.strip_prefix("canary "), list.canary.as_mut()) {
                (Some(rest), _) => {
                    let mut parts = rest.split_whitespace();
                    list.canary = Some(Canary {
                        weight: parts.next().and_then(|w| w.parse().ok()).unwrap_or(1),
                        dials: Vec::new(),
                        since_ms: parts.next().and_then(|t| t.parse().ok()).unwrap_or(0),
                    })
                }
                (None, Some(c)) => c.dials.push(l.to_owned()),
                (None, None) => list.dials.push(l.to_owned()),
            }
        }
        list
    }

    pub(super) fn text(&self) -> String {
        let mut t = format!("{} {}\n", self.generation, self.environment);
        for d in &self.dials {
            t.push_str(d);
            t.push('\n');
        }
        if let Some(c) = &self.canary {
            t.push_str(&format!("canary {} {}\n", c.weight, c.since_ms));
            for d in &c.dials {
                t.push_str(d);
                t.push('\n');
            }
        }
        t
    }
}

/// A hostname as it may appear in a path and a Caddy placeholder: DNS letters, digits, `-`,
/// `.` and a leading `*.` wildcard (state validation allows no more; this guards the path).
pub(super) fn checked(hostname: &str) -> Result<&str, Failure> {
    let body = hostname.strip_prefix("*.").unwrap_or(hostname);
    let fine = !body.is_empty()
        && hostname.len() <= 253
        && !body.starts_with('.')
        && !body.contains("..")
        && body
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    if fine {
        Ok(hostname)
    } else {
        Err(permanent("hostname-invalid", format!("{hostname:?} is not a hostname")))
    }
}

/// Writes `text` to `path` by a rename, so a reader sees the old content or the new.
/// Readable by Caddy's user: the files hold addresses on the environments' networks, no secret.
pub(super) fn replace(path: &Path, text: &str) -> Result<(), Failure> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(disk)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).map_err(disk)?;
    std::fs::rename(&tmp, path).map_err(disk)
}

/// The machine's agents' turn at changing Caddy (the server lock in the upstream folder):
/// every change, and the read-back that judges it, happens in one, since Caddy's `@id` index
/// can answer for another route while a change loads. A function that takes `&Turn` must be
/// called in one and takes no lock itself (a second `flock` would wait for the first).
pub(crate) struct Turn(#[allow(dead_code)] pub(super) std::fs::File);

pub(super) fn lock_file(path: &Path) -> Result<std::fs::File, Failure> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(disk)
}

/// An exclusive lock on the file at `path` (made when missing), held until the file is dropped:
/// the agents sharing a machine take turns with it.
pub(super) fn exclusive(path: &Path) -> Result<std::fs::File, Failure> {
    let file = lock_file(path)?;
    file.lock().map_err(disk)?;
    Ok(file)
}

/// [`exclusive`] when nobody holds it now; `None` when someone does.
pub(super) fn exclusive_now(path: &Path) -> Result<Option<std::fs::File>, Failure> {
    let file = lock_file(path)?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(disk(e)),
    }
}

/// `dir` and the folders above it up to `root`, made and opened to Caddy's user.
pub(super) fn open_folder(root: &Path, dir: &Path) -> Result<(), Failure> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).map_err(disk)?;
    for d in [root, dir] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).map_err(disk)?;
    }
    Ok(())
}

pub(super) fn disk(e: impl std::fmt::Display) -> Failure {
    retryable("ingress-write-failed", e.to_string())
}

impl Ingress {
    pub(super) fn served_path(&self, hostname: &str) -> PathBuf {
        self.folder(hostname).join("tls").join(&self.node)
    }

    /// What this node serves `hostname` with over HTTPS (`None`: plain HTTP).
    pub(super) fn served(&self, hostname: &str) -> Option<Served> {
        let text = std::fs::read_to_string(self.served_path(hostname)).ok()?;
        let mut parts = text.split_whitespace();
        let digest = parts.next().filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()))?;
        Some(Served {
            digest: digest.to_owned(),
            hsts: parts.next() == Some("1"),
        })
    }

    pub(super) fn set_served(&self, hostname: &str, served: Option<&Served>) -> Result<(), Failure> {
        match served {
            Some(s) => {
                open_folder(&self.folder(hostname), &self.folder(hostname).join("tls"))?;
                replace(
                    &self.served_path(hostname),
                    &format!("{} {}\n", s.digest, u8::from(s.hsts)),
                )
            }
            None => match std::fs::remove_file(self.served_path(hostname)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(disk(e)),
                _ => Ok(()),
            },
        }
    }

    pub(super) fn folder(&self, hostname: &str) -> PathBuf {
        self.upstreams.join(hostname)
    }

    pub(super) fn slot(&self, hostname: &str, k: usize) -> PathBuf {
        self.folder(hostname).join(k.to_string())
    }

    pub(super) fn lists(&self, hostname: &str) -> PathBuf {
        self.folder(hostname).join("nodes")
    }

    pub(super) fn list_path(&self, hostname: &str) -> PathBuf {
        self.lists(hostname).join(&self.node)
    }

    /// This node's list for `hostname` (empty: never published here).
    pub(super) fn own(&self, hostname: &str) -> NodeList {
        NodeList::parse(&std::fs::read_to_string(self.list_path(hostname)).unwrap_or_default())
    }

    /// The control plane part of a list's name (`<control plane>_<node>`).
    pub(super) fn plane_of(owner: &str) -> &str {
        owner.split_once('_').map_or(owner, |(cp, _)| cp)
    }

    /// This agent's control plane (the first part of its owner name).
    pub(super) fn plane(&self) -> &str {
        Self::plane_of(&self.node)
    }

    /// The upstreams for `hostname` of every node of this agent's control plane on the machine,
    /// in node order (what the slots share), and the first other control plane that publishes
    /// it here too, if any: a hostname is never shared between control planes. A list named
    /// as this node was before lists named their control plane (`<node>` alone) is this
    /// node's own from an earlier version, and goes.
    pub(super) fn union(&self, hostname: &str) -> Result<(Shares, Option<String>), Failure> {
        let mut files: Vec<PathBuf> = match std::fs::read_dir(self.lists(hostname)) {
            Ok(d) => d
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_none())
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(disk(e)),
        };
        files.sort();
        let (mine, node_alone) = (self.plane(), self.node.split_once('_').map(|(_, n)| n));
        let mut out = Shares::default();
        let mut foreign = None;
        for f in files {
            let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
            if Some(name.as_str()) == node_alone {
                std::fs::remove_file(&f).map_err(disk)?;
                continue;
            }
            let list = NodeList::parse(&std::fs::read_to_string(&f).map_err(disk)?);
            if Self::plane_of(&name) == mine {
                out.add(&list.dials, list.canary.as_ref());
            } else if !(list.dials.is_empty() && list.canary.is_none()) && foreign.is_none() {
                foreign = Some(Self::plane_of(&name).to_owned());
            }
        }
        Ok((out, foreign))
    }

    /// Holds `hostname`'s folder for this node alone until dropped: the nodes sharing it (and
    /// so the slot files and the route) take turns.
    pub(super) fn lock(&self, hostname: &str) -> Result<std::fs::File, Failure> {
        open_folder(&self.upstreams, &self.folder(hostname))?;
        exclusive(&self.folder(hostname).join("lock"))
    }

    /// [`Ingress::lock`] when no node holds it now (a publish or removal of `hostname` is
    /// under way when one does); `None` then.
    pub(super) fn lock_now(&self, hostname: &str) -> Result<Option<std::fs::File>, Failure> {
        open_folder(&self.upstreams, &self.folder(hostname))?;
        exclusive_now(&self.folder(hostname).join("lock"))
    }

    /// Writes this node's list (its fence and its upstreams), by a rename.
    pub(super) fn set_own(&self, hostname: &str, list: &NodeList) -> Result<(), Failure> {
        open_folder(&self.folder(hostname), &self.lists(hostname))?;
        replace(&self.list_path(hostname), &list.text())
    }

    /// Points the slot files at `shares` (each release's share of `slots`, round robin over its
    /// upstreams); whether any changed.
    pub(super) fn write_slots(&self, hostname: &str, shares: &Shares, slots: usize) -> Result<bool, Failure> {
        let mut changed = false;
        for (k, dial) in shares.slot_dials(slots).iter().enumerate() {
            let path = self.slot(hostname, k);
            if std::fs::read_to_string(&path).ok().as_deref() != Some(dial.as_str()) {
                replace(&path, dial)?;
                changed = true;
            }
        }
        Ok(changed)
    }

    /// The slot files of `hostname` (`0`, `1`, …): how many there are.
    pub(super) fn slot_count(&self, hostname: &str) -> usize {
        std::fs::read_dir(self.folder(hostname))
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_str().is_some_and(|n| n.parse::<usize>().is_ok()))
                    .count()
            })
            .unwrap_or(0)
    }
}
