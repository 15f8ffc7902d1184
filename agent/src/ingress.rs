//! The ingress executor: routes in Caddy through its admin API. One server of ours
//! (`pushleft`) holds one route per hostname and generation, with the `@id`
//! `pl-<hostname>-g<generation>`, in front of older ones (index 0), and a last route of ours
//! that answers 404 for any hostname nobody publishes. A route is read back after it is
//! written; the routes of older generations are removed once the new one serves (the cleanup
//! step, `remove ingress`). Only routes whose `@id` starts with `pl-` are ever touched.
//!
//! Not yet here (the node-agent issue): keeping other environments' open streams across a
//! route change. Caddy applies every change as a new configuration, and Debian's 2.6.2 closes
//! streaming connections on each; the intended mechanism is Caddy ≥ 2.7's
//! `stream_close_delay`.

use crate::outcome::{Failure, permanent, retryable};
use serde_json::{Value, json};
use std::time::Duration;

/// The server of ours in Caddy's HTTP app.
pub const SERVER: &str = "pushleft";
/// The catch-all route's `@id`.
pub const FALLBACK: &str = "pl-fallback-404";

/// Caddy's admin API (`http://127.0.0.1:2019` by default) and where our server listens.
pub struct Ingress {
    pub admin: String,
    /// Addresses our server listens on, e.g. `[":80"]`.
    pub listen: Vec<String>,
}

pub fn route_id(hostname: &str, generation: u64) -> String {
    format!("pl-{hostname}-g{generation}")
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

fn caddy(code: &'static str, e: impl std::fmt::Display) -> Failure {
    retryable(code, format!("caddy admin: {e}"))
}

/// The route a hostname gets for one generation.
pub fn route(hostname: &str, generation: u64, dials: &[String]) -> Value {
    json!({
        "@id": route_id(hostname, generation),
        "match": [{"host": [hostname]}],
        "handle": [{
            "handler": "reverse_proxy",
            "upstreams": dials.iter().map(|d| json!({"dial": d})).collect::<Vec<_>>(),
        }],
        "terminal": true,
    })
}

impl Ingress {
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
        let mut r = agent()
            .get(&self.url(path))
            .call()
            .map_err(|e| caddy("caddy-unavailable", e))?;
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
        let a = agent();
        let url = self.url(path);
        let r = match (method, body) {
            ("DELETE", _) => a.delete(&url).call(),
            ("PUT", Some(b)) => a.put(&url).send_json(b),
            ("PATCH", Some(b)) => a.patch(&url).send_json(b),
            ("POST", Some(b)) => a.post(&url).send_json(b),
            _ => return Err(permanent("ingress-internal", "unknown admin call")),
        }
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

    /// Publishes `hostname` for `generation` to `dials` (`ip:port` of this generation's web
    /// replicas), in front of older generations' routes; adopted when the same route is there,
    /// replaced when it differs. Read back.
    pub fn publish(&self, hostname: &str, generation: u64, dials: &[String]) -> Result<String, Failure> {
        if dials.is_empty() {
            return Err(permanent(
                "no-upstream",
                format!("no web replica of {hostname} runs on this node"),
            ));
        }
        self.ensure_server()?;
        let id = route_id(hostname, generation);
        let wanted = route(hostname, generation, dials);
        let note = match self.get(&format!("/id/{id}"))? {
            Some(r) if r == wanted => "adopted",
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
        match self.get(&format!("/id/{id}"))? {
            Some(r) if r == wanted => Ok(format!("{id} {note}")),
            _ => Err(permanent(
                "ingress-readback-mismatch",
                format!("{id} reads back otherwise"),
            )),
        }
    }

    /// The `@id`s of our routes for `hostname`, with their generations.
    fn ours(&self, hostname: &str) -> Result<Vec<(String, u64)>, Failure> {
        let routes = self
            .get(&format!("/config/apps/http/servers/{SERVER}/routes"))?
            .unwrap_or(Value::Array(Vec::new()));
        let prefix = format!("pl-{hostname}-g");
        Ok(routes
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r.get("@id").and_then(Value::as_str))
            .filter_map(|id| {
                id.strip_prefix(&prefix)
                    .and_then(|g| g.parse().ok())
                    .map(|g| (id.to_owned(), g))
            })
            .collect())
    }

    /// Removes `hostname`'s routes of generations older than `generation` (all of them, for a
    /// teardown's generation); gone already is done.
    pub fn remove(&self, hostname: &str, generation: u64) -> Result<String, Failure> {
        let mut removed = Vec::new();
        for (id, g) in self.ours(hostname)? {
            if g < generation {
                match self.send("DELETE", &format!("/id/{id}"), None) {
                    Ok(()) => removed.push(id),
                    Err(_) if self.get(&format!("/id/{id}"))?.is_none() => {}
                    Err(f) => return Err(f),
                }
            }
        }
        Ok(if removed.is_empty() {
            format!("no older route of {hostname}")
        } else {
            format!("removed {}", removed.join(", "))
        })
    }
}
