//! OpenSSH as the reference for tests: keys made by `ssh-keygen`, and what `ssh-keygen -Y sign`
//! writes. Included by path by the tests that compare Pushleft's signatures with OpenSSH's.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A new Ed25519 key `name` in `dir` (no passphrase, comment `name`): its private key's path
/// and its public key line.
#[allow(dead_code)]
pub fn keygen(dir: &Path, name: &str) -> (PathBuf, String) {
    keygen_of(dir, name, "ed25519")
}

/// A new key of `kind` (`ed25519`, `ecdsa`, `rsa`).
pub fn keygen_of(dir: &Path, name: &str, kind: &str) -> (PathBuf, String) {
    let private = dir.join(name);
    let o = Command::new("ssh-keygen")
        .args(["-q", "-t", kind, "-N", "", "-C", name, "-f"])
        .arg(&private)
        .output()
        .expect("ssh-keygen");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let public = std::fs::read_to_string(private.with_extension("pub")).expect("public key");
    (private, public.trim().to_owned())
}

/// `printf %s MESSAGE | ssh-keygen -Y sign -n NAMESPACE -f KEY`: OpenSSH's own signature.
pub fn openssh_sign(key: &Path, namespace: &str, message: &str) -> String {
    use std::io::Write;
    let mut child = Command::new("ssh-keygen")
        .args(["-q", "-Y", "sign", "-n", namespace, "-f"])
        .arg(key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ssh-keygen");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(message.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}
