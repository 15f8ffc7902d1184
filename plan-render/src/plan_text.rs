//! `pl plan --format text`: a coloured unified diff of canonical YAML per object, the
//! consequences, and Terraform's familiar closing line.

use crate::{Paint, PlanHeader};
use state_schema::plan::{Action, Consequences, LineTag, Plan};

pub fn render(plan: &Plan, header: &PlanHeader, paint: Paint) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{} base {} → head {}\n",
        paint.bold("Pushleft plan:"),
        header.base.describe(),
        header.head.describe()
    ));
    if let Some(mb) = &header.merge_base {
        out.push_str(&paint.dim(&format!(
            "  base and head diverged; planning from their merge base {}\n",
            crate::short(mb)
        )));
    }
    if let Some(sig) = &header.signature {
        let text = format!("  signature: {}", sig.describe());
        out.push_str(&match sig.verdict {
            "valid" => paint.green(&text),
            "refused" => paint.red(&text),
            _ => paint.yellow(&text),
        });
        out.push('\n');
    }
    out.push('\n');
    if plan.is_empty() {
        out.push_str("No changes. The desired state matches the base.\n\n");
    }
    for change in &plan.changes {
        let (sign, verb) = match change.action {
            Action::Create => (paint.green("+"), paint.green("create")),
            Action::Update => (paint.yellow("~"), paint.yellow("update")),
            Action::Delete => (paint.red("-"), paint.red("delete")),
        };
        out.push_str(&format!(
            "{sign} {verb} {}/{} {}\n",
            change.kind,
            paint.bold(change.name.as_str()),
            paint.dim(&format!("({})", change.file))
        ));
        for line in &change.diff() {
            let text = match line.tag {
                LineTag::Hunk => paint.cyan(&line.text),
                LineTag::Context => format!(" {}", line.text),
                LineTag::Insert => paint.green(&format!("+{}", line.text)),
                LineTag::Delete => paint.red(&format!("-{}", line.text)),
            };
            out.push_str("    ");
            out.push_str(&text);
            out.push('\n');
        }
        out.push('\n');
    }
    if !plan.consequences.is_empty() {
        out.push_str(&paint.bold("Consequences:"));
        out.push('\n');
        for (sign, line) in consequence_lines(&plan.consequences) {
            let sign = match sign {
                '+' => paint.green("+"),
                '-' => paint.red("-"),
                '!' => paint.yellow("!"),
                other => paint.yellow(&other.to_string()),
            };
            out.push_str(&format!("  {sign} {line}\n"));
        }
        out.push('\n');
    }
    let s = plan.summary;
    out.push_str(&paint.bold(&format!(
        "Plan: {} to add, {} to change, {} to destroy.",
        s.add, s.change, s.destroy
    )));
    out.push('\n');
    out
}

/// An environment's rollout, and how it goes beyond a switch (a canary, rolling batches).
fn rollout_line(c: &Consequences, e: &state_schema::values::Name) -> String {
    let how = match c.progressive.iter().find(|p| &p.environment == e) {
        Some(p) if !p.canary.is_empty() => {
            let weights: Vec<String> = p.canary.iter().map(|w| format!("{w}%")).collect();
            format!("; a canary at {} before the switch", weights.join(", "))
        }
        Some(p) => {
            let roles: Vec<String> = p
                .rolling
                .iter()
                .map(|r| format!("{} in {} batch(es) of {}", r.role, r.batches, r.batch))
                .collect();
            format!("; rolling: {}", roles.join(", "))
        }
        None => String::new(),
    };
    format!("rollout of environment {e} (new generation{how})")
}

/// A replica the live fleet moves, places or leaves waiting.
fn replacement_line(m: &state_schema::replacement::Move) -> (char, String) {
    let replica = format!("replica {}/{}/{}", m.environment, m.role, m.index);
    let how = if m.new_generation { "new generation" } else { "scale" };
    match (&m.from, &m.to) {
        (Some(a), Some(b)) => ('!', format!("{replica} moves from node {a} to {b} (live fleet; {how})")),
        (None, Some(b)) => (
            '+',
            format!("{replica} was waiting: placed on node {b} (live fleet; {how})"),
        ),
        (Some(a), None) => (
            '!',
            format!(
                "{replica} leaves node {a} and waits: {} (live fleet)",
                m.reason.as_deref().unwrap_or("no node")
            ),
        ),
        (None, None) => ('!', format!("{replica} still waits (live fleet)")),
    }
}

/// The consequences as signed lines, shared with the Markdown renderer.
pub fn consequence_lines(c: &Consequences) -> Vec<(char, String)> {
    let mut out = Vec::new();
    out.extend(c.hostnames_added.iter().map(|h| ('+', format!("hostname {h}"))));
    out.extend(c.hostnames_removed.iter().map(|h| ('-', format!("hostname {h}"))));
    out.extend(c.replicas_changed.iter().map(|r| {
        (
            '~',
            format!("replicas {}/{}: {} → {}", r.environment, r.role, r.before, r.after),
        )
    }));
    out.extend(
        c.roles_added
            .iter()
            .map(|r| ('+', format!("role {}/{}", r.project, r.role))),
    );
    out.extend(
        c.roles_removed
            .iter()
            .map(|r| ('-', format!("role {}/{}", r.project, r.role))),
    );
    out.extend(c.nodes_drained.iter().map(|n| {
        let what = n.state.map_or("removed from the pool", |s| s.as_str());
        (
            '!',
            format!("node {}/{} {what}: its work moves elsewhere", n.pool, n.node),
        )
    }));
    out.extend(c.rollouts.iter().map(|e| ('~', rollout_line(c, e))));
    out.extend(c.moved.iter().filter_map(|m| {
        let (from, to) = (m.from.as_ref()?, m.to.as_ref()?);
        Some((
            '~',
            format!(
                "replica {}/{}/{} moves from node {from} to {to} (scale: the other replicas keep running)",
                m.environment, m.role, m.index
            ),
        ))
    }));
    out.extend(c.certificates_changed.iter().map(|r| {
        (
            '~',
            format!(
                "certificate of {} ({}): published again in place, no replica restarted",
                r.hostname, r.environment
            ),
        )
    }));
    out.extend(c.unplaced.iter().map(|u| {
        (
            '!',
            format!(
                "{} replica(s) of {}/{} will not fit{}: {} (they wait; `pl up` and `pl wait` do not call that done)",
                u.waiting,
                u.environment,
                u.role,
                if c.live_fleet {
                    " on the live fleet"
                } else {
                    " on the nodes Git declares"
                },
                u.reason
            ),
        )
    }));
    out.extend(c.replacements.iter().map(replacement_line));
    out.extend(c.held.iter().map(|h| {
        (
            '!',
            format!(
                "environment {} is held by a rollback ({}) at generation {}, generation {}'s release: it differs from Git until a commit changes it or `pl rollback --release {}` (live fleet)",
                h.environment, h.by, h.generation, h.to, h.environment
            ),
        )
    }));
    out
}
