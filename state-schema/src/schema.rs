//! The JSON Schema (draft-07, what yaml-language-server reads best) of every kind, for editors
//! and CI. A test holds its property lists equal to the decoder's field lists.

use crate::model::API_VERSION;
use crate::parse::*;
use serde_json::{Value, json};

const NAME: &str = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$";
const HOSTNAME: &str = "^(?=.{1,253}$)[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$";
const IMAGE: &str = "^[a-z0-9._/:-]+@sha256:[a-f0-9]{64}$";
const CPU: &str = "^([0-9]+m|[0-9]+(\\.[0-9]+)?|\\.[0-9]+)$";
const MEMORY: &str = "^[0-9]+(\\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$";
const ENV_NAME: &str = "^[A-Za-z_][A-Za-z0-9_]*$";

fn name(desc: &str) -> Value {
    json!({"type": "string", "pattern": NAME, "description": desc})
}

fn hostname(desc: &str) -> Value {
    json!({"type": "string", "pattern": HOSTNAME, "description": desc})
}

fn object(props: Value, required: &[&str], desc: &str) -> Value {
    json!({"type": "object", "description": desc, "additionalProperties": false, "properties": props, "required": required})
}

fn quantity(pattern: &str, desc: &str) -> Value {
    json!({"description": desc, "anyOf": [{"type": "string", "pattern": pattern}, {"type": "number", "exclusiveMinimum": 0}]})
}

fn env_map(desc: &str) -> Value {
    json!({"type": "object", "description": desc, "propertyNames": {"pattern": ENV_NAME}, "additionalProperties": {"type": "string"}})
}

fn replicas() -> Value {
    json!({"type": "integer", "minimum": 0, "maximum": MAX_REPLICAS, "description": "Running copies (web and worker roles); default 1."})
}

