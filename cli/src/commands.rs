//! The commands behind `pl`: each returns its exit code; errors become exit 1 in `main`.

use crate::render::{self, Paint, PlanHeader, Side};
use crate::{DiagFormat, PlanArgs, PlanFormat, ShowFormat};
use anyhow::{Context, bail};
use state_repo::load::{PlanInput, load, load_for_plan};
use state_repo::source::{Rev, StateRepo};
use state_schema::state::Loaded;
use std::path::Path;

use crate::out::text as out;

fn rev_of(repo: &StateRepo, spec: Option<&str>) -> anyhow::Result<Rev> {
    Ok(match spec {
        Some(s) => Rev::Commit(repo.resolve(s)?),
        None => Rev::WorkTree,
    })
}

pub fn validate(
    dir: &Path,
    rev: Option<&str>,
    format: DiagFormat,
    (signers, policy): (Option<&Path>, Option<&Path>),
    paint: Paint,
) -> anyhow::Result<u8> {
    // Trust files are read first: a bad one is refused before any work.
    let signers = signers.map(crate::verify::load_signers).transpose()?;
    let policy = crate::verify::load_policy(policy)?;
    let repo = StateRepo::open(dir)?;
    let mut loaded = load(&repo, &rev_of(&repo, rev)?)?;
    check_images(&mut loaded, signers.as_deref(), policy.as_ref());
    let text = match format {
        DiagFormat::Text => render::diagnostics::text(&loaded.diagnostics, loaded.state.len(), loaded.files, paint),
        DiagFormat::Json => render::diagnostics::json(&loaded.diagnostics, loaded.state.len(), loaded.files),
    };
    out(&text)?;
    Ok(if loaded.is_valid() { 0 } else { 1 })
}

/// Adds what nodes would say of the tree's images: every signature file's signatures verify,
/// and with trust files every environment's image meets its project's `images` rules now.
fn check_images(
    loaded: &mut Loaded,
    signers: Option<&[state_repo::trust::allowed_signers::AllowedSigner]>,
    policy: Option<&state_repo::trust::policy::Policy>,
) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let trust = policy.zip(signers);
    let found = state_repo::trust::images::check_tree(&loaded.state, trust, now);
    if !found.is_empty() {
        loaded.diagnostics.extend(found);
        state_schema::diag::sort_diagnostics(&mut loaded.diagnostics);
    }
}

/// Reports an invalid head in the plan's format and returns exit code 1.
fn invalid_head(loaded: &Loaded, format: PlanFormat, paint: Paint) -> anyhow::Result<u8> {
    match format {
        PlanFormat::Json => out(&render::diagnostics::json(
            &loaded.diagnostics,
            loaded.state.len(),
            loaded.files,
        ))?,
        _ => eprint!(
            "{}",
            render::diagnostics::text(&loaded.diagnostics, loaded.state.len(), loaded.files, paint)
        ),
    }
    Ok(1)
}

pub fn plan(args: &PlanArgs, fleet: Option<&crate::client::ServerArgs>, paint: Paint) -> anyhow::Result<u8> {
    let (format, output_dir) = (args.format, args.output_dir.as_deref());
    let dir = args.dir.clone().unwrap_or_else(|| std::path::PathBuf::from("."));
    let (base_spec, head_spec, detailed) = (args.base.as_str(), args.head.as_deref(), args.detailed_exitcode);
    if output_dir.is_some() && format != PlanFormat::Markdown {
        bail!("--output-dir goes with --format markdown");
    }
    // Trust files are read first: a bad one is refused before any work.
    let signers = args
        .allowed_signers
        .as_deref()
        .map(crate::verify::load_signers)
        .transpose()?;
    let policy = crate::verify::load_policy(args.policy.as_deref())?;
    let repo = StateRepo::open(&dir)?;
    let mut base = repo.resolve(base_spec)?;
    let head = rev_of(&repo, head_spec)?;
    let header = plan_header(&repo, &mut base, &head, signers.as_ref(), policy.as_ref())?;
    let PlanInput {
        base: base_state,
        head: mut head_state,
        scope,
    } = load_for_plan(&repo, &base, &head)?;
    check_images(&mut head_state, signers.as_deref(), policy.as_ref());
    if !head_state.is_valid() {
        return invalid_head(&head_state, format, paint);
    }
    if !base_state.is_valid() {
        eprintln!(
            "{} the base has {} problems; objects that do not decode there are planned as new",
            paint.yellow("warning:"),
            base_state.diagnostics.len()
        );
    }
    // The live fleet is asked for before planning: an unreachable control plane fails the
    // command before any work.
    let snapshot = fleet.map(crate::operator::fleet_snapshot).transpose()?;
    let mut plan = state_schema::plan::plan_scoped(&base_state.state, &head_state.state, scope);
    if let Some(snapshot) = &snapshot {
        on_live_fleet(&mut plan, snapshot, &head_state.state);
    }
    write_plan(&plan, &header, format, output_dir, paint)?;
    let code = if detailed && !plan.is_empty() { 2 } else { 0 };
    // The process ends right after printing: freeing tens of thousands of objects one by one
    // would only delay the exit.
    std::mem::forget(plan);
    std::mem::forget((base_state, head_state));
    Ok(code)
}

