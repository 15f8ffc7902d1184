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

#[path = "ingress_acme.rs"]
mod acme;
pub use acme::{ACME_ROUTE, CHALLENGE_PATH};
#[path = "ingress_canary.rs"]
mod canary;
pub use canary::{Canary, Share, Shares};
#[path = "ingress_gate.rs"]
pub mod gate;

use crate::caddy_admin::{Admin, AdminError};
use crate::ingress_tls::{self as tls, Certificate, TLS_SERVER, TlsConfig};
use crate::outcome::{Failure, permanent, retryable};
use agent_proto::IngressTls;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;

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
    /// Where HTTPS is served ([`crate::ingress_tls`]); `None`: a certificate is refused.
    tls: Option<TlsConfig>,
    /// The control plane's token on the certificates server, read or made at the first
    /// HTTPS publish or repair (not at start: an agent that never serves HTTPS writes nothing).
    certs_token: std::sync::OnceLock<String>,
}

/// Where a piece of Caddy's configuration of ours goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// A route of the plain server.
    Http,
    /// A route of the HTTPS server.
    Https,
    /// An automation policy of the `tls` app (a hostname's certificate, fetched per handshake).
    Cert,
    /// The control plane's route on the certificates server.
    Certs,
}

/// What one node has a hostname served with over HTTPS, kept beside its list
/// (`<upstreams>/<hostname>/tls/<node>`: `<digest> <hsts 0|1>`), so drift repair can rebuild
/// the routes without the lease.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Served {
    digest: String,
    hsts: bool,
}

/// What one node's list says: the generation it last published or removed (its fence), the
/// environment that did, and its upstreams (none once removed). During a canary of the
/// generation, `dials` are the old release's and `canary` the new one's, after a
/// `canary <weight>` line.
#[derive(Debug, Default, PartialEq, Eq)]
struct NodeList {
    generation: u64,
    environment: String,
    dials: Vec<String>,
    canary: Option<Canary>,
}

impl NodeList {
    fn parse(text: &str) -> NodeList {
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

    fn text(&self) -> String {
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

/// The `@id` of a hostname's route published by `control_plane`'s agents:
/// `pl-host.<control plane>.<hostname>`, in the hostname space (never a built-in route's) and
/// naming the control plane that owns it.
pub fn route_id(control_plane: &str, hostname: &str) -> String {
    format!("{HOST_ROUTE}{control_plane}.{hostname}")
}

/// An admin call, made again when the connection failed or was cut (Caddy restarts its admin
/// endpoint while it loads a configuration, and a call at that instant is cut): after 20, 40,
/// 80 and 160 ms, so a restart that is over at once costs little and a slow one still gets
/// 300 ms in all.
fn once_more<T>(method: &str, call: impl Fn() -> Result<T, AdminError>) -> Result<T, AdminError> {
    let mut wait = Duration::from_millis(20);
    loop {
        match call() {
            Err(e) if e.may_retry(method) && wait <= Duration::from_millis(160) => {
                std::thread::sleep(wait);
                wait *= 2;
            }
            other => return other,
        }
    }
}

/// An admin call that got no answer. An admin socket open to other users is refused for good
/// until its folder is closed (`caddy-admin-exposed`).
fn caddy(code: &'static str, e: AdminError) -> Failure {
    match e {
        AdminError::Exposed(why) => permanent("caddy-admin-exposed", why),
        e => retryable(code, format!("caddy admin: {e}")),
    }
}

fn disk(e: impl std::fmt::Display) -> Failure {
    retryable("ingress-write-failed", e.to_string())
}

/// A hostname as it may appear in a path and a Caddy placeholder: DNS letters, digits, `-`,
/// `.` and a leading `*.` wildcard (state validation allows no more; this guards the path).
fn checked(hostname: &str) -> Result<&str, Failure> {
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
fn replace(path: &Path, text: &str) -> Result<(), Failure> {
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
pub(crate) struct Turn(#[allow(dead_code)] std::fs::File);

fn lock_file(path: &Path) -> Result<std::fs::File, Failure> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(disk)
}

/// An exclusive lock on the file at `path` (made when missing), held until the file is dropped:
/// the agents sharing a machine take turns with it.
fn exclusive(path: &Path) -> Result<std::fs::File, Failure> {
    let file = lock_file(path)?;
    file.lock().map_err(disk)?;
    Ok(file)
}

/// [`exclusive`] when nobody holds it now; `None` when someone does.
fn exclusive_now(path: &Path) -> Result<Option<std::fs::File>, Failure> {
    let file = lock_file(path)?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(disk(e)),
    }
}

/// `dir` and the folders above it up to `root`, made and opened to Caddy's user.
fn open_folder(root: &Path, dir: &Path) -> Result<(), Failure> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).map_err(disk)?;
    for d in [root, dir] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).map_err(disk)?;
    }
    Ok(())
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

