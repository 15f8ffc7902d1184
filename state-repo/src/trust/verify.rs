//! Verifying a commit's SSH signature as `git verify-commit` does with `gpg.format=ssh`
//! (the SSHSIG format, namespace `git`), in process, against an allowed-signers list, and the
//! signing policy's path rules.

use super::allowed_signers::AllowedSigner;
use super::policy::Rule;
use serde::Serialize;
use ssh_key::{Algorithm, HashAlg, PublicKey, SshSig};

/// Why a commit is refused. Each has a stable code; messages name keys by fingerprint only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    Unsigned,
    UnknownKey {
        fingerprint: String,
    },
    BadSignature {
        detail: String,
    },
    WrongNamespace {
        namespace: String,
    },
    KeyNotYetValid {
        line: usize,
    },
    KeyExpired {
        line: usize,
    },
    /// The key's window held the committer date (which the signer chooses) but not the time
    /// the daemon first saw the commit: a retired key cannot sign with a backdated commit.
    KeyNotValidWhenSeen {
        line: usize,
    },
    PrincipalNotAllowedForPath {
        path: String,
        rule: String,
        principal: String,
    },
    UnsupportedKeyType {
        what: String,
    },
    PrincipalNotAllowedForEnvironment {
        environment: String,
        effect: &'static str,
        rule: String,
        principal: String,
    },
    /// A bot's commit changed more than the images it may move.
    PrincipalLimitedToImages {
        what: String,
        bot: usize,
        principal: String,
    },
}

impl Refusal {
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::Unsigned => "unsigned",
            Refusal::UnknownKey { .. } => "unknown-key",
            Refusal::BadSignature { .. } => "bad-signature",
            Refusal::WrongNamespace { .. } => "wrong-namespace",
            Refusal::KeyNotYetValid { .. } => "key-not-yet-valid",
            Refusal::KeyExpired { .. } => "key-expired",
            Refusal::KeyNotValidWhenSeen { .. } => "key-not-valid-when-seen",
            Refusal::PrincipalNotAllowedForPath { .. } => "principal-not-allowed-for-path",
            Refusal::UnsupportedKeyType { .. } => "unsupported-key-type",
            Refusal::PrincipalNotAllowedForEnvironment { .. } => "principal-not-allowed-for-environment",
            Refusal::PrincipalLimitedToImages { .. } => "principal-limited-to-images",
        }
    }

    pub fn message(&self) -> String {
        match self {
            Refusal::Unsigned => "the commit has no signature".into(),
            Refusal::UnknownKey { fingerprint } => format!("key {fingerprint} is not in the allowed-signers file"),
            Refusal::BadSignature { detail } => format!("the signature does not verify: {detail}"),
            Refusal::WrongNamespace { namespace } => format!("the signature is for namespace `{namespace}`, not `git`"),
            Refusal::KeyNotYetValid { line } => {
                format!("the commit predates the key's valid-after (allowed-signers line {line})")
            }
            Refusal::KeyExpired { line } => {
                format!("the commit postdates the key's valid-before (allowed-signers line {line})")
            }
            Refusal::KeyNotValidWhenSeen { line } => format!(
                "the key's window (allowed-signers line {line}) did not hold when the commit was first seen; a committer date cannot bring a retired key back"
            ),
            Refusal::PrincipalNotAllowedForPath { path, rule, principal } => {
                format!("`{principal}` may not change `{path}` under {rule}")
            }
            Refusal::PrincipalNotAllowedForEnvironment {
                environment,
                effect,
                rule,
                principal,
            } => format!("`{principal}` may not {effect} environment `{environment}` under {rule}"),
            Refusal::PrincipalLimitedToImages { what, bot, principal } => {
                format!("`{principal}` may change only images (the policy's bot {bot}), and this changes {what}")
            }
            Refusal::UnsupportedKeyType { what } => {
                format!("{what} is not supported (ed25519, ecdsa-sha2-nistp256, rsa-sha2-256/512 are)")
            }
        }
    }
}

/// Who signed: the allowed-signers entry's principals and the key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Signer {
    pub principals: Vec<String>,
    /// `SHA256:…`, as `ssh-keygen -l` prints it.
    pub fingerprint: String,
    pub key_type: String,
}

impl Signer {
    pub fn principal(&self) -> String {
        self.principals.join(",")
    }
}

fn supported(alg: &Algorithm) -> bool {
    match alg {
        Algorithm::Ed25519 => true,
        Algorithm::Ecdsa { curve } => curve.as_str() == "nistp256",
        Algorithm::Rsa { .. } => true,
        _ => false,
    }
}