/// What a plan says of its two sides: the base (moved to the merge base when the two diverged:
/// a pull request is reviewed against where it branched off, not against a target branch
/// that moved on since), the head, and, with trust files, the head's signature verdict.
fn plan_header(
    repo: &StateRepo,
    base: &mut state_repo::source::Commit,
    head: &Rev,
    signers: Option<&Vec<state_repo::trust::allowed_signers::AllowedSigner>>,
    policy: Option<&state_repo::trust::policy::Policy>,
) -> anyhow::Result<PlanHeader> {
    let head_commit = match head {
        Rev::Commit(c) => Some(c.id),
        Rev::WorkTree => repo.resolve("HEAD").ok().map(|c| c.id),
    };
    let mut merge_base = None;
    if let Some(h) = head_commit
        && let Some(mb) = repo.merge_base(base.id, h)?
        && mb != base.id
    {
        merge_base = Some(mb.to_string());
        base.id = mb;
    }
    let mut header = PlanHeader {
        base: Side {
            rev: Some(base.spec.clone()),
            commit: Some(base.id.to_string()),
        },
        head: match head {
            Rev::Commit(c) => Side {
                rev: Some(c.spec.clone()),
                commit: Some(c.id.to_string()),
            },
            Rev::WorkTree => Side {
                rev: None,
                commit: None,
            },
        },
        merge_base,
        signature: None,
    };
    if let Some(signers) = signers {
        header.signature = Some(match head {
            Rev::Commit(c) => {
                let rules = policy.map(|p| p.rules.as_slice()).unwrap_or_default();
                let verdict = repo.verify_commit(c.id, signers, rules, Some(base.id), None)?;
                crate::render::verdict::VerdictJson::from(&verdict)
            }
            Rev::WorkTree => crate::render::verdict::VerdictJson::working_tree(),
        });
    }
    Ok(header)
}

/// What the plan adds on the live fleet: the replacements and holds it has, and whether the
/// change fits there rather than on the capacities Git declares (the environments it changes,
/// placed by the daemon's own function).
fn on_live_fleet(
    plan: &mut state_schema::plan::Plan<'_>,
    snapshot: &state_schema::replacement::Snapshot,
    head: &state_schema::state::State,
) {
    plan.consequences.replacements = state_schema::replacement::preview(snapshot, head);
    plan.consequences.held = snapshot.held.clone();
    plan.consequences.live_fleet = true;
    let c = &plan.consequences;
    let changed: std::collections::BTreeSet<state_schema::values::Name> = c
        .replicas_changed
        .iter()
        .map(|r| r.environment.clone())
        .chain(c.rollouts.iter().cloned())
        .chain(
            plan.changes
                .iter()
                .filter(|ch| ch.kind == state_schema::model::Kind::Environment)
                .map(|ch| ch.name.clone()),
        )
        .collect();
    plan.consequences.unplaced = state_schema::replacement::unplaced_on(snapshot, head, &changed);
}

/// The plan in `format`: on stdout, or Markdown parts as files in `output_dir`.
fn write_plan(
    plan: &state_schema::plan::Plan<'_>,
    header: &PlanHeader,
    format: PlanFormat,
    output_dir: Option<&Path>,
    paint: Paint,
) -> anyhow::Result<()> {
    match format {
        PlanFormat::Text => out(&render::plan_text::render(plan, header, paint))?,
        PlanFormat::Json => crate::out::stream(|mut w| render::plan_json::write(plan, header, &mut w))?,
        PlanFormat::Markdown => {
            let parts = render::markdown::render(plan, header);
            match output_dir {
                None => out(&parts.join("\n"))?,
                Some(d) => {
                    std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
                    for (i, p) in parts.iter().enumerate() {
                        let path = d.join(format!("plan-{}.md", i + 1));
                        std::fs::write(&path, p).with_context(|| format!("writing {}", path.display()))?;
                        eprintln!("wrote {}", path.display());
                    }
                }
            }
        }
    }
    Ok(())
}

pub fn show(dir: &Path, rev: Option<&str>, format: ShowFormat, paint: Paint) -> anyhow::Result<u8> {
    let repo = StateRepo::open(dir)?;
    let loaded = load(&repo, &rev_of(&repo, rev)?)?;
    if !loaded.is_valid() {
        eprint!(
            "{}",
            render::diagnostics::text(&loaded.diagnostics, loaded.state.len(), loaded.files, paint)
        );
        return Ok(1);
    }
    let docs = state_schema::show::documents(&loaded.state);
    match format {
        ShowFormat::Yaml => out(&state_schema::show::to_yaml_stream(&docs))?,
        ShowFormat::Json => out(&format!("{}\n", serde_json::to_string_pretty(&docs)?))?,
    }
    Ok(0)
}

pub fn schema() -> anyhow::Result<u8> {
    out(&format!(
        "{}\n",
        serde_json::to_string_pretty(&state_schema::schema::json_schema())?
    ))?;
    Ok(0)
}

/// The quickstart example, embedded so `pl init` needs nothing else.
const QUICKSTART: &[(&str, &str)] = &[
    ("pushleft.yaml", include_str!("../../examples/quickstart/pushleft.yaml")),
    (
        "projects/hello.yaml",
        include_str!("../../examples/quickstart/projects/hello.yaml"),
    ),
    (
        "environments/hello-production.yaml",
        include_str!("../../examples/quickstart/environments/hello-production.yaml"),
    ),
    (
        "pools/default.yaml",
        include_str!("../../examples/quickstart/pools/default.yaml"),
    ),
];

pub fn init(dir: &Path) -> anyhow::Result<u8> {
    // Refuse before writing anything: no file of the example may exist yet.
    for (rel, _) in QUICKSTART {
        let p = dir.join(rel);
        if p.exists() || p.symlink_metadata().is_ok() {
            bail!(
                "{} already exists; `pl init` writes into an empty state tree only",
                p.display()
            );
        }
    }
    for (rel, text) in QUICKSTART {
        let p = dir.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
    }
    eprintln!(
        "created a state tree in {}: run `pl validate {}` next",
        dir.display(),
        dir.display()
    );
    Ok(0)
}
