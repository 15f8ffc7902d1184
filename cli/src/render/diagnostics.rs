//! `pl validate` output: diagnostics as text (one per problem, with hints) or JSON.

use super::Paint;
use state_schema::diag::{Diagnostic, Severity};

pub fn text(diags: &[Diagnostic], objects: usize, files: usize, paint: Paint) -> String {
    let mut out = String::new();
    for d in diags {
        let place = match (d.line, d.column) {
            (Some(l), Some(c)) => format!("{}:{l}:{c}", d.file),
            _ => d.file.clone(),
        };
        let sev = match d.severity {
            Severity::Error => paint.red(&format!("error[{}]", d.code)),
            Severity::Warning => paint.yellow(&format!("warning[{}]", d.code)),
        };
        out.push_str(&format!("{}: {sev}: {}\n", paint.bold(&place), d.message));
        if let Some(h) = &d.hint {
            out.push_str(&format!("  {} {h}\n", paint.cyan("hint:")));
        }
    }
    let errors = diags.iter().filter(|d| d.severity == Severity::Error).count();
    if errors == 0 {
        out.push_str(&format!(
            "{} {objects} objects in {files} files\n",
            paint.green("valid:")
        ));
    } else {
        let in_files = diags
            .iter()
            .map(|d| d.file.as_str())
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        let noun = if errors == 1 { "error" } else { "errors" };
        let fnoun = if in_files == 1 { "file" } else { "files" };
        out.push_str(&format!(
            "{} {errors} {noun} in {in_files} {fnoun}\n",
            paint.red("invalid:")
        ));
    }
    out
}

pub fn json(diags: &[Diagnostic], objects: usize, files: usize) -> String {
    let v = serde_json::json!({
        "formatVersion": 1,
        "valid": diags.iter().all(|d| d.severity != Severity::Error),
        "files": files,
        "objects": objects,
        "diagnostics": diags,
    });
    format!("{}\n", serde_json::to_string_pretty(&v).unwrap_or_default())
}
