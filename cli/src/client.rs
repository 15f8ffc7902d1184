//! `pl`'s client of the operator API: one typed method per endpoint, each reading the
//! `operator_proto` type the daemon serialises (never JSON indexed by string). Errors come
//! back as the daemon's typed body: `path: status message [code]`.

use anyhow::{Context, Result, anyhow, bail};
use operator_proto::ErrorBody;
use operator_proto::backups::{Backups, JobAsked, Restore, Restoring, RunBackup};
use operator_proto::domains::{Certificates, Domains};
use operator_proto::events::EventsPage;
use operator_proto::jobs::JobsPage;
use operator_proto::nodes::{MeshKeyAsked, NodeToken, Nodes};
use operator_proto::revisions::{ApproveRewrite, Approved, RevisionsPage, Rewrites};
use operator_proto::rollbacks::{RollbackAnswer, RollbackAsk, RolloutAnswer, RolloutAsk};
use operator_proto::status::{ReconcileAsked, Status};
use operator_proto::volumes::{MoveVolume, RemoveVolume, VolumeMoving, VolumeRemoved, Volumes};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::path::PathBuf;
use std::sync::Arc;
use zeroize::Zeroizing;

#[derive(clap::Args, Debug, Clone)]
pub struct ServerArgs {
    /// The reconciler's API (default https://127.0.0.1:7443; inside a repository whose local
    /// control plane runs, and with no server, token or `--local` given, that one).
    #[arg(long, env = "PL_SERVER", global = true)]
    pub server: Option<String>,
    /// The CA that signed the API's certificate (PEM); the system's roots when absent.
    #[arg(long, env = "PL_CA_CERT", value_name = "FILE", global = true)]
    pub ca_cert: Option<PathBuf>,
    /// A file holding the API token (or set `PL_TOKEN`).
    #[arg(long, env = "PL_TOKEN_FILE", value_name = "FILE", global = true)]
    pub token_file: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = OutFormat::Text, global = true)]
    pub format: OutFormat,
    /// Talk to the local control plane `pl up` started for this repository (default: the
    /// current directory) instead of `--server`.
    #[arg(long, value_name = "DIR", num_args = 0..=1, default_missing_value = ".", global = true)]
    pub local: Option<PathBuf>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutFormat {
    Text,
    Json,
}

impl ServerArgs {
    /// Whether anything names a control plane (a server, a token, `--local`).
    pub fn names_one(&self) -> bool {
        self.server.is_some()
            || self.token_file.is_some()
            || self.local.is_some()
            || std::env::var("PL_TOKEN").is_ok_and(|t| !t.trim().is_empty())
    }
}

/// The API `pl` talks to when nothing else is said.
pub const DEFAULT_SERVER: &str = "https://127.0.0.1:7443";

/// The most a JSON answer may be: a page of 1,000 deployments is well under it.
const MAX_ANSWER_BYTES: u64 = 64 * 1024 * 1024;

/// Running deployments a page of `/v1/fleet` holds (about 3 KiB of JSON each).
const FLEET_PAGE: u32 = 500;
/// The most pages of `/v1/fleet` read: the daemon answers at most 10,000 deployments.
const MAX_FLEET_PAGES: usize = 10_000 / FLEET_PAGE as usize + 1;

/// `GET /v1/fleet?limit=`'s answer: a page, or from a control plane before the pages, the
/// whole snapshot.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum FleetAnswer {
    Page(state_schema::replacement::SnapshotPage),
    Whole(state_schema::replacement::Snapshot),
}

pub(crate) struct Client {
    agent: ureq::Agent,
    base: String,
    token: Zeroizing<String>,
}

