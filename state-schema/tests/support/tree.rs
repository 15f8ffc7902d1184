//! A state tree on disk, parsed as `pl` parses one: every file (or only the `.yaml` ones)
//! below a folder, in name order, each named by its path under the folder.

use state_schema::parse::{ParsedFile, parse_file};
use std::path::Path;

fn files(dir: &Path, yaml_only: bool, out: &mut Vec<(String, Vec<u8>)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            files(&p, yaml_only, out);
        } else if !yaml_only || p.extension().is_some_and(|x| x == "yaml") {
            out.push((p.display().to_string(), std::fs::read(&p).expect("read")));
        }
    }
}

/// The folder's files, parsed.
pub fn parsed(root: &Path, yaml_only: bool) -> Vec<ParsedFile> {
    let mut fs = Vec::new();
    files(root, yaml_only, &mut fs);
    let prefix = format!("{}/", root.display());
    fs.iter()
        .map(|(p, t)| parse_file(p.strip_prefix(&prefix).unwrap_or(p), t))
        .collect()
}
