//! `pl image update` against a real registry on loopback (Debian's `docker-registry`), filled
//! with real manifests pushed over the distribution API: a semantic-version range picks the
//! newest release and skips pre-releases and the next major; a tag pattern orders by its
//! number; a pinned digest is left alone; a tag moved to new bytes is followed; an
//! environment's own image goes on its own branch; `branch: applied` updates chain on one
//! branch for CI to push. Each update is a commit signed with the bot's key (`git
//! verify-commit` accepts it), on one branch per object that moves instead of piling up; HEAD,
//! the index and the work tree are untouched.

mod common;
#[path = "../../tests-support/registry.rs"]
mod registry_support;
use common::*;
use registry_support::registry;
use std::path::Path;
use std::process::Command;

fn project(name: &str, image: &str, updates: &str) -> String {
    format!(
        "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata:\n  name: {name}\nspec:\n  image: {image}\n  imageUpdates: {updates}\n  roles:\n    work:\n      kind: worker\n      command: [/bin/sleep, \"600\"]\n"
    )
}

fn branch_file(repo: &Path, branch: &str, file: &str) -> String {
    git(repo, &["show", &format!("{branch}:{file}")])
}

fn branches(repo: &Path) -> Vec<String> {
    git(
        repo,
        &[
            "for-each-ref",
            "--format=%(refname:short)",
            "refs/heads/pl-image-update",
        ],
    )
    .lines()
    .map(str::to_owned)
    .collect()
}

#[test]
fn updates_pick_by_policy_and_land_as_signed_commits_on_one_branch_each() {
    let reg = registry();
    let r = |name: &str| format!("127.0.0.1:{}/team/{name}", reg.port);
    let api140 = reg.push("team/api", "1.4.0", "api 1.4.0");
    let api141 = reg.push("team/api", "1.4.1", "api 1.4.1");
    reg.push("team/api", "1.5.0-rc.1", "api rc");
    reg.push("team/api", "2.0.0", "api 2");
    reg.push("team/api", "latest", "api latest");
    let web9 = reg.push("team/web", "main-9", "web 9");
    let web10 = reg.push("team/web", "main-10", "web 10");
    reg.push("team/web", "dev-99", "web dev");
    let db1 = reg.push("team/db", "15.1", "db 15.1");
    reg.push("team/db", "15.2", "db 15.2");

    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, _, _) = quickstart_copy(dir.path());
    init_repo(&repo);
    let bot = dir.path().join("bot");
    let o = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "bot", "-f"])
        .arg(&bot)
        .output()
        .expect("ssh-keygen");
    assert!(o.status.success());
    let bot_public = std::fs::read_to_string(bot.with_extension("pub")).expect("pub");
    let api_image = format!("{}:1.4.0@{api140}", r("api"));
    std::fs::write(
        repo.join("projects/api.yaml"),
        project("api", &api_image, "{semver: \"^1\"}"),
    )
    .expect("api");
    std::fs::write(
        repo.join("projects/web.yaml"),
        project(
            "web",
            &format!("{}:main-9@{web9}", r("web")),
            "{pattern: \"^main-(?P<key>[0-9]+)$\", order: numeric, branch: applied}",
        ),
    )
    .expect("web");
    std::fs::write(
        repo.join("projects/db.yaml"),
        project(
            "db",
            &format!("{}:15.1@{db1}", r("db")),
            "{semver: \"^15\", digests: pin}",
        ),
    )
    .expect("db");
    // hello-production runs an api image of its own, updated on its own branch.
    let env_path = repo.join("environments/hello-production.yaml");
    let env = std::fs::read_to_string(&env_path).expect("env");
    std::fs::write(
        &env_path,
        format!(
            "{env}  image: {}:1.4.0@{api140}\n  imageUpdates: {{semver: \"~1.4\", branch: applied}}\n",
            r("api")
        ),
    )
    .expect("env");
    let (code, text) = {
        let o = run(pl().arg("validate").arg(&repo));
        (o.status.code(), format!("{}{}", stdout(&o), stderr(&o)))
    };
    assert_eq!(code, Some(0), "{text}");
    let head = commit_all(&repo, "three projects with image policies");
    let update = || {
        let o = run(pl()
            .args(["image", "update", "--signing-key"])
            .arg(&bot)
            .arg("-C")
            .arg(&repo));
        (o.status.code(), stdout(&o), stderr(&o))
    };
    let (code, out, err) = update();
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("project/db: pinned"), "{out}");
    assert!(
        out.contains(&format!(
            "project/api: {api_image} → {}:1.4.1@{api141} on pl-image-update/project/api",
            r("api")
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!("{}:main-10@{web10} on pl-image-update/applied/main", r("web"))),
        "{out}"
    );
    assert!(out.contains("environment/hello-production:"), "{out}");
    assert!(
        branch_file(&repo, "pl-image-update/project/api", "projects/api.yaml").contains(&format!("1.4.1@{api141}"))
    );
    // The applied branch's updates chain: the environment's and web's, both on it.
    let applied = "pl-image-update/applied/main";
    assert!(branch_file(&repo, applied, "projects/web.yaml").contains(&format!("main-10@{web10}")));
    assert!(branch_file(&repo, applied, "environments/hello-production.yaml").contains(&format!("1.4.1@{api141}")));
    assert_eq!(
        git(&repo, &["rev-list", "--count", &format!("{head}..{applied}")]).trim(),
        "2"
    );
    // Signed by the bot, as git verifies it; nothing else moved.
    let signers = dir.path().join("allowed_signers");
    std::fs::write(&signers, format!("image-bot {bot_public}")).expect("signers");
    let verify = git_command(&repo)
        .args(["-c", &format!("gpg.ssh.allowedSignersFile={}", signers.display())])
        .args(["verify-commit", "pl-image-update/project/api"])
        .output()
        .expect("git verify-commit");
    assert!(verify.status.success(), "{}", String::from_utf8_lossy(&verify.stderr));
    assert_eq!(git(&repo, &["rev-parse", "HEAD"]).trim(), head);
    assert_eq!(
        git(&repo, &["status", "--porcelain"]).trim(),
        "",
        "work tree and index untouched"
    );
    assert!(
        std::fs::read_to_string(repo.join("projects/api.yaml"))
            .expect("api")
            .contains("1.4.0@")
    );

    // Again with nothing new: nothing written, no branch moves.
    let tip = git(&repo, &["rev-parse", "pl-image-update/project/api"]);
    let (_, out, _) = update();
    assert!(out.contains("already there"), "{out}");
    assert_eq!(git(&repo, &["rev-parse", "pl-image-update/project/api"]), tip);

    // Again, after 1.4.1 moved to new bytes and 1.4.2 came: the same branches move.
    let api141b = reg.push("team/api", "1.4.1", "api 1.4.1, rebuilt");
    assert_ne!(api141, api141b);
    let api142 = reg.push("team/api", "1.4.2", "api 1.4.2");
    let before = branches(&repo);
    let (code, out, _) = update();
    assert_eq!(code, Some(0));
    assert!(out.contains(&format!(":1.4.2@{api142}")), "{out}");
    assert_eq!(branches(&repo), before, "one branch per object, moved, not piled up");
    assert!(
        branch_file(&repo, "pl-image-update/project/api", "projects/api.yaml").contains(&format!("1.4.2@{api142}"))
    );
    assert_eq!(
        git(
            &repo,
            &["rev-list", "--count", &format!("{head}..pl-image-update/project/api")]
        )
        .trim(),
        "1",
        "on HEAD, not on the last update"
    );

    // Once merged, there is nothing to do.
    git(&repo, &["merge", "-q", "--ff-only", "pl-image-update/project/api"]);
    let (_, out, _) = update();
    assert!(out.contains("project/api: up to date"), "{out}");

    // An unreachable registry fails that image alone, with its code.
    let gone = format!("127.0.0.1:{}/team/gone:1.0.0@{api140}", test_ports::free_port());
    std::fs::write(
        repo.join("projects/gone.yaml"),
        project("gone", &gone, "{semver: \"^1\"}"),
    )
    .expect("gone");
    commit_all(&repo, "an image whose registry is gone");
    let (code, out, err) = update();
    assert_eq!(code, Some(1));
    assert!(err.contains("project/gone: error[image-registry-unreachable]"), "{err}");
    assert!(out.contains("project/api: up to date"), "{out}");
}

