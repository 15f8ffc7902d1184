//! `pl-synth`: writes a synthetic state tree (see `state_schema::synthetic`) for benchmarks.
//!
//! `pl-synth --environments 10000 --out DIR [--bump N] [--vars N] [--only I]`; existing files under DIR
//! are overwritten, others left alone.

use anyhow::{Context, bail};
use state_schema::synthetic::{Params, generate};
use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut params = Params::new(100);
    let mut out: Option<PathBuf> = None;
    while let Some(a) = args.next() {
        let mut val = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--environments" => params.environments = val()?.parse()?,
            "--per-project" => params.per_project = val()?.parse()?,
            "--bump" => params.replicas_bump = val()?.parse()?,
            "--vars" => params.vars_bump = val()?.parse()?,
            "--only" => params.only = Some(val()?.parse()?),
            "--out" => out = Some(PathBuf::from(val()?)),
            "-h" | "--help" => {
                println!(
                    "usage: pl-synth --environments N --out DIR [--per-project N] [--bump N] [--vars N] [--only I]"
                );
                return Ok(());
            }
            other => bail!("unknown argument {other}"),
        }
    }
    let out = out.context("--out DIR is required")?;
    for (path, text) in generate(&params) {
        let p = out.join(&path);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}
