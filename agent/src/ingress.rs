//! The ingress executor: routes in Caddy (≥ 2.8) through its admin API, with the upstreams of
//! each route in files Caddy reads on every request.
//!
//! Why files: Caddy applies every admin-API change as a whole new configuration, and each such
//! reload resets a few connections that arrive at that instant (measured with Debian's 2.6.2
//! and 2.11.7: one to three failed requests per change under load) and closes every hijacked
//! stream (WebSockets) of every site. So a generation switch must not reload Caddy. One route
//! per hostname (`@id` `pl-<hostname>`) names its upstreams with Caddy's `{file.*}`
//! placeholder, `{file.<dir>/<hostname>/<slot>}`, 12 slots shared by the web replicas; the
//! switch is an atomic rename of each slot file, which Caddy sees on the next request. Requests
//! in flight finish on the generation they started with. Caddy's configuration changes only
//! when a hostname first appears on this node, leaves it, or gains more than 12 replicas there
//! (fewer replicas share the slots); for those reloads every route of ours
//! sets `stream_close_delay`, so the streams of other environments stay open.
//!
//! A fence (`<dir>/<hostname>/generation`, the newest generation published or removed) keeps a
//! stale retry from restoring older upstreams. Only routes whose `@id` starts with `pl-` are
//! ever touched; the last route of ours answers 404 for a hostname nobody publishes.

use crate::outcome::{Failure, permanent, retryable};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The server of ours in Caddy's HTTP app.
pub const SERVER: &str = "pushleft";
/// The catch-all route's `@id`.
pub const FALLBACK: &str = "pl-fallback-404";
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

/// Caddy's admin API (`http://127.0.0.1:2019` by default), where our server listens, and the
/// folder of upstream files (readable by Caddy).
pub struct Ingress {
    admin: String,
    listen: Vec<String>,
    upstreams: PathBuf,
    /// Also match `<hostname><suffix>` (`pl up`'s `.localhost`, which resolves to loopback).
    host_suffix: Option<String>,
}

