//! Commit signatures against real repositories made with the `git` CLI and keys made by
//! `ssh-keygen`. For every case, `git verify-commit` with the same allowed-signers file must
//! agree with `pl verify` on whether the signature is good. `pl rollback --commit` writes a
//! revert on a branch of its own, signed with the user's own key, which both accept.

mod common;
#[path = "../../reconciler/tests/support/repo.rs"]
mod repo_support;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

struct Key {
    private: PathBuf,
    public: String,
}

fn keygen(dir: &Path, name: &str, args: &[&str]) -> Key {
    let private = dir.join(name);
    let o = Command::new("ssh-keygen")
        .args(args)
        .args(["-q", "-N", "", "-C", name, "-f"])
        .arg(&private)
        .output()
        .expect("ssh-keygen runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let public = std::fs::read_to_string(private.with_extension("pub")).expect("public key");
    Key {
        private,
        public: public.trim().to_owned(),
    }
}

/// `principals [options] key` lines.
fn allowed(dir: &Path, name: &str, lines: &[(&str, &str, &Key)]) -> PathBuf {
    let text: String = lines
        .iter()
        .map(|(p, opts, k)| format!("{p} {opts}{}{}\n", if opts.is_empty() { "" } else { " " }, k.public))
        .collect();
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write allowed signers");
    path
}

fn commit(repo: &Path, file: &str, content: &str, message: &str, key: Option<&Key>) -> String {
    let p = repo.join(file);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(&p, content).expect("write");
    git(repo, &["add", "-A"]);
    match key {
        Some(k) => {
            let signing = format!("user.signingKey={}", k.private.display());
            git(
                repo,
                &[
                    "-c",
                    "gpg.format=ssh",
                    "-c",
                    &signing,
                    "commit",
                    "-q",
                    "-S",
                    "-m",
                    message,
                ],
            );
        }
        None => {
            git(repo, &["commit", "-q", "-m", message]);
        }
    }
    git(repo, &["rev-parse", "HEAD"])
}

/// Writes a commit object that carries `sig` (already armoured) as its `gpgsig` header.
fn with_signature(repo: &Path, unsigned_raw: &[u8], sig: &str) -> String {
    let text = String::from_utf8(unsigned_raw.to_vec()).expect("commit text");
    let (headers, message) = text.split_once("\n\n").expect("headers and message");
    let folded = sig.trim_end().replace('\n', "\n ");
    let raw = format!("{headers}\ngpgsig {folded}\n\n{message}");
    String::from_utf8(git_raw(
        repo,
        &["hash-object", "-t", "commit", "-w", "--stdin"],
        Some(raw.as_bytes()),
    ))
    .expect("sha")
    .trim()
    .to_owned()
}

fn ssh_sign(dir: &Path, key: &Key, namespace: &str, payload: &[u8]) -> String {
    let file = dir.join(format!("payload-{namespace}"));
    std::fs::write(&file, payload).expect("write payload");
    let o = Command::new("ssh-keygen")
        .args(["-Y", "sign", "-n", namespace, "-f"])
        .arg(&key.private)
        .arg(&file)
        .output()
        .expect("ssh-keygen runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::read_to_string(format!("{}.sig", file.display())).expect("ssh-keygen writes FILE.sig")
}

/// `pl verify`'s verdict for one commit: `Ok(principal)` or `Err(code)`.
fn pl_verdict(repo: &Path, rev: &str, signers: &Path, policy: Option<&Path>) -> Result<String, String> {
    pl_verdict_with(repo, rev, signers, policy, &[])
}

fn pl_verdict_with(
    repo: &Path,
    rev: &str,
    signers: &Path,
    policy: Option<&Path>,
    extra: &[&str],
) -> Result<String, String> {
    let mut c = pl();
    c.args(["verify", rev, "--format", "json", "--allowed-signers"])
        .arg(signers)
        .arg("-C")
        .arg(repo)
        .args(extra);
    if let Some(p) = policy {
        c.arg("--policy").arg(p);
    }
    let o = run(&mut c);
    let v: serde_json::Value =
        serde_json::from_str(&stdout(&o)).unwrap_or_else(|_| panic!("json from pl verify: {}", stderr(&o)));
    let first = &v["commits"][0];
    let ok = v["ok"].as_bool().expect("ok");
    assert_eq!(
        o.status.code(),
        Some(if ok { 0 } else { 1 }),
        "exit code follows the verdict"
    );
    if ok {
        Ok(first["signer"]["principals"][0].as_str().expect("principal").to_owned())
    } else {
        Err(first["code"].as_str().expect("code").to_owned())
    }
}

fn git_verifies(repo: &Path, rev: &str, signers: &Path) -> bool {
    let file = format!("gpg.ssh.allowedSignersFile={}", signers.display());
    git_command(repo)
        .args(["-c", &file, "verify-commit", rev])
        .output()
        .expect("git runs")
        .status
        .success()
}

/// `pl verify` returns `expected`, and git agrees on good or bad.
fn check(repo: &Path, rev: &str, signers: &Path, expected: Result<&str, &str>) {
    let got = pl_verdict(repo, rev, signers, None);
    assert_eq!(got.as_deref().map_err(String::as_str), expected, "pl verify {rev}");
    assert_eq!(
        git_verifies(repo, rev, signers),
        expected.is_ok(),
        "git verify-commit agrees for {rev}"
    );
}

#[test]
fn signatures_agree_with_git_verify_commit() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let keys = tmp.path().join("keys");
    std::fs::create_dir_all(&keys).expect("mkdir");
    let alice = keygen(&keys, "alice", &["-t", "ed25519"]);
    let carol = keygen(&keys, "carol", &["-t", "ecdsa", "-b", "256"]);
    let rsa = keygen(&keys, "rsa", &["-t", "rsa", "-b", "2048"]);
    let mallory = keygen(&keys, "mallory", &["-t", "ed25519"]);
    let signers = allowed(
        &keys,
        "allowed",
        &[
            ("ops-alice", "namespaces=\"git\"", &alice),
            ("ops-carol", "", &carol),
            ("ops-rsa", "", &rsa),
        ],
    );
    let repo = tmp.path().join("state");
    init_repo(&repo);

    let good = commit(&repo, "a.yaml", "a: 1\n", "signed change", Some(&alice));
    check(&repo, &good, &signers, Ok("ops-alice"));
    let ecdsa = commit(&repo, "a.yaml", "a: 2\n", "ecdsa", Some(&carol));
    check(&repo, &ecdsa, &signers, Ok("ops-carol"));
    let rsa_commit = commit(&repo, "a.yaml", "a: 3\n", "rsa", Some(&rsa));
    check(&repo, &rsa_commit, &signers, Ok("ops-rsa"));

    let unsigned = commit(&repo, "a.yaml", "a: 4\n", "unsigned", None);
    check(&repo, &unsigned, &signers, Err("unsigned"));
    let unknown = commit(&repo, "a.yaml", "a: 5\n", "mallory", Some(&mallory));
    check(&repo, &unknown, &signers, Err("unknown-key"));

    // A signature copied from another commit onto different content.
    let raw = String::from_utf8(git_raw(&repo, &["cat-file", "commit", &good], None)).expect("text");
    let forged = raw.replacen("signed change", "forged change", 1);
    let forged = String::from_utf8(git_raw(
        &repo,
        &["hash-object", "-t", "commit", "-w", "--stdin"],
        Some(forged.as_bytes()),
    ))
    .expect("sha");
    check(&repo, forged.trim(), &signers, Err("bad-signature"));

    // The same payload signed in namespace `git` verifies; in namespace `file` it must not.
    let payload = git_raw(&repo, &["cat-file", "commit", &unsigned], None);
    let as_git = with_signature(&repo, &payload, &ssh_sign(&keys, &alice, "git", &payload));
    check(&repo, &as_git, &signers, Ok("ops-alice"));
    let as_file = with_signature(&repo, &payload, &ssh_sign(&keys, &alice, "file", &payload));
    check(&repo, &as_file, &signers, Err("wrong-namespace"));

    // Validity windows are checked against the commit time (2026-01-01).
    let expired = allowed(&keys, "expired", &[("ops-alice", "valid-before=\"20200101\"", &alice)]);
    check(&repo, &good, &expired, Err("key-expired"));
    let future = allowed(&keys, "future", &[("ops-alice", "valid-after=\"20300101\"", &alice)]);
    check(&repo, &good, &future, Err("key-not-yet-valid"));
    let window = allowed(
        &keys,
        "window",
        &[(
            "ops-alice",
            "valid-after=\"20250101\",valid-before=\"20270101\"",
            &alice,
        )],
    );
    check(&repo, &good, &window, Ok("ops-alice"));
    // A key retired in mid-2026: git's rule (the committer date, which the signer writes)
    // still passes the commit; `--at` adds the daemon's rule, the key valid when seen.
    let retired = allowed(&keys, "retired", &[("ops-alice", "valid-before=\"20260601\"", &alice)]);
    check(&repo, &good, &retired, Ok("ops-alice"));
    assert_eq!(
        pl_verdict_with(&repo, &good, &retired, None, &["--at", "now"]),
        Err("key-not-valid-when-seen".to_owned())
    );
    assert_eq!(
        pl_verdict_with(&repo, &good, &retired, None, &["--at", "20260301"]),
        Ok("ops-alice".to_owned())
    );
    // Quoted option lists, as git writes and reads them.
    let quoted = allowed(&keys, "quoted", &[("ops-alice", "namespaces=\"git,file\"", &alice)]);
    check(&repo, &good, &quoted, Ok("ops-alice"));
    // A key allowed only for another namespace.
    let files_only = allowed(&keys, "files-only", &[("ops-alice", "namespaces=\"file\"", &alice)]);
    check(&repo, &good, &files_only, Err("wrong-namespace"));

    // A merge commit, signed.
    git(&repo, &["checkout", "-q", "-b", "feature"]);
    commit(&repo, "b.yaml", "b: 1\n", "feature", Some(&alice));
    git(&repo, &["checkout", "-q", "main"]);
    commit(&repo, "c.yaml", "c: 1\n", "main moves", Some(&alice));
    let signing = format!("user.signingKey={}", alice.private.display());
    git(
        &repo,
        &[
            "-c",
            "gpg.format=ssh",
            "-c",
            &signing,
            "merge",
            "-q",
            "--no-ff",
            "-S",
            "-m",
            "merge feature",
            "feature",
        ],
    );
    let merge = git(&repo, &["rev-parse", "HEAD"]);
    assert_eq!(
        git(&repo, &["rev-list", "--parents", "-n", "1", "HEAD"])
            .split(' ')
            .count(),
        3,
        "a merge commit"
    );
    check(&repo, &merge, &signers, Ok("ops-alice"));
}

#[test]
fn path_rules_and_modes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let keys = tmp.path().join("keys");
    std::fs::create_dir_all(&keys).expect("mkdir");
    let ops = keygen(&keys, "ops", &["-t", "ed25519"]);
    let dev = keygen(&keys, "dev", &["-t", "ed25519"]);
    let signers = allowed(&keys, "allowed", &[("ops-alice", "", &ops), ("dev-bob", "", &dev)]);
    let policy = keys.join("policy.yaml");
    std::fs::write(
        &policy,
        "mode: head\nrules:\n  - paths: [\"environments/production/**\"]\n    principals: [\"ops-*\"]\n",
    )
    .expect("write");
    let strict = keys.join("strict.yaml");
    std::fs::write(&strict, "mode: strict\n").expect("write");
    let repo = tmp.path().join("state");
    init_repo(&repo);
    let base = commit(&repo, "environments/production/api.yaml", "x: 1\n", "base", Some(&ops));

    // dev-bob may change previews but not production.
    let preview = commit(&repo, "environments/preview/api.yaml", "x: 1\n", "preview", Some(&dev));
    assert_eq!(
        pl_verdict(&repo, &preview, &signers, Some(&policy)),
        Ok("dev-bob".into())
    );
    let prod = commit(
        &repo,
        "environments/production/api.yaml",
        "x: 2\n",
        "prod by dev",
        Some(&dev),
    );
    assert_eq!(
        pl_verdict(&repo, &prod, &signers, Some(&policy)),
        Err("principal-not-allowed-for-path".into())
    );
    // The signature itself is good, as git says; the refusal is the policy's.
    assert_eq!(pl_verdict(&repo, &prod, &signers, None), Ok("dev-bob".into()));
    assert!(git_verifies(&repo, &prod, &signers));
    let o = run(pl()
        .args(["verify", &prod, "--allowed-signers"])
        .arg(&signers)
        .arg("--policy")
        .arg(&policy)
        .arg("-C")
        .arg(&repo));
    assert!(
        stdout(&o).contains("environments/production/api.yaml") && stdout(&o).contains("rule 1"),
        "names the path and the rule: {}",
        stdout(&o)
    );

    // Ranges: head mode looks at the tip (rules over the whole range); strict at every commit.
    let unsigned = commit(&repo, "environments/preview/web.yaml", "y: 1\n", "unsigned", None);
    let tip = commit(&repo, "environments/preview/web.yaml", "y: 2\n", "tip", Some(&ops));
    let range = format!("{preview}..{tip}");
    let run_range = |p: &Path| {
        run(pl()
            .args(["verify", &range, "--format", "json", "--allowed-signers"])
            .arg(&signers)
            .arg("--policy")
            .arg(p)
            .arg("-C")
            .arg(&repo))
    };
    // Head mode: the tip's signer (ops-alice, allowed on production) vouches for the range.
    let head_mode = run_range(&policy);
    let v: serde_json::Value = serde_json::from_str(&stdout(&head_mode)).expect("json");
    assert_eq!(
        (v["ok"].as_bool(), v["commits"].as_array().map(Vec::len)),
        (Some(true), Some(1)),
        "{v}"
    );
    assert_eq!(head_mode.status.code(), Some(0));
    // Strict mode with the same rule: every commit answers for itself.
    std::fs::write(
        &strict,
        "mode: strict\nrules:\n  - paths: [\"environments/production/**\"]\n    principals: [\"ops-*\"]\n",
    )
    .expect("write");
    let strict_mode = run_range(&strict);
    let v: serde_json::Value = serde_json::from_str(&stdout(&strict_mode)).expect("json");
    let codes: Vec<&str> = v["commits"]
        .as_array()
        .expect("commits")
        .iter()
        .map(|c| c["code"].as_str().unwrap_or("valid"))
        .collect();
    assert_eq!(codes, ["principal-not-allowed-for-path", "unsigned", "valid"]);
    assert_eq!(strict_mode.status.code(), Some(1));
    // A range that names no commit (its end is behind its start) is refused, not passed.
    let bad = run(pl()
        .args(["verify", &format!("{tip}..{base}"), "--allowed-signers"])
        .arg(&signers)
        .arg("-C")
        .arg(&repo));
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains("names no commit"), "{}", stderr(&bad));
    let _ = unsigned;

    plan_header_gives_the_head_verdict(tmp.path(), &signers, &ops, &dev);
}