impl Client {
    /// A client of the control plane `args` name (`--local` is resolved by `main` first).
    pub(crate) fn new(args: &ServerArgs) -> Result<Client> {
        let env_token = std::env::var("PL_TOKEN").ok().filter(|t| !t.trim().is_empty());
        if args.server.is_none() && args.token_file.is_none() && env_token.is_none() {
            bail!(
                "no control plane named: pass --server (or PL_SERVER) with --token-file (or PL_TOKEN), or --local DIR for the one `pl up` runs for a repository (none runs for this folder)"
            );
        }
        let server = args.server.as_deref().unwrap_or(DEFAULT_SERVER);
        let token = match env_token {
            Some(t) => Zeroizing::new(t.trim().to_owned()),
            None => {
                let path = args
                    .token_file
                    .as_ref()
                    .ok_or_else(|| anyhow!("no API token: set PL_TOKEN or pass --token-file (or --local DIR for the control plane `pl up` runs)"))?;
                let t = Zeroizing::new(
                    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
                );
                Zeroizing::new(t.trim().to_owned())
            }
        };
        let mut tls = ureq::tls::TlsConfig::builder();
        if let Some(ca) = &args.ca_cert {
            let pem = std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?;
            let cert = ureq::tls::Certificate::from_pem(&pem)
                .map_err(|e| anyhow!("{}: {e}", ca.display()))?
                .to_owned();
            tls = tls.root_certs(ureq::tls::RootCerts::Specific(Arc::new(vec![cert])));
        }
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .tls_config(tls.build())
            .http_status_as_error(false)
            .build()
            .into();
        if !server.starts_with("https://") {
            bail!("--server must be an https:// URL: the API only speaks TLS");
        }
        Ok(Client {
            agent,
            base: server.trim_end_matches('/').to_owned(),
            token,
        })
    }

    /// The request with the token, its answer whatever its status.
    pub(crate) fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<ureq::http::Response<ureq::Body>> {
        self.send_if(method, path, body, None)
    }

    /// [`Client::send`], with the `If-None-Match` of a long poll.
    fn send_if(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        if_none_match: Option<&str>,
    ) -> Result<ureq::http::Response<ureq::Body>> {
        let url = format!("{}{path}", self.base);
        let auth = Zeroizing::new(format!("Bearer {}", self.token.as_str()));
        match (method, body) {
            ("POST", Some(b)) => self
                .agent
                .post(&url)
                .header("authorization", auth.as_str())
                .header("content-type", "application/json")
                .send(b),
            ("POST", None) => self
                .agent
                .post(&url)
                .header("authorization", auth.as_str())
                .send_empty(),
            _ => match if_none_match {
                Some(tag) => self
                    .agent
                    .get(&url)
                    .header("authorization", auth.as_str())
                    .header("if-none-match", tag)
                    .call(),
                None => self.agent.get(&url).header("authorization", auth.as_str()).call(),
            },
        }
        .map_err(|e| anyhow!("{}: {e}", self.base))
    }

    /// The answer of a request that succeeded; a refusal as `path: status message [code]`.
    pub(crate) fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<ureq::http::Response<ureq::Body>> {
        let mut resp = self.send(method, path, body)?;
        let status = resp.status().as_u16();
        if status >= 400 {
            let e: ErrorBody = resp.body_mut().read_json().unwrap_or(ErrorBody {
                code: "http-error".to_owned(),
                message: String::new(),
            });
            bail!("{path}: {status} {} [{}]", e.message, e.code);
        }
        Ok(resp)
    }

    fn read<T: DeserializeOwned>(path: &str, mut resp: ureq::http::Response<ureq::Body>) -> Result<T> {
        resp.body_mut()
            .with_config()
            .limit(MAX_ANSWER_BYTES)
            .read_json()
            .map_err(|e| anyhow!("{path}: {e}"))
    }

