//! The control host: the durable ledger, the level-triggered reconcile loop, and the HTTP
//! surfaces (the operator API, the agents' API over mutual TLS, enrolment, logs) behind
//! `pl-reconciler`. What it reads from Git, and how it trusts it, comes from `state-repo`.
//!
//! Layers, each a folder: `store` (SQL and rows), `reconcile` (the pass: read, decide,
//! write), `ops` (the use cases the surfaces call), `delivery` (what a lease hands an agent),
//! `http` (the surfaces); `hub` carries the signals between them, and the binary (`main.rs`)
//! composes them.
//!
//! Architecture invariant: SQL and the async runtime live here and nowhere `pl` links.

pub mod acme;
pub mod auth;
pub mod config;
pub mod delivery;
pub mod http;
pub mod hub;
pub mod images;
pub mod issuer;
pub mod notify;
pub mod ops;
pub mod pki;
pub mod reconcile;
pub mod snapshot;
pub mod store;
