//! A commit's signature verdict as JSON (`pl verify --format json`, plan headers): a rendering
//! of `state_repo`'s verdict, so `render` needs nothing of the `verify` command.

use state_repo::trust::{CommitVerdict, verify::Signer};

/// One verdict as JSON.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VerdictJson {
    pub commit: String,
    pub verdict: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signer: Option<Signer>,
}

impl VerdictJson {
    /// A working tree is not a commit and carries no signature.
    pub fn working_tree() -> Self {
        VerdictJson {
            commit: String::new(),
            verdict: "working-tree",
            code: None,
            message: Some("the working tree is not signed; plan a commit to see its verdict".into()),
            signer: None,
        }
    }

    /// One line for a plan's header.
    pub fn describe(&self) -> String {
        match (self.verdict, &self.signer, self.code) {
            ("valid", Some(s), _) => format!("valid, signed by {} ({})", s.principal(), s.fingerprint),
            ("refused", _, Some(code)) => format!("refused [{code}]: {}", self.message.clone().unwrap_or_default()),
            _ => self.message.clone().unwrap_or_default(),
        }
    }
}

impl From<&CommitVerdict> for VerdictJson {
    fn from(v: &CommitVerdict) -> Self {
        match &v.result {
            Ok(s) => VerdictJson {
                commit: v.commit.to_string(),
                verdict: "valid",
                code: None,
                message: None,
                signer: Some(s.clone()),
            },
            Err(r) => VerdictJson {
                commit: v.commit.to_string(),
                verdict: "refused",
                code: Some(r.code()),
                message: Some(r.message()),
                signer: None,
            },
        }
    }
}
