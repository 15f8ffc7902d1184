//! The first deployment a small state tree declares, placed as the daemon would: a text of
//! the root document (`pushleft.yaml`), `---`, and the rest (`state.yaml`).

use state_schema::deployment::DeploymentSpec;
use state_schema::desired::deployments;
use state_schema::parse::parse_file;
use state_schema::placement::Fleet;
use state_schema::state::assemble;

pub fn first_spec(text: &str) -> DeploymentSpec {
    let (root, rest) = text.split_once("---\n").expect("two parts");
    let loaded = assemble(
        vec![
            parse_file("pushleft.yaml", root.as_bytes()),
            parse_file("state.yaml", rest.as_bytes()),
        ],
        Vec::new(),
    );
    assert!(loaded.is_valid(), "{:?}", loaded.diagnostics);
    let (mut d, bad) = deployments(&loaded.state, None, &mut Fleet::declared(&loaded.state));
    assert!(bad.is_empty(), "{bad:?}");
    d.remove(0).spec
}
