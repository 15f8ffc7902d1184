//! Secret values: age encryption to a Secret's recipients, decryption with an identity file,
//! and resealing a value to one node's recipient for delivery.
//!
//! Plaintext exists only inside these functions and in the zeroizing buffers they return; it
//! never reaches an error message, a log line or a process argument.

use age::armor::{ArmoredReader, ArmoredWriter, Format};
use age::{Decryptor, Encryptor, Identity, Recipient};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// Largest secret value, in bytes.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;
/// Largest ciphertext read (a value of the largest size with armour and many recipients).
pub const MAX_CIPHERTEXT_BYTES: usize = 256 * 1024;
/// Largest identity file read.
pub const MAX_IDENTITY_FILE_BYTES: u64 = 1 << 20;

/// Why a secret operation was refused. Messages name keys and files, never values.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("recipient `{0}` is not an age X25519 recipient (`age1…`) or an ssh-ed25519/ssh-rsa public key")]
    InvalidRecipient(String),
    #[error("the value is {0} bytes; the limit is {MAX_VALUE_BYTES}")]
    ValueTooLarge(usize),
    #[error("the ciphertext is not ASCII-armoured age")]
    MalformedArmor,
    #[error("the ciphertext is truncated or corrupt")]
    Truncated,
    #[error("none of the identities can decrypt this value")]
    NoMatchingIdentity,
    #[error("identity file {path} is readable by group or others (mode {mode:03o}); run `chmod 600` on it")]
    IdentityPermissions { path: PathBuf, mode: u32 },
    #[error("identity file {path} holds no usable age or SSH identity")]
    InvalidIdentity { path: PathBuf },
    #[error("no identity: pass --identity FILE or set PL_AGE_IDENTITY")]
    NoIdentity,
    #[error("no recipients to encrypt to")]
    NoRecipients,
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl SecretError {
    /// The stable code of the refusal.
    pub fn code(&self) -> &'static str {
        match self {
            SecretError::InvalidRecipient(_) => "invalid-recipient",
            SecretError::ValueTooLarge(_) => "value-too-large",
            SecretError::MalformedArmor => "malformed-armor",
            SecretError::Truncated => "truncated-ciphertext",
            SecretError::NoMatchingIdentity => "no-matching-identity",
            SecretError::IdentityPermissions { .. } => "identity-permissions",
            SecretError::InvalidIdentity { .. } => "invalid-identity",
            SecretError::NoIdentity => "no-identity",
            SecretError::NoRecipients => "no-recipients",
            SecretError::Io { .. } => "io",
        }
    }
}

fn io(what: &str) -> impl FnOnce(std::io::Error) -> SecretError + '_ {
    move |source| SecretError::Io {
        what: what.to_owned(),
        source,
    }
}

/// Parses a recipient: `age1…` (X25519) or an `ssh-ed25519`/`ssh-rsa` public key.
pub fn parse_recipient(s: &str) -> Result<Box<dyn Recipient + Send>, SecretError> {
    let s = s.trim();
    if s.starts_with("age1") {
        return s
            .parse::<age::x25519::Recipient>()
            .map(|r| Box::new(r) as Box<dyn Recipient + Send>)
            .map_err(|_| SecretError::InvalidRecipient(s.to_owned()));
    }
    if s.starts_with("ssh-ed25519 ") || s.starts_with("ssh-rsa ") {
        return s
            .parse::<age::ssh::Recipient>()
            .map(|r| Box::new(r) as Box<dyn Recipient + Send>)
            .map_err(|_| SecretError::InvalidRecipient(s.to_owned()));
    }
    Err(SecretError::InvalidRecipient(s.to_owned()))
}