/// The spec schema of each kind, by kind name.
pub fn spec_schemas() -> Vec<(&'static str, Value)> {
    let image_updates = object(
        json!({
            "semver": {"type": "string", "description": "A semantic-version range tags must satisfy (`>=1.4, <2`); a leading `v` is ignored."},
            "pattern": {"type": "string", "description": "A regular expression tags must match; its `key` group (or the whole tag) orders them."},
            "order": {"enum": ["numeric", "alphabetical"], "description": "With `pattern`: how keys order; default alphabetical."},
            "digests": {"enum": ["track", "pin"], "description": "`pin` freezes the image; default track."},
            "branch": {"enum": ["own", "applied"], "description": "Where `pl image update` commits: a branch of its own (default) or the branch checked out."},
        }),
        &[],
        "How `pl image update` may move the image: one of `semver` and `pattern`.",
    );
    let resources = object(
        json!({
            "cpu": quantity(CPU, "CPU: millicores (`500m`) or cores (`0.5`, `2`); default 250m."),
            "memory": quantity(MEMORY, "Memory with a unit (`512Mi`, `1Gi`); default 256Mi."),
            "pids": {"type": "integer", "minimum": 8, "maximum": 65536, "description": "Most processes; default 256."},
        }),
        &[],
        "Limits for each replica.",
    );
    let health = object(
        json!({
            "path": {"type": "string", "pattern": "^/\\S*$", "description": "HTTP path; default /healthz."},
            "timeoutSeconds": {"type": "integer", "minimum": 1, "maximum": 300, "description": "Default 5."},
        }),
        &[],
        "HTTP health check of a web role.",
    );
    let logs = object(
        json!({
            "maxSize": quantity(MEMORY, "Bytes a log file may hold, with a unit (`10Mi`); 1Mi to 1Gi; default 10Mi."),
            "maxFiles": {"type": "integer", "minimum": 1, "maximum": 10, "description": "Log files kept (the oldest goes); default 3."},
        }),
        &[],
        "How much output each container keeps on its node (Docker's json-file log, rotated).",
    );
    let rollout = object(
        json!({
            "watchSeconds": {"type": "integer", "minimum": 1, "maximum": 3600, "description": "After a new release's switch, its replicas are watched this long; one its node reports unhealthy meanwhile rolls the environment back to the previous release (held, as `pl rollback`)."},
            "strategy": {"enum": ["switch", "canary", "rolling"], "description": "switch (the default): every new replica starts beside the old ones and takes every request once all are healthy. canary (web roles): before the switch, the ingress sends each step's weight of the requests to the new release, watched all along. rolling: the replicas are replaced in batches (maxSurge, maxUnavailable), each healthy and in the routes before the next."},
            "maxSurge": {"description": "strategy: rolling: at most this many replicas above the role's count during the rollout; a count (0-1000) or a percent of the replicas, rounded up (default 1).", "oneOf": [{"type": "integer", "minimum": 0, "maximum": 1000}, {"type": "string", "pattern": "^(100|[1-9]?[0-9])%$"}]},
            "maxUnavailable": {"description": "strategy: rolling: at most this many replicas below the role's count serve during the rollout; a count or a percent, rounded down (default 0). Not both 0.", "oneOf": [{"type": "integer", "minimum": 0, "maximum": 1000}, {"type": "string", "pattern": "^(100|[1-9]?[0-9])%$"}]},
            "gates": {
                "type": "object", "additionalProperties": false,
                "description": "A canary's gates, judged before each step after the first and before the switch on what the ingress measured of the new release's requests since the step before; a failed gate rolls the environment back.",
                "properties": {
                    "maxErrorPercent": {"type": "integer", "minimum": 0, "maximum": 100, "description": "Most percent of the new release's requests answered 5xx or not at all."},
                    "maxP95Ms": {"type": "integer", "minimum": 1, "maximum": 600000, "description": "Highest p95 latency of the new release's requests, in milliseconds."},
                    "minRequests": {"type": "integer", "minimum": 1, "maximum": 1000000, "description": "Fewer requests than this: the gates are not judged (default 20)."}
                }
            },
            "steps": {
                "type": "array", "minItems": 1, "maxItems": 10,
                "description": "A canary's steps, in order: weights rise; a step without `pause` waits for `pl rollout promote`.",
                "items": {
                    "type": "object", "additionalProperties": false, "required": ["weight"],
                    "properties": {
                        "weight": {"type": "integer", "minimum": 1, "maximum": 99, "description": "Percent of the hostname's requests to the new release."},
                        "pause": {"type": ["integer", "string"], "pattern": "^[0-9]+[smh]?$", "description": "How long to wait before the next step: seconds, or a number with s, m or h; at most a day."}
                    }
                }
            },
        }),
        &[],
        "How a new release of the role is delivered.",
    );
    let volume = object(
        json!({
            "name": name("The volume's name, unique in the project."),
            "path": {"type": "string", "pattern": "^/", "maxLength": 256, "description": "Absolute path in the container; not `/`, `/tmp`, `/run/secrets`, `/proc`, `/sys` or `/dev`."},
            "size": quantity(MEMORY, "What it should hold at most, with a unit (`10Gi`); reported against its measured use."),
            "retainDays": {"type": "integer", "minimum": 0, "maximum": 3650, "description": "Days it is kept after its environment is torn down; default 7."},
            "backup": object(
                json!({
                    "schedule": {"type": "string", "description": "Five cron fields, UTC (`0 3 * * *`)."},
                    "keep": {"type": "integer", "minimum": 1, "maximum": 1000, "description": "The newest snapshots kept; older ones are forgotten and pruned."},
                    "command": {"type": "array", "minItems": 1, "maxItems": 64, "items": {"type": "string", "maxLength": 1024}, "description": "Run in the role's container; its standard output is saved (`pg_dump`). Absent: the files, with the container paused."},
                    "restore": {"type": "array", "minItems": 1, "maxItems": 64, "items": {"type": "string", "maxLength": 1024}, "description": "With `command`: loads a restored dump (on its standard input) in the role's container, once it runs on the restored volume generation (`pg_restore`)."},
                    "verify": object(
                        json!({
                            "schedule": {"type": "string", "description": "Five cron fields, UTC (`0 4 * * 0`)."},
                            "command": {"type": "array", "minItems": 1, "maxItems": 64, "items": {"type": "string", "maxLength": 1024}, "description": "Run in a scratch container of the role's image, no network, the restored copy at the volume's path; exit 0 proves the snapshot."},
                        }),
                        &["schedule", "command"],
                        "A restore drill: the newest snapshot restored into a scratch copy where `command` must succeed.",
                    ),
                }),
                &["schedule", "keep"],
                "Scheduled backups into the environment's `backups` repository.",
            ),
        }),
        &["name", "path"],
        "A volume of the environment, mounted by this role.",
    );
    let role = object(
        json!({
            "kind": {"enum": ["web", "worker", "service", "cron", "job", "release"], "description": "What the role runs as (`service`: one instance, no ingress, restarted in place)."},
            "command": {"type": "array", "items": {"type": "string"}, "description": "argv; default: the image's entrypoint."},
            "port": {"type": "integer", "minimum": 1, "maximum": 65535, "description": "Web roles only; default 8080."},
            "health": health,
            "replicas": replicas(),
            "resources": resources,
            "schedule": {"type": "string", "description": "Cron roles only: five fields, e.g. `*/15 * * * *`."},
            "logs": logs,
            "ports": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 65535}, "maxItems": 16, "uniqueItems": true, "description": "Web, worker and service roles: ports served inside the environment besides `port`; other containers of the environment reach no other."},
            "rollout": rollout,
            "volumes": {"type": "array", "maxItems": 8, "items": volume, "description": "Not on cron roles. The environment's data, kept across releases, restarts and teardowns (for `retainDays`); a role with volumes runs one replica."},
        }),
        &["kind"],
        "One role of a project.",
    );
    let previews = object(
        json!({
            "branches": {"type": "array", "items": {"type": "string"}, "description": "Globs of branches that get preview environments."},
            "pool": name("Node pool that runs previews."),
            "ttlHours": {"type": "integer", "minimum": 1, "maximum": 8760, "description": "Hours a preview lives after its last push; default 72."},
        }),
        &["branches", "pool"],
        "Preview environments made from branches.",
    );
    let node = object(
        json!({
            "name": name("Node name, unique across all pools; the node enrols with it."),
            "state": {"enum": ["active", "draining", "retired"], "description": "Default active."},
            "capacity": object(json!({
                "cpu": quantity(CPU, "CPU the node offers."),
                "memory": quantity(MEMORY, "Memory the node offers."),
            }), &["cpu", "memory"], "What the node offers to placement."),
            "address": {"type": "string", "description": "IP address other nodes reach this one at for the mesh between nodes (over what its agent says)."},
        }),
        &["name", "capacity"],
        "A node, declared before it may enrol.",
    );
    vec![
        (
            "Repository",
            object(
                json!({
                    "baseDomain": hostname("Production hostnames are `<project>.<baseDomain>`."),
                    "previewDomain": hostname("Preview hostnames are `<environment>.<previewDomain>`."),
                    "previews": previews,
                    "include": {"type": "array", "items": {"type": "string"}, "description": "Globs of files to read (default: every YAML file outside hidden folders)."},
                    "controlRecipient": {"type": "string", "description": "The control host's age recipient; every Secret lists it."},
                }),
                &["baseDomain"],
                "The one Repository document, in the root pushleft.yaml.",
            ),
        ),
        (
            "NodePool",
            object(
                json!({
                    "region": name("Region label."),
                    "capabilities": {"type": "array", "items": {"type": "string"}, "description": "Free-form capability tags."},
                    "placement": {"enum": ["spread", "pack"], "description": "Default spread."},
                    "nodes": {"type": "array", "items": node},
                }),
                &["region", "nodes"],
                "Nodes that run environments.",
            ),
        ),
        (
            "Secret",
            object(
                json!({
                    "recipients": {"type": "array", "minItems": 1, "items": {"type": "string"}, "description": "age X25519 (`age1…`) or ssh-ed25519/ssh-rsa public keys."},
                    "data": {"type": "object", "propertyNames": {"pattern": ENV_NAME}, "additionalProperties": {"type": "string", "pattern": "^\\s*-----BEGIN AGE ENCRYPTED FILE-----"}, "description": "Key to ASCII-armoured age ciphertext."},
                }),
                &["recipients"],
                "Encrypted values, delivered as files under /run/secrets.",
            ),
        ),
        (
            "Project",
            object(
                json!({
                    "image": {"type": "string", "pattern": IMAGE, "description": "Image pinned by digest."},
                    "roles": {"type": "object", "minProperties": 1, "propertyNames": {"pattern": NAME}, "additionalProperties": role},
                    "env": env_map("Plain environment variables."),
                    "secrets": {"type": "array", "items": name("A Secret's name.")},
                    "imageUpdates": image_updates.clone(),
                }),
                &["image", "roles"],
                "An application: an image and its roles.",
            ),
        ),
        (
            "Environment",
            object(
                json!({
                    "project": name("The Project it deploys."),
                    "stage": {"enum": ["production", "preview"]},
                    "pool": name("The NodePool it runs on."),
                    "replicas": {"type": "object", "propertyNames": {"pattern": NAME}, "additionalProperties": replicas(), "description": "Per-role replica overrides."},
                    "env": env_map("Variables that override the project's."),
                    "image": {"type": "string", "pattern": IMAGE, "description": "Overrides the project's image."},
                    "imageUpdates": image_updates,
                    "hostname": hostname("Overrides the derived hostname."),
                    "tls": object(
                        json!({
                            "secret": name("A Secret with CERT (PEM chain) and KEY (PEM private key)."),
                            "hsts": {"type": "boolean", "description": "Strict-Transport-Security on HTTPS responses; default false."},
                        }),
                        &["secret"],
                        "HTTPS for the environment's hostnames with the certificate a Secret holds.",
                    ),
                    "backups": object(
                        json!({
                            "repository": {"type": "string", "maxLength": 512, "description": "A restic repository: an absolute path on the node, or `sftp:`, `s3:`, `rest:`, `b2:`, `azure:`, `gs:`, `swift:`."},
                            "secret": name("A Secret with RESTIC_PASSWORD (and the backend's variables)."),
                        }),
                        &["repository", "secret"],
                        "Where the environment's volume backups go.",
                    ),
                }),
                &["project", "stage", "pool"],
                "One deployment of a project.",
            ),
        ),
        (
            "Domain",
            object(
                json!({
                    "hostname": hostname("A name you own, outside baseDomain and previewDomain."),
                    "environment": name("The Environment it serves."),
                    "verification": {"enum": ["txt", "cname"], "description": "Default txt."},
                    "tls": object(
                        json!({"secret": name("A Secret with CERT (PEM chain) and KEY (PEM private key).")}),
                        &["secret"],
                        "HTTPS for this hostname with the certificate a Secret holds.",
                    ),
                }),
                &["hostname", "environment"],
                "A custom domain.",
            ),
        ),
    ]
}

