//! `pl` links no SQL, no async runtime and no server: the daemon's stack stays in
//! `reconciler`. Checked on the dependency graph cargo resolves for `pl` alone.

#[path = "../../tests-support/linked.rs"]
mod linked;

#[test]
fn pl_links_no_sql_and_no_async_runtime() {
    let crates = linked::linked_crates(env!("CARGO_MANIFEST_DIR"), "pushleft-cli");
    assert!(crates.contains("state-repo") && crates.contains("gix"), "{crates:?}");
    for banned in [
        "sqlx",
        "sqlx-core",
        "libsqlite3-sys",
        "tokio",
        "axum",
        "hyper",
        "reqwest",
        "reconciler",
    ] {
        assert!(!crates.contains(banned), "pl links {banned}");
    }
}

/// The product reads and writes Git through gix and makes and uses SSH keys with `ssh-key`: no
/// file of it runs `git` or `ssh-keygen` (tests may, to check what it wrote).
const RUNS: [&str; 2] = ["new(\"git\")", "\"ssh-keygen\""];

/// Every `.rs` file below `dirs` with its product code: what comes before its first
/// `#[cfg(test)]`.
fn product_code(dirs: &[std::path::PathBuf]) -> Vec<(std::path::PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = dirs.to_vec();
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("read dir").flatten() {
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

#[test]
fn nothing_runs_git_or_ssh_keygen() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dirs: Vec<std::path::PathBuf> = [
        "cli",
        "reconciler",
        "agent",
        "state-repo",
        "state-schema",
        "secrets",
        "image-trust",
        "agent-proto",
    ]
    .iter()
    .map(|c| root.join(c).join("src"))
    .collect();
    let mut found: Vec<String> = product_code(&dirs)
        .into_iter()
        .filter(|(_, code)| RUNS.iter().any(|r| code.contains(r)))
        .map(|(p, _)| p.strip_prefix(&root).expect("under root").display().to_string())
        .collect();
    found.sort();
    assert!(found.is_empty(), "files that run git or ssh-keygen: {found:?}");
    // The check sees what it looks for.
    for sample in [
        "let out = std::process::Command::new(\"git\").arg(\"init\");",
        "run(Command::new(\"ssh-keygen\").args([\"-q\"]))",
    ] {
        assert!(RUNS.iter().any(|r| sample.contains(r)), "{sample}");
    }
}

/// `pl` reads the operator API as `operator_proto`'s types: no file of it holds an untyped JSON
/// value or indexes one by a field's name (its own `--format json` output is built, not read).
const UNTYPED: [&str; 2] = ["serde_json::Value", "as_str().unwrap_or"];

/// `v["status"]`, `row]["node"]`: a value indexed by a field's name (an array literal such as
/// `args(["run"])` is not).
fn indexes_by_name(line: &str) -> bool {
    line.match_indices("[\"").any(|(i, _)| {
        line[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ']' || c == ')')
    })
}

#[test]
fn pl_reads_the_api_typed() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    for (p, code) in product_code(std::slice::from_ref(&src)) {
        for (n, line) in code.lines().enumerate() {
            let line = line.trim_start();
            if !line.starts_with("//") && (UNTYPED.iter().any(|u| line.contains(u)) || indexes_by_name(line)) {
                found.push(format!(
                    "{}:{}: {line}",
                    p.strip_prefix(&src).expect("under").display(),
                    n + 1
                ));
            }
        }
    }
    assert!(found.is_empty(), "untyped reads of the API:\n{}", found.join("\n"));
    for sample in [
        "let v: serde_json::Value = x;",
        "v[\"status\"] == \"done\"",
        "r[\"node\"].as_str().unwrap_or(\"?\")",
    ] {
        assert!(
            UNTYPED.iter().any(|u| sample.contains(u)) || indexes_by_name(sample),
            "{sample}"
        );
    }
    assert!(!indexes_by_name(".args([\"run\", \"--config\"])") && indexes_by_name("d[\"status\"]"));
}
