//! The operator API's wire types, shared by the daemon (which serialises them and nothing else)
//! and `pl` (which reads them and never indexes JSON by string). Statuses and states are
//! enums; the JSON is the documented one, field for field (`tests/wire.rs` holds a golden
//! document per endpoint, generated from these types). Each type derives its OpenAPI schema
//! (utoipa): the daemon's `GET /v1/openapi.json` is built from them.
//!
//! One module per resource. The only untyped payloads are documented as opaque where they are.

/// A closed set of states as the API spells them: the enum, its spelling both ways, and
/// every value (for counts and docs).
macro_rules! spelled {
    ($(#[$m:meta])* pub enum $name:ident { $($(#[$vm:meta])* $variant:ident = $text:tt,)+ }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
        pub enum $name {
            $($(#[$vm])* #[serde(rename = $text)] $variant,)+
        }

        impl $name {
            /// Every value, in the documented order.
            pub const ALL: &[$name] = &[$($name::$variant),+];

            /// As the API spells it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }

            /// From the API's spelling; `None` for any other text.
            pub fn parse(s: &str) -> Option<$name> {
                match s {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(self.as_str())
            }
        }
    };
}

pub mod backups;
pub mod deployments;
pub mod domains;
pub mod events;
pub mod images;
pub mod jobs;
pub mod nodes;
pub mod provenance;
pub mod revisions;
pub mod rollbacks;
pub mod status;
pub mod ui;
pub mod volumes;

pub use deployments::{Action, Canary, Deployment, DeploymentStatus, DeploymentsPage, Hold, MAX_WAIT_MS, Waiting};

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Every refusal and error: a stable code and what happened, in the daemon's words.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub code: String,
    pub message: String,
}

/// The most rows one page of a list returns (`limit`).
pub const MAX_PAGE: u32 = 1000;
