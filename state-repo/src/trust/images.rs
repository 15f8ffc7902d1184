//! Which keys may sign a project's images, from the policy's `images` rules and the
//! allowed-signers file: the one decision `pl validate`, `pl plan` and the daemon (which hands
//! the result to the node with each container to run) all make the same way.

use super::allowed_signers::{AllowedSigner, wildcard_match};
use super::policy::Policy;
use image_trust::{NAMESPACE, TrustedKey};
use state_schema::diag::{Code, Diagnostic, Pos};
use state_schema::model::{Kind, Spec};
use state_schema::state::State;

/// What a project's image must carry to run.
#[derive(Clone, Debug)]
pub struct ImageRequirement {
    /// No rule says `unsigned: allow`: an image without a signature is refused.
    pub required: bool,
    /// Keys whose signature is enough: every allowed-signers entry valid at the time asked,
    /// allowed to sign in [`NAMESPACE`], with a principal one of the project's rules names.
    pub keys: Vec<TrustedKey>,
}

/// The requirement on `project`'s images at `now` (seconds since the epoch); `None` when no
/// image rule names the project (its images are not checked, as before image rules existed).
/// Several rules naming one project add their principals; any of them refusing unsigned
/// images refuses them.
pub fn requirement(policy: &Policy, signers: &[AllowedSigner], project: &str, now: i64) -> Option<ImageRequirement> {
    let rules: Vec<_> = policy.images.iter().filter(|r| r.matches(project)).collect();
    if rules.is_empty() {
        return None;
    }
    let named = |s: &AllowedSigner| {
        s.principals.iter().any(|p| {
            rules
                .iter()
                .any(|r| r.principals.iter().any(|pat| wildcard_match(pat, p)))
        })
    };
    let in_window =
        |s: &AllowedSigner| s.valid_after.is_none_or(|t| now >= t) && s.valid_before.is_none_or(|t| now < t);
    let in_namespace = |s: &AllowedSigner| s.namespaces.is_empty() || s.namespaces.iter().any(|n| n == NAMESPACE);
    let keys = signers
        .iter()
        .filter(|s| named(s) && in_window(s) && in_namespace(s))
        .map(|s| TrustedKey {
            principal: s.principals.join(","),
            key: s.key.clone(),
        })
        .collect();
    Some(ImageRequirement {
        required: rules.iter().any(|r| !r.allow_unsigned),
        keys,
    })
}

/// What `pl validate` and `pl plan` say of a tree's images, before any node is asked: every
/// signature in `image-signatures/` must verify over the digest its file names (whoever made
/// it); and with a policy, every environment's image must satisfy its project's image rules
/// at `now`, reported at the `image` field that chose it, with the node's own codes.
pub fn check_tree(state: &State, trust: Option<(&Policy, &[AllowedSigner])>, now: i64) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for (digest, signatures) in state.all_image_signatures() {
        let file = state_schema::image_signatures::path_of(digest).unwrap_or_default();
        for (line, block) in signatures {
            if let Err(why) = image_trust::check(block, digest) {
                out.push(
                    Diagnostic::error(
                        Code::ImageSignatureInvalid,
                        &file,
                        Some(Pos { line: *line, column: 1 }),
                        why,
                    )
                    .with_hint("sign the manifest digest itself, `sha256:<hex>` without a newline, in namespace pushleft-image"),
                );
            }
        }
    }
    let Some((policy, signers)) = trust else { return out };
    let mut seen = std::collections::BTreeSet::new();
    for (name, env) in state.environments() {
        let Some(project) = state.get(Kind::Project, env.project.as_str()) else {
            continue;
        };
        let Spec::Project(p) = &project.object.spec else {
            continue;
        };
        // The environment's own image when it names one, else its project's: where to point.
        let (image, at) = match (&env.image, state.get(Kind::Environment, name.as_str())) {
            (Some(image), Some(loc)) => (image.as_str(), loc),
            _ => (p.image.as_str(), project),
        };
        let Some(needed) = requirement(policy, signers, env.project.as_str(), now) else {
            continue;
        };
        let Some(digest) = image_trust::digest_of(image) else {
            continue;
        };
        let pos = at.pos_of("spec.image");
        if !seen.insert((at.file.clone(), pos.line, pos.column)) {
            continue;
        }
        let signatures = state.image_signatures(digest);
        if let Err(refusal) = image_trust::verify(&signatures, digest, &needed.keys, needed.required) {
            let code = match refusal {
                image_trust::Refusal::Unsigned { .. } => Code::ImageUnsigned,
                image_trust::Refusal::SignerUntrusted { .. } => Code::ImageSignerUntrusted,
                image_trust::Refusal::SignatureInvalid { .. } => Code::ImageSignatureInvalid,
            };
            out.push(
                Diagnostic::error(code, &at.file, Some(pos), format!("project {}: {refusal}", env.project))
                    .with_hint(refusal.hint()),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trust::{allowed_signers, policy};

    const KEY_A: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPOJsxBI20fwBdKMM60K5KqcDJbjkDYkbhFFbVR6qhOX";
    const KEY_B: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIN2CCjJqZvgHTSaUwlw6k8M8OQ2VCtRFd/8hPBmzaDvz";

    #[test]
    fn rules_pick_principals_namespaces_and_windows() {
        let policy = policy::parse(
            "images:\n  - projects: [\"shop-*\"]\n    principals: [ci-shop]\n  - projects: [api, shop-web]\n    principals: [ci-api]\n    unsigned: allow\n",
        )
        .expect("policy");
        let signers = allowed_signers::parse(&format!(
            "ci-shop {KEY_A}\nci-api namespaces=\"git\" {KEY_B}\nci-api valid-before=\"20200101Z\" {KEY_A}\nops {KEY_B}\n"
        ))
        .expect("signers");
        let now = 1_800_000_000;
        assert!(
            requirement(&policy, &signers, "billing", now).is_none(),
            "no rule, no check"
        );
        let shop = requirement(&policy, &signers, "shop-cart", now).expect("rule");
        assert!(shop.required);
        assert_eq!(
            shop.keys.iter().map(|k| k.principal.as_str()).collect::<Vec<_>>(),
            ["ci-shop"]
        );
        // `ci-api`'s one key may sign only commits, its other expired: nobody may sign api's.
        let api = requirement(&policy, &signers, "api", now).expect("rule");
        assert!(!api.required && api.keys.is_empty());
        // Two rules: principals add up, and one `allow` does not outvote a refusal.
        let web = requirement(&policy, &signers, "shop-web", now).expect("rules");
        assert!(web.required, "{web:?}");
        assert_eq!(web.keys.len(), 1, "ci-shop's key; ci-api has none for images: {web:?}");
    }

    #[test]
    fn bad_image_rules_are_refused_with_their_place() {
        for (text, says) in [
            ("images: {}\n", "must be a list"),
            ("images:\n  - projects: [a]\n", "needs `projects` and `principals`"),
            (
                "images:\n  - projects: [a]\n    principals: [b]\n    unsigned: maybe\n",
                "`refuse`",
            ),
            (
                "images:\n  - project: [a]\n    principals: [b]\n",
                "unknown field `project`",
            ),
            ("bots: {}\n", "must be a list"),
            ("bots:\n  - principals: [bot]\n", "needs `principals` and `images`"),
            ("bots:\n  - principals: [bot]\n    images: [\"[\"]\n", "is not a glob"),
        ] {
            let e = policy::parse(text).expect_err(text);
            assert!(e.message.contains(says), "{text}: {}", e.message);
            assert!(e.line >= 1, "{text}");
        }
    }
}
