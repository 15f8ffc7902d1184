//! The control host: the durable ledger, the level-triggered reconcile loop, and the operator
//! API behind `pl-reconciler`. What it reads from Git, and how it trusts it, comes from
//! `state-repo`. Enrolment and the agents' API over mutual TLS are here; capacity-aware
//! placement comes next.
//!
//! Architecture invariant: SQL and the async runtime live here and nowhere `pl` links.

pub mod agent_api;
pub mod api;
pub mod auth;
mod catchup;
pub mod config;
pub mod cron;
pub mod daemon;
pub mod delivery;
pub mod deploy;
pub mod drift;
pub(crate) mod enrolment;
pub mod fleet;
pub mod group;
pub mod ledger;
pub mod logs;
pub mod pki;
pub mod placing;
pub mod rewrites;
pub mod streams;
pub mod views;