    /// A GET's typed answer.
    pub(crate) fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        Self::read(path, self.call("GET", path, None)?)
    }

    /// A POST with a typed body; its typed answer.
    pub(crate) fn post<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> Result<T> {
        let bytes = serde_json::to_vec(body)?;
        Self::read(path, self.call("POST", path, Some(&bytes))?)
    }

    /// The token, for a credential this client hands on (the engine's, `pl image push IMAGE`).
    pub(crate) fn token(&self) -> &str {
        &self.token
    }

    /// The API's address (`https://host:port`), which the web view shares.
    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    /// `POST /v1/ui/sign-in-link`: a one-time web view sign-in for this token.
    pub(crate) fn sign_in_link(&self) -> Result<operator_proto::ui::SignInLink> {
        self.post_empty("/v1/ui/sign-in-link")
    }

    /// `POST /v1/ui/sign-out-everywhere`.
    pub(crate) fn sign_out_everywhere(&self) -> Result<operator_proto::ui::SignedOut> {
        self.post_empty("/v1/ui/sign-out-everywhere")
    }

    /// A POST without a body; its typed answer.
    pub(crate) fn post_empty<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        Self::read(path, self.call("POST", path, None)?)
    }

    /// `GET /v1/environments/{name}`: the environment's deployment, typed; `None` while it
    /// has none (`environment-unknown`).
    pub(crate) fn environment(&self, name: &str) -> Result<Option<operator_proto::Deployment>> {
        let path = format!("/v1/environments/{}", encode(name));
        let mut resp = self.send("GET", &path, None)?;
        let status = resp.status().as_u16();
        if status >= 400 {
            let error: Option<operator_proto::ErrorBody> = resp.body_mut().read_json().ok();
            return match error {
                Some(e) if status == 404 && e.code == "environment-unknown" => Ok(None),
                Some(e) => bail!("{path}: {status} {} [{}]", e.message, e.code),
                // A daemon older than this route answers a bare 404.
                None => bail!("{path}: {status}: the control plane does not serve it (older than this pl?)"),
            };
        }
        resp.body_mut()
            .with_config()
            .limit(1024 * 1024)
            .read_json()
            .map(Some)
            .map_err(|e| anyhow!("{path}: {e}"))
    }

    /// `GET /v1/deployments`, every page: each environment's deployment, typed.
    pub(crate) fn deployments(&self) -> Result<Vec<operator_proto::Deployment>> {
        self.every_page("/v1/deployments", |p: operator_proto::DeploymentsPage| {
            (p.deployments, p.next)
        })
    }

    /// Every page of a list paged by name (`?after=NAME&limit=1000`, a page's `next` the
    /// cursor), its items in order; a cursor that does not move ends it.
    fn every_page<P: DeserializeOwned, T>(
        &self,
        path: &str,
        split: impl Fn(P) -> (Vec<T>, Option<String>),
    ) -> Result<Vec<T>> {
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = format!(
                "{path}{}",
                query(&[("limit", Some("1000".into())), ("after", after.clone())])
            );
            let (items, next) = split(self.get(&page)?);
            out.extend(items);
            match next {
                Some(n) if after.as_ref() != Some(&n) => after = Some(n),
                _ => return Ok(out),
            }
        }
    }

    /// `GET /v1/status`.
    pub(crate) fn status(&self) -> Result<Status> {
        self.get("/v1/status")
    }

    /// `GET /v1/revisions`, one page, newest first.
    pub(crate) fn revisions(&self, branch: Option<&str>, limit: u32) -> Result<RevisionsPage> {
        self.get(&format!(
            "/v1/revisions{}",
            query(&[
                ("branch", branch.map(str::to_owned)),
                ("limit", Some(limit.to_string()))
            ])
        ))
    }

    /// `GET /v1/rewrites`, newest first.
    pub(crate) fn rewrites(&self, limit: u32) -> Result<Rewrites> {
        self.get(&format!("/v1/rewrites?limit={limit}"))
    }

    /// `POST /v1/rewrites/approve`.
    pub(crate) fn approve_rewrite(&self, ask: &ApproveRewrite) -> Result<Approved> {
        self.post("/v1/rewrites/approve", ask)
    }

    /// `GET /v1/jobs`, one page, newest first.
    pub(crate) fn jobs(&self, state: Option<&str>, environment: Option<&str>, limit: u32) -> Result<JobsPage> {
        self.get(&format!(
            "/v1/jobs{}",
            query(&[
                ("state", state.map(str::to_owned)),
                ("environment", environment.map(str::to_owned)),
                ("limit", Some(limit.to_string())),
            ])
        ))
    }

    /// `GET /v1/events` after a cursor.
    pub(crate) fn events(&self, after: i64, limit: u32) -> Result<EventsPage> {
        self.get(&format!("/v1/events?after={after}&limit={limit}"))
    }

    /// `GET /v1/events?waitMs`: events after `after`, waiting up to `wait` (at most the
    /// daemon's 30 s) for one when there is none yet: a follower's wake on any change.
    pub(crate) fn events_wait(&self, after: i64, limit: u32, wait: std::time::Duration) -> Result<EventsPage> {
        let wait_ms = wait.as_millis().min(u128::from(operator_proto::MAX_WAIT_MS));
        self.get(&format!("/v1/events?after={after}&limit={limit}&waitMs={wait_ms}"))
    }

    /// `GET /v1/environments/{name}/provenance`.
    pub(crate) fn provenance(&self, environment: &str) -> Result<operator_proto::provenance::Provenance> {
        self.get(&format!("/v1/environments/{}/provenance", encode(environment)))
    }

    /// `GET /v1/nodes`, every page.
    pub(crate) fn nodes(&self) -> Result<Nodes> {
        let nodes = self.every_page("/v1/nodes", |p: Nodes| (p.nodes, p.next))?;
        Ok(Nodes { nodes, next: None })
    }

    /// `POST /v1/nodes/{node}/token`.
    pub(crate) fn node_token(&self, node: &str) -> Result<NodeToken> {
        self.post_empty(&format!("/v1/nodes/{}/token", encode(node)))
    }

    /// `POST /v1/nodes/{node}/mesh-key`.
    pub(crate) fn rotate_mesh_key(&self, node: &str) -> Result<MeshKeyAsked> {
        self.post_empty(&format!("/v1/nodes/{}/mesh-key", encode(node)))
    }

    /// `GET /v1/certificates`.
    pub(crate) fn certificates(&self) -> Result<Certificates> {
        self.get("/v1/certificates")
    }

    /// `GET /v1/domains`.
    pub(crate) fn domains(&self) -> Result<Domains> {
        self.get("/v1/domains")
    }

    /// `GET /v1/volumes`.
    pub(crate) fn volumes(&self) -> Result<Volumes> {
        self.get("/v1/volumes")
    }

    /// `POST /v1/volumes/remove`.
    pub(crate) fn remove_volume(&self, ask: &RemoveVolume) -> Result<VolumeRemoved> {
        self.post("/v1/volumes/remove", ask)
    }

    /// `POST /v1/volumes/move`.
    pub(crate) fn move_volume(&self, ask: &MoveVolume) -> Result<VolumeMoving> {
        self.post("/v1/volumes/move", ask)
    }

    /// `GET /v1/backups` of an environment (and one volume).
    pub(crate) fn backups(&self, environment: &str, volume: Option<&str>, limit: u32) -> Result<Backups> {
        self.get(&backups_path(environment, volume, limit))
    }

    /// `POST /v1/backups/run`.
    pub(crate) fn run_backup(&self, ask: &RunBackup) -> Result<JobAsked> {
        self.post("/v1/backups/run", ask)
    }

    /// `POST /v1/images/gc`.
    pub(crate) fn collect_images(
        &self,
        ask: &operator_proto::images::CollectImages,
    ) -> Result<operator_proto::images::ImagesCollected> {
        self.post("/v1/images/gc", ask)
    }

    /// The image store's distribution endpoint (`/v2/`), with this client's TLS and token.
    pub(crate) fn pusher(&self) -> registry::push::Pusher {
        registry::push::Pusher::new(self.agent.clone(), &self.base, &self.token)
    }

    /// `POST /v1/restores`.
    pub(crate) fn restore(&self, ask: &Restore) -> Result<Restoring> {
        self.post("/v1/restores", ask)
    }

    /// `POST /v1/rollbacks`.
    pub(crate) fn rollback(&self, ask: &RollbackAsk) -> Result<RollbackAnswer> {
        self.post("/v1/rollbacks", ask)
    }

    /// `POST /v1/rollouts`.
    pub(crate) fn rollout(&self, ask: &RolloutAsk) -> Result<RolloutAnswer> {
        self.post("/v1/rollouts", ask)
    }

    /// `POST /v1/reconcile`.
    pub(crate) fn reconcile(&self) -> Result<ReconcileAsked> {
        self.post_empty("/v1/reconcile")
    }

    /// `GET /v1/fleet`: the live fleet as re-placement sees it (opaque to the wire types: it
    /// is `state_schema::replacement::Snapshot`, which `pl plan --fleet` decides on), read in
    /// pages of one snapshot of [`FLEET_PAGE`] deployments each, so that no answer grows with
    /// the fleet. A control plane from before the pages answers the whole snapshot at once.
    pub(crate) fn fleet(&self) -> Result<state_schema::replacement::Snapshot> {
        let context = "the control plane's /v1/fleet answer";
        let mut path = format!("/v1/fleet?limit={FLEET_PAGE}");
        let mut whole: Option<state_schema::replacement::Snapshot> = None;
        for _ in 0..MAX_FLEET_PAGES {
            let page = match self.get::<FleetAnswer>(&path).context(context)? {
                FleetAnswer::Page(p) => p,
                FleetAnswer::Whole(s) => return Ok(s),
            };
            match &mut whole {
                Some(w) => w.running.extend(page.snapshot.running),
                None => whole = Some(page.snapshot),
            }
            let Some(next) = page.next else {
                return Ok(whole.unwrap_or_default());
            };
            // The daemon's cursor is an id and an offset; anything else is not put in a URL.
            if !next.bytes().all(|b| b.is_ascii_hexdigit() || b == b'.') {
                anyhow::bail!("{context}: its cursor {next:?} is not one this client reads");
            }
            path = format!("/v1/fleet?limit={FLEET_PAGE}&cursor={next}");
        }
        anyhow::bail!("{context}: more than {MAX_FLEET_PAGES} pages")
    }
}

