//! Deeply nested trees, in Git (5,000 levels, written with gix) and on disk (40 levels): listing
//! refuses them with `tree-too-deep` at 32 levels and never recurses past it, so a hostile push
//! cannot overflow a thread's stack. Every walk runs on a thread with a 256 KiB stack.

#[path = "support/repo.rs"]
mod repo_support;

use repo_support::{ROOT, git};
use state_repo::source::{Rev, SourceError, StateRepo};
use std::path::Path;

/// Runs `f` on a thread with a small stack, as a worker of a pool might have.
fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(f)
        .expect("thread")
        .join()
        .expect("no stack overflow")
}

/// Commits a tree with `pushleft.yaml` and a file `levels` folders deep; returns the sha.
fn commit_deep(dir: &Path, levels: usize) -> String {
    use gix::objs::tree::{Entry, EntryKind};
    let repo = gix::open(dir).expect("open");
    let blob = repo.write_blob(b"a: 1\n").expect("blob").detach();
    let root_blob = repo.write_blob(ROOT.as_bytes()).expect("blob").detach();
    let mut inner = gix::objs::Tree {
        entries: vec![Entry {
            mode: EntryKind::Blob.into(),
            filename: "deep.yaml".into(),
            oid: blob,
        }],
    };
    for _ in 0..levels {
        let id = repo.write_object(&inner).expect("tree").detach();
        inner = gix::objs::Tree {
            entries: vec![Entry {
                mode: EntryKind::Tree.into(),
                filename: "d".into(),
                oid: id,
            }],
        };
    }
    // `inner` now holds `d/` at the top; add the root file beside it (entries sorted).
    inner.entries.push(Entry {
        mode: EntryKind::Blob.into(),
        filename: "pushleft.yaml".into(),
        oid: root_blob,
    });
    let top = repo.write_object(&inner).expect("tree").detach();
    git(dir, &["commit-tree", &top.to_string(), "-m", "deep"])
}

#[test]
fn a_deep_git_tree_is_refused_without_deep_recursion() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("state");
    std::fs::create_dir_all(&dir).expect("mkdir");
    git(&dir, &["init", "-q", "-b", "main"]);
    let shallow = commit_deep(&dir, 3);
    let deep = commit_deep(&dir, 5_000);
    let (codes, diff) = on_small_stack(move || {
        let repo = StateRepo::open(&dir).expect("open");
        let c = repo.resolve(&deep).expect("resolve");
        let listing = repo.list(&Rev::Commit(c.clone())).expect("listing is bounded");
        let codes: Vec<String> = listing.problems.iter().map(|p| p.code.as_str().to_owned()).collect();
        let base = repo.resolve(&shallow).expect("resolve");
        let diff = repo.diff_commits(&base, &c).map(|_| ());
        let loaded = state_repo::load::load(&repo, &Rev::Commit(c)).expect("load");
        assert!(loaded.diagnostics.iter().any(|d| d.code.as_str() == "tree-too-deep"));
        (codes, diff)
    });
    assert_eq!(codes, ["tree-too-deep"]);
    assert!(matches!(diff, Err(SourceError::TooDeep { .. })), "{diff:?}");
}

#[test]
fn a_deep_working_tree_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("state");
    let mut deep = dir.clone();
    for _ in 0..40 {
        deep.push("d");
    }
    std::fs::create_dir_all(&deep).expect("mkdir");
    std::fs::write(deep.join("x.yaml"), "a: 1\n").expect("write");
    std::fs::write(dir.join("pushleft.yaml"), ROOT).expect("write");
    // Within the limit: 31 folders (the file is at depth 32) are read.
    let mut ok = dir.join("ok");
    for _ in 0..30 {
        ok.push("d");
    }
    std::fs::create_dir_all(&ok).expect("mkdir");
    std::fs::write(ok.join("fine.yaml"), "a: 1\n").expect("write");
    let (codes, files) = on_small_stack(move || {
        let repo = StateRepo::open(&dir).expect("open");
        let listing = repo.list(&Rev::WorkTree).expect("listing");
        let codes: Vec<String> = listing.problems.iter().map(|p| p.code.as_str().to_owned()).collect();
        let files: Vec<String> = listing.files.iter().map(|f| f.path.clone()).collect();
        (codes, files)
    });
    assert_eq!(codes, ["tree-too-deep"]);
    assert!(files.iter().any(|f| f.ends_with("fine.yaml")), "{files:?}");
    assert!(!files.iter().any(|f| f.ends_with("x.yaml")), "{files:?}");
}