fn plan_header_gives_the_head_verdict(tmp: &Path, signers: &Path, ops: &Key, dev: &Key) {
    let repo = tmp.join("plan-state");
    init_repo(&repo);
    copy_tree(&workspace().join("examples/quickstart"), &repo);
    let policy = tmp.join("env-policy.yaml");
    std::fs::write(
        &policy,
        "rules:\n  - paths: [\"environments/**\"]\n    principals: [\"ops-*\"]\n",
    )
    .expect("write");
    let env = "environments/hello-production.yaml";
    let text = std::fs::read_to_string(repo.join(env)).expect("read");
    let base = commit(
        &repo,
        "pools/default.yaml",
        &std::fs::read_to_string(repo.join("pools/default.yaml")).expect("read"),
        "base",
        Some(ops),
    );
    let by_ops = commit(
        &repo,
        env,
        &format!("{text}  replicas: {{web: 3}}\n"),
        "ops scales",
        Some(ops),
    );
    let by_dev = commit(
        &repo,
        env,
        &format!("{text}  replicas: {{web: 4}}\n"),
        "dev scales",
        Some(dev),
    );
    let unsigned = commit(&repo, env, &format!("{text}  replicas: {{web: 5}}\n"), "unsigned", None);
    let plan = |head: Option<&str>, policy: Option<&Path>, format: &str| {
        let mut c = pl();
        c.arg("plan")
            .arg(&repo)
            .args(["--base", &base, "--format", format, "--allowed-signers"])
            .arg(signers);
        if let Some(h) = head {
            c.args(["--head", h]);
        }
        if let Some(p) = policy {
            c.arg("--policy").arg(p);
        }
        let o = run(&mut c);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        stdout(&o)
    };
    let json = |s: String| -> serde_json::Value { serde_json::from_str(&s).expect("plan json") };
    let v = json(plan(Some(&by_ops), Some(&policy), "json"));
    assert_eq!(
        (
            v["headSignature"]["verdict"].as_str(),
            v["headSignature"]["signer"]["principals"][0].as_str()
        ),
        (Some("valid"), Some("ops-alice"))
    );
    let v = json(plan(Some(&by_dev), Some(&policy), "json"));
    assert_eq!(v["headSignature"]["code"], "principal-not-allowed-for-path");
    let v = json(plan(Some(&by_dev), None, "json"));
    assert_eq!(
        v["headSignature"]["verdict"], "valid",
        "without a policy only the signature counts"
    );
    let v = json(plan(None, None, "json"));
    assert_eq!(v["headSignature"]["verdict"], "working-tree");
    let text = plan(Some(&by_ops), None, "text");
    assert!(
        text.contains("signature: valid, signed by ops-alice (SHA256:"),
        "{text}"
    );
    let md = plan(Some(&unsigned), None, "markdown");
    assert!(md.contains("**signature**: refused [unsigned]"), "{md}");
}

