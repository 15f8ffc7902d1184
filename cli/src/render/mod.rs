//! Rendering for people and machines. The terminal (colour, width) is this crate's alone;
//! plans read the same here and in the daemon's web view (`pushleft_plan_render`).

pub mod diagnostics;
pub mod plan_json;

pub use pushleft_plan_render::{Paint, PlanHeader, Side, markdown, plan_text, short, verdict};