/// Verifies one signature over `payload` made at `time` (the committer's timestamp, seconds
/// since the epoch, as git passes to `ssh-keygen -Y verify -Overify-time`). With `seen_at`,
/// the key's window must also hold at that time (the daemon's clock when it first saw the
/// commit): git's check alone trusts a date the signer wrote.
pub fn verify_signature(
    signature: &[u8],
    payload: &[u8],
    time: i64,
    seen_at: Option<i64>,
    signers: &[AllowedSigner],
) -> Result<Signer, Refusal> {
    let text = std::str::from_utf8(signature).map_err(|_| Refusal::BadSignature {
        detail: "not text".into(),
    })?;
    if text.contains("-----BEGIN PGP SIGNATURE-----") {
        return Err(Refusal::UnsupportedKeyType {
            what: "an OpenPGP signature".into(),
        });
    }
    if text.contains("-----BEGIN SIGNED MESSAGE-----") {
        return Err(Refusal::UnsupportedKeyType {
            what: "an X.509 (gpgsm) signature".into(),
        });
    }
    let sig = SshSig::from_pem(text.trim()).map_err(|e| Refusal::BadSignature { detail: e.to_string() })?;
    if sig.namespace() != "git" {
        return Err(Refusal::WrongNamespace {
            namespace: sig.namespace().to_owned(),
        });
    }
    let key = PublicKey::from(sig.public_key().clone());
    if !supported(&key.algorithm()) {
        return Err(Refusal::UnsupportedKeyType {
            what: format!("key type {}", key.algorithm()),
        });
    }
    let fingerprint = key.fingerprint(HashAlg::Sha256).to_string();
    let entries: Vec<&AllowedSigner> = signers.iter().filter(|s| s.key.key_data() == key.key_data()).collect();
    if entries.is_empty() {
        return Err(Refusal::UnknownKey { fingerprint });
    }
    let in_namespace: Vec<&AllowedSigner> = entries
        .iter()
        .copied()
        .filter(|s| s.namespaces.is_empty() || s.namespaces.iter().any(|n| n == "git"))
        .collect();
    let Some(first) = in_namespace.first() else {
        return Err(Refusal::WrongNamespace {
            namespace: "git (the key's allowed-signers entry does not allow it)".into(),
        });
    };
    key.verify("git", payload, &sig)
        .map_err(|e| Refusal::BadSignature { detail: e.to_string() })?;
    // A key may be listed more than once (say, before and after a rotation); one entry whose
    // window holds the commit time is enough.
    let holds =
        |s: &AllowedSigner, at: i64| s.valid_after.is_none_or(|t| at >= t) && s.valid_before.is_none_or(|t| at < t);
    let valid = in_namespace.iter().find(|s| holds(s, time));
    let Some(entry) = valid else {
        return Err(if first.valid_after.is_some_and(|t| time < t) {
            Refusal::KeyNotYetValid { line: first.line }
        } else {
            Refusal::KeyExpired { line: first.line }
        });
    };
    let entry = match seen_at {
        Some(now) => in_namespace
            .iter()
            .find(|s| holds(s, time) && holds(s, now))
            .ok_or(Refusal::KeyNotValidWhenSeen { line: entry.line })?,
        None => entry,
    };
    Ok(Signer {
        principals: entry.principals.clone(),
        fingerprint,
        key_type: key.algorithm().to_string(),
    })
}

/// True when one of the signer's principals matches one of the rule's patterns.
fn allowed(signer: &Signer, rule: &Rule) -> bool {
    signer.principals.iter().any(|p| {
        rule.principals
            .iter()
            .any(|pat| super::allowed_signers::wildcard_match(pat, p))
    })
}

/// A signer limited to images (the policy's `bots`): its change from `before` to `after` may
/// move only the images of the projects a bot rule naming it allows.
pub fn check_bots(
    signer: &Signer,
    before: &state_schema::state::State,
    after: &state_schema::state::State,
    bots: &[super::policy::BotRule],
) -> Result<(), Refusal> {
    let mine: Vec<&super::policy::BotRule> = bots
        .iter()
        .filter(|b| {
            signer.principals.iter().any(|p| {
                b.principals
                    .iter()
                    .any(|pat| super::allowed_signers::wildcard_match(pat, p))
            })
        })
        .collect();
    let Some(first) = mine.first() else { return Ok(()) };
    state_schema::state::images::only_images(before, after, |project| mine.iter().any(|b| b.may_update(project)))
        .map_err(|what| Refusal::PrincipalLimitedToImages {
            what,
            bot: first.index,
            principal: signer.principal(),
        })
}

/// Checks the environment rules for what a signer's change does.
pub fn check_environments(
    signer: &Signer,
    affected: &[state_schema::desired::Affected],
    rules: &[Rule],
) -> Result<(), Refusal> {
    use state_schema::desired::Effect;
    for a in affected {
        let (name, stage, pool) = (a.environment.as_str(), a.stage.as_str(), a.pool.as_str());
        for rule in rules.iter().filter(|r| r.matches_environment(name, stage, pool)) {
            if !allowed(signer, rule) {
                return Err(Refusal::PrincipalNotAllowedForEnvironment {
                    environment: name.to_owned(),
                    effect: match a.effect {
                        Effect::Rollout => "roll out",
                        Effect::Teardown => "tear down",
                        Effect::Change => "change",
                    },
                    rule: rule.describe(),
                    principal: signer.principal(),
                });
            }
        }
    }
    Ok(())
}

/// Checks the path rules for the paths a signer changed.
pub fn check_paths<'p>(
    signer: &Signer,
    changed: impl IntoIterator<Item = &'p str>,
    rules: &[Rule],
) -> Result<(), Refusal> {
    for path in changed {
        for rule in rules.iter().filter(|r| r.matches(path)) {
            if !allowed(signer, rule) {
                return Err(Refusal::PrincipalNotAllowedForPath {
                    path: path.to_owned(),
                    rule: rule.describe(),
                    principal: signer.principal(),
                });
            }
        }
    }
    Ok(())
}
