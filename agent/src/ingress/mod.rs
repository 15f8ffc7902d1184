//! The ingress executor: routes in Caddy (≥ 2.8) through its admin API, with the upstreams of
//! each route in files Caddy reads on every request.
//!
//! Why files: Caddy applies every admin-API change as a whole new configuration, and each such
//! reload resets a few connections that arrive at that instant (measured with Debian's 2.6.2
//! and 2.11.7: one to three failed requests per change under load) and closes every hijacked
//! stream (WebSockets) of every site. So a generation switch must not reload Caddy. One route
//! per hostname (`@id` `pl-host.<control plane>.<hostname>`) names its upstreams with Caddy's `{file.*}`
//! placeholder, `{file.<dir>/<hostname>/<slot>}`, 12 slots shared by the web replicas; the
//! switch is an atomic rename of each slot file, which Caddy sees on the next request. Requests
//! in flight finish on the generation they started with. Caddy's configuration changes only
//! when a hostname first appears on this node, leaves it, or gains more than 12 replicas there
//! (fewer replicas share the slots); for those reloads every route of ours
//! sets `stream_close_delay`, so the streams of other environments stay open.
//!
//! Several agents may share one machine, and so one Caddy and one upstream folder (`pl up` with
//! two nodes). Each node keeps its own list, `<dir>/<hostname>/nodes/<node>` (`<generation>
//! <environment>` and then its replicas' addresses); the slot files are the union of every
//! node's list, rewritten under an exclusive lock on `<dir>/<hostname>/lock`. The route goes
//! only when the last node's list empties. So a replica moving between two nodes of one
//! machine is added by the new node's publish and dropped by the old node's removal, which
//! comes before its container stops: no request reaches a stopped replica.
//!
//! Each node's list is also its fence: its generation, the newest it published or removed,
//! keeps a stale retry from restoring older upstreams. Only routes whose `@id` starts with
//! `pl-` are ever touched; the last route of ours answers 404 for a hostname nobody publishes.

mod acme;
pub use acme::{ACME_ROUTE, CHALLENGE_PATH};
mod canary;
pub use canary::{Canary, Share, Shares};
mod caddy;
pub mod caddy_admin;
mod files;
pub mod gate;
pub mod kernel;
pub mod tls;

use crate::ingress::caddy_admin::{Admin, AdminError};
use crate::outcome::{Failure, permanent};
use agent_proto::{CanaryMeasure, IngressTls};
use caddy::Place;
use files::{NodeList, Turn, checked, disk, exclusive, open_folder};
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;
use tls::TlsConfig;

/// The server of ours in Caddy's HTTP app.
pub const SERVER: &str = "pushleft";
/// Every `@id` of ours starts with `pl-`; a hostname's route continues with [`HOST_ROUTE`], a
/// built-in one with [`BUILTIN_ROUTE`]. The two prefixes differ before either ends, so no
/// hostname's route can take a built-in route's id (a hostname `fallback-404` once replaced
/// the catch-all route, and unknown hostnames got an empty 200).
pub const HOST_ROUTE: &str = "pl-host.";
pub const BUILTIN_ROUTE: &str = "pl-builtin.";
/// The catch-all route's `@id`.
pub const FALLBACK: &str = "pl-builtin.fallback-404";
/// How long a hijacked stream (a WebSocket) of ours stays open after a reload of Caddy's
/// configuration. Reloads come from other hostnames' changes; the stream's own generation
/// switch reloads nothing, and its old container ends its streams when it is stopped.
pub const STREAM_CLOSE_DELAY: &str = "24h";

/// Upstream slots a hostname's route starts with: up to this many replicas on one node come
/// and go without a reload of Caddy's configuration (12 shares evenly among 1, 2, 3, 4, 6 and
/// 12 replicas; other counts get at most one slot more per replica).
pub const SLOTS: usize = 12;

/// After a switch, how long `publish` waits before it reports: requests already sent to the old
/// generation finish before the cleanup step (which starts only after the publish succeeded)
/// stops it. Longer requests get the application's SIGTERM grace.
pub const DRAIN: Duration = Duration::from_secs(1);

