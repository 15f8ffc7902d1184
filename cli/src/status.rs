//! `pl status`: where the control plane stands, read from a running `pl-reconciler`: the
//! daemon and its branch, counts, the service level objectives over the last day, replicas
//! as the agents report them, holds and canaries, certificates, the mesh.

use crate::client::{Client, OutFormat, ServerArgs, print_json};
use anyhow::Result;
use operator_proto::domains::CertificateState;

pub fn status(args: &ServerArgs) -> Result<u8> {
    let client = Client::new(args)?;
    let v = client.status()?;
    if args.format == OutFormat::Json {
        return print_json(&v);
    }
    let role = if v.leader { "leader" } else { "standby" };
    outln!("daemon      {role}, last pass {} ms ago", v.last_pass_ms_ago);
    outln!(
        "plane id    {} (every object this control plane makes on the hosts names it)",
        v.control_plane
    );
    outln!(
        "branch      {} in force at {}",
        v.branch,
        v.in_force.as_deref().unwrap_or("(nothing accepted yet)")
    );
    if v.last_judged != v.in_force {
        outln!("last judged {}", v.last_judged.as_deref().unwrap_or("-"));
    }
    let counts = &v.counts;
    for (title, by) in [
        ("revisions", &counts.revisions),
        ("deployments", &counts.deployments),
        ("jobs", &counts.jobs),
    ] {
        let parts: Vec<String> = by.iter().map(|(k, n)| format!("{k} {n}")).collect();
        outln!(
            "{title:<11} {}",
            if parts.is_empty() { "-".into() } else { parts.join(", ") }
        );
    }
    outln!("queue age   {} ms", counts.queue_age_ms);
    slo_lines(&v.slos)?;
    // Replicas as the agents report them, not as asked: what differs is listed.
    let typed: Vec<crate::live::Deployment> = client
        .deployments()?
        .into_iter()
        .filter(|d| d.action == operator_proto::Action::Rollout)
        .collect();
    replica_lines(&typed)?;
    hold_and_canary_lines(&typed)?;
    certificates_line(&client)?;
    // The mesh between nodes, as agents report their links (said only when there is one).
    // An older daemon names every down link and counts none.
    let (links, down) = (v.mesh.links, &v.mesh.down);
    let down_total = v.mesh.down_total.max(down.len());
    if links > 0 || down_total > 0 {
        outln!("mesh        {links} links, {down_total} down");
        for d in down.iter().take(20) {
            outln!("  {} -> {}: down (no handshake within 180 s)", d.node, d.peer);
        }
    }
    Ok(0)
}

/// `pl status`'s service level objectives over the last day: one line each, met, burning
/// (below its target) or missing data.
fn slo_lines(slos: &[operator_proto::status::Slo]) -> Result<()> {
    if slos.is_empty() {
        return Ok(());
    }
    outln!("SLOs, last day (docs/operations.md):");
    for s in slos {
        let measured = s.measured.map_or("-".to_owned(), |m| format!("{:.1}%", m * 100.0));
        outln!(
            "  {:<18} {:<12} {measured:>6} of {} (target {:.0}%): {}",
            s.name,
            s.state.as_str(),
            s.over,
            s.target * 100.0,
            s.objective
        );
    }
    Ok(())
}

/// `pl status`'s replicas, as the agents report them, not as asked: the totals, then each
/// environment that differs (at most 20).
fn replica_lines(typed: &[crate::live::Deployment]) -> Result<()> {
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
    Ok(())
}

/// `pl status`'s rollbacks that hold environments away from Git, and canaries under way (the
/// share the new release has, and what the next step waits for).
fn hold_and_canary_lines(typed: &[crate::live::Deployment]) -> Result<()> {
    for d in typed {
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
    for d in typed {
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
    Ok(())
}

/// `pl status`'s certificates: how many are valid, the next to expire, and each that is not
/// (a control plane that issues none says nothing).
fn certificates_line(client: &Client) -> Result<()> {
    let list = client.certificates()?.certificates;
    if list.is_empty() {
        return Ok(());
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let valid = list.iter().filter(|c| c.state == CertificateState::Valid).count();
    let next = list
        .iter()
        .filter(|c| c.not_after_ms > 0)
        .min_by_key(|c| c.not_after_ms);
    outln!(
        "certificates {valid} valid of {}{}",
        list.len(),
        next.map(|c| format!(
            "; next to expire: {} in {} h",
            c.hostname,
            (c.not_after_ms - now) / 3_600_000
        ))
        .unwrap_or_default()
    );
    for c in list.iter().filter(|c| c.state != CertificateState::Valid).take(20) {
        outln!(
            "  {}: {}{}",
            c.hostname,
            c.state,
            c.last_error
                .as_deref()
                .map(|e| format!(" ({} failure(s): {e})", c.failures))
                .unwrap_or_default()
        );
    }
    Ok(())
}