pub fn route_id(hostname: &str) -> String {
    format!("pl-{hostname}")
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

/// An admin call, made again once after 100 ms when the connection failed: Caddy restarts its
/// admin endpoint while it loads a configuration, and a call at that instant is cut.
fn once_more<T>(call: impl Fn() -> Result<T, ureq::Error>) -> Result<T, ureq::Error> {
    match call() {
        Err(ureq::Error::Io(_) | ureq::Error::ConnectionFailed) => {
            std::thread::sleep(Duration::from_millis(100));
            call()
        }
        other => other,
    }
}

fn caddy(code: &'static str, e: impl std::fmt::Display) -> Failure {
    retryable(code, format!("caddy admin: {e}"))
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
    /// `upstreams` must be an absolute path without braces (it goes into a Caddy placeholder).
    pub fn new(admin: String, listen: Vec<String>, upstreams: PathBuf) -> Result<Self, String> {
        let text = upstreams.to_string_lossy();
        if !upstreams.is_absolute() || text.contains(['{', '}', ' ']) {
            return Err(format!(
                "the ingress upstream folder {text:?} must be an absolute path without braces or spaces"
            ));
        }
        Ok(Ingress {
            admin,
            listen,
            upstreams,
            host_suffix: None,
        })
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
            "@id": route_id(hostname),
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

    fn fence(&self, hostname: &str) -> PathBuf {
        self.folder(hostname).join("generation")
    }

    /// The newest generation published or removed for `hostname` here (0: none), and the
    /// environment that did (`<generation> <environment>`).
    fn fenced(&self, hostname: &str) -> (u64, String) {
        let text = std::fs::read_to_string(self.fence(hostname)).unwrap_or_default();
        let mut words = text.split_whitespace();
        let generation = words.next().and_then(|g| g.parse().ok()).unwrap_or(0);
        (generation, words.next().unwrap_or_default().to_owned())
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
            let slots = self.slot_count(&hostname);
            if slots == 0 || checked(&hostname).is_err() {
                continue;
            }
            let (_, environment) = self.fenced(&hostname);
            let id = route_id(&hostname);
            let wanted = self.route(&hostname, slots);
            let fixed = match self.get(&format!("/id/{id}")) {
                Ok(Some(r)) if r == wanted => continue,
                Ok(Some(_)) => self.send("PATCH", &format!("/id/{id}"), Some(&wanted)),
                Ok(None) => self.ensure_server().and_then(|()| {
                    self.send(
                        "PUT",
                        &format!("/config/apps/http/servers/{SERVER}/routes/0"),
                        Some(&wanted),
                    )
                }),
                Err(_) => return out,
            };
            match fixed {
                Ok(()) => out.push((environment, format!("ingress route {id} put back"))),
                Err(f) => tracing::warn!(hostname = %hostname, code = f.code, "cannot repair the ingress route"),
            }
        }
        out
    }

    /// Whether Caddy's admin API answers (the heartbeat offers `ingress` only then).
    pub async fn answers(&self) -> bool {
        let url = self.url("/config/");
        tokio::task::spawn_blocking(move || agent().get(&url).call().is_ok_and(|r| r.status().as_u16() == 200))
            .await
            .unwrap_or(false)
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.admin.trim_end_matches('/'))
    }

    fn get(&self, path: &str) -> Result<Option<Value>, Failure> {
        let url = self.url(path);
        let mut r = once_more(|| agent().get(&url).call()).map_err(|e| caddy("caddy-unavailable", e))?;
        match r.status().as_u16() {
            200 => Ok(Some(
                r.body_mut().read_json().map_err(|e| caddy("caddy-unavailable", e))?,
            )),
            // Caddy answers 400 for a path into the configuration that does not exist (an
            // unknown key or `@id`), 404 for some: both mean absent.
            400 | 404 => Ok(None),
            s => Err(caddy("caddy-unavailable", format!("GET {path} answered {s}"))),
        }
    }

    fn send(&self, method: &str, path: &str, body: Option<&Value>) -> Result<(), Failure> {
        if !matches!((method, body), ("DELETE", _) | ("PUT" | "PATCH" | "POST", Some(_))) {
            return Err(permanent("ingress-internal", "unknown admin call"));
        }
        let a = agent();
        let url = self.url(path);
        let r = once_more(|| match (method, body) {
            ("DELETE", _) => a.delete(&url).call(),
            ("PUT", Some(b)) => a.put(&url).send_json(b),
            ("PATCH", Some(b)) => a.patch(&url).send_json(b),
            ("POST", Some(b)) => a.post(&url).send_json(b),
            _ => Err(ureq::Error::BadUri("unknown admin call".into())),
        })
        .map_err(|e| caddy("caddy-unavailable", e))?;
        let status = r.status().as_u16();
        if (200..300).contains(&status) {
            Ok(())
        } else {
            let mut r = r;
            let text = r.body_mut().read_to_string().unwrap_or_default();
            Err(retryable(
                "caddy-refused",
                format!("{method} {path} answered {status}: {text:.300}"),
            ))
        }
    }

    /// Our server, created (with its 404 fallback) when Caddy has none.
    fn ensure_server(&self) -> Result<(), Failure> {
        if self.get(&format!("/config/apps/http/servers/{SERVER}"))?.is_some() {
            return Ok(());
        }
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
            .and_then(|r| r.pointer("/handle/0/upstreams"))
            .and_then(Value::as_array)
            .map_or(0, Vec::len)
    }

    /// Points `hostname` at `dials` (`ip:port` of generation `generation`'s web replicas on
    /// this node): the slot files first (the switch, with no reload when the route has slots
    /// enough), then the fence, then the route when it is missing or short of slots. Adopted
    /// when all of it is in place already; read back; refused for a generation older than the
    /// fence.
    pub fn publish(
        &self,
        environment: &str,
        hostname: &str,
        generation: u64,
        dials: &[String],
    ) -> Result<String, Failure> {
        let hostname = checked(hostname)?;
        if dials.is_empty() {
            return Err(permanent(
                "no-upstream",
                format!("no web replica of {hostname} runs on this node"),
            ));
        }
        let (fenced, _) = self.fenced(hostname);
        if fenced > generation {
            return Err(permanent(
                "stale-generation",
                format!("generation {fenced} of {hostname} is published or removed already; {generation} is older"),
            ));
        }
        self.ensure_server()?;
        let id = route_id(hostname);
        let current = self.get(&format!("/id/{id}"))?;
        let slots = self.slots(current.as_ref()).max(dials.len()).max(SLOTS);
        let wanted_files: Vec<&String> = (0..slots).map(|k| &dials[k % dials.len()]).collect();
        open_folder(&self.upstreams, &self.folder(hostname))?;
        let mut changed = false;
        for (k, dial) in wanted_files.iter().enumerate() {
            let path = self.slot(hostname, k);
            if std::fs::read_to_string(&path).ok().as_deref() != Some(dial.as_str()) {
                replace(&path, dial)?;
                changed = true;
            }
        }
        if fenced != generation {
            replace(&self.fence(hostname), &format!("{generation} {environment}"))?;
        }
        let wanted = self.route(hostname, slots);
        let note = match current {
            Some(r) if r == wanted => {
                if changed {
                    "switched"
                } else {
                    "adopted"
                }
            }
            Some(_) => {
                self.send("PATCH", &format!("/id/{id}"), Some(&wanted))?;
                "replaced"
            }
            None => {
                self.send(
                    "PUT",
                    &format!("/config/apps/http/servers/{SERVER}/routes/0"),
                    Some(&wanted),
                )?;
                "published"
            }
        };
        let files_back = wanted_files
            .iter()
            .enumerate()
            .all(|(k, d)| std::fs::read_to_string(self.slot(hostname, k)).ok().as_deref() == Some(d.as_str()));
        if changed && fenced != 0 {
            std::thread::sleep(DRAIN);
        }
        match self.get(&format!("/id/{id}"))? {
            Some(r) if r == wanted && files_back => Ok(format!(
                "{id} {note}: generation {generation} on {} slot(s) to {}",
                slots,
                dials.join(", ")
            )),
            _ => Err(permanent(
                "ingress-readback-mismatch",
                format!("{id} or its upstream files read back otherwise"),
            )),
        }
    }

    /// Takes `hostname` off this node for generation `generation` (it no longer serves the
    /// hostname here, or the environment is torn down): the route, then its upstream files;
    /// the fence stays so a stale publish cannot bring it back. Kept when a newer generation
    /// published it; gone already is done.
    pub fn remove(&self, environment: &str, hostname: &str, generation: u64) -> Result<String, Failure> {
        let hostname = checked(hostname)?;
        let (fenced, _) = self.fenced(hostname);
        if fenced > generation {
            return Ok(format!(
                "{hostname} kept: generation {fenced} published it after {generation}"
            ));
        }
        let id = route_id(hostname);
        let mut removed = false;
        if self.get(&format!("/id/{id}"))?.is_some() {
            match self.send("DELETE", &format!("/id/{id}"), None) {
                Ok(()) => removed = true,
                Err(_) if self.get(&format!("/id/{id}"))?.is_none() => {}
                Err(f) => return Err(f),
            }
        }
        open_folder(&self.upstreams, &self.folder(hostname))?;
        replace(&self.fence(hostname), &format!("{generation} {environment}"))?;
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
        Ok(if removed {
            format!("{id} removed")
        } else {
            format!("no route of {hostname}")
        })
    }
}
