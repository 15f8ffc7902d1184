//! ACME HTTP-01 challenges at the ingress: the control plane orders a hostname's certificate
//! once and asks every node serving that hostname to answer the CA's challenge
//! (`place-acme-challenge`), so whichever node the CA's request reaches answers it.
//!
//! The answer is a file, `<upstreams>/.acme/.well-known/acme-challenge/<token>`, served by a
//! `file_server` whose route matches only when that file exists (Caddy's `file` matcher), so
//! placing a challenge writes a file and reloads nothing. Two places serve it: a handler at the
//! head of every plain route of ours (a hostname already published answers before its proxy or
//! its HTTPS redirect), and a route of its own, `pl-acme.<control plane>`, for hostnames not
//! published yet (a new hostname's first certificate is ordered before its replicas are up).
//! The folder is this control plane's (its upstream folder), so two control planes sharing a
//! Caddy answer only their own tokens. The key authorization is public by design (the CA reads
//! it over plain HTTP); files older than [`KEEP`] are swept at each placement.

use super::{Ingress, SERVER, checked, disk, open_folder};
use crate::outcome::{Failure, permanent, retryable};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

/// The `@id` prefix of the route answering challenges for hostnames with no route of ours yet:
/// `pl-acme.<control plane>` (differs from `pl-host.` and `pl-builtin.` before either ends).
pub const ACME_ROUTE: &str = "pl-acme.";
/// The path challenges are asked at (RFC 8555 8.3).
pub const CHALLENGE_PATH: &str = "/.well-known/acme-challenge/";
/// How long a placed challenge's file is kept: an order is over long before.
pub const KEEP: Duration = Duration::from_secs(3600);
/// How long the agent waits for its own Caddy to answer the challenge it placed.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

impl Ingress {
    /// The folder Caddy serves challenges from (the file server's root).
    fn challenge_root(&self) -> PathBuf {
        self.upstreams.join(".acme")
    }

    /// A request for a challenge whose file exists under this control plane's folder.
    fn challenge_match(&self) -> Value {
        let root = self.challenge_root();
        json!([{"path": [format!("{CHALLENGE_PATH}*")], "file": {"root": root}}])
    }

    /// The handler put first in each plain route of ours: serves a placed challenge and lets
    /// every other request through to the route's own handlers. The path is matched before the
    /// file is looked for (nested routes: Caddy does not promise an order within one matcher
    /// set), so an ordinary request costs a prefix comparison and no file system call.
    pub(super) fn challenge_handler(&self) -> Value {
        json!({
            "handler": "subroute",
            "routes": [{
                "match": [{"path": [format!("{CHALLENGE_PATH}*")]}],
                "handle": [{
                    "handler": "subroute",
                    "routes": [{
                        "match": [{"file": {"root": self.challenge_root()}}],
                        "handle": [{"handler": "file_server", "root": self.challenge_root()}],
                    }],
                }],
            }],
        })
    }

    /// The route answering challenges of hostnames with no route of ours yet.
    fn challenge_route(&self) -> Value {
        json!({
            "@id": format!("{ACME_ROUTE}{}", self.plane()),
            "match": self.challenge_match(),
            "handle": [{"handler": "file_server", "root": self.challenge_root()}],
            "terminal": true,
        })
    }

    /// Serves `key_authorization` for `token` to the CA's request for `hostname`, then asks
    /// this node's own listener for it as the CA will: done only when Caddy answers it.
    pub fn place_challenge(&self, hostname: &str, token: &str, key_authorization: &str) -> Result<String, Failure> {
        let hostname = checked(hostname)?;
        let well_known = agent_proto::is_acme_token(token)
            && key_authorization
                .split_once('.')
                .is_some_and(|(t, thumb)| t == token && agent_proto::is_acme_token(thumb));
        if !well_known {
            return Err(permanent(
                "acme-challenge-invalid",
                format!("the challenge for {hostname} is not an ACME token and key authorization"),
            ));
        }
        let dir = self.challenge_root().join(".well-known/acme-challenge");
        open_folder(&self.upstreams, &self.challenge_root())?;
        open_folder(&self.challenge_root(), &dir)?;
        self.sweep_challenges(&dir);
        // Nodes sharing this folder may place one token at once: each writes a file of its own
        // and renames it into place.
        let tmp = dir.join(format!(".{token}.{}.tmp", self.node));
        std::fs::write(&tmp, key_authorization).map_err(disk)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).map_err(disk)?;
        std::fs::rename(&tmp, dir.join(token)).map_err(disk)?;
        self.ensure_server()?;
        let route = self.challenge_route();
        let id = format!("{ACME_ROUTE}{}", self.plane());
        // Placements run side by side (one per hostname and token, and agents share a Caddy):
        // looking for the route and adding it is one step under the server lock, or two adds
        // would both miss it and the second would be refused as a duplicate `@id`.
        {
            let _turn = self.turn()?;
            match self.get(&format!("/id/{id}"))? {
                Some(r) if r == route => {}
                Some(_) => self.send("PATCH", &format!("/id/{id}"), Some(&route))?,
                None => self.send(
                    "PUT",
                    &format!("/config/apps/http/servers/{SERVER}/routes/0"),
                    Some(&route),
                )?,
            }
        }
        let answered = self.ask_own_listener(hostname, token);
        if answered.as_deref() != Some(key_authorization) {
            return Err(retryable(
                "acme-challenge-unanswered",
                format!(
                    "this node's ingress does not answer the challenge for {hostname} ({})",
                    answered.map_or_else(
                        || "no answer".to_owned(),
                        |a| format!("{} bytes of something else", a.len())
                    )
                ),
            ));
        }
        Ok(format!(
            "ACME challenge for {hostname} answered at {CHALLENGE_PATH}{token}"
        ))
    }

    /// Removes challenge files older than [`KEEP`] (an order long over), whatever their token.
    fn sweep_challenges(&self, dir: &std::path::Path) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > KEEP);
            if old {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    /// What this node's first plain listener answers for the challenge, asked with the
    /// hostname as the CA asks (`None`: no 200 answer).
    fn ask_own_listener(&self, hostname: &str, token: &str) -> Option<String> {
        let listen = self.listen.first()?;
        let (host, port) = listen.rsplit_once(':')?;
        let host = match host {
            "" | "0.0.0.0" => "127.0.0.1",
            "[::]" => "[::1]",
            h => h,
        };
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(CHECK_TIMEOUT))
            .max_redirects(0)
            .http_status_as_error(false)
            .build()
            .into();
        let mut reply = agent
            .get(&format!("http://{host}:{port}{CHALLENGE_PATH}{token}"))
            .header("Host", hostname)
            .call()
            .ok()?;
        if reply.status() != 200 {
            return None;
        }
        reply.body_mut().with_config().limit(4096).read_to_string().ok()
    }
}
