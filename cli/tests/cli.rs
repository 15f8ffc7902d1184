//! End-to-end tests of `pl` against real Git repositories made with the `git` CLI.

mod common;
use common::*;
use std::path::Path;

fn codes(json: &str) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(json).expect("json output");
    v["diagnostics"]
        .as_array()
        .expect("diagnostics")
        .iter()
        .map(|d| d["code"].as_str().expect("code").to_owned())
        .collect()
}

/// `pl <args> <repo>` refuses the tree with exactly the limit codes the test planted.
fn assert_limits_refused(repo: &Path, args: &[&str]) {
    let o = run(pl().args(args).arg(repo));
    assert_eq!(o.status.code(), Some(1));
    let mut got = codes(&stdout(&o));
    got.sort();
    assert_eq!(
        got,
        [
            "file-too-large",
            "not-a-regular-file",
            "symlink-in-tree",
            "symlink-in-tree",
            "too-many-documents"
        ]
    );
}

fn quickstart_repo(dir: &Path) {
    init_repo(dir);
    copy_tree(&workspace().join("examples/quickstart"), dir);
    commit_all(dir, "quickstart");
}

#[test]
fn examples_validate() {
    for ex in ["quickstart", "acme"] {
        let o = run(pl().arg("validate").arg(workspace().join("examples").join(ex)));
        assert_eq!(o.status.code(), Some(0), "{ex}: {}", stdout(&o));
    }
}

#[test]
fn limits_are_refused_on_disk_and_in_git() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = tmp.path();
    quickstart_repo(repo);
    std::fs::write(repo.join("big.yaml"), format!("# {}\n", "x".repeat(1 << 20))).expect("write");
    std::fs::write(repo.join("many.yaml"), "---\na: 1\n".repeat(10_001)).expect("write");
    std::os::unix::fs::symlink("/etc/passwd", repo.join("link.yaml")).expect("symlink");
    std::os::unix::fs::symlink("pools", repo.join("linked-dir")).expect("symlink");
    let fifo = std::process::Command::new("mkfifo")
        .arg(repo.join("pipe.yaml"))
        .status()
        .expect("mkfifo");
    assert!(fifo.success());
    assert_limits_refused(repo, &["validate", "--format", "json"]);

    // The same tree committed (git cannot hold the FIFO), plus a submodule entry.
    std::fs::remove_file(repo.join("pipe.yaml")).expect("rm fifo");
    let head = git(repo, &["rev-parse", "HEAD"]);
    git(repo, &["add", "-A"]);
    // A gitlink without a folder: `git add -A` would stage its removal, so commit directly.
    git(
        repo,
        &[
            "update-index",
            "--add",
            "--cacheinfo",
            &format!("160000,{head},vendored"),
        ],
    );
    git(repo, &["commit", "-q", "-m", "limits"]);
    assert_limits_refused(repo, &["validate", "--format", "json", "--rev", "HEAD"]);
    // A refused tree cannot be planned.
    let o = run(pl().args(["plan", "--base", "HEAD~1", "--head", "HEAD"]).arg(repo));
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("file-too-large"), "{}", stderr(&o));
}

#[test]
fn init_writes_a_valid_tree_and_refuses_to_overwrite() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("new");
    let o = run(pl().arg("init").arg(&dir));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(run(pl().arg("validate").arg(&dir)).status.code(), Some(0));
    // A second init refuses before writing anything: the edited file stays as it was.
    std::fs::write(dir.join("projects/hello.yaml"), "edited").expect("write");
    std::fs::remove_file(dir.join("pools/default.yaml")).expect("rm");
    let o = run(pl().arg("init").arg(&dir));
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("already exists"));
    assert_eq!(
        std::fs::read_to_string(dir.join("projects/hello.yaml")).expect("read"),
        "edited"
    );
    assert!(!dir.join("pools/default.yaml").exists(), "nothing was written");
}

