//! The web view's sign-in through the API: `pl ui` asks for a one-time link, and may end every
//! session of its token.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/ui/sign-in-link`: a link that signs a browser in once, as the caller's token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SignInLink {
    /// The path on this listener, with its one-time code (`/ui/sign-in/link?code=…`).
    pub path: String,
    /// Until when it may be used.
    pub expires_at_ms: i64,
}

/// `POST /v1/ui/sign-out-everywhere`: the caller token's sessions ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SignedOut {
    pub sessions: u64,
}
