//! Property tests: plan(a, a) is empty; canonical form is idempotent (render, parse, render
//! gives the same bytes); results do not depend on the order files are read in.

use proptest::prelude::*;
use state_schema::canonical::{self, Secrets};
use state_schema::parse::parse_file;
use state_schema::plan::plan;
use state_schema::state::{Loaded, assemble};
use state_schema::synthetic::{Params, generate};

fn load(files: &[(String, String)]) -> Loaded {
    assemble(
        files.iter().map(|(p, t)| parse_file(p, t.as_bytes())).collect(),
        Vec::new(),
    )
}

/// A synthetic tree plus a project whose labels, variables and commands hold arbitrary text,
/// written as JSON (valid YAML) so the input does not come from our own emitter.
fn arb_tree() -> impl Strategy<Value = Vec<(String, String)>> {
    (
        1usize..40,
        1usize..6,
        proptest::collection::btree_map("[A-Z_][A-Z0-9_]{0,8}", "\\PC{0,24}", 0..6),
        proptest::collection::vec("\\PC{0,16}", 0..4),
        proptest::collection::btree_map("[a-z]{1,8}", "\\PC{0,12}", 0..3),
    )
        .prop_map(|(envs, per, vars, argv, labels)| {
            let mut files = generate(&Params {
                per_project: per,
                ..Params::new(envs)
            });
            let doc = serde_json::json!({
                "apiVersion": "pushleft.dev/v1alpha1",
                "kind": "Project",
                "metadata": {"name": "arbitrary", "labels": labels},
                "spec": {
                    "image": format!("r.example.com/a@sha256:{}", "0".repeat(64)),
                    "roles": {"web": {"kind": "web", "command": argv}},
                    "env": vars,
                },
            });
            files.push((
                "projects/arbitrary.yaml".to_owned(),
                serde_json::to_string(&doc).expect("json"),
            ));
            files
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn plan_of_a_state_against_itself_is_empty(files in arb_tree()) {
        let a = load(&files);
        prop_assert_eq!(&a.diagnostics, &Vec::new());
        let p = plan(&a.state, &a.state);
        prop_assert!(p.is_empty());
        prop_assert!(p.consequences.is_empty());
    }

    #[test]
    fn canonical_form_is_idempotent(files in arb_tree()) {
        let a = load(&files);
        prop_assert_eq!(&a.diagnostics, &Vec::new());
        for loc in a.state.iter() {
            let once = canonical::to_yaml(&canonical::document(&loc.object, Secrets::Ciphertext));
            let reparsed = parse_file("canonical.yaml", once.as_bytes());
            prop_assert_eq!(&reparsed.diagnostics, &Vec::new(), "{}", once);
            prop_assert_eq!(reparsed.objects.len(), 1);
            prop_assert_eq!(&reparsed.objects[0].object, &loc.object);
            let twice = canonical::to_yaml(&canonical::document(&reparsed.objects[0].object, Secrets::Ciphertext));
            prop_assert_eq!(once, twice);
        }
    }

    #[test]
    fn file_order_does_not_matter(files in arb_tree(), seed in any::<u64>()) {
        let mut shuffled = files.clone();
        // A simple deterministic shuffle driven by the seed.
        let mut x = seed | 1;
        for i in (1..shuffled.len()).rev() {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            shuffled.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let (a, b) = (load(&files), load(&shuffled));
        prop_assert_eq!(&a.state, &b.state);
        prop_assert_eq!(&a.diagnostics, &b.diagnostics);
        let base = load(&generate(&Params::new(3)));
        let (pa, pb) = (plan(&base.state, &a.state), plan(&base.state, &b.state));
        prop_assert_eq!(serde_json::to_string(&pa).expect("json"), serde_json::to_string(&pb).expect("json"));
    }
}

#[test]
fn duplicates_are_reported_the_same_whatever_the_order() {
    let mut files = generate(&Params::new(5));
    let dup = files
        .iter()
        .find(|(p, _)| p.starts_with("environments/"))
        .cloned()
        .expect("an environment");
    files.push(("zz/copy.yaml".to_owned(), dup.1.clone()));
    let a = load(&files);
    files.reverse();
    let b = load(&files);
    assert_eq!(a.diagnostics, b.diagnostics);
    assert_eq!(a.diagnostics.len(), 1);
    assert_eq!(a.diagnostics[0].file, "zz/copy.yaml", "the later path is the duplicate");
}

/// A random local change to one environment of a synthetic tree: replica values, labels, an
/// image override changed (present on both sides).
fn local_mutation() -> impl Strategy<Value = (usize, u32, bool, bool)> {
    (0usize..30, 0u32..5, any::<bool>(), any::<bool>())
}

fn with_env_override(text: &str, image: Option<&str>, label: bool) -> String {
    let mut t = text.to_owned();
    if label {
        t = t.replace("tier: synthetic", "tier: changed");
    }
    if let Some(img) = image {
        t.push_str(&format!("  image: r.example.com/x@sha256:{img}\n"));
    }
    t
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The plan of the changed files alone equals the plan of the whole trees for local changes.
    #[test]
    fn local_plans_equal_whole_plans((idx, bump, label, image) in local_mutation()) {
        let base_files = generate(&Params { replicas_bump: 1, ..Params::new(30) });
        let head_files = generate(&Params { replicas_bump: 1 + bump, ..Params::new(30) });
        // Change one environment only: take the head text for it, keep base elsewhere.
        let target = format!("env-{idx:06}.yaml");
        let old_img = "1".repeat(64);
        let new_img = if image { "2".repeat(64) } else { old_img.clone() };
        let mut head = base_files.clone();
        let mut changed = Vec::new();
        let mut base = base_files.clone();
        for ((path, text), (_, new_text)) in head.iter_mut().zip(&head_files) {
            if path.ends_with(&target) {
                *text = with_env_override(new_text, Some(&new_img), label);
                changed.push(path.clone());
            }
        }
        for (path, text) in base.iter_mut() {
            if path.ends_with(&target) {
                *text = with_env_override(text, Some(&old_img), false);
            }
        }
        let (lb, lh) = (load(&base), load(&head));
        prop_assert_eq!(&lh.diagnostics, &Vec::new());
        let whole = plan(&lb.state, &lh.state);
        let pick = |files: &[(String, String)]| -> Vec<state_schema::parse::ParsedFile> {
            files.iter().filter(|(p, _)| changed.contains(p) || p == "pushleft.yaml").map(|(p, t)| parse_file(p, t.as_bytes())).collect()
        };
        let (pb, ph) = (state_schema::state::assemble_partial(pick(&base), Vec::new()), state_schema::state::assemble_partial(pick(&head), Vec::new()));
        prop_assert!(state_schema::incremental::is_local(&pb.state, &ph.state));
        let local = state_schema::plan::plan_scoped(&pb.state, &ph.state, state_schema::plan::Scope::Local);
        prop_assert_eq!(serde_json::to_string(&whole).expect("json"), serde_json::to_string(&local).expect("json"));
    }
}

#[test]
fn changes_that_reach_other_objects_are_not_local() {
    let files = generate(&Params::new(12));
    let env_path = files
        .iter()
        .find(|(p, _)| p.ends_with("env-000003.yaml"))
        .map(|(p, _)| p.clone())
        .expect("env");
    let project_path = files
        .iter()
        .find(|(p, _)| p.starts_with("projects/"))
        .map(|(p, _)| p.clone())
        .expect("project");
    let only = |files: &[(String, String)], path: &str| {
        state_schema::state::assemble_partial(
            files
                .iter()
                .filter(|(p, _)| p == path || p == "pushleft.yaml")
                .map(|(p, t)| parse_file(p, t.as_bytes()))
                .collect(),
            Vec::new(),
        )
    };
    let edit = |path: &str, from: &str, to: &str| -> Vec<(String, String)> {
        files
            .iter()
            .map(|(p, t)| {
                if p == path {
                    (p.clone(), t.replacen(from, to, 1))
                } else {
                    (p.clone(), t.clone())
                }
            })
            .collect()
    };
    for (path, from, to, why) in [
        (&env_path, "web:", "worker: 1\n    web:", "an overridden role is added"),
        (&env_path, "ENVIRONMENT_INDEX", "OTHER_VARIABLE", "variables change"),
        (&env_path, "stage: preview", "stage: production", "the hostname changes"),
        (&env_path, "pool: pool-a", "pool: pool-b", "a reference changes"),
        (&env_path, "name: env-000003", "name: env-renamed", "a name changes"),
        (
            &project_path,
            "LOG_LEVEL: info",
            "LOG_LEVEL: debug",
            "a project changes",
        ),
    ] {
        let changed = edit(path, from, to);
        assert_ne!(changed, files, "{why}: the edit applies");
        assert!(
            !state_schema::incremental::is_local(&only(&files, path).state, &only(&changed, path).state),
            "{why}"
        );
    }
    let same = edit(&env_path, "tier: synthetic", "tier: other");
    assert!(state_schema::incremental::is_local(
        &only(&files, &env_path).state,
        &only(&same, &env_path).state
    ));
}

/// Every form of `rollout` reads back from its canonical YAML as the same policy (the model's
/// fields were once printed instead: `watchSeconds: 0` and no `strategy`, refused on input).
#[test]
fn every_rollout_form_reads_back_from_its_canonical_form() {
    for rollout in [
        "{watchSeconds: 30}",
        "{strategy: switch}",
        "{strategy: canary, steps: [{weight: 10, pause: 60s}, {weight: 50}]}",
        "{strategy: canary, steps: [{weight: 25, pause: 2m}], gates: {maxErrorPercent: 2, maxP95Ms: 300, minRequests: 50}, watchSeconds: 120}",
        "{strategy: rolling}",
        "{strategy: rolling, maxSurge: '25%', maxUnavailable: 1}",
        "{strategy: rolling, maxSurge: 0, maxUnavailable: '50%', watchSeconds: 5}",
    ] {
        let text = format!(
            "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: p}}\nspec:\n  image: registry.example.invalid/p@sha256:{}\n  roles:\n    web: {{kind: web, port: 8080, replicas: 4, rollout: {rollout}}}\n",
            "0".repeat(64)
        );
        let parsed = parse_file("p.yaml", text.as_bytes());
        assert_eq!(parsed.diagnostics, Vec::new(), "{rollout}");
        let object = &parsed.objects[0].object;
        let once = canonical::to_yaml(&canonical::document(object, Secrets::Ciphertext));
        let reparsed = parse_file("canonical.yaml", once.as_bytes());
        assert_eq!(reparsed.diagnostics, Vec::new(), "{rollout}:\n{once}");
        assert_eq!(&reparsed.objects[0].object, object, "{rollout}:\n{once}");
    }
}