#[test]
fn rollback_commit_reverts_the_release_signed_and_keeps_later_changes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = repo_support::Repo::new(tmp.path());
    let project = |digest: char, replicas: u32| {
        let d: String = std::iter::repeat_n(digest, 64).collect();
        format!(
            "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: api}}\nspec:\n  image: registry.example.invalid/api@sha256:{d}\n  roles:\n    web: {{kind: web, port: 8080, replicas: {replicas}}}\n"
        )
    };
    let pl_in = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_pl"))
            .args(args)
            .arg("-C")
            .arg(&repo.dir)
            .output()
            .expect("pl");
        (
            o.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    repo.write("projects/api.yaml", &project('a', 2));
    repo.write(
        "envs/api-production.yaml",
        &repo_support::environment("api-production", "api"),
    );
    repo.commit("release a", true);
    // One release only: nothing to go back to.
    let (code, _, err) = pl_in(&["rollback", "api-production", "--commit"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("error[no-previous-release]"), "{err}");
    repo.write("projects/api.yaml", &project('b', 2));
    let release_b = repo.commit("release b", true);
    repo.write("projects/api.yaml", &project('b', 3));
    repo.commit("scale to 3", true);

    // The user's own signing key, as git's configuration says (the public key's path, as
    // git's ssh signing takes it; the private key is beside it).
    for (k, v) in [
        ("gpg.format", "ssh"),
        ("user.signingkey", &format!("{}.pub", repo.key.display())),
        ("user.name", "Alice"),
        ("user.email", "alice@example.invalid"),
    ] {
        repo.git(&["config", k, v]);
    }
    // The work tree is left alone: a change in it stays, and does not count.
    repo.write("projects/api.yaml", &project('c', 3));
    let before = repo.git(&["rev-parse", "HEAD"]);
    let (code, out, err) = pl_in(&["rollback", "api-production", "--commit"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("wrote pl-rollback/api-production") && out.contains("(release b), signed"),
        "{out}"
    );
    assert_eq!(
        repo.git(&["rev-parse", "HEAD"]),
        before,
        "the current branch did not move"
    );
    let file = std::fs::read_to_string(repo.dir.join("projects/api.yaml")).expect("read");
    assert_eq!(file, project('c', 3), "the work tree untouched");
    let branch = "pl-rollback/api-production";
    assert_eq!(
        repo.git(&["rev-parse", &format!("{branch}^")]),
        before,
        "one commit on HEAD"
    );
    let message = repo.git(&["log", "-1", "--format=%B", branch]);
    assert!(
        message.contains(&format!("Reverts {release_b} (release b).")),
        "{message}"
    );
    assert_eq!(
        repo.git(&["log", "-1", "--format=%an <%ae>", branch]),
        "Alice <alice@example.invalid>"
    );
    // Release a's image again, the later scale kept (the same file: its lines merged).
    assert_eq!(
        repo.git(&["show", &format!("{branch}:projects/api.yaml")]),
        project('a', 3).trim_end()
    );
    // Signed with the user's key: `pl verify` and `git verify-commit` accept it.
    let signers = tmp.path().join("allowed_signers");
    std::fs::write(&signers, &repo.signers).expect("signers");
    check(&repo.dir, branch, &signers, Ok("ops-alice"));
    let (code, _, err) = pl_in(&["rollback", "api-production", "--commit"]);
    assert_eq!(code, 1);
    assert!(err.contains("error[branch-exists]"), "{err}");
    // An environment nobody declares.
    let (code, _, err) = pl_in(&["rollback", "api-staging", "--commit"]);
    assert_eq!(code, 1);
    assert!(err.contains("error[unknown-environment]"), "{err}");
}
