//! `pl image sign`, and what `pl validate` and `pl plan` say of a tree's images, against keys
//! made by `ssh-keygen`: the signature `pl` writes is byte for byte OpenSSH's own (`ssh-keygen
//! -Y sign -n pushleft-image`), and OpenSSH's verifies; with the trust files, an unsigned
//! image, one signed by a key no `images` rule trusts and a tampered signature are each
//! reported with the node's code at the file, line and column of the `image` that chose it.

mod common;
#[path = "../../tests-support/ssh.rs"]
mod ssh;
use common::*;
use ssh::keygen;
use std::path::Path;

const DIGEST: &str = "sha256:3b0f9c1d5e2a4f6b8c7d9e0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e";

fn openssh_sign(key: &Path, message: &str) -> String {
    ssh::openssh_sign(key, "pushleft-image", message)
}

fn validate(repo: &Path, trust: &[&Path]) -> (i32, String) {
    let mut c = pl();
    c.arg("validate").arg(repo);
    if let [signers, policy] = trust {
        c.arg("--allowed-signers").arg(signers).arg("--policy").arg(policy);
    }
    let o = run(&mut c);
    (o.status.code().unwrap_or(-1), format!("{}{}", stdout(&o), stderr(&o)))
}

#[test]
fn signatures_are_openssh_s_and_validate_checks_them_as_nodes_would() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, _, _) = quickstart_copy(dir.path());
    let (ci, ci_public) = keygen(dir.path(), "ci");
    let (intruder, _) = keygen(dir.path(), "intruder");
    let signers = dir.path().join("allowed_signers");
    std::fs::write(
        &signers,
        format!("ci-release namespaces=\"pushleft-image\" {ci_public}\n"),
    )
    .expect("signers");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "images:\n  - projects: [hello]\n    principals: [ci-release]\n",
    )
    .expect("policy");
    let trust = [signers.as_path(), policy.as_path()];
    let file = repo.join(format!(
        "image-signatures/sha256-{}.sig",
        DIGEST.trim_start_matches("sha256:")
    ));

    // Unsigned: valid as a tree, refused under the policy, where the image is named.
    assert_eq!(validate(&repo, &[]).0, 0);
    let (code, text) = validate(&repo, &trust);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("projects/hello.yaml:8:10"), "{text}");
    assert!(text.contains("image-unsigned"), "{text}");

    // Signed by a key no rule trusts.
    let image = format!("registry.example.invalid/hello@{DIGEST}");
    let sign = |key: &Path| {
        let o = run(pl()
            .args(["image", "sign", &image, "--signing-key"])
            .arg(key)
            .arg("-C")
            .arg(&repo));
        (o.status.code(), stdout(&o), stderr(&o))
    };
    let (code, out, err) = sign(&intruder);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out.trim(),
        format!("image-signatures/sha256-{}.sig", DIGEST.trim_start_matches("sha256:"))
    );
    assert_eq!(
        std::fs::read_to_string(&file).expect("sig"),
        openssh_sign(&intruder, DIGEST),
        "what ssh-keygen -Y sign writes"
    );
    let (code, text) = validate(&repo, &trust);
    assert_eq!(code, 1);
    assert!(
        text.contains("image-signer-untrusted") && text.contains("projects/hello.yaml:8:10"),
        "{text}"
    );

    // The trusted key's signature added beside it: valid; signing again adds nothing.
    assert_eq!(sign(&ci).0, Some(0));
    let (code, text) = validate(&repo, &trust);
    assert_eq!(code, 0, "{text}");
    let before = std::fs::read_to_string(&file).expect("sig");
    let (code, out, _) = sign(&ci);
    assert_eq!((code, out.contains("already signed")), (Some(0), true));
    assert_eq!(std::fs::read_to_string(&file).expect("sig"), before);
    assert_eq!(before.matches("BEGIN SSH SIGNATURE").count(), 2);

    // A signature of another digest under this one's name: refused even without trust files,
    // at the line its block starts on.
    let other = "sha256:0000000000000000000000000000000000000000000000000000000000000001";
    std::fs::write(&file, format!("{before}\n{}", openssh_sign(&ci, other))).expect("write");
    let (code, text) = validate(&repo, &[]);
    assert_eq!(code, 1, "{text}");
    let line = before.lines().count() + 2;
    assert!(
        text.contains(&format!("sha256-{}.sig:{line}:1", DIGEST.trim_start_matches("sha256:")))
            && text.contains("image-signature-invalid"),
        "{text}"
    );
    // And junk in the file, or a file whose name is no digest, is refused with its place.
    std::fs::write(&file, "not a signature\n").expect("write");
    let (_, text) = validate(&repo, &[]);
    assert!(
        text.contains(".sig:1:1") && text.contains("outside a signature block"),
        "{text}"
    );
    std::fs::remove_file(&file).expect("rm");
    std::fs::write(repo.join("image-signatures/hello.sig"), before).expect("write");
    let (code, text) = validate(&repo, &[]);
    assert_eq!(code, 1);
    assert!(
        text.contains("image-signatures/hello.sig") && text.contains("image-signature-invalid"),
        "{text}"
    );

    // `pl image sign` refuses what is not pinned, before reading any key.
    let o = run(pl()
        .args(["image", "sign", "registry.example.invalid/hello:latest", "-C"])
        .arg(&repo));
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("image-not-pinned"), "{}", stderr(&o));
}

#[test]
fn plan_refuses_a_head_whose_image_nodes_would_refuse() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, _, _) = quickstart_copy(dir.path());
    init_repo(&repo);
    let (_, ci_public) = keygen(dir.path(), "ci");
    let signers = dir.path().join("allowed_signers");
    std::fs::write(&signers, format!("ci-release {ci_public}\n")).expect("signers");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "images:\n  - projects: [\"*\"]\n    principals: [ci-release]\n",
    )
    .expect("policy");
    commit_all(&repo, "quickstart");
    let path = repo.join("projects/hello.yaml");
    let text = std::fs::read_to_string(&path).expect("project");
    std::fs::write(&path, text.replace("replicas: 2", "replicas: 3")).expect("write");
    let plan = |trust: bool| {
        let mut c = pl();
        c.arg("plan").arg(&repo).args(["--base", "HEAD"]);
        if trust {
            c.arg("--allowed-signers").arg(&signers).arg("--policy").arg(&policy);
        }
        run(&mut c)
    };
    assert_eq!(plan(false).status.code(), Some(0));
    let o = plan(true);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("image-unsigned"), "{}", stderr(&o));
}