/// Caddy's admin API (a unix socket only the agent's user reaches), where our server listens,
/// and the folder of upstream files (readable by Caddy).
pub struct Ingress {
    admin: Admin,
    listen: Vec<String>,
    upstreams: PathBuf,
    /// Also match `<hostname><suffix>` (`pl up`'s `.localhost`, which resolves to loopback).
    host_suffix: Option<String>,
    /// Who this agent is on the machine, `<control plane>_<node>`: its list of upstreams in
    /// each hostname's folder.
    node: String,
    /// Where HTTPS is served ([`crate::ingress::tls`]); `None`: a certificate is refused.
    tls: Option<TlsConfig>,
    /// The control plane's token on the certificates server, read or made at the first
    /// HTTPS publish or repair (not at start: an agent that never serves HTTPS writes nothing).
    certs_token: std::sync::OnceLock<String>,
}

/// The `@id` of a hostname's route published by `control_plane`'s agents:
/// `pl-host.<control plane>.<hostname>`, in the hostname space (never a built-in route's) and
/// naming the control plane that owns it.
pub fn route_id(control_plane: &str, hostname: &str) -> String {
    format!("{HOST_ROUTE}{control_plane}.{hostname}")
}

impl Ingress {
    /// `admin` is Caddy's admin socket as `unix//<path>` ([`Admin::parse`]); `upstreams` must be
    /// an absolute path without braces (it goes into a Caddy placeholder).
    pub fn new(admin: &str, listen: Vec<String>, upstreams: PathBuf, node: &str) -> Result<Self, String> {
        let admin = Admin::parse(admin)?;
        let text = upstreams.to_string_lossy();
        if !upstreams.is_absolute() || text.contains(['{', '}', ' ']) {
            return Err(format!(
                "the ingress upstream folder {text:?} must be an absolute path without braces or spaces"
            ));
        }
        if node.is_empty()
            || !node
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return Err(format!("{node:?} is not a node name"));
        }
        Ok(Ingress {
            admin,
            listen,
            upstreams,
            host_suffix: None,
            node: node.to_owned(),
            tls: None,
            certs_token: std::sync::OnceLock::new(),
        })
    }

    /// Serves hostnames whose lease brings a certificate over HTTPS ([`crate::ingress::tls`]).
    pub fn with_tls(mut self, config: TlsConfig) -> Result<Self, String> {
        if !config.dir.is_absolute() {
            return Err(format!(
                "the ingress certificate folder {} must be an absolute path",
                config.dir.display()
            ));
        }
        tls::check_certs_listen(&config.certs_listen)?;
        self.tls = Some(config);
        Ok(self)
    }

    /// Routes also match each hostname with `suffix` appended (`.localhost` for `pl up`).
    pub fn with_host_suffix(mut self, suffix: &str) -> Result<Self, String> {
        let fine = suffix.starts_with('.') && suffix.len() <= 63 && checked(&format!("a{suffix}")).is_ok();
        if !fine {
            return Err(format!("the ingress host suffix {suffix:?} must be `.` and DNS labels"));
        }
        self.host_suffix = Some(suffix.to_owned());
        Ok(self)
    }

    /// Drift: every hostname with upstream files (published here, not removed) must have its
    /// route in Caddy as written (a Caddy restarted without its saved configuration, a route
    /// deleted by hand). A missing or changed route is put back; returns `(environment, what)`
    /// for each repair. Caddy unreachable: nothing to do now.
    pub fn repair(&self) -> Vec<(String, String)> {
        let Ok(dir) = std::fs::read_dir(&self.upstreams) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for entry in dir.flatten() {
            let Some(hostname) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if checked(&hostname).is_err() || self.own(&hostname).dials.is_empty() {
                continue;
            }
            // What this node serves and what it finds are read under the hostname's lock, and
            // a hostname a publish or removal holds is left to it: a repair that read this
            // node's state before a publish changed it, and wrote after, would undo the
            // publish (a node sharing the machine, its certificate not yet published, took the
            // HTTPS route away from the other one, whose publish had succeeded).
            let _held = match self.lock_now(&hostname) {
                Ok(Some(held)) => held,
                Ok(None) => continue,
                Err(f) => {
                    tracing::warn!(hostname = %hostname, code = f.code, "cannot lock the hostname's folder");
                    continue;
                }
            };
            let slots = self.slot_count(&hostname);
            // Each node repairs the routes it publishes (nodes sharing a machine all may),
            // as its list says under the lock.
            let own = self.own(&hostname);
            if slots == 0 || own.dials.is_empty() {
                continue;
            }
            let environment = own.environment;
            let id = route_id(self.plane(), &hostname);
            let served = self.served(&hostname);
            // The file handshakes read, when gone (another node's newer one is left alone).
            if let (Some(s), Some(t)) = (&served, &self.tls) {
                if let Err(f) = self.ensure_token(t) {
                    tracing::warn!(hostname = %hostname, code = f.code, "cannot read the certificates token");
                    continue;
                }
                let path = t.dir.join(&hostname).join(tls::serving_file(self.plane()));
                if !path.exists() {
                    let owner = self.admin.socket().parent().and_then(tls::caddy_owner);
                    match tls::serve(&self.cert_folder(t, &hostname), &s.digest, &path, owner) {
                        Ok(()) => out.push((environment.clone(), format!("certificate of {hostname} put back"))),
                        Err(f) => {
                            tracing::warn!(hostname = %hostname, code = f.code, "cannot put the certificate back")
                        }
                    }
                }
            }
            let pieces = self.pieces(&hostname, slots, served.as_ref());
            let stale = self.stale(&hostname, &pieces);
            let in_place = |(_, id, wanted): &(Place, String, Value)| {
                self.get(&format!("/id/{id}")).map(|r| r.as_ref() == Some(wanted))
            };
            let mut all_in_place = true;
            for p in &pieces {
                match in_place(p) {
                    Ok(fine) => all_in_place &= fine,
                    Err(_) => return out,
                }
            }
            for s in &stale {
                match self.get(&format!("/id/{s}")) {
                    Ok(found) => all_in_place &= found.is_none(),
                    Err(_) => return out,
                }
            }
            if all_in_place {
                continue;
            }
            let applied = self
                .ensure_server()
                .and_then(|()| self.turn())
                .and_then(|turn| self.apply(&pieces, &stale, &turn));
            match applied {
                Ok(_) => out.push((environment, format!("ingress route {id} put back"))),
                Err(f) => tracing::warn!(hostname = %hostname, code = f.code, "cannot repair the ingress route"),
            }
        }
        out
    }

    /// Whether Caddy's admin API answers (the heartbeat offers `ingress` only then).
    pub async fn answers(&self) -> bool {
        let admin = self.admin.clone();
        tokio::task::spawn_blocking(move || match admin.call("GET", "/config/", None) {
            Ok(r) => r.status == 200,
            Err(AdminError::Exposed(why)) => {
                tracing::error!(code = "caddy-admin-exposed", reason = %why, "ingress not offered");
                false
            }
            Err(_) => false,
        })
        .await
        .unwrap_or(false)
    }

    /// The admin endpoint, to check its folder's permissions at start.
    pub fn admin(&self) -> &Admin {
        &self.admin
    }

    /// Our server, created (with its 404 fallback) when Caddy has none. Agents sharing the
    /// machine take turns (a lock in the upstream folder), so one cannot replace the server
    /// another just made and routed.
    /// Waits for the machine's agents' turn at changing Caddy ([`Turn`]).
    pub(crate) fn turn(&self) -> Result<Turn, Failure> {
        open_folder(&self.upstreams, &self.upstreams)?;
        exclusive(&self.upstreams.join("server.lock")).map(Turn)
    }

    /// Points `hostname` at `dials` (`ip:port` of generation `generation`'s web replicas on
    /// this node), beside what other nodes of this machine publish: this node's list first
    /// (its fence), then the slot files (the switch, with no reload when the route has slots
    /// enough), then the route when it is missing or short of slots. Adopted when all of it is
    /// in place already; read back; refused for a generation older than the fence.
    pub fn publish(
        &self,
        environment: &str,
        hostname: &str,
        generation: u64,
        dials: &[String],
        sealed: Option<&IngressTls>,
    ) -> Result<String, Failure> {
        self.publish_share(environment, hostname, generation, dials, sealed, Share::Whole)
    }

    /// [`Ingress::publish`] of a share of the hostname's requests (`share`): a canary step
    /// keeps the release this node published before beside the new one
    /// ([`crate::ingress::Shares`]).
    // The publish's own arguments plus how it shares and what it must pass first: one call,
    // as the lease's task is one.
    #[allow(clippy::too_many_arguments)]
    pub fn publish_share(
        &self,
        environment: &str,
        hostname: &str,
        generation: u64,
        dials: &[String],
        sealed: Option<&IngressTls>,
        share: Share,
    ) -> Result<String, Failure> {
        let hostname = checked(hostname)?;
        if dials.is_empty() {
            return Err(permanent(
                "no-upstream",
                format!("no web replica of {hostname} runs on this node"),
            ));
        }
        let fenced = self.own(hostname).generation;
        if fenced > generation {
            return Err(permanent(
                "stale-generation",
                format!("generation {fenced} of {hostname} is published or removed already; {generation} is older"),
            ));
        }
        let own = self.own(hostname);
        // The certificate first: one that cannot be used changes nothing.
        let served = sealed.map(|s| self.certificate(hostname, s)).transpose()?;
        self.ensure_server()?;
        let held = self.lock(hostname)?;
        if let (_, Some(other)) = self.union(hostname)? {
            return Err(permanent(
                "hostname-taken",
                format!(
                    "control plane {other} serves {hostname} through this machine's Caddy: a hostname is never shared between control planes"
                ),
            ));
        }
        let (list, weight) = shared_list(own, share, generation, environment, dials);
        let canary_note = match &list.canary {
            Some(c) => format!(", a canary at {}%", c.weight),
            None if weight.is_some() => ", whole: no earlier release published here".to_owned(),
            None => String::new(),
        };
        self.set_own(hostname, &list)?;
        let (all, _) = self.union(hostname)?;
        let id = route_id(self.plane(), hostname);
        // The slots are the proxy route's: the plain route's, or the HTTPS route's.
        let https_id = tls::https_route_id(self.plane(), hostname);
        let had_slots = self
            .slots(self.get(&format!("/id/{id}"))?.as_ref())
            .max(self.slots(self.get(&format!("/id/{https_id}"))?.as_ref()));
        let slots = had_slots.max(all.len()).max(SLOTS);
        let changed = self.write_slots(hostname, &all, slots)?;
        // The certificate handshakes read: switched here, under the hostname's lock and once
        // the hostname is known to be this control plane's (a rename; nothing reloads).
        if let (Some(s), Some(t)) = (&served, &self.tls) {
            self.ensure_token(t)?;
            let owner = self.admin.socket().parent().and_then(tls::caddy_owner);
            let path = t.dir.join(hostname).join(tls::serving_file(self.plane()));
            tls::serve(&self.cert_folder(t, hostname), &s.digest, &path, owner)?;
        }
        self.set_served(hostname, served.as_ref())?;
        let pieces = self.pieces(hostname, slots, served.as_ref());
        let stale = self.stale(hostname, &pieces);
        // Changing Caddy and reading the change back is one turn of the machine's agents.
        let turn = self.turn()?;
        let note = match self.apply(&pieces, &stale, &turn)? {
            "adopted" if changed => "switched",
            n => n,
        };
        // Read back in the same turn: Caddy resolves an `@id` through an index of the last
        // configuration it loaded, so while another agent's change loads, `/id/<ours>` may
        // answer another route (10 HTTPS publishes at once read back another hostname's), and
        // a PATCH through it would change that route.
        let mismatched = self.read_back(hostname, &all.slot_dials(slots), &pieces, &stale)?;
        drop(turn);
        drop(held);
        if !mismatched.is_empty() {
            return Err(permanent(
                "ingress-readback-mismatch",
                format!("{id}: {} read back otherwise", mismatched.join(", ")),
            ));
        }
        // A canary step keeps the old release running: nothing stops after it, no drain.
        if changed && had_slots != 0 && list.canary.is_none() {
            std::thread::sleep(DRAIN);
        }
        self.prune_certificates(hostname, served.as_ref());
        let on = match all.canary_slots(slots) {
            0 => slots,
            k => k,
        };
        Ok(format!(
            "{id} {note}: generation {generation} on {on} of {slots} slot(s) to {}{canary_note}{}",
            dials.join(", "),
            if served.is_some() { ", over HTTPS" } else { "" }
        ))
    }

    /// What of a publish reads back otherwise than written: the upstream files, each piece of
    /// Caddy's configuration, and each stale piece (still there).
    fn read_back(
        &self,
        hostname: &str,
        wanted: &[String],
        pieces: &[(Place, String, Value)],
        stale: &[String],
    ) -> Result<Vec<String>, Failure> {
        let mut mismatched: Vec<String> = Vec::new();
        if !(0..wanted.len())
            .all(|k| std::fs::read_to_string(self.slot(hostname, k)).ok().as_deref() == Some(&wanted[k]))
        {
            mismatched.push("its upstream files".into());
        }
        for (_, pid, wanted) in pieces {
            if self.get(&format!("/id/{pid}"))?.as_ref() != Some(wanted) {
                mismatched.push(pid.clone());
            }
        }
        for s in stale {
            if self.get(&format!("/id/{s}"))?.is_some() {
                mismatched.push(format!("{s} (still there)"));
            }
        }
        Ok(mismatched)
    }

    /// What this node's ingress saw of `hostname`'s canary of generation `generation` since its
    /// share began (the control plane judges the gates on every node's measure together):
    /// nothing measured, and said, when no canary of that generation is here or this
    /// machine's Caddy has no proxy log. Changes nothing.
    pub fn measure_canary(&self, hostname: &str, generation: u64) -> Result<(String, CanaryMeasure), Failure> {
        let hostname = checked(hostname)?;
        let own = self.own(hostname);
        let Some(c) = own.canary.as_ref().filter(|_| own.generation == generation) else {
            let note = format!("{hostname}: no canary of generation {generation} on this node: nothing measured");
            return Ok((
                note,
                CanaryMeasure {
                    logged: true,
                    ..CanaryMeasure::default()
                },
            ));
        };
        if self.get(&format!("/config/logging/logs/{}", gate::LOGGER))?.is_none() {
            let note = format!(
                "{hostname}: this machine's Caddy has no proxy log (it comes with the ingress server: a Caddy restarted without its saved configuration gets it back then): nothing measured"
            );
            return Ok((note, CanaryMeasure::default()));
        }
        let m = gate::measure(&self.proxy_log(), &self.canary_upstreams(hostname, c), c.since_ms);
        let measured = m.report();
        let note = format!(
            "{hostname}: {} request(s) to the new release since its {}% share, {} 5xx or failed",
            measured.requests, c.weight, measured.errors
        );
        Ok((note, measured))
    }

    /// Takes `hostname` off this node for generation `generation` (it no longer serves the
    /// hostname here, or the environment is torn down). Its list empties (the fence stays, so
    /// a stale publish cannot bring it back). When other nodes of this machine still publish
    /// the hostname, the slots go to theirs alone and requests already sent here get the drain
    /// time; otherwise the route goes, then the slot files. Kept when a newer generation
    /// published it; gone already is done.
    pub fn remove(&self, environment: &str, hostname: &str, generation: u64) -> Result<String, Failure> {
        let hostname = checked(hostname)?;
        let fenced = self.own(hostname).generation;
        if fenced > generation {
            return Ok(format!(
                "{hostname} kept: generation {fenced} published it after {generation}"
            ));
        }
        let held = self.lock(hostname)?;
        let had = self.own(hostname).dials;
        self.set_own(
            hostname,
            &NodeList {
                generation,
                environment: environment.to_owned(),
                dials: Vec::new(),
                canary: None,
            },
        )?;
        let (others, foreign) = self.union(hostname)?;
        let id = route_id(self.plane(), hostname);
        if let (true, Some(other)) = (others.is_empty(), foreign) {
            // The route and its slots are another control plane's: never ours to remove.
            drop(held);
            return Ok(format!("{id} left to control plane {other}, which serves it here"));
        }
        // This node's certificate files (and an earlier agent's `load_files` entry) go in every
        // case; the routes, the policy and the serving file only with the last node.
        let turn = self.turn()?;
        let legacy = tls::cert_entry_id(&self.node, hostname);
        if self.get(&format!("/id/{legacy}"))?.is_some() {
            self.send("DELETE", &format!("/id/{legacy}"), None)?;
        }
        self.set_served(hostname, None)?;
        self.prune_certificates(hostname, None);
        if !others.is_empty() {
            let slots = self.slot_count(hostname).max(others.len());
            let changed = self.write_slots(hostname, &others, slots)?;
            drop(turn);
            drop(held);
            if changed && !had.is_empty() {
                std::thread::sleep(DRAIN);
            }
            return Ok(format!(
                "{id} kept for the other nodes here: {} upstream(s)",
                others.len()
            ));
        }
        let mut removed = false;
        // The last node here: the hostname's certificate policy and the file it serves go too.
        for rid in [
            id.clone(),
            tls::https_route_id(self.plane(), hostname),
            tls::cert_policy_id(self.plane(), hostname),
        ] {
            if self.get(&format!("/id/{rid}"))?.is_some() {
                match self.send("DELETE", &format!("/id/{rid}"), None) {
                    Ok(()) => removed = true,
                    Err(_) if self.get(&format!("/id/{rid}"))?.is_none() => {}
                    Err(f) => return Err(f),
                }
            }
        }
        for entry in std::fs::read_dir(self.folder(hostname)).map_err(disk)? {
            let path = entry.map_err(disk)?.path();
            if path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.parse::<usize>().is_ok())
            {
                std::fs::remove_file(&path).map_err(disk)?;
            }
        }
        if let Some(t) = &self.tls {
            let _ = std::fs::remove_file(t.dir.join(hostname).join(tls::serving_file(self.plane())));
            let _ = std::fs::remove_dir(t.dir.join(hostname));
        }
        drop(turn);
        drop(held);
        Ok(if removed {
            format!("{id} removed")
        } else {
            format!("no route of {hostname}")
        })
    }
}

