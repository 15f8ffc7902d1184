//! `pl events [--follow]`, `pl jobs`, `pl revisions`, `pl reconcile --now`: the
//! operator API of a running `pl-reconciler`, over TLS with a bearer token.
//!
//! The token comes from `PL_TOKEN` or a file (`--token-file`, `PL_TOKEN_FILE`), never from an
//! argument, so it is not in the process list or shell history.

use crate::client::{Client, OutFormat, ServerArgs, print_json, query};
use anyhow::{Result, anyhow, bail};
use operator_proto::domains::DomainState;
use operator_proto::events::Event;
use operator_proto::nodes::{NodeMesh, Nodes};
use std::io::BufRead;

pub fn revisions(args: &ServerArgs, branch: Option<String>, limit: u32) -> Result<u8> {
    let client = Client::new(args)?;
    let v = client.revisions(branch.as_deref(), limit)?;
    if args.format == OutFormat::Json {
        return print_json(&v);
    }
    for r in client.rewrites(20)?.rewrites {
        let approved = r.approved_by.as_deref();
        outln!(
            "{:<8} {:<16} {} does not descend from {}  [history-rewritten]{}",
            if approved.is_some() { "approved" } else { "refused" },
            r.branch,
            r.sha.get(..12).unwrap_or(""),
            r.accepted_sha.get(..12).unwrap_or(""),
            approved
                .map(|a| format!(" by {a}"))
                .unwrap_or_else(|| format!("; `pl revisions approve-rewrite {} {}` accepts it", r.branch, r.sha)),
        );
    }
    for r in &v.revisions {
        let reasons: Vec<&str> = r.reasons.iter().map(|x| x.code.as_str()).collect();
        outln!(
            "{:<8} {:<16} {} {}{}",
            r.verdict,
            r.branch,
            r.sha.get(..12).unwrap_or(""),
            r.principals.as_deref().unwrap_or("-"),
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
    let v = Client::new(args)?.jobs(state.as_deref(), environment.as_deref(), limit)?;
    if args.format == OutFormat::Json {
        return print_json(&v);
    }
    let jobs = &v.jobs;
    if jobs.is_empty() {
        outln!("no jobs");
        return Ok(0);
    }
    // Columns with a header, each as wide as its widest cell.
    let rows: Vec<[String; 6]> = jobs
        .iter()
        .map(|j| {
            [
                j.state.as_str().to_owned(),
                format!("{}/{}", j.attempts, j.max_attempts),
                j.target_node.clone(),
                j.generation.map_or("-".to_owned(), |g| g.to_string()),
                // In words; the node has its column (`--format json` keeps the key).
                state_schema::job_words::describe(j.key.rsplit_once('@').map_or(j.key.as_str(), |(k, _)| k)),
                j.reason.clone().unwrap_or_default(),
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
    let v = client.approve_rewrite(&operator_proto::revisions::ApproveRewrite {
        branch: branch.to_owned(),
        sha: sha.to_ascii_lowercase(),
    })?;
    if args.format == OutFormat::Json {
        return print_json(&v);
    }
    if v.already {
        outln!("{branch} at {sha} was approved already");
    } else {
        outln!("approved: {branch} at {sha} will be judged at the next pass");
    }
    Ok(0)
}

/// The live fleet a control plane sees now (`GET /v1/fleet`), for `pl plan --fleet`.
pub fn fleet_snapshot(args: &ServerArgs) -> Result<state_schema::replacement::Snapshot> {
    Client::new(args)?.fleet()
}

/// `pl domains`: each custom domain's state, and for one not proven, the record to make and
/// what DNS answered instead. Exit 0 whatever the states (`--format json` for scripts).
pub fn domains(args: &ServerArgs) -> Result<u8> {
    let v = Client::new(args)?.domains()?;
    if args.format == OutFormat::Json {
        return print_json(&v);
    }
    let list = &v.domains;
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
    for d in list {
        let certificate = match &d.certificate {
            Some(c) if c.issued.is_none() => "brought in Git".to_owned(),
            Some(c) => match &c.issued {
                Some(i) if i.not_after_ms > 0 => {
                    format!("{}, expires in {} h", c.source, (i.not_after_ms - now) / 3_600_000)
                }
                _ => "none".to_owned(),
            },
            None => "none".to_owned(),
        };
        outln!(
            "{:<32} {:<24} {:<6} {:<9} {certificate}",
            d.hostname,
            d.environment,
            d.method.as_str(),
            d.state.as_str(),
        );
        if matches!(d.state, DomainState::Pending | DomainState::Failing) {
            let r = &d.record;
            outln!("  needs {} {} = {}", r.kind, r.name, r.value);
            if let Some(why) = &d.reason {
                outln!("  last check: {why}");
            }
        }
    }
    Ok(0)
}

/// `pl provenance ENV`: one block per replica, each link on its own line.
pub fn provenance(args: &ServerArgs, environment: &str) -> Result<u8> {
    let v = Client::new(args)?.provenance(environment)?;
    if args.format == OutFormat::Json {
        return print_json(&v);
    }
    if v.replicas.is_empty() {
        outln!("{environment}: no replica reported running");
    }
    let short = |s: &Option<String>| s.as_deref().map_or("-".to_owned(), |s| s.chars().take(12).collect());
    for r in &v.replicas {
        outln!(
            "{}/{} on {}  generation {}  {}",
            r.role,
            r.instance,
            r.node,
            r.generation,
            if r.healthy { "healthy" } else { "unhealthy" }
        );
        outln!("  image     {}", r.image.as_deref().unwrap_or("- (not reported)"));
        match (&r.image_signer, &r.image_fingerprint) {
            (Some(who), Some(key)) => outln!(
                "  signed by {who} ({key}), verified by the node at {}",
                r.image_verified_at_ms.map_or("-".to_owned(), crate::out::utc)
            ),
            _ => outln!("  signed by - (no image rule names this project)"),
        }
        outln!(
            "  commit    {} signed by {} ({}), seen at {}",
            short(&r.commit),
            r.commit_signer.as_deref().unwrap_or("-"),
            r.commit_fingerprint.as_deref().unwrap_or("-"),
            r.commit_seen_at_ms.map_or("-".to_owned(), crate::out::utc)
        );
    }
    Ok(0)
}

/// A node's agent as `pl nodes` shows it: its version, and when it speaks an older protocol
/// than the control plane (it gets that protocol's tasks until it is upgraded), which one.
fn agent_words(n: &operator_proto::nodes::Node) -> String {
    let version = n.agent_version.as_deref().unwrap_or("-");
    match (n.older_agent, n.agent_protocol) {
        (true, Some(p)) => format!("{version} (older: protocol {p})"),
        _ => version.to_owned(),
    }
}

pub fn nodes(args: &ServerArgs) -> Result<u8> {
    let v = Client::new(args)?.nodes()?;
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
    for n in &v.nodes {
        let seen = n
            .last_seen_ms
            .map_or("never".to_owned(), |t| format!("{} s ago", (now - t).max(0) / 1000));
        let cpu = format!("{}/{}m", n.reserved_cpu_millis, n.cpu_millis);
        let memory = format!("{}/{}Mi", n.reserved_memory_bytes >> 20, n.memory_bytes >> 20);
        outln!(
            "{:<16} {:<12} {:<13} {:>13} {:>15} {:>9} {:>14}  {}",
            n.name,
            n.pool,
            n.state.as_str(),
            cpu,
            memory,
            format!("{}/{}", n.running, n.instances),
            seen,
            agent_words(n),
        );
        // The mesh, as the node's agent said it: applied or behind, and each link's health.
        if let Some(m) = &n.mesh {
            let (g, a) = (m.generation, m.applied);
            let state = if a >= g {
                format!("generation {g} applied")
            } else {
                format!("generation {g}, {a} applied")
            };
            let links: Vec<String> = m
                .links
                .iter()
                .map(|l| {
                    let down = m.down.contains(&l.node);
                    format!(
                        "{} {}{}",
                        l.node,
                        match l.last_handshake {
                            Some(t) => format!("handshake {} s ago", (now / 1000 - t as i64).max(0)),
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

/// Whether a node's new key is in use, as its agents report: the node applied a mesh newer
/// than `before` (and its newest), and each of its peers applied its newest mesh and handshook
/// with it at or after `asked_at` (Unix seconds).
fn rotated(nodes: &Nodes, node: &str, before: i64, asked_at: i64) -> bool {
    let mesh_of = |name: &str| -> Option<&NodeMesh> { nodes.nodes.iter().find(|n| n.name == name)?.mesh.as_ref() };
    mesh_of(node).is_some_and(|m| {
        m.applied > before
            && m.applied >= m.generation
            && m.links.iter().all(|l| {
                mesh_of(&l.node).is_some_and(|p| {
                    p.applied >= p.generation
                        && p.links
                            .iter()
                            .any(|pl| pl.node == node && pl.last_handshake.is_some_and(|t| t as i64 >= asked_at))
                })
            })
    })
}

/// `pl node rotate-mesh-key`: asks, then waits until it is true on the hosts: the node applied
/// the mesh carrying the new epoch, and each of its peers applied its newest mesh and handshook
/// with the node after the ask (links come with heartbeats).
pub fn rotate_mesh_key(args: &ServerArgs, node: &str, timeout_secs: u64) -> Result<u8> {
    let client = Client::new(args)?;
    let g0 = client
        .nodes()?
        .nodes
        .iter()
        .find(|n| n.name == node)
        .and_then(|n| n.mesh.as_ref())
        .map_or(0, |m| m.generation);
    let asked_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let v = client.rotate_mesh_key(node)?;
    if args.format != OutFormat::Json {
        eprintln!(
            "{node}: new mesh key pair asked (epoch {}); waiting for it on the hosts",
            v.key_epoch
        );
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(timeout_secs);
    loop {
        if rotated(&client.nodes()?, node, g0, asked_at) {
            if args.format == OutFormat::Json {
                return print_json(&v);
            }
            outln!("{node}: new mesh key pair in use; every peer handshook with it");
            return Ok(0);
        }
        if std::time::Instant::now() >= deadline {
            return Err(anyhow!(
                "{node}: the new key was asked for (epoch {}), but its peers had not all taken it within {timeout_secs} s; see `pl nodes`",
                v.key_epoch
            ));
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

pub fn node_token(args: &ServerArgs, node: &str) -> Result<u8> {
    let t = Client::new(args)?.node_token(node)?;
    if args.format == OutFormat::Json {
        return print_json(&t);
    }
    outln!("{}", t.token);
    eprintln!("one-time enrolment token for {}, valid 15 minutes", t.node);
    Ok(0)
}

pub fn reconcile(args: &ServerArgs) -> Result<u8> {
    let v = Client::new(args)?.reconcile()?;
    if args.format == OutFormat::Json {
        return print_json(&v);
    }
    if v.leader {
        outln!("reconcile requested");
    } else {
        outln!("reconcile requested (this daemon stands by; the leader reconciles on its own schedule)");
    }
    Ok(0)
}

fn print_event(e: &Event, format: OutFormat) -> Result<()> {
    if format == OutFormat::Json {
        outln!("{}", serde_json::to_string(e)?);
    } else {
        outln!("{:>6} {:<24} {} {}", e.id, e.kind, e.subject, e.detail);
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
            let v = client.events(cursor, 1000)?;
            for e in &v.events {
                print_event(e, args.format)?;
            }
            match v.next {
                n if n > cursor && !v.events.is_empty() => cursor = n,
                _ => return Ok(0),
            }
        }
    }
    loop {
        let resp = client.call("GET", &format!("/v1/events/stream?after={cursor}"), None);
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
                // A line that is not an event is skipped: the stream resumes from the cursor.
                let Ok(e) = serde_json::from_str::<Event>(data.trim()) else {
                    continue;
                };
                cursor = e.id;
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
    let mut resp = client.call("GET", &path, None)?;
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
