//! `pl verify` and the signature line of `pl plan`: reading the trust files (from outside the
//! state repository) and rendering verdicts.

use crate::args::DiagFormat;
use crate::render::verdict::VerdictJson;
use crate::render::{Paint, short};
use anyhow::{Context, bail};
use state_repo::source::StateRepo;
use state_repo::trust::CommitVerdict;
use state_repo::trust::allowed_signers::{self, AllowedSigner};
use state_repo::trust::policy::{self, Policy};
use std::path::Path;

fn read_limited(path: &Path, limit: usize, what: &str) -> anyhow::Result<String> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading the {what} {}", path.display()))?;
    if meta.len() > limit as u64 {
        bail!(
            "the {what} {} is {} bytes; the limit is {limit}",
            path.display(),
            meta.len()
        );
    }
    std::fs::read_to_string(path).with_context(|| format!("reading the {what} {}", path.display()))
}

pub fn load_signers(path: &Path) -> anyhow::Result<Vec<AllowedSigner>> {
    let text = read_limited(path, allowed_signers::MAX_FILE_BYTES, "allowed-signers file")?;
    allowed_signers::parse(&text).with_context(|| format!("in {}", path.display()))
}

pub fn load_policy(path: Option<&Path>) -> anyhow::Result<Option<Policy>> {
    let Some(path) = path else { return Ok(None) };
    let text = read_limited(path, policy::MAX_FILE_BYTES, "policy file")?;
    Ok(Some(
        policy::parse(&text).with_context(|| format!("in {}", path.display()))?,
    ))
}

/// One verdict as a line of text.
pub fn verdict_line(v: &CommitVerdict, paint: Paint) -> String {
    let sha = v.commit.to_string();
    match &v.result {
        Ok(s) => format!(
            "{}  {}  {}  {}",
            short(&sha),
            paint.green("valid  "),
            s.principal(),
            paint.dim(&s.fingerprint)
        ),
        Err(r) => format!(
            "{}  {}  {}: {}",
            short(&sha),
            paint.red("refused"),
            r.code(),
            r.message()
        ),
    }
}

/// `--at`: `now`, or a time in the allowed-signers format.
fn parse_at(at: &str) -> anyhow::Result<i64> {
    if at == "now" {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
        return Ok(i64::try_from(now.as_secs())?);
    }
    allowed_signers::parse_time(at).with_context(|| format!("--at `{at}` is `now` or YYYYMMDD[HHMM[SS]][Z]"))
}

pub fn verify(
    dir: &Path,
    range: &str,
    signers_path: &Path,
    policy_path: Option<&Path>,
    at: Option<&str>,
    format: DiagFormat,
    paint: Paint,
) -> anyhow::Result<u8> {
    let seen_at = at.map(parse_at).transpose()?;
    let signers = load_signers(signers_path)?;
    let policy = load_policy(policy_path)?;
    let repo = StateRepo::open(dir)?;
    let (from, to) = match range.split_once("..") {
        Some((a, b)) => (
            Some(repo.resolve(if a.is_empty() { "HEAD" } else { a })?.id),
            repo.resolve(if b.is_empty() { "HEAD" } else { b })?.id,
        ),
        None => (None, repo.resolve(range)?.id),
    };
    let verdicts = repo.verify_range(from, to, &signers, policy.as_ref(), seen_at)?;
    if verdicts.is_empty() {
        // `A..B` with nothing in B that A lacks: passing it would vouch for nothing.
        bail!("`{range}` names no commit: its end adds nothing to its start");
    }
    let ok = verdicts.iter().all(|v| v.result.is_ok());
    match format {
        DiagFormat::Text => {
            let mut out = String::new();
            for v in &verdicts {
                out.push_str(&verdict_line(v, paint));
                out.push('\n');
            }
            crate::out::text(&out)?;
        }
        DiagFormat::Json => {
            let commits: Vec<VerdictJson> = verdicts.iter().map(VerdictJson::from).collect();
            let v = serde_json::json!({ "formatVersion": 1, "ok": ok, "commits": commits });
            crate::out::text(&format!("{}\n", serde_json::to_string_pretty(&v)?))?;
        }
    }
    Ok(if ok { 0 } else { 1 })
}
