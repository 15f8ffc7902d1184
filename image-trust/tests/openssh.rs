//! Signatures checked against OpenSSH's own `ssh-keygen -Y sign` and `-Y verify`.

#[path = "../../tests-support/ssh.rs"]
mod ssh;

use image_trust::*;
use ssh::openssh_sign;
use ssh_key::{PrivateKey, PublicKey};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const DIGEST: &str = "sha256:5b0bcabd1ed22e9fb1310cf6c2dec7cdef19f0ad69efa1f392e94a4333501270";
const OTHER: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000001";

fn keygen(dir: &Path, name: &str, kind: &str) -> PathBuf {
    ssh::keygen_of(dir, name, kind).0
}

fn private(path: &Path) -> PrivateKey {
    PrivateKey::read_openssh_file(path).expect("read key")
}

fn public(path: &Path) -> PublicKey {
    PublicKey::read_openssh_file(&path.with_extension("pub")).expect("read public key")
}

fn trusted(principal: &str, key: &Path) -> TrustedKey {
    TrustedKey {
        principal: principal.into(),
        key: public(key),
    }
}

#[test]
fn ours_is_byte_for_byte_what_ssh_keygen_makes_and_each_verifies_the_other() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = keygen(dir.path(), "ci", "ed25519");
    let ours = sign(&private(&key), DIGEST).expect("sign");
    let theirs = openssh_sign(&key, NAMESPACE, DIGEST);
    assert_eq!(ours, theirs, "Ed25519 SSHSIG is deterministic: the same bytes");
    // ssh-keygen -Y verify accepts ours.
    let signers = dir.path().join("allowed_signers");
    let line = format!("ci@example.invalid {}", public(&key).to_openssh().expect("openssh"));
    std::fs::write(&signers, line).expect("write");
    let sig = dir.path().join("sig");
    std::fs::write(&sig, &ours).expect("write");
    let verified = |message: &str| {
        use std::io::Write;
        let mut child = Command::new("ssh-keygen")
            .args(["-Y", "verify", "-n", NAMESPACE, "-I", "ci@example.invalid", "-f"])
            .arg(&signers)
            .arg("-s")
            .arg(&sig)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("ssh-keygen");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(message.as_bytes())
            .expect("write");
        child.wait().expect("wait").success()
    };
    assert!(verified(DIGEST));
    assert!(!verified(OTHER), "the check can fail");
    // And ours accepts an ECDSA signature ssh-keygen made (not deterministic, so only verified).
    let p256 = keygen(dir.path(), "p256", "ecdsa");
    let theirs = openssh_sign(&p256, NAMESPACE, DIGEST);
    let v = verify(&[theirs], DIGEST, &[trusted("ci-p256", &p256)], true).expect("verifies");
    assert_eq!(v.map(|v| v.principal).as_deref(), Some("ci-p256"));
}

#[test]
fn each_refusal_has_its_code() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ci = keygen(dir.path(), "ci", "ed25519");
    let other = keygen(dir.path(), "other", "ed25519");
    let good = sign(&private(&ci), DIGEST).expect("sign");
    let keys = [trusted("ci", &ci)];
    let code = |r: Result<Option<Verified>, Refusal>| r.expect_err("refused").code();

    let v = verify(std::slice::from_ref(&good), DIGEST, &keys, true).expect("trusted");
    assert_eq!(v.expect("verified").principal, "ci");
    assert_eq!(code(verify(&[], DIGEST, &keys, true)), "image-unsigned");
    assert_eq!(verify(&[], DIGEST, &keys, false), Ok(None), "unsigned allowed");
    // A good signature by a key no rule trusts.
    let by_other = sign(&private(&other), DIGEST).expect("sign");
    assert_eq!(
        code(verify(std::slice::from_ref(&by_other), DIGEST, &keys, false)),
        "image-signer-untrusted"
    );
    // Another image's signature, a commit's namespace, a changed byte.
    assert_eq!(
        code(verify(std::slice::from_ref(&good), OTHER, &keys, true)),
        "image-signature-invalid"
    );
    let git = openssh_sign(&ci, "git", DIGEST);
    assert_eq!(code(verify(&[git], DIGEST, &keys, true)), "image-signature-invalid");
    let mut tampered: Vec<char> = good.chars().collect();
    let at = good.find("\n").expect("line") + 40;
    tampered[at] = if tampered[at] == 'A' { 'B' } else { 'A' };
    let tampered: String = tampered.into_iter().collect();
    assert_eq!(
        code(verify(&[tampered], DIGEST, &keys, true)),
        "image-signature-invalid"
    );
    // One trusted signature among others is enough; an invalid one outranks an untrusted one.
    assert!(verify(&[by_other.clone(), good.clone()], DIGEST, &keys, true).is_ok());
    assert_eq!(
        code(verify(&[by_other, "junk".into()], DIGEST, &keys, true)),
        "image-signature-invalid"
    );
    assert!(sign(&private(&ci), "sha256:abc").is_err());
}

#[test]
fn digests_are_read_off_references() {
    assert_eq!(digest_of(&format!("registry.invalid/api@{DIGEST}")), Some(DIGEST));
    assert_eq!(digest_of("registry.invalid/api:latest"), None);
    assert!(!is_digest("sha256:ABC"));
}
