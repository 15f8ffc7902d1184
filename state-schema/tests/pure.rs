//! `state-schema` is pure: it links no runtime, no Git, no SQL and no network client, its
//! code opens no file, socket or process and reads no environment, and it writes no terminal
//! escape (colour is `pl`'s). Checked on the dependency graph cargo resolves for it and on its
//! non-test sources.

#[path = "../../tests-support/linked.rs"]
mod linked;

use std::path::{Path, PathBuf};

/// Non-test code of every `.rs` file under `dir`: what comes before the first `#[cfg(test)]`.
fn sources(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).expect("read");
                let code = text.split("#[cfg(test)]").next().unwrap_or("").to_owned();
                out.push((p, code));
            }
        }
    }
    out
}

/// What pure code never names.
const IMPURE: [&str; 8] = [
    "std::fs",
    "std::net",
    "std::process",
    "std::env::var",
    "File::open",
    "tokio::",
    "\\x1b[",
    "\\u{1b}",
];

fn impure(code: &str) -> Option<&'static str> {
    IMPURE.iter().copied().find(|s| code.contains(s))
}

#[test]
fn state_schema_links_nothing_that_does_io() {
    let crates = linked::linked_crates(env!("CARGO_MANIFEST_DIR"), "state-schema");
    assert!(crates.contains("saphyr-parser"), "{crates:?}");
    for banned in [
        "tokio",
        "gix",
        "sqlx",
        "sqlx-core",
        "reqwest",
        "ureq",
        "hyper",
        "notify",
        "mio",
    ] {
        assert!(!crates.contains(banned), "state-schema links {banned}");
    }
}

#[test]
fn state_schema_code_opens_nothing_and_paints_nothing() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = sources(&src);
    assert!(files.len() > 20, "the walk saw the crate: {}", files.len());
    for (path, code) in &files {
        assert_eq!(impure(code), None, "{} is not pure", path.display());
    }
    // The check sees what it looks for.
    for sample in [
        "let t = std::fs::read_to_string(p)?;",
        "let _ = std::process::Command::new(\"sh\");",
        "format!(\"\\x1b[31m{s}\\x1b[0m\")",
    ] {
        assert!(impure(sample).is_some(), "{sample}");
    }
}
