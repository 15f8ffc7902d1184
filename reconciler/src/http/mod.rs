//! The HTTP surfaces: the operator API (`operator.rs`, its handlers thin over `ops`; the
//! probes in `metrics.rs`; one environment's long poll in `environments.rs`; the OpenAPI
//! document in `openapi.rs`), the agents' API over mutual TLS (`agent.rs`; the image store's side in `agent_images.rs`, its
//! push side `registry.rs`), enrolment, `pl
//! logs` and event streams, and the web view (`ui/`, on the operator API's listener).

pub mod agent;
pub mod agent_images;
pub mod enrolment;
pub mod environments;
pub mod logs;
pub mod metrics;
pub mod openapi;
pub mod operator;
pub mod peer;
pub mod registry;
pub mod server;
pub mod slis;
pub mod streams;
pub mod ui;