    /// Serves hostnames whose lease brings a certificate over HTTPS ([`crate::ingress_tls`]).
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

    /// Reads or makes the control plane's certificates token (before any piece names it).
    fn ensure_token(&self, t: &TlsConfig) -> Result<(), Failure> {
        if self.certs_token.get().is_none() {
            let token = tls::certs_token(&t.dir, self.plane())?;
            let _ = self.certs_token.set(token);
        }
        Ok(())
    }

    /// The token, once `ensure_token` has run (every HTTPS path runs it first).
    fn token(&self) -> &str {
        self.certs_token.get().map_or("", String::as_str)
    }

    fn hosts(&self, hostname: &str) -> Vec<String> {
        let mut hosts = vec![hostname.to_owned()];
        hosts.extend(self.host_suffix.iter().map(|s| format!("{hostname}{s}")));
        hosts
    }

    fn served_path(&self, hostname: &str) -> PathBuf {
        self.folder(hostname).join("tls").join(&self.node)
    }

    /// What this node serves `hostname` with over HTTPS (`None`: plain HTTP).
    fn served(&self, hostname: &str) -> Option<Served> {
        let text = std::fs::read_to_string(self.served_path(hostname)).ok()?;
        let mut parts = text.split_whitespace();
        let digest = parts.next().filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()))?;
        Some(Served {
            digest: digest.to_owned(),
            hsts: parts.next() == Some("1"),
        })
    }

    fn set_served(&self, hostname: &str, served: Option<&Served>) -> Result<(), Failure> {
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

    /// This node's certificate files for `hostname`: `<tls dir>/<hostname>/<node>/`.
    fn cert_folder(&self, tls: &TlsConfig, hostname: &str) -> PathBuf {
        tls.dir.join(hostname).join(&self.node)
    }

    /// Caddy's configuration of ours for `hostname` with `slots` upstream slots: the plain
    /// route alone, or (served over HTTPS) the certificate entry, the HTTPS route and the
    /// plain route's redirect, in the order they are put in place.
    fn pieces(&self, hostname: &str, slots: usize, served: Option<&Served>) -> Vec<(Place, String, Value)> {
        let mut pieces = self.pieces_without_challenges(hostname, slots, served);
        // Plain HTTP answers ACME challenges first (`ingress_acme.rs`).
        for (place, _, route) in &mut pieces {
            // (`route["handle"]` on a piece without one would add it: the place first.)
            if *place == Place::Http
                && let Some(handle) = route.get_mut("handle").and_then(Value::as_array_mut)
            {
                handle.insert(0, self.challenge_handler());
            }
        }
        pieces
    }

    fn pieces_without_challenges(
        &self,
        hostname: &str,
        slots: usize,
        served: Option<&Served>,
    ) -> Vec<(Place, String, Value)> {
        let id = route_id(self.plane(), hostname);
        match (served, &self.tls) {
            (Some(s), Some(t)) => {
                let policy_id = tls::cert_policy_id(self.plane(), hostname);
                let certs_id = tls::certs_route_id(self.plane());
                let https_id = tls::https_route_id(self.plane(), hostname);
                let mut route = self.route(hostname, slots);
                route["@id"] = json!(https_id);
                if let (true, Some(handle)) = (s.hsts, route["handle"].as_array_mut()) {
                    handle.insert(
                        0,
                        json!({"handler": "headers", "response": {"set": {"Strict-Transport-Security": [tls::HSTS]}}}),
                    );
                }
                // The policy names the file, not the certificate: a new one changes nothing here.
                let url = format!(
                    "http://{}/{}/{hostname}/{}",
                    t.certs_listen,
                    self.token(),
                    tls::serving_file(self.plane())
                );
                vec![
                    (
                        Place::Certs,
                        certs_id.clone(),
                        tls::certs_route(&certs_id, self.token(), &t.dir),
                    ),
                    (
                        Place::Cert,
                        policy_id.clone(),
                        tls::cert_policy(&policy_id, &self.hosts(hostname), &url),
                    ),
                    (Place::Https, https_id, route),
                    (
                        Place::Http,
                        id.clone(),
                        tls::redirect_route(&id, &self.hosts(hostname), &t.redirect_port()),
                    ),
                ]
            }
            _ => vec![(Place::Http, id, self.route(hostname, slots))],
        }
    }

    /// The `@id`s of ours for `hostname` that `pieces` does not hold: an HTTPS route and this
    /// node's certificate policy once a hostname is plain HTTP again, and the `load_files`
    /// entry earlier agents loaded its certificate with.
    fn stale(&self, hostname: &str, pieces: &[(Place, String, Value)]) -> Vec<String> {
        [
            tls::https_route_id(self.plane(), hostname),
            tls::cert_policy_id(self.plane(), hostname),
            tls::cert_entry_id(&self.node, hostname),
        ]
        .into_iter()
        .filter(|id| pieces.iter().all(|(_, p, _)| p != id))
        .collect()
    }

    /// Puts each piece in place (added when missing, replaced when it differs), then deletes
    /// `stale` ids; what was done: `"published"`, `"replaced"`, or `"adopted"` (all in place).
    fn apply(&self, pieces: &[(Place, String, Value)], stale: &[String], turn: &Turn) -> Result<&'static str, Failure> {
        let mut note = "adopted";
        for (place, id, wanted) in pieces {
            match self.get(&format!("/id/{id}"))? {
                Some(r) if &r == wanted => {}
                Some(_) => {
                    self.send("PATCH", &format!("/id/{id}"), Some(wanted))?;
                    note = "replaced";
                }
                None => {
                    match place {
                        Place::Http => self.send(
                            "PUT",
                            &format!("/config/apps/http/servers/{SERVER}/routes/0"),
                            Some(wanted),
                        )?,
                        Place::Https => {
                            self.ensure_tls_server(turn)?;
                            self.send(
                                "PUT",
                                &format!("/config/apps/http/servers/{TLS_SERVER}/routes/0"),
                                Some(wanted),
                            )?
                        }
                        Place::Cert => self.add_cert_policy(wanted, turn)?,
                        Place::Certs => {
                            self.ensure_certs_server(turn)?;
                            self.send(
                                "PUT",
                                &format!("/config/apps/http/servers/{}/routes/0", tls::CERTS_SERVER),
                                Some(wanted),
                            )?
                        }
                    }
                    if note == "adopted" {
                        note = "published";
                    }
                }
            }
        }
        for id in stale {
            if self.get(&format!("/id/{id}"))?.is_some() {
                self.send("DELETE", &format!("/id/{id}"), None)?;
                note = "replaced";
            }
        }
        Ok(note)
    }

    /// Puts a certificate policy first in the `tls` app's automation policies (before any
    /// catch-all policy of someone else's), making the path to it where it is missing (never
    /// replacing what another agent has there).
    fn add_cert_policy(&self, policy: &Value, _turn: &Turn) -> Result<(), Failure> {
        let base = "/config/apps/tls/automation/policies";
        if self.get(base)?.is_some() {
            self.send("PUT", &format!("{base}/0"), Some(policy))
        } else if self.get("/config/apps/tls/automation")?.is_some() {
            self.send("PUT", base, Some(&json!([policy])))
        } else if self.get("/config/apps/tls")?.is_some() {
            self.send(
                "PUT",
                "/config/apps/tls/automation",
                Some(&json!({"policies": [policy]})),
            )
        } else {
            self.send(
                "PUT",
                "/config/apps/tls",
                Some(&json!({"automation": {"policies": [policy]}})),
            )
        }
    }

    /// The certificates server of ours, created (with its catch-all) when Caddy has none.
    fn ensure_certs_server(&self, _turn: &Turn) -> Result<(), Failure> {
        let path = format!("/config/apps/http/servers/{}", tls::CERTS_SERVER);
        let Some(t) = &self.tls else {
            return Err(permanent("tls-not-configured", "this agent serves no HTTPS"));
        };
        match self.get(&format!("{path}/listen"))? {
            None => self.send("PUT", &path, Some(&tls::certs_server(&t.certs_listen))),
            Some(listen) if listen == json!([t.certs_listen]) => Ok(()),
            // The policies name this agent's address: with another one they would fetch nothing.
            Some(listen) => Err(permanent(
                "ingress-certs-listen-mismatch",
                format!(
                    "this machine's Caddy has the certificates server on {listen}, this agent's ingress_certs_listen is {}: the agents sharing a Caddy must say the same address",
                    t.certs_listen
                ),
            )),
        }
    }

    /// The HTTPS server of ours, created (with its catch-all) when Caddy has none.
    fn ensure_tls_server(&self, _turn: &Turn) -> Result<(), Failure> {
        let path = format!("/config/apps/http/servers/{TLS_SERVER}");
        if self.get(&path)?.is_some() {
            return Ok(());
        }
        let Some(t) = &self.tls else {
            return Err(permanent("tls-not-configured", "this agent serves no HTTPS"));
        };
        self.send("PUT", &path, Some(&tls::tls_server(&t.listen)))
    }

    /// Opens and writes the certificate a lease brings for `hostname` (checked first; nothing
    /// changes when it is unusable).
    fn certificate(&self, hostname: &str, sealed: &IngressTls) -> Result<Served, Failure> {
        let Some(t) = &self.tls else {
            return Err(permanent(
                "tls-not-configured",
                format!("{hostname} is to be served over HTTPS, and this agent has no ingress_tls_listen"),
            ));
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        let cert = Certificate::open(sealed, &t.identity, &self.hosts(hostname), now)?;
        let owner = self.admin.socket().parent().and_then(tls::caddy_owner);
        cert.write(&self.cert_folder(t, hostname), owner)?;
        Ok(Served {
            digest: cert.digest.clone(),
            hsts: cert.hsts,
        })
    }

    /// Removes this node's certificate files of `hostname` other than `keep`'s.
    fn prune_certificates(&self, hostname: &str, keep: Option<&Served>) {
        let Some(t) = &self.tls else { return };
        let folder = self.cert_folder(t, hostname);
        let Ok(dir) = std::fs::read_dir(&folder) else { return };
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let kept = keep.is_some_and(|s| name.starts_with(&format!("{}.", s.digest)));
            if !kept {
                let _ = std::fs::remove_file(e.path());
            }
        }
        if keep.is_none() {
            let _ = std::fs::remove_dir(&folder);
        }
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

    /// The route a hostname gets with `slots` upstream slots.
    pub fn route(&self, hostname: &str, slots: usize) -> Value {
        let dials: Vec<Value> = (0..slots)
            .map(|k| json!({"dial": format!("{{file.{}}}", self.slot(hostname, k).display())}))
            .collect();
        let mut hosts = vec![hostname.to_owned()];
        hosts.extend(self.host_suffix.iter().map(|s| format!("{hostname}{s}")));
        json!({
            "@id": route_id(self.plane(), hostname),
            "match": [{"host": hosts}],
            "handle": [{
                "handler": "reverse_proxy",
                "upstreams": dials,
                "stream_close_delay": STREAM_CLOSE_DELAY,
            }],
            "terminal": true,
        })
    }

    fn folder(&self, hostname: &str) -> PathBuf {
        self.upstreams.join(hostname)
    }

    fn slot(&self, hostname: &str, k: usize) -> PathBuf {
        self.folder(hostname).join(k.to_string())
    }

    fn lists(&self, hostname: &str) -> PathBuf {
        self.folder(hostname).join("nodes")
    }

    fn list_path(&self, hostname: &str) -> PathBuf {
        self.lists(hostname).join(&self.node)
    }

    /// This node's list for `hostname` (empty: never published here).
    fn own(&self, hostname: &str) -> NodeList {
        NodeList::parse(&std::fs::read_to_string(self.list_path(hostname)).unwrap_or_default())
    }

    /// The control plane part of a list's name (`<control plane>_<node>`).
    fn plane_of(owner: &str) -> &str {
        owner.split_once('_').map_or(owner, |(cp, _)| cp)
    }

    /// This agent's control plane (the first part of its owner name).
    fn plane(&self) -> &str {
        Self::plane_of(&self.node)
    }

    /// The upstreams for `hostname` of every node of this agent's control plane on the machine,
    /// in node order (what the slots share), and the first other control plane that publishes
    /// it here too, if any: a hostname is never shared between control planes. A list named
    /// as this node was before lists named their control plane (`<node>` alone) is this
    /// node's own from an earlier version, and goes.
    fn union(&self, hostname: &str) -> Result<(Shares, Option<String>), Failure> {
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
    fn lock(&self, hostname: &str) -> Result<std::fs::File, Failure> {
        open_folder(&self.upstreams, &self.folder(hostname))?;
        exclusive(&self.folder(hostname).join("lock"))
    }

    /// [`Ingress::lock`] when no node holds it now (a publish or removal of `hostname` is
    /// under way when one does); `None` then.
    fn lock_now(&self, hostname: &str) -> Result<Option<std::fs::File>, Failure> {
        open_folder(&self.upstreams, &self.folder(hostname))?;
        exclusive_now(&self.folder(hostname).join("lock"))
    }

    /// Writes this node's list (its fence and its upstreams), by a rename.
    fn set_own(&self, hostname: &str, list: &NodeList) -> Result<(), Failure> {
        open_folder(&self.folder(hostname), &self.lists(hostname))?;
        replace(&self.list_path(hostname), &list.text())
    }

    /// Points the slot files at `shares` (each release's share of `slots`, round robin over its
    /// upstreams); whether any changed.
    fn write_slots(&self, hostname: &str, shares: &Shares, slots: usize) -> Result<bool, Failure> {
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
    fn slot_count(&self, hostname: &str) -> usize {
        std::fs::read_dir(self.folder(hostname))
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_str().is_some_and(|n| n.parse::<usize>().is_ok()))
                    .count()
            })
            .unwrap_or(0)
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

    fn get(&self, path: &str) -> Result<Option<Value>, Failure> {
        let r = once_more("GET", || self.admin.call("GET", path, None)).map_err(|e| caddy("caddy-unavailable", e))?;
        match r.status {
            // A key that is not there reads as `null`: absent too.
            200 => Ok(Some(
                serde_json::from_slice::<Value>(&r.body)
                    .map_err(|e| retryable("caddy-unavailable", format!("caddy admin: GET {path}: {e}")))?,
            )
            .filter(|v| !v.is_null())),
            // Caddy answers 400 for a path into the configuration that does not exist (an
            // unknown key or `@id`), 404 for some: both mean absent.
            400 | 404 => Ok(None),
            s => Err(retryable(
                "caddy-unavailable",
                format!("caddy admin: GET {path} answered {s}"),
            )),
        }
    }

    fn send(&self, method: &str, path: &str, body: Option<&Value>) -> Result<(), Failure> {
        if !matches!((method, body), ("DELETE", None) | ("PUT" | "PATCH" | "POST", Some(_))) {
            return Err(permanent("ingress-internal", "unknown admin call"));
        }
        let r = once_more(method, || self.admin.call(method, path, body)).map_err(|e| caddy("caddy-unavailable", e))?;
        if (200..300).contains(&r.status) {
            Ok(())
        } else {
            let text = String::from_utf8_lossy(&r.body);
            Err(retryable(
                "caddy-refused",
                format!("{method} {path} answered {}: {text:.300}", r.status),
            ))
        }
    }

    /// Our server, created (with its 404 fallback) when Caddy has none. Agents sharing the
    /// machine take turns (a lock in the upstream folder), so one cannot replace the server
    /// another just made and routed.
    /// Waits for the machine's agents' turn at changing Caddy ([`Turn`]).
    pub(crate) fn turn(&self) -> Result<Turn, Failure> {
        open_folder(&self.upstreams, &self.upstreams)?;
        exclusive(&self.upstreams.join("server.lock")).map(Turn)
    }

    /// How the proxy's log names the canary's upstreams: Caddy logs a round trip under the
    /// upstream as configured, the slot's `{file.*}` placeholder, so the canary's are the slots
    /// that point at its upstreams now (a step's shares hold until the next step), and the
    /// upstreams themselves.
    fn canary_upstreams(&self, hostname: &str, c: &Canary) -> Vec<String> {
        let mut out = c.dials.clone();
        for k in 0..self.slot_count(hostname) {
            let path = self.slot(hostname, k);
            if std::fs::read_to_string(&path).is_ok_and(|d| c.dials.contains(&d)) {
                out.push(format!("{{file.{}}}", path.display()));
            }
        }
        out
    }

    /// The file the reverse proxy's round trips are logged to ([`gate`]).
    fn proxy_log(&self) -> PathBuf {
        let dir = self.admin.socket().parent().unwrap_or(&self.upstreams);
        dir.join(gate::FILE)
    }

    /// The logger of the proxy's round trips (what a canary's gates read), added with the
    /// server of ours, in the same turn, before any route of ours carries a request: a change
    /// of Caddy's configuration is a reload, which fails requests that arrive at that
    /// instant, so it never comes at a canary step.
    fn ensure_proxy_log(&self) -> Result<(), Failure> {
        let path = format!("/config/logging/logs/{}", gate::LOGGER);
        if self.get(&path)?.is_some() {
            return Ok(());
        }
        let logger = gate::logger(&self.proxy_log());
        if self.get("/config/logging/logs")?.is_some() {
            self.send("PUT", &path, Some(&logger))
        } else if self.get("/config/logging")?.is_some() {
            self.send("PUT", "/config/logging/logs", Some(&json!({ gate::LOGGER: logger })))
        } else {
            self.send(
                "PUT",
                "/config/logging",
                Some(&json!({"logs": { gate::LOGGER: logger }})),
            )
        }
    }

    fn ensure_server(&self) -> Result<(), Failure> {
        if self.get(&format!("/config/apps/http/servers/{SERVER}"))?.is_some() {
            return Ok(());
        }
        open_folder(&self.upstreams, &self.upstreams)?;
        let _held = exclusive(&self.upstreams.join("server.lock"))?;
        if self.get(&format!("/config/apps/http/servers/{SERVER}"))?.is_some() {
            return Ok(());
        }
        self.ensure_proxy_log()?;
        let server = json!({
            "listen": self.listen,
            "routes": [{"@id": FALLBACK, "handle": [{"handler": "static_response", "status_code": 404}]}],
            "automatic_https": {"disable": true},
        });
        if self.get("/config/apps/http/servers")?.is_some() {
            self.send("PUT", &format!("/config/apps/http/servers/{SERVER}"), Some(&server))
        } else if self.get("/config/apps/http")?.is_some() {
            self.send("PUT", "/config/apps/http/servers", Some(&json!({ SERVER: server })))
        } else if self.get("/config/apps")?.is_some() {
            self.send(
                "PUT",
                "/config/apps/http",
                Some(&json!({"servers": { SERVER: server }})),
            )
        } else {
            self.send(
                "POST",
                "/config/apps",
                Some(&json!({"http": {"servers": { SERVER: server }}})),
            )
        }
    }

    /// The number of upstream slots the hostname's route has now (0: no route of ours).
    fn slots(&self, route: Option<&Value>) -> usize {
        route
            .and_then(|r| r.get("handle"))
            .and_then(Value::as_array)
            .and_then(|h| h.iter().find_map(|x| x.get("upstreams")))
            .and_then(Value::as_array)
            .map_or(0, Vec::len)
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
        self.publish_share(environment, hostname, generation, dials, sealed, Share::Whole, None)
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
        gate: Option<&agent_proto::task::CanaryGate>,
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
        // A canary's gates before anything changes: what the ingress measured of this node's
        // canary of this generation since its step before.
        let own = self.own(hostname);
        let gate_note = match (gate, own.canary.as_ref().filter(|_| own.generation == generation)) {
            (Some(_), Some(_)) if self.get(&format!("/config/logging/logs/{}", gate::LOGGER))?.is_none() => {
                "; gates not judged: this machine's Caddy has no proxy log (it comes with the ingress server: a Caddy restarted without its saved configuration gets it back then)".to_owned()
            }
            (Some(g), Some(c)) => match gate::judge(
                g,
                &gate::measure(&self.proxy_log(), &self.canary_upstreams(hostname, c), c.since_ms),
            ) {
                Ok(note) => format!("; {note}"),
                Err(why) => {
                    return Err(permanent(
                        "canary-gate-failed",
                        format!("{hostname}: the new release's {why}"),
                    ));
                }
            },
            _ => String::new(),
        };
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
        let weight = match share {
            Share::Whole => None,
            Share::Canary(w) => Some(w),
            Share::Repair => own
                .canary
                .as_ref()
                .filter(|_| own.generation == generation)
                .map(|c| c.weight),
        };
        // The release this node published before, while it still serves: kept beside a
        // canary (a canary of a newer commit, mid-canary, keeps it too).
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
        let mut mismatched: Vec<String> = Vec::new();
        let wanted = all.slot_dials(slots);
        if !(0..slots).all(|k| std::fs::read_to_string(self.slot(hostname, k)).ok().as_deref() == Some(&wanted[k])) {
            mismatched.push("its upstream files".into());
        }
        for (_, pid, wanted) in &pieces {
            if self.get(&format!("/id/{pid}"))?.as_ref() != Some(wanted) {
                mismatched.push(pid.clone());
            }
        }
        for s in &stale {
            if self.get(&format!("/id/{s}"))?.is_some() {
                mismatched.push(format!("{s} (still there)"));
            }
        }
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
            "{id} {note}: generation {generation} on {on} of {slots} slot(s) to {}{canary_note}{}{gate_note}",
            dials.join(", "),
            if served.is_some() { ", over HTTPS" } else { "" }
        ))
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
