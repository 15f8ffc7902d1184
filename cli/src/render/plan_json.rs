//! `pl plan --format json`: a versioned object for machines. `formatVersion` changes only
//! when a field is removed or changes meaning; new fields may appear in any version.

use super::PlanHeader;
use state_schema::plan::Plan;

pub const FORMAT_VERSION: u32 = 1;

pub fn render(plan: &Plan, header: &PlanHeader) -> String {
    let v = serde_json::json!({
        "formatVersion": FORMAT_VERSION,
        "base": header.base,
        "head": header.head,
        "mergeBase": header.merge_base,
        "summary": plan.summary,
        "changes": plan.changes,
        "consequences": plan.consequences,
    });
    format!("{}\n", serde_json::to_string_pretty(&v).unwrap_or_default())
}
