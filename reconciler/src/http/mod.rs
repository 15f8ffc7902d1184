//! The HTTP surfaces: the operator API (`operator.rs`), the agents' API over mutual TLS
//! (`agent.rs`), enrolment, `pl logs` and event streams.

pub mod agent;
pub mod backups;
pub mod domains;
pub mod enrolment;
pub mod environments;
pub mod logs;
pub mod mesh;
pub mod operator;
pub mod peer;
pub mod rollbacks;
pub mod server;
pub mod streams;
pub mod volumes;
