//! The node agent's library: enrolment and the client of the agent API. The `pl-agent` binary
//! is a thin shell around it.

pub mod client;
pub mod enroll;
