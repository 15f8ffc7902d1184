//! The control host: reading state trees from Git (gix) or disk, deciding which commits to
//! trust, the durable ledger, the level-triggered reconcile loop and the operator API behind
//! `pl-reconciler`. Capacity-aware placement and the agents' mTLS API come next.
//!
//! Architecture invariant: this crate owns Git access; `state-schema` never sees a repository,
//! only bytes.

pub mod api;
pub mod auth;
pub mod config;
pub mod daemon;
pub mod deploy;
pub mod ledger;
pub mod load;
pub mod remote;
pub mod revision;
pub mod rewrites;
pub mod secrets;
pub mod source;
pub mod streams;
pub mod trust;
pub mod views;
