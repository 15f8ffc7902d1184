//! `pl status`, `pl events [--follow]`, `pl jobs`, `pl revisions`, `pl reconcile --now`: the
//! operator API of a running `pl-reconciler`, over TLS with a bearer token.
//!
//! The token comes from `PL_TOKEN` or a file (`--token-file`, `PL_TOKEN_FILE`), never from an
//! argument, so it is not in the process list or shell history.

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;
use std::io::BufRead;
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

    fn call(&self, method: &str, path: &str) -> Result<ureq::http::Response<ureq::Body>> {
        self.call_with(method, path, None)
    }

    fn call_with(&self, method: &str, path: &str, body: Option<&Value>) -> Result<ureq::http::Response<ureq::Body>> {
        let resp = self.send(method, path, body)?;
        let status = resp.status().as_u16();
        if status >= 400 {
            let mut resp = resp;
            let body: Value = resp.body_mut().read_json().unwrap_or(Value::Null);
            let code = body["code"].as_str().unwrap_or("http-error");
            let message = body["message"].as_str().unwrap_or("");
            bail!("{path}: {status} {message} [{code}]");
        }
        Ok(resp)
    }

    /// The request with the token, its answer whatever its status.
    fn send(&self, method: &str, path: &str, body: Option<&Value>) -> Result<ureq::http::Response<ureq::Body>> {
        let url = format!("{}{path}", self.base);
        let auth = Zeroizing::new(format!("Bearer {}", self.token.as_str()));
        match (method, body) {
            ("POST", Some(b)) => self
                .agent
                .post(&url)
                .header("authorization", auth.as_str())
                .send_json(b),
            ("POST", None) => self
                .agent
                .post(&url)
                .header("authorization", auth.as_str())
                .send_empty(),
            _ => self.agent.get(&url).header("authorization", auth.as_str()).call(),
        }
        .map_err(|e| anyhow!("{}: {e}", self.base))
    }

    /// A POST with a JSON body; its JSON answer.
    pub(crate) fn post_json(&self, path: &str, body: &Value) -> Result<Value> {
        let mut resp = self.call_with("POST", path, Some(body))?;
        resp.body_mut()
            .with_config()
            .limit(1024 * 1024)
            .read_json()
            .map_err(|e| anyhow!("{path}: {e}"))
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
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let path = format!(
                "/v1/deployments{}",
                query(&[("limit", Some("1000".into())), ("after", after.clone())])
            );
            let mut resp = self.call("GET", &path)?;
            let page: operator_proto::DeploymentsPage = resp
                .body_mut()
                .with_config()
                .limit(64 * 1024 * 1024)
                .read_json()
                .map_err(|e| anyhow!("{path}: {e}"))?;
            out.extend(page.deployments);
            match page.next {
                Some(n) if after.as_ref() != Some(&n) => after = Some(n),
                _ => return Ok(out),
            }
        }
    }

    pub(crate) fn json(&self, method: &str, path: &str) -> Result<Value> {
        let mut resp = self.call(method, path)?;
        resp.body_mut()
            .with_config()
            .limit(64 * 1024 * 1024)
            .read_json()
            .map_err(|e| anyhow!("{path}: {e}"))
    }
}