/// Encrypts a value to every recipient, ASCII-armoured.
pub fn encrypt(plaintext: &[u8], recipients: &[String]) -> Result<String, SecretError> {
    if plaintext.len() > MAX_VALUE_BYTES {
        return Err(SecretError::ValueTooLarge(plaintext.len()));
    }
    if recipients.is_empty() {
        return Err(SecretError::NoRecipients);
    }
    let parsed = recipients
        .iter()
        .map(|r| parse_recipient(r))
        .collect::<Result<Vec<_>, _>>()?;
    let encryptor = Encryptor::with_recipients(parsed.iter().map(|r| r.as_ref() as &dyn Recipient))
        .map_err(|_| SecretError::NoRecipients)?;
    let mut out = Vec::new();
    let armored = ArmoredWriter::wrap_output(&mut out, Format::AsciiArmor).map_err(io("armouring"))?;
    let mut writer = encryptor.wrap_output(armored).map_err(io("encrypting"))?;
    writer.write_all(plaintext).map_err(io("encrypting"))?;
    writer
        .finish()
        .and_then(|armor| armor.finish())
        .map_err(io("encrypting"))?;
    String::from_utf8(out).map_err(|_| SecretError::MalformedArmor)
}

/// Whether any of `identities` opens an armoured value: its header's file key is unwrapped and
/// the payload is never read, so no plaintext exists (`pl up`'s check before it starts).
pub fn opens(armored: &str, identities: &[Box<dyn Identity + Send + Sync>]) -> Result<(), SecretError> {
    let text = checked_armor(armored)?;
    let decryptor = Decryptor::new(ArmoredReader::new(text.as_bytes())).map_err(|_| SecretError::MalformedArmor)?;
    decryptor
        .decrypt(identities.iter().map(|i| i.as_ref() as &dyn Identity))
        .map(drop)
        .map_err(|e| match e {
            age::DecryptError::NoMatchingKeys => SecretError::NoMatchingIdentity,
            _ => SecretError::Truncated,
        })
}

/// An armoured value within the limits, trimmed.
fn checked_armor(armored: &str) -> Result<&str, SecretError> {
    let text = armored.trim();
    if text.len() > MAX_CIPHERTEXT_BYTES || !text.starts_with("-----BEGIN AGE ENCRYPTED FILE-----") {
        return Err(SecretError::MalformedArmor);
    }
    if !text.ends_with("-----END AGE ENCRYPTED FILE-----") {
        return Err(SecretError::Truncated);
    }
    Ok(text)
}

/// Decrypts an armoured value with any of `identities`.
pub fn decrypt(
    armored: &str,
    identities: &[Box<dyn Identity + Send + Sync>],
) -> Result<Zeroizing<Vec<u8>>, SecretError> {
    let text = checked_armor(armored)?;
    // A header that does not read is not age; a payload that does not is cut or corrupt.
    let decryptor = Decryptor::new(ArmoredReader::new(text.as_bytes())).map_err(|_| SecretError::MalformedArmor)?;
    let mut reader = decryptor
        .decrypt(identities.iter().map(|i| i.as_ref() as &dyn Identity))
        .map_err(|e| match e {
            age::DecryptError::NoMatchingKeys => SecretError::NoMatchingIdentity,
            age::DecryptError::Io(_) => SecretError::Truncated,
            _ => SecretError::Truncated,
        })?;
    let mut out = Zeroizing::new(Vec::new());
    reader
        .by_ref()
        .take(MAX_VALUE_BYTES as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|_| SecretError::Truncated)?;
    if out.len() > MAX_VALUE_BYTES {
        return Err(SecretError::ValueTooLarge(out.len()));
    }
    Ok(out)
}

