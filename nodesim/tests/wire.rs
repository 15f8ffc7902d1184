//! The simulator speaks the agent protocol only through the agent's own client: no file of it
//! names an agent API path or builds the wire's JSON itself, so what a run measures is what an
//! agent sends.

#[test]
fn the_simulator_speaks_only_through_the_agents_client() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut seen = 0;
    for e in std::fs::read_dir(&src).expect("src") {
        let p = e.expect("entry").path();
        let text = std::fs::read_to_string(&p).expect("read");
        seen += 1;
        for banned in ["/v1/agent/", "json!(", "serde_json::Value"] {
            assert!(!text.contains(banned), "{} contains {banned}", p.display());
        }
    }
    assert!(seen >= 3, "the sources were read");
    for sample in ["\"/v1/agent/heartbeat\"", "serde_json::json!({})"] {
        assert!(["/v1/agent/", "json!("].iter().any(|b| sample.contains(b)));
    }
}
