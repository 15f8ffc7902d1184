//! The OpenAPI document against the daemon that serves it: `GET /v1/openapi.json` answers the
//! kept document (`docs/openapi.json`); every route the operator listener's routers mount (read
//! from their source) is in it; and every path in it is mounted: asked without a token, the
//! running daemon answers each with its own words (a typed refusal, or the resource for what
//! anyone may read), never the router's bare 404. Loopback only; one request per path.

#[path = "support/daemon.rs"]
mod daemon_support;
#[path = "support/repo.rs"]
mod repo_support;

use daemon_support::{Daemon, config, free_port, setup};
use repo_support::{Repo, project};
use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

/// `(METHOD, path)` of every `.route("…", get(…))` / `post(…)` in a router's source.
fn mounted(source: &str) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for chunk in source.split(".route(\"").skip(1) {
        let Some((path, rest)) = chunk.split_once('"') else {
            continue;
        };
        let rest = rest.trim_start_matches([',', ' ', '\n']);
        let rest = rest.trim_start_matches("axum::routing::");
        for (verb, method) in [("get(", "GET"), ("post(", "POST")] {
            if rest.starts_with(verb) {
                out.insert((method.to_owned(), path.to_owned()));
            }
        }
    }
    out
}

/// The operator listener's routers: `operator::router`, `enrolment::router` and
/// `logs::reader_router` (`main.rs` merges these three; the agents' listener is another).
fn operator_listener_routes() -> BTreeSet<(String, String)> {
    let http = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/http");
    let read = |f: &str| std::fs::read_to_string(http.join(f)).expect("router source");
    let logs = read("logs.rs");
    let reader = logs
        .split("pub fn reader_router")
        .nth(1)
        .and_then(|r| r.split("pub fn agent_router").next())
        .expect("logs::reader_router")
        .to_owned();
    let main = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/main.rs")).expect("main");
    assert!(
        main.contains("operator::router(operator)")
            && main.contains(".merge(enrolment::router(enrol))")
            && main.contains(".merge(logs::reader_router(readers))"),
        "main.rs no longer merges the three operator routers this test reads"
    );
    let mut all = mounted(&read("operator.rs"));
    all.extend(mounted(&read("enrolment.rs")));
    all.extend(mounted(&reader));
    all
}

fn documented(doc: &serde_json::Value) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("item").keys() {
            out.insert((method.to_ascii_uppercase(), path.clone()));
        }
    }
    out
}

#[test]
fn the_source_reader_sees_routes() {
    let sample = r#"Router::new()
        .route("/v1/a", get(a))
        .route("/v1/b/{x}", axum::routing::post(b))"#;
    let got = mounted(sample);
    assert!(got.contains(&("GET".into(), "/v1/a".into())) && got.contains(&("POST".into(), "/v1/b/{x}".into())));
    assert_eq!(got.len(), 2);
}

#[test]
fn every_mounted_route_is_documented_and_every_documented_path_answers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    std::fs::write(dir.path().join("allowed_signers"), &repo.signers).expect("signers");
    repo.write("projects/api.yaml", &project("api", 1));
    repo.commit("pool and project", true);
    let s = setup(dir.path());
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let port = free_port();
    let cfg = config(&s, "d", &repo.dir, &url, port, "");
    let mut daemon = Daemon::start(&s, &cfg, port);
    daemon.wait_ready(Duration::from_secs(20));

    let (status, body) = daemon.get("/v1/openapi.json", None);
    assert_eq!(status, 200, "{body}");
    let kept = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json"))
        .expect("docs/openapi.json");
    assert_eq!(body, kept, "the daemon serves another document than docs/openapi.json");
    let doc: serde_json::Value = serde_json::from_str(&body).expect("json");

    let mounted = operator_listener_routes();
    let documented = documented(&doc);
    let missing: Vec<_> = mounted.difference(&documented).collect();
    assert!(missing.is_empty(), "mounted and not in the document: {missing:?}");
    let unmounted: Vec<_> = documented.difference(&mounted).collect();
    assert!(unmounted.is_empty(), "in the document and not mounted: {unmounted:?}");

    // Asked for without a token: each path is the daemon's (a typed refusal or an answer),
    // not the router's empty 404.
    for (method, path) in &documented {
        let concrete = path
            .replace("{name}", "api")
            .replace("{node}", "n1")
            .replace("{forge}", "github");
        let (status, text) = match method.as_str() {
            "GET" => daemon.get(&concrete, None),
            _ => daemon.post(&concrete, &[("content-type", "application/json")], b"{}"),
        };
        let typed = serde_json::from_str::<operator_proto::ErrorBody>(&text).is_ok();
        assert!(
            (200..300).contains(&status) || (status >= 400 && typed),
            "{method} {path}: {status} {text:?}"
        );
        if doc["paths"][path][method.to_ascii_lowercase()]["security"].is_array() {
            assert_eq!(status, 401, "{method} {path} answered without a token: {text}");
        }
    }
    // The image store's endpoint (the distribution spec's, documented in docs/images.md, not
    // here): without `[images]`, it says so in its own words.
    let (status, text) = daemon.get("/v2/web/blobs/uploads/", None);
    assert_eq!(status, 404, "{text}");
    assert!(text.contains("images-not-configured"), "{text}");
}