#[test]
fn plan_uses_the_merge_base_of_diverged_branches() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = tmp.path();
    quickstart_repo(repo);
    git(repo, &["checkout", "-q", "-b", "feature"]);
    let env = "apiVersion: pushleft.dev/v1alpha1\nkind: Environment\nmetadata:\n  name: hello-preview\nspec:\n  project: hello\n  stage: preview\n  pool: default\n";
    std::fs::write(repo.join("environments/hello-preview.yaml"), env).expect("write");
    commit_all(repo, "feature: a preview");
    git(repo, &["checkout", "-q", "main"]);
    let pool = std::fs::read_to_string(repo.join("pools/default.yaml"))
        .expect("read")
        .replace("region: local", "region: moved");
    std::fs::write(repo.join("pools/default.yaml"), pool).expect("write");
    let main_tip = commit_all(repo, "main moves on");
    git(repo, &["checkout", "-q", "feature"]);
    let o = run(pl().args(["plan", "--base", "main", "--format", "json"]).arg(repo));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    let mb = v["mergeBase"].as_str().expect("merge base reported");
    assert_ne!(mb, main_tip);
    assert_eq!(v["base"]["commit"].as_str(), Some(mb));
    let changes = v["changes"].as_array().expect("changes");
    assert_eq!(changes.len(), 1, "only the feature's own change: {changes:?}");
    assert_eq!(changes[0]["name"], "hello-preview");
    assert_eq!(
        v["consequences"]["hostnamesAdded"][0],
        "hello-preview.preview.example.com"
    );
}

#[test]
fn exit_codes_colour_and_determinism() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = tmp.path();
    quickstart_repo(repo);
    let same = run(pl().args(["plan", "--detailed-exitcode", "--base", "HEAD"]).arg(repo));
    assert_eq!(same.status.code(), Some(0));
    assert!(stdout(&same).contains("Plan: 0 to add, 0 to change, 0 to destroy."));
    let p = repo.join("projects/hello.yaml");
    std::fs::write(
        &p,
        std::fs::read_to_string(&p)
            .expect("read")
            .replace("replicas: 2", "replicas: 3"),
    )
    .expect("write");
    let changed = run(pl().args(["plan", "--detailed-exitcode", "--base", "HEAD"]).arg(repo));
    assert_eq!(changed.status.code(), Some(2));
    assert!(!stdout(&changed).contains('\u{1b}'), "no colour when not a terminal");
    let plain = run(pl().args(["plan", "--base", "HEAD"]).arg(repo));
    assert_eq!(
        plain.status.code(),
        Some(0),
        "without --detailed-exitcode changes exit 0"
    );
    let coloured = run(pl().args(["plan", "--color", "always", "--base", "HEAD"]).arg(repo));
    assert!(stdout(&coloured).contains("\u{1b}[32m+"), "green insertions");
    let off = run(pl()
        .args(["plan", "--color", "always", "--no-color", "--base", "HEAD"])
        .arg(repo));
    assert!(!stdout(&off).contains('\u{1b}'));
    let bad_rev = run(pl()
        .args(["plan", "--detailed-exitcode", "--base", "no-such-branch"])
        .arg(repo));
    assert_eq!(bad_rev.status.code(), Some(1));
    assert!(stderr(&bad_rev).contains("no-such-branch"));
    let usage = run(pl().args(["plan", "--detailed-exitcode"]).arg(repo));
    assert_eq!(usage.status.code(), Some(1), "usage errors are not 'changes'");
    // Separate processes (separate hash seeds) give byte-identical output.
    let a = run(pl().args(["plan", "--format", "json", "--base", "HEAD"]).arg(repo));
    let b = run(pl().args(["plan", "--format", "json", "--base", "HEAD"]).arg(repo));
    assert_eq!(a.stdout, b.stdout);
    assert!(stdout(&a).contains("\"spec.roles.web.replicas\""));
}

#[test]
fn invalid_head_is_reported_in_the_plan_format() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = tmp.path();
    quickstart_repo(repo);
    std::fs::write(repo.join("environments/broken.yaml"), "apiVersion: pushleft.dev/v1alpha1\nkind: Environment\nmetadata: {name: broken}\nspec: {project: nope, stage: production, pool: default}\n").expect("write");
    let o = run(pl().args(["plan", "--format", "json", "--base", "HEAD"]).arg(repo));
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(codes(&stdout(&o)), ["dangling-reference"]);
}

