//! `pl plan --format markdown`: a pull-request comment. A summary table, the consequences and
//! a collapsible section per object; split into parts of at most [`PART_LIMIT`] characters
//! (GitHub refuses comments over 65,536), each part standalone and marked with an HTML comment
//! so a bot can find and update its own comments.

use crate::PlanHeader;
use crate::plan_text::consequence_lines;
use state_schema::plan::{Action, LineTag, Plan};

/// Most characters in one part, marker and heading included.
pub const PART_LIMIT: usize = 65_000;
/// Room kept for a part's marker and heading.
const HEADER_RESERVE: usize = 300;
/// Largest block of table rows or consequence lines before it is continued in a new block.
const CHUNK: usize = 16_000;

fn chars(s: &str) -> usize {
    s.chars().count()
}

fn icon(a: Action) -> &'static str {
    match a {
        Action::Create => "➕",
        Action::Update => "🔄",
        Action::Delete => "➖",
    }
}

/// Escapes text for a table cell or inline position.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('<', "&lt;").replace('>', "&gt;")
}

/// Groups lines into blocks of at most [`CHUNK`] characters, each starting with `head`.
fn chunked(head: &str, lines: &[String]) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut cur = head.to_owned();
    for l in lines {
        if chars(&cur) + chars(l) + 1 > CHUNK && cur != head {
            blocks.push(std::mem::replace(&mut cur, head.to_owned()));
        }
        cur.push_str(l);
        cur.push('\n');
    }
    if cur != head {
        blocks.push(cur);
    }
    blocks
}

fn details(change: &state_schema::plan::Change, budget: usize) -> String {
    let summary = format!(
        "<details><summary>{} <b>{}</b> {}/{} <code>{}</code></summary>\n\n```diff\n",
        icon(change.action),
        change.action.as_str(),
        change.kind,
        cell(change.name.as_str()),
        cell(&change.file)
    );
    let tail = "```\n\n</details>\n\n";
    let note = "… (diff truncated; run `pl plan` locally for the whole object)\n";
    let mut body = String::new();
    let mut size = chars(&summary) + chars(tail);
    for line in &change.diff() {
        let text = match line.tag {
            LineTag::Hunk => format!("{}\n", line.text),
            LineTag::Context => format!(" {}\n", line.text),
            LineTag::Insert => format!("+{}\n", line.text),
            LineTag::Delete => format!("-{}\n", line.text),
        };
        // Code fences end at a line of backticks; an indented one cannot.
        let text = if text.trim_start_matches([' ', '+', '-']).starts_with("```") {
            text.replace("```", "`\u{200b}``")
        } else {
            text
        };
        if size + chars(&text) + chars(note) > budget {
            body.push_str(note);
            break;
        }
        size += chars(&text);
        body.push_str(&text);
    }
    format!("{summary}{body}{tail}")
}

/// Renders the plan as one or more Markdown parts.
pub fn render(plan: &Plan, header: &PlanHeader) -> Vec<String> {
    let mut blocks: Vec<String> = Vec::new();
    let s = plan.summary;
    let mut intro = format!(
        "**base** {} → **head** {}\n",
        cell(&header.base.describe()),
        cell(&header.head.describe())
    );
    if let Some(mb) = &header.merge_base {
        intro.push_str(&format!(
            "\nBase and head diverged; planned from their merge base `{}`.\n",
            crate::short(mb)
        ));
    }
    if let Some(sig) = &header.signature {
        let mark = match sig.verdict {
            "valid" => "✅",
            "refused" => "⛔",
            _ => "⚠️",
        };
        intro.push_str(&format!("\n{mark} **signature**: {}\n", cell(&sig.describe())));
    }
    intro.push_str(&format!(
        "\n**Plan: {} to add, {} to change, {} to destroy.**\n\n",
        s.add, s.change, s.destroy
    ));
    if plan.is_empty() {
        intro.push_str("No changes. The desired state matches the base.\n\n");
    }
    blocks.push(intro);
    if !plan.is_empty() {
        let rows: Vec<String> = plan
            .changes
            .iter()
            .map(|c| {
                format!(
                    "| {} {} | {} | {} | `{}` |",
                    icon(c.action),
                    c.action.as_str(),
                    c.kind,
                    cell(c.name.as_str()),
                    cell(&c.file)
                )
            })
            .collect();
        for mut b in chunked("| Action | Kind | Name | File |\n|---|---|---|---|\n", &rows) {
            b.push('\n');
            blocks.push(b);
        }
    }
    let cons: Vec<String> = consequence_lines(&plan.consequences)
        .into_iter()
        .map(|(sign, l)| format!("- `{sign}` {}", cell(&l)))
        .collect();
    for mut b in chunked("#### Consequences\n\n", &cons) {
        b.push('\n');
        blocks.push(b);
    }
    let budget = PART_LIMIT - HEADER_RESERVE;
    blocks.extend(plan.changes.iter().map(|c| details(c, budget)));

    let mut parts: Vec<String> = Vec::new();
    let mut cur = String::new();
    for b in blocks {
        if !cur.is_empty() && chars(&cur) + chars(&b) > budget {
            parts.push(std::mem::take(&mut cur));
        }
        cur.push_str(&b);
    }
    parts.push(cur);
    let n = parts.len();
    parts
        .into_iter()
        .enumerate()
        .map(|(i, body)| {
            let title = if n == 1 {
                "### Pushleft plan".to_owned()
            } else {
                format!("### Pushleft plan (part {} of {n})", i + 1)
            };
            format!(
                "<!-- pushleft-plan part {}/{n} -->\n{title}\n\n{}",
                i + 1,
                body.trim_end_matches('\n')
            ) + "\n"
        })
        .collect()
}
