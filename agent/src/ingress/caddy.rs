//! The ingress's part of Caddy's configuration: the pieces a hostname needs (its plain and
//! HTTPS routes, a certificate policy, the control plane's route on the certificates server),
//! which of ours are stale, applying them through the admin API (each call once more on a
//! dropped connection), our servers and the proxy's log, and a hostname's certificate unsealed
//! into its folder.

use super::caddy_admin::AdminError;
use super::canary::Canary;
use super::files::{Served, Turn};
use super::tls::{Certificate, TLS_SERVER, TlsConfig};
use super::*;
use crate::outcome::{Failure, permanent, retryable};
use agent_proto::IngressTls;
use serde_json::{Value, json};
use std::path::PathBuf;

/// Where a piece of Caddy's configuration of ours goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Place {
    /// A route of the plain server.
    Http,
    /// A route of the HTTPS server.
    Https,
    /// An automation policy of the `tls` app (a hostname's certificate, fetched per handshake).
    Cert,
    /// The control plane's route on the certificates server.
    Certs,
}

/// An admin call, made again when the connection failed or was cut (Caddy restarts its admin
/// endpoint while it loads a configuration, and a call at that instant is cut): after 20, 40,
/// 80 and 160 ms, so a restart that is over at once costs little and a slow one still gets
/// 300 ms in all.
pub(super) fn once_more<T>(method: &str, call: impl Fn() -> Result<T, AdminError>) -> Result<T, AdminError> {
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
pub(super) fn caddy(code: &'static str, e: AdminError) -> Failure {
    match e {
        AdminError::Exposed(why) => permanent("caddy-admin-exposed", why),
        e => retryable(code, format!("caddy admin: {e}")),
    }
}

impl Ingress {
    /// Reads or makes the control plane's certificates token (before any piece names it).
    pub(super) fn ensure_token(&self, t: &TlsConfig) -> Result<(), Failure> {
        if self.certs_token.get().is_none() {
            let token = tls::certs_token(&t.dir, self.plane())?;
            let _ = self.certs_token.set(token);
        }
        Ok(())
    }

    /// The token, once `ensure_token` has run (every HTTPS path runs it first).
    pub(super) fn token(&self) -> &str {
        self.certs_token.get().map_or("", String::as_str)
    }

    pub(super) fn hosts(&self, hostname: &str) -> Vec<String> {
        let mut hosts = vec![hostname.to_owned()];
        hosts.extend(self.host_suffix.iter().map(|s| format!("{hostname}{s}")));
        hosts
    }

    /// This node's certificate files for `hostname`: `<tls dir>/<hostname>/<node>/`.
    pub(super) fn cert_folder(&self, tls: &TlsConfig, hostname: &str) -> PathBuf {
        tls.dir.join(hostname).join(&self.node)
    }

    /// Caddy's configuration of ours for `hostname` with `slots` upstream slots: the plain
    /// route alone, or (served over HTTPS) the certificate entry, the HTTPS route and the
    /// plain route's redirect, in the order they are put in place.
    pub(super) fn pieces(&self, hostname: &str, slots: usize, served: Option<&Served>) -> Vec<(Place, String, Value)> {
        let mut pieces = self.pieces_without_challenges(hostname, slots, served);
        // Plain HTTP answers ACME challenges first (`ingress/acme.rs`).
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

    pub(super) fn pieces_without_challenges(
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
    pub(super) fn stale(&self, hostname: &str, pieces: &[(Place, String, Value)]) -> Vec<String> {
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
    pub(super) fn apply(
        &self,
        pieces: &[(Place, String, Value)],
        stale: &[String],
        turn: &Turn,
    ) -> Result<&'static str, Failure> {
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
    pub(super) fn add_cert_policy(&self, policy: &Value, _turn: &Turn) -> Result<(), Failure> {
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
    pub(super) fn ensure_certs_server(&self, _turn: &Turn) -> Result<(), Failure> {
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
    pub(super) fn ensure_tls_server(&self, _turn: &Turn) -> Result<(), Failure> {
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
    pub(super) fn certificate(&self, hostname: &str, sealed: &IngressTls) -> Result<Served, Failure> {
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
    pub(super) fn prune_certificates(&self, hostname: &str, keep: Option<&Served>) {
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

    pub(super) fn get(&self, path: &str) -> Result<Option<Value>, Failure> {
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

    pub(super) fn send(&self, method: &str, path: &str, body: Option<&Value>) -> Result<(), Failure> {
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

    /// How the proxy's log names the canary's upstreams: Caddy logs a round trip under the
    /// upstream as configured, the slot's `{file.*}` placeholder, so the canary's are the slots
    /// that point at its upstreams now (a step's shares hold until the next step), and the
    /// upstreams themselves.
    pub(super) fn canary_upstreams(&self, hostname: &str, c: &Canary) -> Vec<String> {
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
    pub(super) fn proxy_log(&self) -> PathBuf {
        let dir = self.admin.socket().parent().unwrap_or(&self.upstreams);
        dir.join(gate::FILE)
    }

    /// The logger of the proxy's round trips (what a canary's gates read), added with the
    /// server of ours, in the same turn, before any route of ours carries a request: a change
    /// of Caddy's configuration is a reload, which fails requests that arrive at that
    /// instant, so it never comes at a canary step.
    pub(super) fn ensure_proxy_log(&self) -> Result<(), Failure> {
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

    pub(super) fn ensure_server(&self) -> Result<(), Failure> {
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
    pub(super) fn slots(&self, route: Option<&Value>) -> usize {
        route
            .and_then(|r| r.get("handle"))
            .and_then(Value::as_array)
            .and_then(|h| h.iter().find_map(|x| x.get("upstreams")))
            .and_then(Value::as_array)
            .map_or(0, Vec::len)
    }
}