/// Reads an identity file (age X25519 identities or an unencrypted OpenSSH private key),
/// refusing one that group or others can read, as ssh does.
pub fn load_identities(path: &Path) -> Result<Vec<Box<dyn Identity + Send + Sync>>, SecretError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|source| SecretError::Io {
        what: format!("reading identity file {}", path.display()),
        source,
    })?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(SecretError::IdentityPermissions {
            path: path.to_owned(),
            mode,
        });
    }
    if meta.len() > MAX_IDENTITY_FILE_BYTES {
        return Err(SecretError::InvalidIdentity { path: path.to_owned() });
    }
    let bytes = Zeroizing::new(std::fs::read(path).map_err(|source| SecretError::Io {
        what: format!("reading identity file {}", path.display()),
        source,
    })?);
    let invalid = || SecretError::InvalidIdentity { path: path.to_owned() };
    if bytes.starts_with(b"-----BEGIN OPENSSH PRIVATE KEY-----")
        || bytes.starts_with(b"-----BEGIN RSA PRIVATE KEY-----")
    {
        let id =
            age::ssh::Identity::from_buffer(&bytes[..], Some(path.display().to_string())).map_err(|_| invalid())?;
        return match id {
            age::ssh::Identity::Unencrypted(_) => Ok(vec![Box::new(id)]),
            _ => Err(invalid()),
        };
    }
    let file = age::IdentityFile::from_buffer(&bytes[..]).map_err(|_| invalid())?;
    let ids = file.into_identities().map_err(|_| invalid())?;
    if ids.is_empty() {
        return Err(invalid());
    }
    Ok(ids)
}

/// The recipients (`age1…`) of the X25519 identities in an identity file: what the holder can
/// encrypt to itself (the control host keeps issued certificate keys sealed this way). An
/// OpenSSH identity has none here: its public key is not in the file.
pub fn own_recipients(path: &Path) -> Result<Vec<String>, SecretError> {
    use std::str::FromStr;
    load_identities(path)?;
    let text = Zeroizing::new(std::fs::read_to_string(path).map_err(|source| SecretError::Io {
        what: format!("reading identity file {}", path.display()),
        source,
    })?);
    let out: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("AGE-SECRET-KEY-"))
        .filter_map(|l| age::x25519::Identity::from_str(l).ok())
        .map(|id| id.to_public().to_string())
        .collect();
    if out.is_empty() {
        return Err(SecretError::InvalidIdentity { path: path.to_owned() });
    }
    Ok(out)
}

/// Delivery: decrypts a value with the control host's identities and at once encrypts it to
/// one node's recipient. The ledger stores only the result; the plaintext lives in a zeroizing
/// buffer for the length of this call.
pub fn reseal(
    armored: &str,
    control: &[Box<dyn Identity + Send + Sync>],
    node_recipient: &str,
) -> Result<String, SecretError> {
    // Check the node's key first: a refusal must come before any plaintext exists.
    parse_recipient(node_recipient)?;
    let plaintext = decrypt(armored, control)?;
    encrypt(&plaintext, &[node_recipient.to_owned()])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keypair() -> (Box<dyn Identity + Send + Sync>, String) {
        let id = age::x25519::Identity::generate();
        let recipient = id.to_public().to_string();
        (Box::new(id), recipient)
    }

    #[test]
    fn round_trip_and_reseal() {
        let (control, control_r) = keypair();
        let (node, node_r) = keypair();
        let (_, other_r) = keypair();
        let ct = encrypt(b"s3cr3t", &[control_r.clone(), other_r]).expect("encrypt");
        assert!(ct.starts_with("-----BEGIN AGE ENCRYPTED FILE-----"));
        assert!(!ct.contains("s3cr3t"));
        let controls = vec![control];
        assert_eq!(decrypt(&ct, &controls).expect("decrypt").as_slice(), b"s3cr3t");
        let sealed = reseal(&ct, &controls, &node_r).expect("reseal");
        let nodes = vec![node];
        assert_eq!(decrypt(&sealed, &nodes).expect("node decrypts").as_slice(), b"s3cr3t");
        assert_eq!(
            decrypt(&sealed, &controls)
                .map(|_| ())
                .expect_err("control cannot")
                .code(),
            "no-matching-identity"
        );
        assert_eq!(
            reseal(&ct, &controls, "age1nope").expect_err("bad node key").code(),
            "invalid-recipient"
        );
        let _ = control_r;
    }

    #[test]
    fn opening_checks_the_identity_without_the_payload() {
        let (id, r) = keypair();
        let (other, _) = keypair();
        let sealed = encrypt(b"value", &[r]).expect("encrypt");
        assert!(opens(&sealed, &[id]).is_ok());
        assert!(matches!(opens(&sealed, &[other]), Err(SecretError::NoMatchingIdentity)));
        assert!(matches!(opens("not age", &[]), Err(SecretError::MalformedArmor)));
    }

    #[test]
    fn refusals_have_codes() {
        let (id, r) = keypair();
        let ids = vec![id];
        assert_eq!(
            encrypt(&vec![0u8; MAX_VALUE_BYTES + 1], std::slice::from_ref(&r))
                .expect_err("big")
                .code(),
            "value-too-large"
        );
        assert_eq!(
            encrypt(b"x", &["ssh-dss AAAA".into()]).expect_err("bad").code(),
            "invalid-recipient"
        );
        assert_eq!(encrypt(b"x", &[]).expect_err("none").code(), "no-recipients");
        assert_eq!(
            decrypt("hello", &ids).expect_err("not armour").code(),
            "malformed-armor"
        );
        let ct = encrypt(b"value", &[r]).expect("encrypt");
        let cut = &ct[..ct.len() / 2];
        assert_eq!(
            decrypt(cut, &ids).expect_err("truncated").code(),
            "truncated-ciphertext"
        );
        let garbled = ct.replacen(
            "-----BEGIN AGE ENCRYPTED FILE-----\n",
            "-----BEGIN AGE ENCRYPTED FILE-----\nAAAA",
            1,
        );
        assert!(matches!(
            decrypt(&garbled, &ids).expect_err("garbled").code(),
            "malformed-armor" | "truncated-ciphertext"
        ));
        let (_, stranger) = keypair();
        let ct = encrypt(b"value", &[stranger]).expect("encrypt");
        assert_eq!(decrypt(&ct, &ids).expect_err("not ours").code(), "no-matching-identity");
    }
}

