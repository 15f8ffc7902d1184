//! Pushleft's desired state: the types of every kind, parsing from bytes with spans,
//! validation, derivations, canonical form and hashes, and the planner.
//!
//! Architecture invariant: this crate is pure. It reads no files, runs no git, starts no
//! runtime; callers hand it bytes and get values back, which is what makes golden tests cheap.

pub mod canonical;
mod consequences;
pub mod cron;
pub mod declared;
mod decode;
pub mod deployment;
pub mod desired;
pub mod diag;
pub mod domains;
pub mod edit;
pub mod generations;
pub mod image_signatures;
pub mod image_updates;
pub mod incremental;
pub mod job_words;
mod kinds;
pub mod model;
pub mod parse;
pub mod placement;
pub mod plan;
pub mod release;
pub mod replacement;
pub mod rolling;
pub mod rollout;
pub mod runspec;
pub mod schema;
pub mod show;
mod small_map;
pub mod state;
pub mod synthetic;
pub mod task;
pub mod values;
pub mod volume_jobs;
pub mod volumes;
pub mod watch;
pub mod yaml;
pub mod yaml_errors;
mod yaml_input;
