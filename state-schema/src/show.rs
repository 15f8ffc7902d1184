//! What `pl show` prints: every object's canonical document, with a `derived` section for
//! environments (hostname, effective image, replicas, variables, domains).

use crate::canonical::{self, Secrets};
use crate::model::Spec;
use crate::state::{State, derive_environment};
use serde_json::Value;

/// The canonical, fully derived documents of a state, in plan order.
pub fn documents(state: &State) -> Vec<Value> {
    state
        .iter()
        .map(|loc| {
            let mut doc = canonical::document(&loc.object, Secrets::Fingerprint);
            if let Spec::Environment(env) = &loc.object.spec
                && let Some(d) = derive_environment(state, loc.object.name(), env)
            {
                doc["derived"] = serde_json::to_value(d).unwrap_or(Value::Null);
            }
            doc
        })
        .collect()
}

/// The documents as one YAML stream.
pub fn to_yaml_stream(docs: &[Value]) -> String {
    let mut out = String::new();
    for d in docs {
        out.push_str("---\n");
        out.push_str(&canonical::to_yaml(d));
    }
    out
}