#[test]
fn policies_are_validated_where_they_are_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, _, _) = quickstart_copy(dir.path());
    let path = repo.join("projects/hello.yaml");
    let text = std::fs::read_to_string(&path).expect("project");
    for (updates, says) in [
        ("{semver: \"not a range\"}", "invalid-value"),
        ("{pattern: \"(\"}", "invalid-value"),
        ("{semver: \"^1\", pattern: \"x\"}", "exactly one of"),
        ("{semver: \"^1\", order: numeric}", "goes with `pattern`"),
        ("{semver: \"^1\", digests: frozen}", "one of track, pin"),
    ] {
        std::fs::write(
            &path,
            text.replace("  roles:\n", &format!("  imageUpdates: {updates}\n  roles:\n")),
        )
        .expect("write");
        let o = run(pl().arg("validate").arg(&repo));
        assert_eq!(o.status.code(), Some(1), "{updates}");
        assert!(stdout(&o).contains(says), "{updates}: {}", stdout(&o));
        assert!(stdout(&o).contains("projects/hello.yaml:"), "{}", stdout(&o));
    }
    std::fs::write(&path, text).expect("restore");
    let env = repo.join("environments/hello-production.yaml");
    let e = std::fs::read_to_string(&env).expect("env");
    std::fs::write(&env, format!("{e}  imageUpdates: {{semver: \"^1\"}}\n")).expect("write");
    let o = run(pl().arg("validate").arg(&repo));
    assert!(
        stdout(&o).contains("field-not-allowed") && stdout(&o).contains("its own `image`"),
        "{}",
        stdout(&o)
    );
}
