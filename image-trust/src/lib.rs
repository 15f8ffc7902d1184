//! Image signatures: an SSH signature (OpenSSH's SSHSIG, as `ssh-keygen -Y sign` makes) over
//! an image's manifest digest, the text `sha256:<64 hex>` and nothing else, in the namespace
//! [`NAMESPACE`]. The same keys and allowed-signers file as commits sign images; the namespace
//! keeps the two apart (a commit signature can never pass for an image's, nor the other way).
//!
//! Pure: bytes in, verdicts out. `pl` signs and checks what a state tree holds, the reconciler
//! hands the signatures and the trusted keys to the node, and the agent checks them before it
//! pulls or runs anything.

use ssh_key::{HashAlg, LineEnding, PrivateKey, PublicKey, SshSig};

/// The SSHSIG namespace of image signatures (`ssh-keygen -Y sign -n pushleft-image`).
pub const NAMESPACE: &str = "pushleft-image";

/// Most signatures one image may carry; more are refused, not skipped.
pub const MAX_SIGNATURES: usize = 16;

/// Largest armored signature read, in bytes (an RSA-4096 one is under 2 KiB).
pub const MAX_SIGNATURE_BYTES: usize = 8 * 1024;

/// A key trusted to sign a project's images, with the principal its allowed-signers entry
/// names (for messages and provenance).
#[derive(Clone, Debug)]
pub struct TrustedKey {
    pub principal: String,
    pub key: PublicKey,
}

/// Who signed an image, when one of its signatures verified with a trusted key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    pub principal: String,
    /// `SHA256:…`, as `ssh-keygen -l` prints it.
    pub fingerprint: String,
}

/// Why an image may not run. Each has a stable code ([`Refusal::code`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{digest} carries no image signature, and this project's images must be signed")]
    Unsigned { digest: String },
    #[error("{digest} is signed only by {fingerprints:?}, which no image rule of this project trusts")]
    SignerUntrusted { digest: String, fingerprints: Vec<String> },
    #[error("{digest}: {detail}")]
    SignatureInvalid { digest: String, detail: String },
}

impl Refusal {
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::Unsigned { .. } => "image-unsigned",
            Refusal::SignerUntrusted { .. } => "image-signer-untrusted",
            Refusal::SignatureInvalid { .. } => "image-signature-invalid",
        }
    }

    pub fn hint(&self) -> &'static str {
        match self {
            Refusal::Unsigned { .. } => {
                "sign it (`pl image sign IMAGE@DIGEST`, or `printf %s DIGEST | ssh-keygen -Y sign -n pushleft-image -f KEY`) and commit image-signatures/sha256-<hex>.sig"
            }
            Refusal::SignerUntrusted { .. } => {
                "sign with a key whose allowed-signers principal an `images` rule of the policy names for this project"
            }
            Refusal::SignatureInvalid { .. } => {
                "sign the manifest digest itself, `sha256:<hex>` without a newline, in namespace pushleft-image"
            }
        }
    }
}

/// Whether `digest` is `sha256:` and 64 lowercase hex digits, the only form signed.
pub fn is_digest(digest: &str) -> bool {
    digest
        .strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)))
}

/// The digest an image reference is pinned to (`name@sha256:…`).
pub fn digest_of(image: &str) -> Option<&str> {
    image.rsplit_once('@').map(|(_, d)| d).filter(|d| is_digest(d))
}

/// Signs `digest` as `ssh-keygen -Y sign -n pushleft-image` would (SHA-512, LF line ends, a
/// final newline). Ed25519 signatures are deterministic, so the two are byte for byte equal.
pub fn sign(key: &PrivateKey, digest: &str) -> Result<String, SignError> {
    if !is_digest(digest) {
        return Err(SignError::NotADigest(digest.to_owned()));
    }
    let sig = SshSig::sign(key, NAMESPACE, HashAlg::Sha512, digest.as_bytes())?;
    let mut pem = sig.to_pem(LineEnding::LF)?;
    if !pem.ends_with('\n') {
        pem.push('\n');
    }
    Ok(pem)
}

#[derive(Debug, thiserror::Error)]
pub enum SignError {
    #[error("`{0}` is not a manifest digest (`sha256:` and 64 lowercase hex digits)")]
    NotADigest(String),
    #[error(transparent)]
    Ssh(#[from] ssh_key::Error),
}

/// Checks one armored signature over `digest` by the key it names, whoever that is: the
/// namespace, the hash and the signature itself. Returns the signing key.
pub fn check(signature: &str, digest: &str) -> Result<PublicKey, String> {
    if signature.len() > MAX_SIGNATURE_BYTES {
        return Err(format!("a signature is larger than {MAX_SIGNATURE_BYTES} bytes"));
    }
    let sig = SshSig::from_pem(signature.trim()).map_err(|e| format!("not an SSH signature: {e}"))?;
    if sig.namespace() != NAMESPACE {
        return Err(format!("signed in namespace `{}`, not `{NAMESPACE}`", sig.namespace()));
    }
    let key = PublicKey::from(sig.public_key().clone());
    key.verify(NAMESPACE, digest.as_bytes(), &sig)
        .map_err(|e| format!("the signature does not verify over {digest}: {e}"))?;
    Ok(key)
}

/// The verdict on an image pinned to `digest` carrying `signatures`, for a project whose image
/// rules trust `trusted` and whose images must be signed when `required`.
///
/// One signature by a trusted key that verifies is enough. Otherwise the refusal says the worst
/// that was found: a signature that does not verify (someone tampered, or signed something
/// else) before one that verifies by an untrusted key. With no signatures and not `required`,
/// `Ok(None)`.
pub fn verify(
    signatures: &[String],
    digest: &str,
    trusted: &[TrustedKey],
    required: bool,
) -> Result<Option<Verified>, Refusal> {
    let invalid = |detail: String| Refusal::SignatureInvalid {
        digest: digest.to_owned(),
        detail,
    };
    if !is_digest(digest) {
        return Err(invalid("the image is not pinned to a sha256 digest".into()));
    }
    if signatures.is_empty() {
        return match required {
            true => Err(Refusal::Unsigned {
                digest: digest.to_owned(),
            }),
            false => Ok(None),
        };
    }
    if signatures.len() > MAX_SIGNATURES {
        return Err(invalid(format!("more than {MAX_SIGNATURES} signatures")));
    }
    let (mut untrusted, mut broken) = (Vec::new(), None);
    for s in signatures {
        match check(s, digest) {
            Ok(key) => match trusted.iter().find(|t| t.key.key_data() == key.key_data()) {
                Some(t) => {
                    return Ok(Some(Verified {
                        principal: t.principal.clone(),
                        fingerprint: key.fingerprint(HashAlg::Sha256).to_string(),
                    }));
                }
                None => untrusted.push(key.fingerprint(HashAlg::Sha256).to_string()),
            },
            Err(e) => broken = broken.or(Some(e)),
        }
    }
    match broken {
        Some(detail) => Err(invalid(detail)),
        None => Err(Refusal::SignerUntrusted {
            digest: digest.to_owned(),
            fingerprints: untrusted,
        }),
    }
}