/// One environment followed with the daemon's long poll (`GET /v1/environments/{name}` with
/// `waitMs` and `If-None-Match`): a look answers as soon as the deployment differs from the one
/// seen last, or when its wait ends with the same one. One request per change, instead of one
/// every 100 ms.
pub(crate) struct Watch<'c> {
    client: &'c Client,
    name: String,
    tag: Option<String>,
    last: Option<operator_proto::Deployment>,
}

impl<'c> Watch<'c> {
    pub(crate) fn new(client: &'c Client, name: &str) -> Watch<'c> {
        Watch {
            client,
            name: name.to_owned(),
            tag: None,
            last: None,
        }
    }

    /// The deployment now: the first look answers at once; each later one waits (at most
    /// `wait`, and the daemon's 30 s) for a change. `None` while the environment has none.
    pub(crate) fn next(&mut self, wait: std::time::Duration) -> Result<Option<operator_proto::Deployment>> {
        let wait_ms = if self.tag.is_some() {
            wait.as_millis().min(u128::from(operator_proto::MAX_WAIT_MS)) as u64
        } else {
            0
        };
        let path = format!("/v1/environments/{}?waitMs={wait_ms}", encode(&self.name));
        let mut resp = self.client.send_if("GET", &path, None, self.tag.as_deref())?;
        match resp.status().as_u16() {
            304 => return Ok(self.last.clone()),
            200 => {}
            status => {
                let error: Option<ErrorBody> = resp.body_mut().read_json().ok();
                return match error {
                    Some(e) if status == 404 && e.code == "environment-unknown" => {
                        // Nothing to wait on yet: look again shortly, not at once.
                        (self.tag, self.last) = (None, None);
                        std::thread::sleep(wait.min(std::time::Duration::from_millis(250)));
                        Ok(None)
                    }
                    Some(e) => bail!("{path}: {status} {} [{}]", e.message, e.code),
                    None => bail!("{path}: {status}: the control plane does not serve it (older than this pl?)"),
                };
            }
        }
        self.tag = resp
            .headers()
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let d: operator_proto::Deployment = Client::read(&path, resp)?;
        self.last = Some(d.clone());
        Ok(Some(d))
    }
}

/// `GET /v1/backups`' path.
pub(crate) fn backups_path(environment: &str, volume: Option<&str>, limit: u32) -> String {
    format!(
        "/v1/backups{}",
        query(&[
            ("environment", Some(environment.to_owned())),
            ("volume", volume.map(str::to_owned)),
            ("limit", Some(limit.to_string())),
        ])
    )
}

/// Prints an answer as JSON (`--format json`).
pub(crate) fn print_json<T: Serialize>(v: &T) -> Result<u8> {
    outln!("{}", serde_json::to_string_pretty(v)?);
    Ok(0)
}

pub(crate) fn query(pairs: &[(&str, Option<String>)]) -> String {
    let parts: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", encode(v))))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

pub(crate) fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A follower's wake on anything the fleet does: a long poll on the events after a cursor
/// (`pl up` and `pl wait` over several environments), instead of looking at a fixed pace.
pub(crate) struct Wake<'c> {
    client: &'c Client,
    /// The newest event seen; read from the daemon's counts when first needed.
    cursor: Option<i64>,
}

impl<'c> Wake<'c> {
    pub(crate) fn new(client: &'c Client) -> Wake<'c> {
        Wake { client, cursor: None }
    }

    /// Returns once an event newer than the last one seen is there, or after `at_most`. The
    /// first wait starts from the newest event the daemon's last pass counted (an older
    /// cursor only wakes it at once).
    pub(crate) fn wait(&mut self, at_most: std::time::Duration) -> Result<()> {
        let cursor = match self.cursor {
            Some(c) => c,
            None => self.client.status()?.counts.last_event,
        };
        let page = self.client.events_wait(cursor, operator_proto::MAX_PAGE, at_most)?;
        self.cursor = Some(page.next);
        Ok(())
    }
}
