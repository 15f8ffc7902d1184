//! The enrolment folder: the names of the files `pl-agent enroll` writes there, which the
//! client and the run loop read. Its own module so that the client does not depend on
//! enrolment (which uses the client).

/// The files enrolment writes in the node's folder.
pub const KEY: &str = "node.key";
pub const CERT: &str = "node.crt";
pub const CA: &str = "ca.crt";
pub const AGE: &str = "age.key";
/// The control plane's id, which every host object this node's agent makes names.
pub const CONTROL_PLANE: &str = "control-plane";