/// Now, in Unix milliseconds.
fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The node's list for a publish of `generation` with `share`, from the list it held (`own`),
/// and the canary weight asked for. The release this node published before, while it still
/// serves, is kept beside a canary (a canary of a newer commit, mid-canary, keeps it too); a
/// repair keeps its step's share and start.
fn shared_list(
    own: NodeList,
    share: Share,
    generation: u64,
    environment: &str,
    dials: &[String],
) -> (NodeList, Option<u8>) {
    let weight = match share {
        Share::Whole => None,
        Share::Canary(w) => Some(w),
        Share::Repair => own
            .canary
            .as_ref()
            .filter(|_| own.generation == generation)
            .map(|c| c.weight),
    };
    let old = match own.canary.is_some() || own.generation < generation {
        true => own.dials,
        false => Vec::new(),
    };
    let list = match weight {
        Some(weight) if !old.is_empty() => NodeList {
            generation,
            environment: environment.to_owned(),
            dials: old,
            canary: Some(Canary {
                weight,
                dials: dials.to_vec(),
                // A repair keeps its step's start; a step starts now.
                since_ms: match (share, &own.canary) {
                    (Share::Repair, Some(c)) => c.since_ms,
                    _ => unix_ms(),
                },
            }),
        },
        _ => NodeList {
            generation,
            environment: environment.to_owned(),
            dials: dials.to_vec(),
            canary: None,
        },
    };
    (list, weight)
}
