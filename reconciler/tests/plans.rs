//! Which path `load_for_plan` takes, on a real repository made with the `git` CLI: a one-file
//! local change reads and parses only the changed blobs and `pushleft.yaml`, and a change that
//! is not local reads both trees whole. (`pl`'s own test holds the two plans equal.)

#[path = "support/repo.rs"]
mod repo_support;

use repo_support::git;
use state_repo::load::load_for_plan;
use state_repo::source::{Rev, StateRepo};
use state_schema::plan::Scope;
use state_schema::synthetic::{Params, generate};

fn write_tree(dir: &std::path::Path, p: &Params) {
    for (path, text) in generate(p) {
        let f = dir.join(path);
        std::fs::create_dir_all(f.parent().expect("parent")).expect("mkdir");
        std::fs::write(f, text).expect("write");
    }
}

#[test]
fn a_local_change_parses_only_the_changed_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("state");
    std::fs::create_dir_all(&dir).expect("mkdir");
    git(&dir, &["init", "-q", "-b", "main"]);
    let base = Params::new(200);
    write_tree(&dir, &base);
    git(&dir, &["add", "-A"]);
    git(&dir, &["commit", "-q", "-m", "base"]);
    write_tree(&dir, &Params { only: Some(42), ..base });
    git(&dir, &["commit", "-q", "-am", "one environment scaled"]);
    let repo = StateRepo::open(&dir).expect("open");
    let (b, h) = (
        repo.resolve("HEAD~1").expect("base"),
        repo.resolve("HEAD").expect("head"),
    );
    let input = load_for_plan(&repo, &b, &Rev::Commit(h.clone())).expect("load");
    assert_eq!(input.scope, Scope::Local, "a one-file change is local");
    assert_eq!(
        (input.base.files, input.head.files),
        (2, 2),
        "pushleft.yaml and the changed file on each side, of 200 environments' files"
    );

    // A change of every environment's variables is not local: both trees are read whole.
    write_tree(&dir, &Params { vars_bump: 1, ..base });
    git(&dir, &["commit", "-q", "-am", "every variable"]);
    let h2 = repo.resolve("HEAD").expect("head");
    let input = load_for_plan(&repo, &h, &Rev::Commit(h2)).expect("load");
    assert_eq!(input.scope, Scope::Full);
    assert!(input.head.files > 200, "{}", input.head.files);
}
