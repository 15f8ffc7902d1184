//! What a node must check of an image before it pulls or runs it: the policy's `images` rules
//! for the container's project, turned into the keys the node trusts (`ImageTrust`), and the
//! signatures the generation's own spec carries. Decided by `state_repo::trust::images`, the
//! same call `pl validate` and `pl plan` make; the node verifies, the control plane only
//! hands over.

use agent_proto::{ApplicationSpec, Execution, ImageSigner, ImageTrust, MAX_IMAGE_SIGNATURES, MAX_IMAGE_SIGNERS};
use state_repo::trust::allowed_signers::AllowedSigner;
use state_repo::trust::images::requirement;
use state_repo::trust::policy::Policy;
use state_schema::deployment::DeploymentSpec;

/// The daemon's trust files, as far as images go.
#[derive(Clone, Debug, Default)]
pub struct ImageRules {
    policy: Policy,
    signers: Vec<AllowedSigner>,
}

impl ImageRules {
    pub fn new(policy: Option<Policy>, signers: Vec<AllowedSigner>) -> ImageRules {
        ImageRules {
            policy: policy.unwrap_or_default(),
            signers,
        }
    }

    /// What `project`'s image must carry at `now_s`, with `signatures` (its generation's);
    /// `None` when no image rule names the project.
    fn trust(&self, project: &str, signatures: &[String], now_s: i64) -> Option<ImageTrust> {
        let needed = requirement(&self.policy, &self.signers, project, now_s)?;
        let signers = needed
            .keys
            .iter()
            .take(MAX_IMAGE_SIGNERS)
            .filter_map(|k| {
                Some(ImageSigner {
                    principal: k.principal.clone(),
                    key: k.key.to_openssh().ok()?,
                })
            })
            .collect();
        Some(ImageTrust {
            required: needed.required,
            signatures: signatures.iter().take(MAX_IMAGE_SIGNATURES).cloned().collect(),
            signers,
        })
    }

    /// Sets the image trust of every container `built` runs, from `spec` (the job's own
    /// generation's, whose role says the signatures).
    pub(super) fn attach(&self, built: &mut Execution, spec: Option<&DeploymentSpec>, now_ms: i64) {
        let app: &mut ApplicationSpec = match built {
            Execution::Application(a) => a,
            Execution::Drill(d) => &mut d.run,
            _ => return,
        };
        let signatures = spec
            .and_then(|s| s.roles.iter().find(|(name, _)| name.as_str() == app.role))
            .map(|(_, r)| r.image_signatures.as_slice())
            .unwrap_or_default();
        app.image_trust = self.trust(&app.deployment, signatures, now_ms / 1000);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use state_repo::trust::{allowed_signers, policy};

    const KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPOJsxBI20fwBdKMM60K5KqcDJbjkDYkbhFFbVR6qhOX";

    #[test]
    fn the_limits_the_wire_carries_are_the_trees_and_the_verifiers() {
        // Three crates say how many signatures an image may carry; one number.
        assert_eq!(MAX_IMAGE_SIGNATURES, state_schema::image_signatures::MAX_SIGNATURES);
        assert_eq!(MAX_IMAGE_SIGNATURES, image_trust::MAX_SIGNATURES);
        assert_eq!(
            state_schema::image_signatures::MAX_SIGNATURE_BYTES,
            image_trust::MAX_SIGNATURE_BYTES
        );
    }

    #[test]
    fn a_project_some_rule_names_gets_its_keys_and_signatures_and_another_nothing() {
        let rules = ImageRules::new(
            Some(policy::parse("images:\n  - projects: [api]\n    principals: [ci]\n").expect("policy")),
            allowed_signers::parse(&format!("ci {KEY}\nops {KEY}\n")).expect("signers"),
        );
        let sig = vec!["-----BEGIN SSH SIGNATURE-----\nAAAA\n-----END SSH SIGNATURE-----\n".to_owned()];
        let t = rules.trust("api", &sig, 1_800_000_000).expect("named");
        assert!(t.required);
        assert_eq!(t.signatures, sig);
        assert_eq!(t.signers.len(), 1, "ci's entry alone: {t:?}");
        assert_eq!(t.signers[0].principal, "ci");
        assert!(t.signers[0].key.starts_with("ssh-ed25519 AAAAC3"));
        assert_eq!(rules.trust("billing", &sig, 1_800_000_000), None);
        assert_eq!(
            ImageRules::default().trust("api", &sig, 0),
            None,
            "no policy: nothing checked"
        );
    }
}
