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
