//! The node agent's library: enrolment, the client of the agent API, the run loop and the
//! executors. The `pl-agent` binary is a thin shell around it.
//!
//! Architecture invariant: the agent sees no SQL and no domain types of the control plane: it
//! speaks `agent-proto`, and Docker only through bollard (`docker/`). It links neither gix
//! nor `state-schema` (`tests/deps.rs`).

pub mod build;
pub mod client;
pub mod docker;
pub mod enroll;
pub mod firewall;
pub mod folder;
pub mod image_proxy;
pub mod ingress;
pub mod lease_loop;
pub mod logs;
pub mod mesh;
pub mod names;
pub mod outcome;
pub mod registry_auth;
pub mod renewal;
pub mod restic;
pub mod routes;
pub mod run;
pub mod volume_root;
