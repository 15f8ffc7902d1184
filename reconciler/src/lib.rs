//! The control host's library: reading state trees from Git (gix) or disk, and deciding
//! which commits to trust. The daemon, the ledger and placement come later.
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
pub mod secrets;
pub mod source;
pub mod trust;
pub mod views;