#[test]
fn markdown_splits_long_plans_into_parts() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = tmp.path().join("state");
    init_repo(&repo);
    let synth = env!("CARGO_BIN_EXE_pl-synth");
    let synthesize = |bump: &str| {
        let s = std::process::Command::new(synth)
            .args(["--environments", "600", "--bump", bump, "--out"])
            .arg(&repo)
            .status()
            .expect("pl-synth");
        assert!(s.success());
    };
    synthesize("0");
    commit_all(&repo, "base");
    synthesize("1");
    let outdir = tmp.path().join("md");
    let o = run(pl()
        .args(["plan", "--format", "markdown", "--base", "HEAD", "--output-dir"])
        .arg(&outdir)
        .arg(&repo));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let mut parts: Vec<String> = std::fs::read_dir(&outdir)
        .expect("outdir")
        .map(|e| std::fs::read_to_string(e.expect("entry").path()).expect("read"))
        .collect();
    parts.sort_by_key(|p| p.lines().next().map(str::to_owned));
    assert!(parts.len() > 1, "600 changed environments do not fit one comment");
    let n = parts.len();
    for (i, p) in parts.iter().enumerate() {
        assert!(
            p.chars().count() <= 65_000,
            "part {} has {} characters",
            i + 1,
            p.chars().count()
        );
        assert!(
            p.starts_with(&format!("<!-- pushleft-plan part {}/{n} -->", i + 1)),
            "{}",
            &p[..60]
        );
    }
    let all = parts.concat();
    for i in 0..600 {
        assert!(all.contains(&format!("Environment/env-{i:06} ")), "env-{i:06} missing");
    }
    let stdout_md = run(pl().args(["plan", "--format", "markdown", "--base", "HEAD"]).arg(&repo));
    assert_eq!(stdout(&stdout_md).matches("<!-- pushleft-plan part ").count(), n);
}

#[test]
fn a_state_tree_inside_a_monorepo_folder() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = tmp.path();
    init_repo(repo);
    std::fs::write(repo.join("README.yaml"), "not: state\n").expect("write");
    copy_tree(&workspace().join("examples/quickstart"), &repo.join("infra"));
    commit_all(repo, "monorepo");
    let infra = repo.join("infra");
    let p = infra.join("environments/hello-production.yaml");
    std::fs::write(
        &p,
        std::fs::read_to_string(&p).expect("read") + "  replicas: {web: 5}\n",
    )
    .expect("write");
    commit_all(repo, "scale");
    let o = run(pl()
        .args(["plan", "--format", "json", "--base", "HEAD~1", "--head", "HEAD"])
        .arg(&infra));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert_eq!(v["changes"][0]["file"], "environments/hello-production.yaml");
    assert_eq!(v["consequences"]["replicasChanged"][0]["after"], 5);
    assert_eq!(
        run(pl().args(["validate", "--rev", "HEAD~1"]).arg(&infra))
            .status
            .code(),
        Some(0)
    );
}

#[test]
fn schema_completions_and_docs() {
    let o = run(pl().arg("schema"));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("schema is JSON");
    assert_eq!(v["properties"]["kind"]["enum"].as_array().map(Vec::len), Some(6));
    let o = run(pl().args(["completions", "bash"]));
    let script = stdout(&o);
    assert!(
        script.contains("_pl()") && script.contains("complete -F _pl"),
        "a bash completion function for pl"
    );
    for sub in ["validate", "plan", "verify", "secret"] {
        assert!(script.contains(sub), "completes `{sub}`");
    }
    let docs = std::fs::read_to_string(workspace().join("docs/diagnostics.md")).expect("docs/diagnostics.md");
    for code in state_schema::diag::Code::ALL {
        assert!(
            docs.contains(&format!("`{}`", code.as_str())),
            "docs/diagnostics.md lacks {code}"
        );
    }
}

#[test]
fn incremental_and_whole_plans_agree() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = tmp.path().join("state");
    init_repo(&repo);
    let synth = env!("CARGO_BIN_EXE_pl-synth");
    let synthesize = |extra: &[&str]| {
        let s = std::process::Command::new(synth)
            .args(["--environments", "200"])
            .args(extra)
            .arg("--out")
            .arg(&repo)
            .status()
            .expect("pl-synth");
        assert!(s.success());
    };
    synthesize(&[]);
    commit_all(&repo, "base");
    synthesize(&["--only", "42"]);
    commit_all(&repo, "one environment scaled");
    // Committed head: the trees are diffed and only the changed blob is parsed (that this
    // path runs is asserted in reconciler/tests/plans.rs, where the load is visible).
    let local = run(pl()
        .args(["plan", "--format", "json", "--base", "HEAD~1", "--head", "HEAD"])
        .arg(&repo));
    // Working-tree head: both trees are read whole.
    let whole = run(pl().args(["plan", "--format", "json", "--base", "HEAD~1"]).arg(&repo));
    assert_eq!(local.status.code(), Some(0), "{}", stderr(&local));
    assert_eq!(whole.status.code(), Some(0), "{}", stderr(&whole));
    let strip = |o: &std::process::Output| {
        let mut v: serde_json::Value = serde_json::from_str(&stdout(o)).expect("json");
        v.as_object_mut().expect("object").remove("head");
        v
    };
    assert_eq!(strip(&local), strip(&whole));
    assert_eq!(
        strip(&local)["consequences"]["replicasChanged"][0]["environment"],
        "env-000042"
    );
}