/// The whole schema: one document of any kind.
pub fn json_schema() -> Value {
    let metadata = object(
        json!({
            "name": name("Unique per kind."),
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        }),
        &["name"],
        "Name and labels.",
    );
    let kinds: Vec<Value> = spec_schemas()
        .into_iter()
        .map(|(kind, spec)| {
            json!({
                "if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]},
                "then": {"properties": {"spec": spec}},
            })
        })
        .collect();
    let kind_names: Vec<&str> = spec_schemas().iter().map(|(k, _)| *k).collect();
    json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$id": "https://pushleft.dev/schema/v1alpha1.json",
        "title": "Pushleft state document",
        "type": "object",
        "additionalProperties": false,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": API_VERSION},
            "kind": {"enum": kind_names},
            "metadata": metadata,
            "spec": {"type": "object"},
        },
        "allOf": kinds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(v: &Value) -> Vec<String> {
        let mut k: Vec<String> = v["properties"]
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        k.sort();
        k
    }

    fn sorted(f: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = f.iter().map(|s| (*s).to_owned()).collect();
        v.sort();
        v
    }

    #[test]
    fn schema_matches_decoder_fields() {
        let specs: std::collections::BTreeMap<&str, Value> = spec_schemas().into_iter().collect();
        assert_eq!(keys(&specs["Repository"]), sorted(REPOSITORY_FIELDS));
        assert_eq!(
            keys(&specs["Repository"]["properties"]["previews"]),
            sorted(PREVIEWS_FIELDS)
        );
        assert_eq!(keys(&specs["Project"]), sorted(PROJECT_FIELDS));
        assert_eq!(
            keys(&specs["Project"]["properties"]["imageUpdates"]),
            sorted(IMAGE_UPDATES_FIELDS)
        );
        let role = &specs["Project"]["properties"]["roles"]["additionalProperties"];
        assert_eq!(keys(role), sorted(ROLE_FIELDS));
        assert_eq!(keys(&role["properties"]["health"]), sorted(HEALTH_FIELDS));
        assert_eq!(keys(&role["properties"]["resources"]), sorted(RESOURCES_FIELDS));
        assert_eq!(keys(&role["properties"]["logs"]), sorted(LOGS_FIELDS));
        assert_eq!(keys(&specs["Environment"]["properties"]["tls"]), sorted(TLS_FIELDS));
        assert_eq!(
            keys(&specs["Environment"]["properties"]["backups"]),
            sorted(crate::volumes::BACKUPS_FIELDS)
        );
        let volume = &role["properties"]["volumes"]["items"];
        assert_eq!(keys(volume), sorted(crate::volumes::VOLUME_FIELDS));
        assert_eq!(
            keys(&volume["properties"]["backup"]),
            sorted(crate::volumes::BACKUP_FIELDS)
        );
        assert_eq!(
            keys(&volume["properties"]["backup"]["properties"]["verify"]),
            sorted(crate::volumes::VERIFY_FIELDS)
        );
        assert_eq!(keys(&specs["Domain"]["properties"]["tls"]), sorted(DOMAIN_TLS_FIELDS));
        assert_eq!(keys(&specs["Environment"]), sorted(ENVIRONMENT_FIELDS));
        assert_eq!(keys(&specs["Domain"]), sorted(DOMAIN_FIELDS));
        assert_eq!(keys(&specs["NodePool"]), sorted(NODEPOOL_FIELDS));
        let node = &specs["NodePool"]["properties"]["nodes"]["items"];
        assert_eq!(keys(node), sorted(NODE_FIELDS));
        assert_eq!(keys(&node["properties"]["capacity"]), sorted(CAPACITY_FIELDS));
        assert_eq!(keys(&specs["Secret"]), sorted(SECRET_FIELDS));
        let whole = json_schema();
        assert_eq!(keys(&whole), sorted(DOCUMENT_FIELDS));
        assert_eq!(keys(&whole["properties"]["metadata"]), sorted(METADATA_FIELDS));
    }
}
