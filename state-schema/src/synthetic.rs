//! Synthetic state trees of any size, for benchmarks and property tests. Pure: returns files
//! as (path, text); `pl-synth` writes them.
//!
//! Layout: `pushleft.yaml`, `pools/`, `projects/`, one file per environment under
//! `environments/<project>/`, and a Domain for every 50th environment. Each project's first
//! environment is production, the others previews, so hostnames never collide.

use std::fmt::Write;

/// What to generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    pub environments: usize,
    /// Environments per project (at least 1).
    pub per_project: usize,
    /// Added to every environment's web replicas: a different value changes every
    /// environment file (a "full change").
    pub replicas_bump: u32,
    /// Changes a variable of every environment: a full change that is not local, so a plan
    /// reads both trees whole.
    pub vars_bump: u32,
    /// When set, this environment gets one replica more on top of `replicas_bump`: against
    /// the same parameters without it, a one-file change.
    pub only: Option<usize>,
}

impl Params {
    pub fn new(environments: usize) -> Self {
        Params {
            environments,
            per_project: 10,
            replicas_bump: 0,
            vars_bump: 0,
            only: None,
        }
    }
}

fn digest(i: usize) -> String {
    format!(
        "{:064x}",
        (i as u128).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834) | 1
    )
}

/// Generates the files of a synthetic state tree, sorted by path.
pub fn generate(p: &Params) -> Vec<(String, String)> {
    let per = p.per_project.max(1);
    let projects = p.environments.div_ceil(per).max(1);
    let mut files = Vec::with_capacity(p.environments + projects + 4);
    files.push((
        "pushleft.yaml".to_owned(),
        "apiVersion: pushleft.dev/v1alpha1\nkind: Repository\nmetadata:\n  name: synthetic\nspec:\n  baseDomain: apps.example.com\n  previewDomain: preview.example.com\n".to_owned(),
    ));
    for (pool, region) in [("pool-a", "region-a"), ("pool-b", "region-b")] {
        let mut t = format!(
            "apiVersion: pushleft.dev/v1alpha1\nkind: NodePool\nmetadata:\n  name: {pool}\nspec:\n  region: {region}\n  nodes:\n"
        );
        for n in 0..8 {
            let _ = writeln!(
                t,
                "    - name: {pool}-node-{n}\n      capacity: {{cpu: \"16\", memory: 64Gi}}"
            );
        }
        files.push((format!("pools/{pool}.yaml"), t));
    }
    for j in 0..projects {
        let t = format!(
            "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata:\n  name: proj-{j:05}\nspec:\n  image: registry.example.invalid/proj-{j:05}@sha256:{}\n  roles:\n    web:\n      kind: web\n      command: [\"/app/server\", \"--port\", \"8080\"]\n      resources: {{cpu: 250m, memory: 256Mi}}\n    worker:\n      kind: worker\n      replicas: 1\n    nightly:\n      kind: cron\n      schedule: \"0 2 * * *\"\n  env:\n    LOG_LEVEL: info\n    PROJECT_ID: \"{j}\"\n",
            digest(j)
        );
        files.push((format!("projects/proj-{j:05}.yaml"), t));
    }
    for i in 0..p.environments {
        let j = i / per;
        let stage = if i % per == 0 { "production" } else { "preview" };
        let pool = if j.is_multiple_of(2) { "pool-a" } else { "pool-b" };
        let bump = p.replicas_bump + u32::from(p.only == Some(i));
        let t = format!(
            "apiVersion: pushleft.dev/v1alpha1\nkind: Environment\nmetadata:\n  name: env-{i:06}\n  labels: {{tier: synthetic}}\nspec:\n  project: proj-{j:05}\n  stage: {stage}\n  pool: {pool}\n  replicas:\n    web: {}\n  env:\n    ENVIRONMENT_INDEX: \"{i}\"\n    CONFIG_REVISION: \"{}\"\n",
            1 + i % 3 + bump as usize,
            p.vars_bump
        );
        files.push((format!("environments/proj-{j:05}/env-{i:06}.yaml"), t));
        if i % 50 == 0 {
            let d = format!(
                "apiVersion: pushleft.dev/v1alpha1\nkind: Domain\nmetadata:\n  name: domain-{i:06}\nspec:\n  hostname: www.customer-{i}.example.net\n  environment: env-{i:06}\n"
            );
            files.push((format!("domains/domain-{i:06}.yaml"), d));
        }
    }
    files.sort();
    files
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse_file;
    use crate::state::assemble;

    #[test]
    fn synthetic_trees_are_valid() {
        let files = generate(&Params::new(120));
        let parsed = files.iter().map(|(p, t)| parse_file(p, t.as_bytes())).collect();
        let loaded = assemble(parsed, Vec::new());
        assert_eq!(loaded.diagnostics, Vec::new());
        assert_eq!(loaded.state.environments().count(), 120);
    }

    #[test]
    fn one_file_change_changes_one_file() {
        let a = generate(&Params::new(40));
        let b = generate(&Params {
            only: Some(7),
            ..Params::new(40)
        });
        let differing = a.iter().zip(&b).filter(|(x, y)| x != y).count();
        assert_eq!(differing, 1);
        let c = generate(&Params {
            replicas_bump: 1,
            ..Params::new(40)
        });
        assert_eq!(a.iter().zip(&c).filter(|(x, y)| x != y).count(), 40);
    }
}
