//! The code map's rules, checked on the source: the reconciler's layers import only downwards
//! (`http -> ops -> hub -> store`, `reconcile -> hub -> store`; `store` imports neither; no
//! surface imports another's module; the operator surface reaches the store only through
//! `ops`), and no crate of the workspace has an import circle between its files. Read from the `crate::…`, `self::…` and `super::…` paths of non-test code (`use`
//! lines and inline paths; `super::` resolved from the file's own module); a `#[cfg(test)]`
//! item and everything after it in a file is test code.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A file's module path (`store::views`, `reconcile`, `main`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().expect("a file");
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_owned());
    }
    if parts.is_empty() {
        return if stem == "lib" { "crate".into() } else { stem.into() };
    }
    parts.join("::")
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Non-test code: everything before the first `#[cfg(test)]`, without comment lines (a doc
/// link is not an import).
fn code(file: &Path) -> String {
    let text = std::fs::read_to_string(file).expect("read");
    let text = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => &text,
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths a file's code names from `prefix` on (`crate::a::b`, `crate::{a::b, c}`), as
/// written after the prefix, each with how many `super::` it starts with.
fn paths_after(text: &str, prefix: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find(prefix) {
        let begin = i + at;
        let start = begin + prefix.len();
        // A whole word only (`my_crate::` is not `crate::`), and a `super::super::` chain is
        // read once, from its first `super::`.
        let before = begin.checked_sub(1).map(|b| bytes[b]);
        if before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':') {
            i = start;
            continue;
        }
        // `prefix{a::b, c}`: each member of the group.
        if bytes.get(start) == Some(&b'{') {
            let end = text[start..].find('}').map_or(text.len(), |e| start + e);
            for member in text[start + 1..end].split(',') {
                paths.push(member.trim().to_owned());
            }
            i = end;
        } else {
            let end = text[start..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .map_or(text.len(), |e| start + e);
            paths.push(text[start..end].to_owned());
            i = end;
        }
    }
    paths
}

/// The modules a file's code names through `crate::`, `self::` and `super::` (relative to its
/// own module `me`), resolved to the longest known module.
fn imports(text: &str, modules: &BTreeSet<String>, me: &str) -> BTreeSet<String> {
    let own: Vec<&str> = match me {
        "crate" | "main" => Vec::new(),
        m => m.split("::").collect(),
    };
    let mut absolute: Vec<Vec<String>> = Vec::new();
    for p in paths_after(text, "crate::") {
        absolute.push(p.split("::").filter(|s| !s.is_empty()).map(str::to_owned).collect());
    }
    for p in paths_after(text, "self::") {
        let mut segs: Vec<String> = own.iter().map(|s| (*s).to_owned()).collect();
        segs.extend(p.split("::").filter(|s| !s.is_empty()).map(str::to_owned));
        absolute.push(segs);
    }
    for p in paths_after(text, "super::") {
        // `super::` is the parent of this file's module; each further `super::` one more up.
        let mut rest: Vec<&str> = p.split("::").filter(|s| !s.is_empty()).collect();
        let mut up = 1;
        while rest.first() == Some(&"super") {
            rest.remove(0);
            up += 1;
        }
        let Some(keep) = own.len().checked_sub(up) else {
            continue;
        };
        let mut segs: Vec<String> = own[..keep].iter().map(|s| (*s).to_owned()).collect();
        segs.extend(rest.iter().map(|s| (*s).to_owned()));
        absolute.push(segs);
    }
    let mut out = BTreeSet::new();
    for segs in absolute {
        for n in (1..=segs.len()).rev() {
            let m = segs[..n].join("::");
            if modules.contains(&m) {
                out.insert(m);
                break;
            }
        }
    }
    out
}

/// Each file's module and what it imports, for a crate's `src`.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut all = Vec::new();
    files(src, &mut all);
    let modules: BTreeSet<String> = all.iter().map(|f| module_of(src, f)).collect();
    all.iter()
        .map(|f| {
            let me = module_of(src, f);
            let mut deps = imports(&code(f), &modules, &me);
            deps.remove(&me);
            (me, deps)
        })
        .collect()
}

/// A circle of imports, if there is one.
fn circle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(n) {
            Some(1) => {
                let from = path.iter().position(|p| p == n).unwrap_or(0);
                let mut c = path[from..].to_vec();
                c.push(n.to_owned());
                return Some(c);
            }
            Some(_) => return None,
            None => {}
        }
        state.insert(n.to_owned(), 1);
        path.push(n.to_owned());
        for d in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(d, g, state, path) {
                return Some(c);
            }
        }
        path.pop();
        state.insert(n.to_owned(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in g.keys() {
        if let Some(c) = visit(n, g, &mut state, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn no_crate_has_an_import_circle_between_its_files() {
    for krate in [
        "reconciler",
        "cli",
        "state-schema",
        "state-repo",
        "agent",
        "agent-proto",
        "operator-proto",
        "secrets",
    ] {
        let g = graph(&workspace().join(krate).join("src"));
        assert!(
            g.len() > 1 || krate.ends_with("proto") || krate == "secrets",
            "{krate}: {g:?}"
        );
        if let Some(c) = circle(&g) {
            panic!("{krate} has an import circle: {}", c.join(" -> "));
        }
    }
}

/// The top of a module path (`http`, `store`, …).
fn layer(m: &str) -> &str {
    m.split("::").next().unwrap_or(m)
}

#[test]
fn the_reconcilers_layers_import_only_downwards() {
    let g = graph(&workspace().join("reconciler/src"));
    // What each layer may import besides itself; leaves (config, auth, pki, issuer) import no layer.
    let allowed: BTreeMap<&str, &[&str]> = BTreeMap::from([
        ("store", &["config", "pki"][..]),
        ("hub", &["store"][..]),
        // The operator's use cases: between the surfaces and the store.
        ("ops", &["store", "hub", "config", "pki", "images"][..]),
        ("reconcile", &["store", "hub", "config", "issuer", "acme"][..]),
        (
            "http",
            &["ops", "delivery", "store", "hub", "config", "auth", "pki", "images"][..],
        ),
        // What a lease hands an agent: execution specs built from the store's rows.
        ("delivery", &["store"][..]),
        ("config", &["auth"][..]),
        ("auth", &["config"][..]),
        ("pki", &[][..]),
        // The image store on disk: blobs and their decisions, a leaf like pki (files, no SQL).
        ("images", &[][..]),
        // Who signs issued certificates: a leaf like pki; the ACME client returns what it signs.
        ("issuer", &[][..]),
        ("acme", &["issuer"][..]),
        // Outgoing notifications: reads events and the outbox, delivers through `forge`.
        ("notify", &["store", "hub", "config"][..]),
        // Disaster recovery's archives: the ledger's copy and the files the config names.
        ("snapshot", &["store", "config", "hub"][..]),
        ("crate", &[][..]),
        // The composition root may build anything; nothing imports it.
        (
            "main",
            &[
                "store",
                "hub",
                "ops",
                "reconcile",
                "delivery",
                "http",
                "config",
                "auth",
                "pki",
                "issuer",
                "acme",
                "notify",
                "snapshot",
                "images",
            ][..],
        ),
    ]);
    for (m, deps) in &g {
        let mine = layer(m);
        let ok = allowed
            .get(mine)
            .unwrap_or_else(|| panic!("{m}: a layer the code map does not name"));
        for d in deps {
            let theirs = layer(d);
            assert!(
                theirs == mine || ok.contains(&theirs),
                "{m} imports {d}: {mine} may import only {ok:?}"
            );
            assert_ne!(theirs, "main", "{m} imports the composition root");
        }
    }
    // The surfaces: neither imports the other; what both use (the server, peers, logs,
    // enrolment, streams) imports neither.
    for (m, deps) in g.iter().filter(|(m, _)| layer(m) == "http") {
        for surface in ["http::operator", "http::agent"] {
            if m != surface {
                assert!(!deps.contains(surface), "{m} imports the surface {surface}");
            }
        }
    }
    // The reconcile layer knows nothing of HTTP, and the store nothing above it.
    assert!(
        g.iter()
            .all(|(m, d)| layer(m) != "store" || d.iter().all(|x| !["reconcile", "http", "hub"].contains(&layer(x))))
    );
}

#[test]
fn only_the_store_speaks_sql() {
    // The store is SQL only, and SQL is the store's only: the layers above read rows through
    // its methods and never write a statement of their own (their tests may).
    let src = workspace().join("reconciler/src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let mut outside = 0;
    for f in &all {
        let m = module_of(&src, f);
        let text = code(f);
        // Rows are read by name (`FromRow`, tuples of `query_as`), never by position.
        assert!(!text.contains(".try_get("), "{m} reads a row by position");
        let speaks = ["sqlx::query", "sqlx::Row"].iter().any(|s| text.contains(s));
        if layer(&m) == "store" {
            continue;
        }
        outside += 1;
        assert!(!speaks, "{m} runs SQL outside the store");
    }
    assert!(outside > 10, "the walk saw the layers above the store: {outside} files");
}

/// The names of the methods that `impl Ledger` blocks in `text` define.
fn ledger_methods(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with("impl Ledger") {
            inside = true;
        } else if line == "}" {
            inside = false;
        } else if inside
            && line.starts_with("    ")
            && !line.starts_with("        ")
            && let Some(rest) = line.split("fn ").nth(1)
        {
            out.insert(rest.split(['(', '<']).next().unwrap_or_default().to_owned());
        }
    }
    out
}

#[test]
fn the_store_calls_no_method_the_reconcile_layer_adds_to_the_ledger() {
    // `impl Ledger` blocks in `reconcile/` and `delivery/` add methods to the store's type,
    // which no import shows: the store calling one would be an upward dependency the import
    // walk misses.
    let src = workspace().join("reconciler/src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let mut theirs = BTreeSet::new();
    for f in all
        .iter()
        .filter(|f| ["reconcile", "delivery"].contains(&layer(&module_of(&src, f))))
    {
        theirs.extend(ledger_methods(&code(f)));
    }
    assert!(
        theirs.contains("apply_revision") && theirs.contains("advance") && theirs.contains("executions"),
        "{theirs:?}"
    );
    for f in all.iter().filter(|f| layer(&module_of(&src, f)) == "store") {
        let text = code(f);
        for name in &theirs {
            assert!(
                !text.contains(&format!("self.{name}(")),
                "{} calls `{name}`, which a layer above adds to the ledger",
                module_of(&src, f)
            );
        }
    }
}

#[test]
fn the_daemon_decrypts_a_secret_only_to_reseal_it() {
    // The plaintext of a secret exists on the control host only inside
    // `pushleft_secrets::reseal`, called in one place.
    let src = workspace().join("reconciler/src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let mut resealers = Vec::new();
    for f in &all {
        let text = code(f);
        assert!(
            !text.contains("pushleft_secrets::decrypt") && !text.contains("secrets::decrypt("),
            "{} decrypts a secret outside reseal",
            module_of(&src, f)
        );
        if text.contains("pushleft_secrets::reseal(") {
            resealers.push(module_of(&src, f));
        }
    }
    assert_eq!(resealers, ["delivery"], "one place reseals");
}

#[test]
fn the_walk_sees_imports_and_circles() {
    // A check that cannot fail is no check: the same walk over a made-up crate finds its
    // imports, grouped or inline, and its circle.
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("a")).expect("dir");
    std::fs::write(src.join("lib.rs"), "pub mod a;\npub mod b;\n").expect("lib");
    std::fs::write(
        src.join("a/mod.rs"),
        "use crate::{b::X, a::c};\npub mod c;\npub mod d;\n",
    )
    .expect("a");
    // Relative paths: `super::` from a file is its module's parent, `self::` the module itself.
    std::fs::write(
        src.join("a/d.rs"),
        "use super::c::h;\nfn f() { super::super::b::g(); self::k(); }\nfn k() {}\nuse my_super::x;\n",
    )
    .expect("d");
    std::fs::write(src.join("a/c.rs"), "/// Not [`crate::a`].\nfn f() { crate::b::g(); }\n").expect("c");
    std::fs::write(
        src.join("b.rs"),
        "pub fn g() { crate::a::c::h(); }\n#[cfg(test)]\nmod t { use crate::a; }\n",
    )
    .expect("b");
    let g = graph(&src);
    assert_eq!(g["a"], BTreeSet::from(["b".to_owned(), "a::c".to_owned()]));
    assert_eq!(g["b"], BTreeSet::from(["a::c".to_owned()]), "test code is left out");
    assert_eq!(
        g["a::d"],
        BTreeSet::from(["a::c".to_owned(), "b".to_owned()]),
        "super:: resolved"
    );
    let c = circle(&g).expect("a circle");
    assert!(c.contains(&"b".to_owned()) && c.contains(&"a::c".to_owned()), "{c:?}");
}

/// The operator surface only parses, authorises, calls `ops` and writes: none of its files
/// names the store (the agents' surface, enrolment and `pl logs` still do; `docs/architecture.md`
/// says so).
#[test]
fn the_operator_surface_reaches_the_store_only_through_ops() {
    let g = graph(&workspace().join("reconciler/src"));
    for m in [
        "http::operator",
        "http::environments",
        "http::metrics",
        "http::openapi",
        "http::server",
        "http::ui",
        "http::ui::pages",
        "http::ui::lists",
        "http::ui::actions",
        "http::ui::signin",
        "http::ui::live",
    ] {
        let deps = g.get(m).unwrap_or_else(|| panic!("{m} is not a module any more"));
        let store: Vec<&String> = deps.iter().filter(|d| layer(d) == "store").collect();
        assert!(
            store.is_empty(),
            "{m} imports {store:?}: the operator surface goes through ops"
        );
        assert!(
            m == "http::openapi" || m == "http::server" || m == "http::ui::live" || deps.contains("ops"),
            "{m} does not call ops: {deps:?}"
        );
    }
}

/// The web view writes every value through maud's escaping: no file of it opts out with
/// `PreEscaped`, and its pages load no script but its own file (no inline script, which its
/// Content-Security-Policy would refuse anyway).
#[test]
fn the_web_view_writes_no_value_unescaped() {
    let dir = workspace().join("reconciler/src/http/ui");
    let mut all = Vec::new();
    files(&dir, &mut all);
    assert!(all.len() >= 6, "the walk sees the view's files: {all:?}");
    for f in &all {
        let text = code(f);
        assert!(!text.contains("PreEscaped"), "{} writes unescaped HTML", f.display());
        assert!(!text.contains("script {"), "{} writes an inline script", f.display());
    }
    let js = std::fs::read_to_string(dir.join("assets/ui.js")).expect("ui.js");
    for risky in [
        "innerHTML =",
        "outerHTML",
        "insertAdjacentHTML",
        "eval(",
        "document.write",
    ] {
        assert!(!js.contains(risky), "ui.js uses {risky}");
    }
}

#[test]
fn a_rollout_advances_by_one_decision_written_in_one_module() {
    // How a rollout's step advances is `state_schema::rollout::advance::advance`'s, called
    // by one module, which writes it; a step's wait is a typed column, never a far-off time
    // (no `i64::MAX / n` sentinel in the reconciler, and a scale's held removals are
    // `jobs.held`, not a `not_before` no clock reaches).
    let src = workspace().join("reconciler/src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let mut callers = Vec::new();
    for f in &all {
        let m = module_of(&src, f);
        let text = code(f);
        if text.contains("advance::advance(") {
            callers.push(m.clone());
        }
        let squeezed: String = text.chars().filter(|c| !c.is_whitespace()).collect();
        assert!(!squeezed.contains("i64::MAX/"), "{m} keeps a sentinel time");
        for gone in ["PROMOTE", "CANARY_UNTIL", "HELD"] {
            assert!(!text.contains(gone), "{m} names {gone}");
        }
    }
    assert_eq!(callers, ["reconcile::advance"], "the decision's callers");
    // And the agent judges no gate: it measures.
    let agent = workspace().join("agent/src");
    let mut all = Vec::new();
    files(&agent, &mut all);
    assert!(all.len() > 20, "the walk saw the agent");
    for f in &all {
        let text = code(f);
        assert!(
            !text.contains("max_error_percent") && !text.contains("CanaryGate"),
            "{} judges a canary's gates",
            f.display()
        );
    }
}

/// Every `state_schema::…` path a file's code names, use groups expanded
/// (`state_schema::a::{B, c::D}` is `a::B` and `a::c::D`).
fn schema_paths(text: &str) -> Vec<String> {
    fn expand(prefix: &str, group: &str, out: &mut Vec<String>) {
        // Split the group's members at top-level commas.
        let (mut depth, mut start) = (0, 0);
        let bytes = group.as_bytes();
        let mut members = Vec::new();
        for (i, b) in bytes.iter().enumerate() {
            match b {
                b'{' => depth += 1,
                b'}' => depth -= 1,
                b',' if depth == 0 => {
                    members.push(&group[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        members.push(&group[start..]);
        for m in members.iter().map(|m| m.trim()).filter(|m| !m.is_empty()) {
            match m.find('{') {
                Some(open) => {
                    let inner = &m[open + 1..m.rfind('}').unwrap_or(m.len())];
                    expand(&format!("{prefix}{}", &m[..open]), inner, out);
                }
                None => {
                    let path = format!("{prefix}{}", m.split_whitespace().next().unwrap_or(m));
                    // `a::{self, …}` names the module `a`.
                    out.push(path.strip_suffix("::self").unwrap_or(&path).to_owned());
                }
            }
        }
    }
    let mut out = Vec::new();
    let prefix = "state_schema::";
    let mut i = 0;
    while let Some(at) = text[i..].find(prefix) {
        let start = i + at + prefix.len();
        let end = text[start..]
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .map_or(text.len(), |e| start + e);
        let head = &text[start..end];
        if text[end..].starts_with('{') {
            // The group up to its matching brace.
            let mut depth = 0;
            let mut close = text.len();
            for (k, c) in text[end..].char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            close = end + k;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            expand(head, &text[end + 1..close.min(text.len())], &mut out);
            i = close.min(text.len());
        } else {
            out.push(head.trim_end_matches("::").to_owned());
            i = end;
        }
    }
    out
}

/// What of `state_schema` the store may name: its types, constants and the task keys' own
/// helpers (a job key is the store's column), never a decision.
fn a_row_type(path: &str) -> bool {
    const MODULES: [&str; 4] = ["deployment::", "values::", "model::", "task::"];
    const NAMES: [&str; 24] = [
        "domains::DomainState",
        "generations::Action",
        "generations::Status",
        "generations::Current",
        "generations::StepJobs",
        "generations::RollbackAsk",
        "generations::RollbackRefusal",
        "rollout::Step",
        "rollout::PUBLISH_STEP",
        "rollout::advance::StepState",
        "watch::Seen",
        "placement::Waiting",
        "placement::UNHEALTHY_AFTER_MS",
        "placement::LOST_AFTER_MS",
        "placement::Liveness",
        "placement::Pin",
        "placement::NOT_ELIGIBLE",
        "replacement::Held",
        "replacement::Running",
        "replacement::SeenNode",
        "replacement::Snapshot",
        "replacement::FleetRows",
        "placement::Fleet",
        "volumes::MAX_KEEP",
    ];
    MODULES.iter().any(|m| path.starts_with(m))
        || NAMES.iter().any(|n| path == *n || path.starts_with(&format!("{n} ")))
}

#[test]
fn the_store_names_no_decision_of_the_pure_core() {
    // The store is rows: it names `state_schema`'s types, never its decisions (a decision a
    // store transaction must make is handed in by the caller as a function, or left for the
    // pass, as a repaired replica's republish is).
    // The fleet's decisions are its methods: a store file may hold a fleet (made by its
    // caller) and read it, not ask it where something goes.
    let fleet_calls = [".place(", ".move_lands(", ".answers("];
    let src = workspace().join("reconciler/src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let mut named = 0;
    for f in &all {
        let m = module_of(&src, f);
        if layer(&m) != "store" {
            continue;
        }
        let text = code(f);
        for c in fleet_calls {
            assert!(
                !text.contains(c),
                "{m} asks the fleet {c}..): the caller decides, the store reads and writes"
            );
        }
        for p in schema_paths(&text) {
            named += 1;
            assert!(
                a_row_type(&p),
                "{m} names the decision state_schema::{p}: the caller decides, the store reads and writes"
            );
        }
    }
    assert!(named > 30, "the walk saw the store's state_schema paths: {named}");
    // A decision is told from a type.
    assert!(a_row_type("deployment::DeploymentSpec") && !a_row_type("rollout::republish_after_repair"));
    // The walk reads groups and nested groups.
    assert_eq!(
        schema_paths(
            "use state_schema::generations::{self, Action, x::{Y, Z}};\nlet s = state_schema::watch::judge(a);"
        ),
        [
            "generations",
            "generations::Action",
            "generations::x::Y",
            "generations::x::Z",
            "watch::judge"
        ]
    );
}

/// The fields of `pub struct {name}` in `text`, one line each.
fn struct_fields<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    let open = format!("pub struct {name} {{");
    let Some(at) = text.find(&open) else {
        return Vec::new();
    };
    text[at + open.len()..]
        .lines()
        .take_while(|l| *l != "}")
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("//"))
        .collect()
}

#[test]
fn the_ledger_holds_rows_not_runtime_flags() {
    // The store is rows: what the daemon decides or remembers between passes (a drift
    // suspected, when it last looked, until when something is watched, its configuration) is
    // the caller's, kept in the hub or the layer's own state and handed in.
    let text = std::fs::read_to_string(workspace().join("reconciler/src/store/mod.rs")).expect("read");
    let fields = struct_fields(&text, "Ledger");
    assert!(fields.len() >= 4, "the walk read the Ledger's fields: {fields:?}");
    for f in &fields {
        let ty = f.split_once(':').map_or(*f, |(_, t)| t);
        for flag in ["Atomic", "Hint", "Cell<bool>"] {
            assert!(!ty.contains(flag), "the Ledger keeps a runtime flag: {f}");
        }
    }
    // The walk sees one.
    let flagged = "pub struct Ledger {\n    pool: AnyPool,\n    drift: std::sync::atomic::AtomicBool,\n}\n";
    assert!(struct_fields(flagged, "Ledger")[1].contains("Atomic"));
}

#[test]
fn the_ledger_splits_by_aggregate_each_with_its_own_handle() {
    // The `Ledger` itself is the connection: connecting, migrating, the dialect, write
    // transactions, leadership. Every row method belongs to one aggregate's handle
    // (`ledger.deployments()`, `.jobs()`, …), and a store file serves one aggregate.
    let core: BTreeSet<&str> = BTreeSet::from([
        "connect",
        "control_plane",
        "backend",
        "migrate",
        "write_tx",
        // Where the tasks that hold the writer run (SQLite: a thread each).
        "spawn_writer",
        // Wakes between the replicas of a pair (PostgreSQL's LISTEN/NOTIFY), beside leadership.
        "announce",
        "wakes",
        "sqlite_in",
        "id_set",
        "sql",
        "placeholders",
        "ping",
        "try_lead",
        "execute_raw",
        "close",
    ]);
    let aggregates = [
        "Deployments",
        "Jobs",
        "Nodes",
        "Volumes",
        "Backups",
        "Certificates",
        "Domains",
        "Events",
        "Revisions",
        "Views",
        "Sessions",
    ];
    let src = workspace().join("reconciler/src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let mut served: BTreeMap<&str, usize> = BTreeMap::new();
    for f in &all {
        let m = module_of(&src, f);
        if layer(&m) != "store" {
            continue;
        }
        let text = code(f);
        for name in ledger_methods(&text) {
            assert!(
                core.contains(name.as_str()),
                "{m} adds `{name}` to the Ledger itself: it belongs to an aggregate's handle"
            );
        }
        let mut mine: BTreeSet<&str> = BTreeSet::new();
        for line in text.lines().filter(|l| l.starts_with("impl ")) {
            if let Some(a) = aggregates
                .iter()
                .find(|a| line.starts_with(&format!("impl crate::store::{a}<'_>")))
            {
                mine.insert(a);
            }
        }
        assert!(mine.len() <= 1, "{m} serves several aggregates: {mine:?}");
        for a in mine {
            *served.entry(a).or_default() += 1;
        }
    }
    for a in aggregates {
        assert!(served.contains_key(a), "no store file serves {a}: {served:?}");
    }
}

#[test]
fn the_surfaces_call_the_store_only_for_the_reads_the_code_map_names() {
    // `http/` parses, authorises, calls `ops` (or `delivery`) and writes its answer; what it
    // asks the store itself is a read the code map names: who a job or a certificate belongs
    // to, a node's newer mesh (for its waiting lease), which specs run (for `pl logs`), the
    // newest event, the control plane's id.
    let reads: BTreeSet<&str> = BTreeSet::from([
        "nodes().job_nodes",
        "nodes().mesh_newer",
        "nodes().running_specs",
        "views().last_event_id",
    ]);
    let accessors = [
        "deployments",
        "jobs",
        "nodes",
        "volumes",
        "backups",
        "certificates",
        "domains",
        "events",
        "revisions",
        "views",
        "sessions",
    ];
    let src = workspace().join("reconciler/src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let mut seen = BTreeSet::new();
    for f in &all {
        let m = module_of(&src, f);
        if layer(&m) != "http" {
            continue;
        }
        // One line per statement is not a given (rustfmt breaks chains): read the file whole,
        // without whitespace.
        let text: String = code(f).chars().filter(|c| !c.is_whitespace()).collect();
        for a in accessors {
            let open = format!("ledger.{a}().");
            for (at, _) in text.match_indices(&open) {
                let rest = &text[at + "ledger.".len()..];
                let call = rest.split('(').take(2).collect::<Vec<_>>().join("(");
                assert!(
                    reads.contains(call.as_str()),
                    "{m} calls the store's {call}: go through ops"
                );
                seen.insert(call);
            }
        }
        for core in ["execute_raw(", "write_tx(", "migrate("] {
            assert!(!text.contains(core), "{m} calls the ledger's {core}..)");
        }
        // Both wires are typed: a surface answers with `operator_proto` or `agent_proto` types.
        assert!(!text.contains("json!("), "{m} builds an answer with json!");
    }
    assert!(seen.len() >= 3, "the walk saw the surfaces' reads: {seen:?}");
}

/// The product sources of every crate of the workspace: `<crate>/src/**.rs`.
fn product_files() -> Vec<PathBuf> {
    let mut all = Vec::new();
    for e in std::fs::read_dir(workspace()).expect("workspace").flatten() {
        let src = e.path().join("src");
        if e.path().join("Cargo.toml").is_file() && src.is_dir() {
            files(&src, &mut all);
        }
    }
    all.sort();
    all
}

/// `text` with string, raw-string and char literals and comments blanked (braces in them are
/// no blocks), line breaks kept.
fn blank_literals(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let keep = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            while i < b.len() && !(b[i] == '*' && b.get(i + 1) == Some(&'/')) {
                out.push(keep(b[i]));
                i += 1;
            }
            out.push_str("  ");
            i += 2;
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && (i == 0 || !b[i - 1].is_alphanumeric()) {
            let mut j = i + 1;
            while b.get(j) == Some(&'#') {
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let hashes = j - i - 1;
            let close: String = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            let rest: String = b[j + 1..].iter().collect();
            let len = rest
                .find(&close)
                .map_or(rest.chars().count(), |k| rest[..k].chars().count());
            for &x in &b[i..(j + 1 + len + close.len()).min(b.len())] {
                out.push(keep(x));
            }
            i = j + 1 + len + close.len();
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < b.len() {
                    out.push(keep(b[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' && next == Some('\\') {
            // An escaped char literal: up to its closing quote.
            let end = (i + 2..b.len()).find(|&k| b[k] == '\'').unwrap_or(b.len() - 1);
            out.extend(std::iter::repeat_n(' ', end + 1 - i));
            i = end + 1;
        } else if c == '\'' && b.get(i + 2) == Some(&'\'') {
            out.push_str("   ");
            i += 3;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Each function of `text` (non-test code) longer than `limit` lines: (name, first line, lines).
fn long_functions(text: &str, limit: usize) -> Vec<(String, usize, usize)> {
    let code = blank_literals(text);
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let words: Vec<&str> = lines[i].split_whitespace().collect();
        let at = words
            .iter()
            .take_while(|w| w.starts_with("pub") || ["async", "const", "unsafe", "extern"].contains(w))
            .count();
        let name = match (words.get(at), words.get(at + 1)) {
            (Some(&"fn"), Some(n)) => n.split(['(', '<']).next().unwrap_or(n).to_owned(),
            _ => {
                i += 1;
                continue;
            }
        };
        let (mut depth, mut opened, mut end) = (0i64, false, None);
        'body: for (j, line) in lines.iter().enumerate().skip(i) {
            for ch in line.chars() {
                match ch {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    ';' if !opened => break 'body,
                    _ => {}
                }
                if opened && depth == 0 {
                    end = Some(j);
                    break 'body;
                }
            }
        }
        match end {
            Some(j) => {
                if j + 1 - i > limit {
                    out.push((name, i + 1, j + 1 - i));
                }
                i = j + 1;
            }
            None => i += 1,
        }
    }
    out
}

/// Functions over 100 lines that stay whole, each with why: a table (one arm per variant of a
/// closed enum, or one entry per schema or route) reads best as one list.
const LONG_BY_DESIGN: &[(&str, &str)] = &[
    (
        "reconciler/src/http/openapi/mod.rs document",
        "the document: one entry per route",
    ),
    ("state-schema/src/schema.rs spec_schemas", "one JSON Schema per kind"),
    ("cli/src/main.rs main", "the command dispatch: one arm per command"),
    (
        "reconciler/src/delivery/task.rs wire_task",
        "one arm per task: the exhaustive wire map",
    ),
    ("state-schema/src/task.rs idempotency_key", "one arm per task: its key"),
    (
        "state-schema/src/yaml_errors.rs explain",
        "one arm per parse error: its words",
    ),
    (
        "reconciler/src/delivery/mod.rs executions",
        "one arm per task: what its lease carries",
    ),
    ("agent/src/run/executors.rs run_task", "one arm per task: its executor"),
];

#[test]
fn files_and_functions_fit_a_reader() {
    let root = workspace();
    let mut long = Vec::new();
    let mut files_seen = 0;
    for f in product_files() {
        let text = std::fs::read_to_string(&f).expect("read");
        let product = text.find("#[cfg(test)]").map_or(text.as_str(), |i| &text[..i]);
        let rel = f.strip_prefix(&root).unwrap_or(&f).to_string_lossy().replace('\\', "/");
        files_seen += 1;
        let lines = product.lines().count();
        assert!(
            lines <= 600,
            "{rel}: {lines} lines of product code: split it by concern (at most 600)"
        );
        for (name, line, n) in long_functions(product, 100) {
            let key = format!("{rel} {name}");
            if !LONG_BY_DESIGN.iter().any(|(k, _)| *k == key) {
                long.push(format!("{rel}:{line} {name}: {n} lines"));
            }
        }
    }
    assert!(files_seen > 200, "the walk saw the workspace: {files_seen} files");
    assert!(
        long.is_empty(),
        "functions over 100 lines (split them into steps that read in one screen, or name a table in LONG_BY_DESIGN):\n{}",
        long.join("\n")
    );
    // The count sees braces in code only, and names each function.
    let sample = "fn a() {\n    let s = \"{\";\n    let c = '{';\n    // {\n    let r = r#\"}\"#;\n}\npub(crate) async fn b<'x>(v: &'x str) -> u8 {\n    1\n}\n";
    assert_eq!(long_functions(sample, 3), [("a".to_owned(), 1, 6)]);
    assert_eq!(
        long_functions(sample, 2),
        [("a".to_owned(), 1, 6), ("b".to_owned(), 7, 3)]
    );
}