/// On a terminal `auto` colours, and `NO_COLOR` turns that off (run under `script`, which gives
/// the command a pseudo-terminal).
#[test]
fn no_color_is_honoured_on_a_terminal() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = tmp.path();
    quickstart_repo(repo);
    let p = repo.join("projects/hello.yaml");
    std::fs::write(
        &p,
        std::fs::read_to_string(&p)
            .expect("read")
            .replace("replicas: 2", "replicas: 3"),
    )
    .expect("write");
    let cmd = format!("{} plan --base HEAD {}", env!("CARGO_BIN_EXE_pl"), repo.display());
    let on_tty = |no_color: Option<&str>| {
        let mut c = std::process::Command::new("script");
        c.args(["-qec", &cmd, "/dev/null"]).env_remove("NO_COLOR");
        if let Some(v) = no_color {
            c.env("NO_COLOR", v);
        }
        let o = c.output().expect("script runs");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert!(on_tty(None).contains("\u{1b}["), "colour on a terminal");
    assert!(!on_tty(Some("1")).contains("\u{1b}["), "NO_COLOR=1 turns it off");
    assert!(on_tty(Some("")).contains("\u{1b}["), "an empty NO_COLOR does not count");
}

/// `pl --help` and `pl up --help` end with examples, and `pl up --help` lists its own options
/// before the global ones, under a heading of their own.
#[test]
fn help_shows_examples_and_keeps_global_options_apart() {
    let top = stdout(&run(pl().arg("--help")));
    assert!(top.contains("Examples:") && top.contains("pl up "), "{top}");
    let up = stdout(&run(pl().args(["up", "--help"])));
    let (own, rest) = up
        .split_once("Global options:")
        .expect("a heading for the global options");
    assert!(
        own.contains("--port") && own.contains("--build") && !own.contains("--color"),
        "{up}"
    );
    assert!(
        rest.contains("--color") && rest.contains("Examples:") && rest.contains("pl up --build"),
        "{up}"
    );
}

/// Every command in `pl --help` has a description of its own (`wait` once had `jobs`'s, and
/// `jobs` had none).
#[test]
fn help_describes_every_command_with_its_own_words() {
    let top = stdout(&run(pl().arg("--help")));
    let commands = top
        .split_once("Commands:")
        .expect("a commands list")
        .1
        .split("\n\n")
        .next()
        .unwrap_or_default();
    let mut seen = 0;
    for line in commands.lines() {
        let mut parts = line.split_whitespace();
        let Some(name) = parts.next() else { continue };
        let about: Vec<&str> = parts.collect();
        assert!(!about.is_empty(), "`pl {name}` has no description:\n{top}");
        seen += 1;
    }
    assert!(seen > 20, "{top}");
    let line = |name: &str| {
        commands
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(line("wait").contains("Wait until a revision is live"), "{top}");
    assert!(line("jobs").contains("List jobs"), "{top}");
}

/// Output to a reader that went away (`pl show | head -0`) ends quietly: no panic, no error,
/// and the command's own exit code (`--detailed-exitcode` keeps 2 for changes).
#[test]
fn a_closed_pipe_ends_output_quietly_with_the_commands_exit_code() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = tmp.path();
    quickstart_repo(repo);
    let project = repo.join("projects/hello.yaml");
    let text = std::fs::read_to_string(&project).expect("project");
    std::fs::write(&project, text.replace("replicas: 2", "replicas: 3")).expect("write");
    for (args, code) in [
        (vec!["show".to_owned(), repo.display().to_string()], 0),
        (
            vec![
                "plan".to_owned(),
                "--format".to_owned(),
                "json".to_owned(),
                "--detailed-exitcode".to_owned(),
                "--base".to_owned(),
                "HEAD".to_owned(),
                repo.display().to_string(),
            ],
            2,
        ),
    ] {
        let mut child = pl()
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("pl runs");
        drop(child.stdout.take());
        let o = child.wait_with_output().expect("pl ends");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        assert!(!err.contains("panicked") && !err.contains("error"), "{args:?}: {err}");
    }
}
