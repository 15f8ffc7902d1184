//! Helpers shared by the CLI's integration tests: the built `pl`, and real Git repositories
//! made with the `git` CLI under a fixed identity and clock so commit ids are reproducible.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cli/ has a parent")
        .to_owned()
}

/// `pl-reconciler` and `pl-agent` beside `pl` (a workspace test run builds them; a lone run of
/// a test that starts them builds them here).
pub fn siblings() {
    let dir = Path::new(env!("CARGO_BIN_EXE_pl"))
        .parent()
        .expect("bin dir")
        .to_owned();
    if !dir.join("pl-reconciler").exists() || !dir.join("pl-agent").exists() {
        let o = Command::new(env!("CARGO"))
            .args(["build", "-q", "-p", "reconciler", "-p", "pushleft-agent"])
            .output()
            .expect("cargo build");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
}

/// The quickstart copied under `dir` as `pl up --build` takes it: the repository
/// (`quickstart/`, not yet in Git), the image's build context with the static busybox
/// (`app/`), and where the state folder goes (`pl-state/`, not made).
pub fn quickstart_copy(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let (repo, context, state) = (dir.join("quickstart"), dir.join("app"), dir.join("pl-state"));
    for (from, to) in [
        (workspace().join("examples/quickstart"), &repo),
        (workspace().join("examples/quickstart/app"), &context),
    ] {
        assert!(
            Command::new("cp")
                .arg("-r")
                .arg(&from)
                .arg(to)
                .status()
                .expect("cp")
                .success()
        );
    }
    std::fs::copy("/bin/busybox", context.join("busybox")).expect("busybox-static");
    (repo, context, state)
}

/// `pl` with a clean environment for output: no colour, no pager surprises.
pub fn pl() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pl"));
    c.env_remove("NO_COLOR").env("PL_TEST", "1");
    c
}

pub fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("command runs")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("utf-8 stdout")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).expect("utf-8 stderr")
}

/// `git` with no user or system config and a fixed author, committer and date.
pub fn git_command(dir: &Path) -> Command {
    let mut c = Command::new("git");
    c.current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "Golden")
        .env("GIT_AUTHOR_EMAIL", "golden@pushleft.invalid")
        .env("GIT_COMMITTER_NAME", "Golden")
        .env("GIT_COMMITTER_EMAIL", "golden@pushleft.invalid")
        .env("GIT_AUTHOR_DATE", "2026-01-01T00:00:00Z")
        .env("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z");
    c
}

/// Runs git in `dir` (see [`git_command`]) and returns its trimmed output.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let o = git_command(dir).args(args).output().expect("git runs");
    assert!(
        o.status.success(),
        "git {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

/// Runs git with `input` on stdin and returns its exact output.
pub fn git_raw(dir: &Path, args: &[&str], input: Option<&[u8]>) -> Vec<u8> {
    use std::io::Write;
    let mut child = git_command(dir)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("git runs");
    let mut stdin = child.stdin.take().expect("stdin");
    if let Some(i) = input {
        stdin.write_all(i).expect("write stdin");
    }
    drop(stdin);
    let o = child.wait_with_output().expect("git finishes");
    assert!(
        o.status.success(),
        "git {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout
}

pub fn init_repo(dir: &Path) {
    std::fs::create_dir_all(dir).expect("mkdir");
    git(dir, &["init", "-q", "-b", "main"]);
}

/// Copies a directory tree (regular files and folders only).
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        let target = to.join(e.file_name());
        if e.file_type().expect("type").is_dir() {
            copy_tree(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).expect("copy");
        }
    }
}

/// Replaces the work tree (all but `.git`) with `from`.
pub fn replace_tree(repo: &Path, from: &Path) {
    for e in std::fs::read_dir(repo).expect("read_dir") {
        let e = e.expect("entry");
        if e.file_name() == ".git" {
            continue;
        }
        if e.file_type().expect("type").is_dir() {
            std::fs::remove_dir_all(e.path()).expect("rm -r");
        } else {
            std::fs::remove_file(e.path()).expect("rm");
        }
    }
    copy_tree(from, repo);
}

pub fn commit_all(repo: &Path, message: &str) -> String {
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-q", "--allow-empty", "-m", message]);
    git(repo, &["rev-parse", "HEAD"])
}

/// Compares `actual` with the golden file, or rewrites it under `PL_UPDATE_GOLDEN=1`.
pub fn check_golden(path: &Path, actual: &str) {
    if std::env::var_os("PL_UPDATE_GOLDEN").is_some() {
        std::fs::write(path, actual).expect("write golden");
        return;
    }
    let expected = std::fs::read_to_string(path).unwrap_or_else(|_| {
        panic!(
            "{} is missing: run `PL_UPDATE_GOLDEN=1 cargo test -p pushleft-cli --test golden`",
            path.display()
        )
    });
    if expected != actual {
        let diff = similar_lines(&expected, actual);
        panic!(
            "{} differs from the output (rerun with PL_UPDATE_GOLDEN=1 and review the diff):\n{diff}",
            path.display()
        );
    }
}

fn similar_lines(a: &str, b: &str) -> String {
    let mut out = String::new();
    for (i, (x, y)) in a.lines().zip(b.lines()).enumerate() {
        if x != y {
            out.push_str(&format!("line {}:\n- {x}\n+ {y}\n", i + 1));
            break;
        }
    }
    out.push_str(&format!("({} vs {} lines)", a.lines().count(), b.lines().count()));
    out
}
