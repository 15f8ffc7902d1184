//! Golden tests: `pl validate` on bad inputs and `pl plan` on revision pairs, in every format,
//! compared byte for byte with `golden/`. Regenerate with
//! `PL_UPDATE_GOLDEN=1 cargo test -p pushleft-cli --test golden`, then review `git diff golden/`.

mod common;
use common::*;
use std::path::Path;

fn cases(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("golden dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(!names.is_empty(), "no golden cases in {}", dir.display());
    names
}

#[test]
fn validate_golden() {
    let root = workspace().join("golden/validate");
    for case in cases(&root) {
        let tree = root.join(&case).join("tree");
        for (format, ext) in [("text", "txt"), ("json", "json")] {
            let o = run(pl()
                .args(["validate", "--color", "never", "--format", format])
                .arg(&tree));
            assert_eq!(o.status.code(), Some(1), "{case}: invalid trees exit 1\n{}", stderr(&o));
            check_golden(&root.join(&case).join(format!("expected.{ext}")), &stdout(&o));
        }
    }
}

#[test]
fn plan_golden() {
    let root = workspace().join("golden/plan");
    for case in cases(&root) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let repo = tmp.path().join("state");
        init_repo(&repo);
        copy_tree(&root.join(&case).join("base"), &repo);
        commit_all(&repo, "base");
        replace_tree(&repo, &root.join(&case).join("head"));
        // The working tree first (uncommitted head), then the committed head.
        let o = run(pl().args(["plan", "--color", "never", "--base", "main"]).arg(&repo));
        assert_eq!(o.status.code(), Some(0), "{case}: {}", stderr(&o));
        check_golden(&root.join(&case).join("expected-worktree.txt"), &stdout(&o));
        commit_all(&repo, "head");
        for (format, ext) in [("text", "txt"), ("markdown", "md"), ("json", "json")] {
            let o = run(pl()
                .args([
                    "plan", "--color", "never", "--base", "HEAD~1", "--head", "HEAD", "--format", format,
                ])
                .arg(&repo));
            assert_eq!(o.status.code(), Some(0), "{case} {format}: {}", stderr(&o));
            check_golden(&root.join(&case).join(format!("expected.{ext}")), &stdout(&o));
        }
    }
}
