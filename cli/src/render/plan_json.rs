//! `pl plan --format json`: a versioned object for machines. `formatVersion` changes only
//! when a field is removed or changes meaning; new fields may appear in any version.

use super::PlanHeader;
use state_schema::plan::Plan;

pub const FORMAT_VERSION: u32 = 1;

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct PlanJson<'p, 'a> {
    format_version: u32,
    base: &'p super::Side,
    head: &'p super::Side,
    merge_base: &'p Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    head_signature: &'p Option<crate::render::verdict::VerdictJson>,
    summary: state_schema::plan::Summary,
    changes: &'p [state_schema::plan::Change<'a>],
    consequences: &'p state_schema::plan::Consequences,
}

/// Writes the plan as pretty JSON straight to `w`, without building a copy in memory.
pub fn write(plan: &Plan<'_>, header: &PlanHeader, w: &mut impl std::io::Write) -> std::io::Result<()> {
    let doc = PlanJson {
        format_version: FORMAT_VERSION,
        base: &header.base,
        head: &header.head,
        merge_base: &header.merge_base,
        head_signature: &header.signature,
        summary: plan.summary,
        changes: &plan.changes,
        consequences: &plan.consequences,
    };
    serde_json::to_writer_pretty(&mut *w, &doc)?;
    w.write_all(b"\n")
}