pub(crate) fn print_json(v: &Value) -> Result<u8> {
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

fn encode(s: &str) -> String {
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

pub fn status(args: &ServerArgs) -> Result<u8> {
    let client = Client::new(args)?;
    let v = client.json("GET", "/v1/status")?;
    if args.format == OutFormat::Json {
        return print_json(&v);
    }
    let role = if v["leader"].as_bool() == Some(true) {
        "leader"
    } else {
        "standby"
    };
    outln!("daemon      {role}, last pass {} ms ago", v["lastPassMsAgo"]);
    outln!(
        "branch      {} in force at {}",
        v["branch"].as_str().unwrap_or("?"),
        v["inForce"].as_str().unwrap_or("(nothing accepted yet)")
    );
    if v["lastJudged"] != v["inForce"] {
        outln!("last judged {}", v["lastJudged"].as_str().unwrap_or("-"));
    }
    let counts = &v["counts"];
    for (title, key) in [
        ("revisions", "revisions"),
        ("deployments", "deployments"),
        ("jobs", "jobs"),
    ] {
        let parts: Vec<String> = counts[key]
            .as_object()
            .map(|m| m.iter().map(|(k, n)| format!("{k} {n}")).collect())
            .unwrap_or_default();
        outln!(
            "{title:<11} {}",
            if parts.is_empty() { "-".into() } else { parts.join(", ") }
        );
    }
    outln!("queue age   {} ms", counts["queueAgeMs"]);
    // Replicas as the agents report them, not as asked: what differs is listed.
    let typed: Vec<crate::live::Deployment> = client
        .deployments()?
        .into_iter()
        .filter(|d| d.action == operator_proto::Action::Rollout)
        .collect();
    let sum = |f: fn(&crate::live::Deployment) -> usize| typed.iter().map(f).sum::<usize>();
    outln!(
        "replicas    {} running of {} placed of {} asked, as agents report them",
        sum(|d| d.running),
        sum(|d| d.replicas),
        sum(|d| d.asked()),
    );
    let off: Vec<&crate::live::Deployment> = typed
        .iter()
        .filter(|d| d.running != d.replicas || d.stale > 0 || d.asked() != d.replicas || !d.waiting.is_empty())
        .collect();
    for d in off.iter().take(20) {
        outln!(
            "  {}: {} running of {} placed of {} asked at generation {}{} ({}){}",
            d.environment,
            d.running,
            d.replicas,
            d.asked(),
            d.generation,
            match d.stale {
                0 => String::new(),
                n => format!(", {n} of another generation still running"),
            },
            d.status.as_str(),
            match crate::live::waiting_summary(d) {
                w if w.is_empty() => String::new(),
                w => format!(": {w}"),
            }
        );
    }
    if off.len() > 20 {
        outln!("  … and {} more", off.len() - 20);
    }
    // Rollbacks hold environments away from Git: each says so.
    for d in &typed {
        let Some(h) = &d.hold else { continue };
        let env = d.environment.as_str();
        outln!(
            "held        {env} at generation {} (generation {}'s release), rolled back from {} by {}: differs from Git until a commit changes it or `pl rollback --release {env}`",
            h.generation,
            h.to,
            h.from,
            h.by
        );
    }
    // Canaries under way: the share the new release has, and what the next step waits for.
    for d in &typed {
        let Some(c) = &d.canary else { continue };
        let env = d.environment.as_str();
        let next = if c.waits_for_promote {
            format!("the next step waits for `pl rollout promote {env}`")
        } else if let Some(at) = c.next_at_ms {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            format!("the next step in {} s", ((at - now).max(0) + 999) / 1000)
        } else {
            "a step is running".to_owned()
        };
        outln!(
            "canary      {env} generation {}: {}% of requests on the new release; {next}",
            d.generation,
            c.weight
        );
    }
    certificates_line(&client)?;
    // The mesh between nodes, as agents report their links (said only when there is one).
    let links = v["mesh"]["links"].as_u64().unwrap_or(0);
    let down: Vec<&Value> = v["mesh"]["down"].as_array().into_iter().flatten().collect();
    if links > 0 || !down.is_empty() {
        outln!("mesh        {links} links, {} down", down.len());
        for d in down.iter().take(20) {
            outln!(
                "  {} -> {}: down (no handshake within 180 s)",
                d["node"].as_str().unwrap_or("?"),
                d["peer"].as_str().unwrap_or("?")
            );
        }
    }
    Ok(0)
}

/// `pl status`'s certificates: how many are valid, the next to expire, and each that is not
/// (a control plane that issues none says nothing).
fn certificates_line(client: &Client) -> Result<()> {
    let v = client.json("GET", "/v1/certificates")?;
    let list: Vec<&Value> = v["certificates"].as_array().into_iter().flatten().collect();
    if list.is_empty() {
        return Ok(());
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let valid = list.iter().filter(|c| c["state"] == "valid").count();
    let next = list
        .iter()
        .filter(|c| c["notAfterMs"].as_i64().unwrap_or(0) > 0)
        .min_by_key(|c| c["notAfterMs"].as_i64().unwrap_or(i64::MAX));
    outln!(
        "certificates {valid} valid of {}{}",
        list.len(),
        next.map(|c| format!(
            "; next to expire: {} in {} h",
            c["hostname"].as_str().unwrap_or("?"),
            (c["notAfterMs"].as_i64().unwrap_or(0) - now) / 3_600_000
        ))
        .unwrap_or_default()
    );
    for c in list.iter().filter(|c| c["state"] != "valid").take(20) {
        outln!(
            "  {}: {}{}",
            c["hostname"].as_str().unwrap_or("?"),
            c["state"].as_str().unwrap_or("?"),
            c["lastError"]
                .as_str()
                .map(|e| format!(" ({} failure(s): {e})", c["failures"]))
                .unwrap_or_default()
        );
    }
    Ok(())
}

pub fn revisions(args: &ServerArgs, branch: Option<String>, limit: u32) -> Result<u8> {
    let path = format!(
        "/v1/revisions{}",
        query(&[("branch", branch), ("limit", Some(limit.to_string()))])
    );
    let v = Client::new(args)?.json("GET", &path)?;
    if args.format == OutFormat::Json {
        return print_json(&v);
    }
    let rewrites = Client::new(args)?.json("GET", "/v1/rewrites?limit=20")?;
    for r in rewrites["rewrites"].as_array().into_iter().flatten() {
        let approved = r["approvedBy"].as_str();
        outln!(
            "{:<8} {:<16} {} does not descend from {}  [history-rewritten]{}",
            if approved.is_some() { "approved" } else { "refused" },
            r["branch"].as_str().unwrap_or("?"),
            r["sha"].as_str().unwrap_or("?").get(..12).unwrap_or(""),
            r["acceptedSha"].as_str().unwrap_or("?").get(..12).unwrap_or(""),
            approved.map(|a| format!(" by {a}")).unwrap_or_else(|| format!(
                "; `pl revisions approve-rewrite {} {}` accepts it",
                r["branch"].as_str().unwrap_or("?"),
                r["sha"].as_str().unwrap_or("?")
            )),
        );
    }
    for r in v["revisions"].as_array().into_iter().flatten() {
        let reasons: Vec<&str> = r["reasons"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x["code"].as_str())
            .collect();
        outln!(
            "{:<8} {:<16} {} {}{}",
            r["verdict"].as_str().unwrap_or("?"),
            r["branch"].as_str().unwrap_or("?"),
            r["sha"].as_str().unwrap_or("?").get(..12).unwrap_or(""),
            r["principals"].as_str().unwrap_or("-"),
            if reasons.is_empty() {
                String::new()
            } else {
                format!("  [{}]", reasons.join(", "))
            }
        );
    }
    Ok(0)
}

pub fn jobs(args: &ServerArgs, state: Option<String>, environment: Option<String>, limit: u32) -> Result<u8> {
    let path = format!(
        "/v1/jobs{}",
        query(&[
            ("state", state),
            ("environment", environment),
            ("limit", Some(limit.to_string()))
        ])
    );
    let v = Client::new(args)?.json("GET", &path)?;
    if args.format == OutFormat::Json {
        return print_json(&v);
    }
    let jobs: Vec<&Value> = v["jobs"].as_array().into_iter().flatten().collect();
    if jobs.is_empty() {
        outln!("no jobs");
        return Ok(0);
    }
    // Columns with a header, each as wide as its widest cell.
    let rows: Vec<[String; 6]> = jobs
        .iter()
        .map(|j| {
            [
                j["state"].as_str().unwrap_or("?").to_owned(),
                format!("{}/{}", j["attempts"], j["maxAttempts"]),
                j["targetNode"].as_str().unwrap_or("-").to_owned(),
                j["generation"].as_i64().map_or("-".to_owned(), |g| g.to_string()),
                // In words; the node has its column (`--format json` keeps the key).
                state_schema::job_words::describe(
                    j["key"]
                        .as_str()
                        .unwrap_or("?")
                        .rsplit_once('@')
                        .map_or(j["key"].as_str().unwrap_or("?"), |(k, _)| k),
                ),
                j["reason"].as_str().unwrap_or_default().to_owned(),
            ]
        })
        .collect();
    let header = ["STATE", "ATTEMPTS", "NODE", "GENERATION", "JOB", ""];
    let width = |c: usize| {
        rows.iter()
            .map(|r| r[c].len())
            .chain([header[c].len()])
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..4).map(width).collect();
    for r in std::iter::once(header.map(str::to_owned)).chain(rows) {
        outln!(
            "{:<w0$}  {:<w1$}  {:<w2$}  {:<w3$}  {}",
            r[0],
            r[1],
            r[2],
            r[3],
            r[4],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3],
        );
        // Why a failed job failed, on a line of its own under it.
        if !r[5].is_empty() {
            outln!("  why: {}", r[5].lines().next().unwrap_or_default());
        }
    }
    Ok(0)
}

pub fn approve_rewrite(args: &ServerArgs, branch: &str, sha: &str) -> Result<u8> {
    if sha.len() != 40 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("`{sha}` is not a full commit sha (40 hex digits): an approval names exactly one head");
    }
    let client = Client::new(args)?;
    let body = serde_json::json!({"branch": branch, "sha": sha.to_ascii_lowercase()});
    let v = client.post_json("/v1/rewrites/approve", &body)?;
    if args.format == OutFormat::Json {
        return print_json(&v);
    }
    if v["already"].as_bool() == Some(true) {
        outln!("{branch} at {sha} was approved already");
    } else {
        outln!("approved: {branch} at {sha} will be judged at the next pass");
    }
    Ok(0)
}

/// The live fleet a control plane sees now (`GET /v1/fleet`), for `pl plan --fleet`.
pub fn fleet_snapshot(args: &ServerArgs) -> Result<state_schema::replacement::Snapshot> {
    let v = Client::new(args)?.json("GET", "/v1/fleet")?;
    serde_json::from_value(v).context("the control plane's /v1/fleet answer")
}

/// `pl domains`: each custom domain's state, and for one not proven, the record to make and
/// what DNS answered instead. Exit 0 whatever the states (`--format json` for scripts).
pub fn domains(args: &ServerArgs) -> Result<u8> {
    let v = Client::new(args)?.json("GET", "/v1/domains")?;
    if args.format == OutFormat::Json {
        return print_json(&v);
    }
    let list: Vec<&Value> = v["domains"].as_array().into_iter().flatten().collect();
    if list.is_empty() {
        outln!("no custom domains");
        return Ok(0);
    }
    outln!(
        "{:<32} {:<24} {:<6} {:<9} certificate",
        "domain",
        "environment",
        "method",
        "state"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    for d in &list {
        let c = &d["certificate"];
        let certificate = match (c["source"].as_str(), c["notAfterMs"].as_i64()) {
            (Some("brought"), _) => "brought in Git".to_owned(),
            (Some(issuer), Some(t)) if t > 0 => format!("{issuer}, expires in {} h", (t - now) / 3_600_000),
            _ => "none".to_owned(),
        };
        outln!(
            "{:<32} {:<24} {:<6} {:<9} {certificate}",
            d["hostname"].as_str().unwrap_or("?"),
            d["environment"].as_str().unwrap_or("?"),
            d["method"].as_str().unwrap_or("?"),
            d["state"].as_str().unwrap_or("?"),
        );
        if d["state"] == "pending" || d["state"] == "failing" {
            let r = &d["record"];
            outln!(
                "  needs {} {} = {}",
                r["type"].as_str().unwrap_or("?"),
                r["name"].as_str().unwrap_or("?"),
                r["value"].as_str().unwrap_or("?")
            );
            if let Some(why) = d["reason"].as_str() {
                outln!("  last check: {why}");
            }
        }
    }
    Ok(0)
}

pub fn nodes(args: &ServerArgs) -> Result<u8> {
    let v = Client::new(args)?.json("GET", "/v1/nodes")?;
    if args.format == OutFormat::Json {
        return print_json(&v);
    }
    // CPU and memory as reserved/declared: what placement has left on each node.
    outln!(
        "{:<16} {:<12} {:<13} {:>13} {:>15} {:>9} {:>14}  agent",
        "node",
        "pool",
        "state",
        "cpu",
        "memory",
        "running",
        "last seen"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    for n in v["nodes"].as_array().into_iter().flatten() {
        let seen = n["lastSeenMs"]
            .as_i64()
            .map_or("never".to_owned(), |t| format!("{} s ago", (now - t).max(0) / 1000));
        let cpu = format!(
            "{}/{}m",
            n["reservedCpuMillis"].as_u64().unwrap_or(0),
            n["cpuMillis"].as_u64().unwrap_or(0)
        );
        let memory = format!(
            "{}/{}Mi",
            n["reservedMemoryBytes"].as_u64().unwrap_or(0) >> 20,
            n["memoryBytes"].as_u64().unwrap_or(0) >> 20
        );
        outln!(
            "{:<16} {:<12} {:<13} {:>13} {:>15} {:>9} {:>14}  {}",
            n["name"].as_str().unwrap_or("?"),
            n["pool"].as_str().unwrap_or("?"),
            n["state"].as_str().unwrap_or("?"),
            cpu,
            memory,
            format!(
                "{}/{}",
                n["running"].as_u64().unwrap_or(0),
                n["instances"].as_u64().unwrap_or(0)
            ),
            seen,
            n["agentVersion"].as_str().unwrap_or("-"),
        );
        // The mesh, as the node's agent said it: applied or behind, and each link's health.
        if let Some(m) = n.get("mesh") {
            let (g, a) = (
                m["generation"].as_i64().unwrap_or(0),
                m["applied"].as_i64().unwrap_or(0),
            );
            let state = if a >= g {
                format!("generation {g} applied")
            } else {
                format!("generation {g}, {a} applied")
            };
            let links: Vec<String> = m["links"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|l| {
                    let peer = l["node"].as_str().unwrap_or("?");
                    let down = m["down"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|d| d.as_str() == Some(peer));
                    format!(
                        "{peer} {}{}",
                        match l["lastHandshake"].as_i64() {
                            Some(t) => format!("handshake {} s ago", (now / 1000 - t).max(0)),
                            None => "no handshake".to_owned(),
                        },
                        if down { " (DOWN)" } else { "" }
                    )
                })
                .collect();
            outln!(
                "  mesh: {state}{}{}",
                if links.is_empty() { "" } else { "; " },
                links.join(", ")
            );
        }
    }
    Ok(0)
}

/// `pl node rotate-mesh-key`: asks, then waits until it is true on the hosts: the node applied
/// the mesh carrying the new epoch, and each of its peers applied its newest mesh and handshook
/// with the node after the ask (links come with heartbeats).
pub fn rotate_mesh_key(args: &ServerArgs, node: &str, timeout_secs: u64) -> Result<u8> {
    let client = Client::new(args)?;
    let mesh_of = |v: &Value, name: &str| -> Option<Value> {
        v["nodes"]
            .as_array()?
            .iter()
            .find(|n| n["name"].as_str() == Some(name))
            .map(|n| n["mesh"].clone())
    };
    let before = client.json("GET", "/v1/nodes")?;
    let g0 = mesh_of(&before, node)
        .and_then(|m| m["generation"].as_i64())
        .unwrap_or(0);
    let asked_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let v = client.json("POST", &format!("/v1/nodes/{}/mesh-key", encode(node)))?;
    if args.format != OutFormat::Json {
        eprintln!(
            "{node}: new mesh key pair asked (epoch {}); waiting for it on the hosts",
            v["keyEpoch"]
        );
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(timeout_secs);
    loop {
        let now = client.json("GET", "/v1/nodes")?;
        let done = mesh_of(&now, node).is_some_and(|m| {
            let applied = m["applied"].as_i64().unwrap_or(0);
            applied > g0
                && applied >= m["generation"].as_i64().unwrap_or(0)
                && m["links"].as_array().into_iter().flatten().all(|l| {
                    let peer = l["node"].as_str().unwrap_or("");
                    mesh_of(&now, peer).is_some_and(|p| {
                        p["applied"].as_i64() >= p["generation"].as_i64()
                            && p["links"].as_array().into_iter().flatten().any(|pl| {
                                pl["node"].as_str() == Some(node)
                                    && pl["lastHandshake"].as_i64().is_some_and(|t| t >= asked_at)
                            })
                    })
                })
        });
        if done {
            if args.format == OutFormat::Json {
                return print_json(&v);
            }
            outln!("{node}: new mesh key pair in use; every peer handshook with it");
            return Ok(0);
        }
        if std::time::Instant::now() >= deadline {
            return Err(anyhow!(
                "{node}: the new key was asked for (epoch {}), but its peers had not all taken it within {timeout_secs} s; see `pl nodes`",
                v["keyEpoch"]
            ));
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

pub fn node_token(args: &ServerArgs, node: &str) -> Result<u8> {
    let client = Client::new(args)?;
    let v = client.json("POST", &format!("/v1/nodes/{}/token", encode(node)))?;
    if args.format == OutFormat::Json {
        return print_json(&v);
    }
    let t: agent_proto::TokenResponse = serde_json::from_value(v).map_err(|e| anyhow!("the token answer: {e}"))?;
    outln!("{}", t.token);
    eprintln!("one-time enrolment token for {}, valid 15 minutes", t.node);
    Ok(0)
}

pub fn reconcile(args: &ServerArgs) -> Result<u8> {
    let v = Client::new(args)?.json("POST", "/v1/reconcile")?;
    if args.format == OutFormat::Json {
        return print_json(&v);
    }
    if v["leader"].as_bool() == Some(true) {
        outln!("reconcile requested");
    } else {
        outln!("reconcile requested (this daemon stands by; the leader reconciles on its own schedule)");
    }
    Ok(0)
}

fn print_event(e: &Value, format: OutFormat) -> Result<()> {
    if format == OutFormat::Json {
        outln!("{e}");
    } else {
        outln!(
            "{:>6} {:<24} {} {}",
            e["id"],
            e["kind"].as_str().unwrap_or("?"),
            e["subject"].as_str().unwrap_or(""),
            e["detail"].as_str().unwrap_or("")
        );
    }
    Ok(())
}

/// Prints events after a cursor; with `follow`, keeps streaming (Server-Sent Events) and
/// resumes from the last cursor seen if the connection drops.
pub fn events(args: &ServerArgs, after: i64, follow: bool) -> Result<u8> {
    let client = Client::new(args)?;
    let mut cursor = after;
    if !follow {
        loop {
            let v = client.json("GET", &format!("/v1/events?after={cursor}&limit=1000"))?;
            let rows = v["events"].as_array().cloned().unwrap_or_default();
            for e in &rows {
                print_event(e, args.format)?;
            }
            match v["next"].as_i64() {
                Some(n) if n > cursor && !rows.is_empty() => cursor = n,
                _ => return Ok(0),
            }
        }
    }
    loop {
        let resp = client.call("GET", &format!("/v1/events/stream?after={cursor}"));
        let mut resp = match resp {
            Ok(r) => r,
            Err(e) if e.to_string().contains("[bad-token]") || e.to_string().contains("[insufficient-role]") => {
                return Err(e);
            }
            Err(e) => {
                eprintln!("pl: {e:#}; reconnecting");
                std::thread::sleep(std::time::Duration::from_secs(1));
                continue;
            }
        };
        let reader = std::io::BufReader::new(resp.body_mut().with_config().limit(u64::MAX).reader());
        for line in reader.lines() {
            let Ok(line) = line else { break };
            if let Some(data) = line.strip_prefix("data:") {
                let e: Value = serde_json::from_str(data.trim()).unwrap_or(Value::Null);
                if let Some(id) = e["id"].as_i64() {
                    cursor = id;
                }
                print_event(&e, args.format)?;
            }
        }
    }
}

/// `pl logs ENV ROLE`: the role's container logs from every node that runs it, relayed by the
/// control plane (each line prefixed by its replica and generation); `--follow` keeps
/// printing new lines until interrupted.
pub fn logs(args: &ServerArgs, environment: &str, role: &str, tail: u32, follow: bool) -> Result<u8> {
    use std::io::{Read, Write};
    let client = Client::new(args)?;
    let path = format!(
        "/v1/logs{}",
        query(&[
            ("environment", Some(environment.to_owned())),
            ("role", Some(role.to_owned())),
            ("tail", Some(tail.to_string())),
            ("follow", Some(follow.to_string())),
        ])
    );
    let mut resp = client.call("GET", &path)?;
    let mut reader = resp.body_mut().with_config().limit(u64::MAX).reader();
    let mut buf = vec![0u8; 64 * 1024];
    let mut out = std::io::stdout();
    loop {
        let n = reader.read(&mut buf).map_err(|e| anyhow!("{path}: {e}"))?;
        if n == 0 {
            return Ok(0);
        }
        out.write_all(&buf[..n])?;
        out.flush()?;
    }
}