/// Makes this process hold keys and plaintext safely: no core dump (a crash would write
/// decrypted values and keys to disk) and not dumpable (no ptrace attach or /proc/PID/mem
/// read by other processes of the same user). Every process that decrypts or holds a private
/// key calls this first.
pub fn harden_process() -> std::io::Result<()> {
    use rustix::process::{DumpableBehavior, Resource, Rlimit, set_dumpable_behavior, setrlimit};
    setrlimit(
        Resource::Core,
        Rlimit {
            current: Some(0),
            maximum: Some(0),
        },
    )?;
    set_dumpable_behavior(DumpableBehavior::NotDumpable)?;
    Ok(())
}

/// Creates a file only its owner can read (mode 0600), with `bytes`, synced; refuses to
/// overwrite one. For keys, identities and tokens.
pub fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Refuses a private file (a key, an identity, a webhook secret) that its group or others
/// can read or write, naming it, as ssh does for its keys.
pub fn check_private_file(path: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "{} is a private file but its mode is {mode:04o}: group or others can read it; `chmod 600 {}`",
            path.display(),
            path.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod hardening_tests {
    use super::*;

    #[test]
    fn a_hardened_process_dumps_no_core() {
        harden_process().expect("harden");
        let core = rustix::process::getrlimit(rustix::process::Resource::Core);
        assert_eq!((core.current, core.maximum), (Some(0), Some(0)));
        assert_eq!(
            rustix::process::dumpable_behavior().expect("prctl"),
            rustix::process::DumpableBehavior::NotDumpable
        );
    }

    #[test]
    fn private_files_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let key = dir.path().join("api.key");
        std::fs::write(&key, "k").expect("write");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let e = check_private_file(&key).expect_err("world-readable");
        assert!(
            e.contains("api.key") && e.contains("0644") && e.contains("chmod 600"),
            "{e}"
        );
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        assert!(check_private_file(&key).is_err(), "group-readable");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert!(check_private_file(&key).is_ok());
        assert!(check_private_file(&dir.path().join("missing")).is_err());
    }
}
