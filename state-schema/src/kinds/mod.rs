//! Decoding each kind's spec: the per-kind field lists, defaults and single-object rules.
//! (`parse.rs` reads files into documents and hands each spec here.) A Project's roles are in
//! `project.rs`, a web role's rollout in `rollout.rs`.

use crate::decode::{
    self, Ctx, Fields, boolean, checked, int_in, map_of, one_of, quantity_text, string, strings, u32_in,
};
use crate::diag::Code;
use crate::model::*;
use crate::values::SmallMap;
use crate::values::{Cpu, CronSchedule, Hostname, ImageRef, Memory, Name};
use crate::yaml::{self, Node};

mod project;
mod rollout;
mod updates;

pub(crate) use project::decode_project;
use project::*;
use rollout::*;
use updates::decode_image_updates;

pub const METADATA_FIELDS: &[&str] = &["name", "labels", "annotations"];
pub const REPOSITORY_FIELDS: &[&str] = &["baseDomain", "previewDomain", "previews", "include", "controlRecipient"];
pub const PREVIEWS_FIELDS: &[&str] = &["branches", "pool", "ttlHours"];
pub const PROJECT_FIELDS: &[&str] = &["image", "roles", "env", "secrets", "imageUpdates"];
pub const IMAGE_UPDATES_FIELDS: &[&str] = &["semver", "pattern", "order", "digests", "branch"];
pub const ROLE_FIELDS: &[&str] = &[
    "kind",
    "command",
    "port",
    "health",
    "replicas",
    "resources",
    "schedule",
    "logs",
    "ports",
    "volumes",
    "rollout",
];
pub const ROLLOUT_FIELDS: &[&str] = &[
    "watchSeconds",
    "strategy",
    "steps",
    "gates",
    "maxSurge",
    "maxUnavailable",
];
pub const GATE_FIELDS: &[&str] = &["maxErrorPercent", "maxP95Ms", "minRequests"];
pub const CANARY_STEP_FIELDS: &[&str] = &["weight", "pause"];
pub const LOGS_FIELDS: &[&str] = &["maxSize", "maxFiles"];
pub const HEALTH_FIELDS: &[&str] = &["path", "timeoutSeconds"];
pub const RESOURCES_FIELDS: &[&str] = &["cpu", "memory", "pids"];
pub const ENVIRONMENT_FIELDS: &[&str] = &[
    "project",
    "stage",
    "pool",
    "replicas",
    "env",
    "image",
    "hostname",
    "tls",
    "backups",
    "imageUpdates",
];
pub const TLS_FIELDS: &[&str] = &["secret", "hsts"];
pub const DOMAIN_FIELDS: &[&str] = &["hostname", "environment", "verification", "tls"];
pub const DOMAIN_TLS_FIELDS: &[&str] = &["secret"];
pub const NODEPOOL_FIELDS: &[&str] = &["region", "capabilities", "placement", "nodes"];
pub const NODE_FIELDS: &[&str] = &["name", "state", "capacity", "address"];
pub const CAPACITY_FIELDS: &[&str] = &["cpu", "memory"];
pub const SECRET_FIELDS: &[&str] = &["recipients", "data"];

/// Defaults, documented in `docs/state-format.md`.
pub mod defaults {
    pub const WEB_PORT: u16 = 8080;
    /// The longest watch window after a release's switch (`rollout.watchSeconds`).
    pub const MAX_WATCH_SECONDS: u32 = 3600;
    /// A canary has at most this many steps (`rollout.steps`)…
    pub const MAX_CANARY_STEPS: usize = 10;
    /// …and waits at most this long at one (`pause`): 24 hours.
    pub const MAX_PAUSE_SECONDS: u32 = 86_400;
    /// A canary's gate judges nothing below this many requests (`gates.minRequests`).
    pub const GATE_MIN_REQUESTS: u32 = 20;
    pub const HEALTH_PATH: &str = "/healthz";
    pub const HEALTH_TIMEOUT_SECONDS: u32 = 5;
    pub const REPLICAS: u32 = 1;
    pub const CPU_MILLIS: u64 = 250;
    pub const MEMORY_BYTES: u64 = 256 << 20;
    pub const PIDS: u32 = 256;
    pub const PREVIEW_TTL_HOURS: u32 = 72;
    /// A container's log on its node: at most this many bytes a file (`logs.maxSize`)…
    pub const LOG_MAX_BYTES: u64 = 10 << 20;
    /// …in at most this many files (`logs.maxFiles`): 30 MiB a container by default.
    pub const LOG_MAX_FILES: u32 = 3;
    pub const LOG_MAX_BYTES_RANGE: (u64, u64) = (1 << 20, 1 << 30);
    pub const LOG_MAX_FILES_RANGE: (u32, u32) = (1, 10);
}

pub const MAX_REPLICAS: u32 = 1000;
/// Most ports one role declares (`ports`).
pub const MAX_PORTS: usize = 16;

/// An optional field: absent is `Some(None)`, present but invalid is `None` (already reported).
fn present<T>(field: Option<Option<T>>) -> Option<Option<T>> {
    match field {
        None => Some(None),
        Some(v) => v.map(Some),
    }
}

fn name(ctx: &mut Ctx<'_>, node: &Node<'_>, what: &str) -> Option<Name> {
    checked(ctx, node, what, Code::InvalidName, Name::new)
}

fn hostname(ctx: &mut Ctx<'_>, node: &Node<'_>, what: &str) -> Option<Hostname> {
    checked(ctx, node, what, Code::InvalidHostname, Hostname::new)
}

fn image(ctx: &mut Ctx<'_>, node: &Node<'_>) -> Option<ImageRef> {
    checked(ctx, node, "`image`", Code::ImageNotPinned, ImageRef::new)
}

fn string_map(ctx: &mut Ctx<'_>, node: &Node<'_>, what: &str) -> Option<SmallMap<String, String>> {
    map_of(ctx, node, what, |ctx, v, _| {
        string(ctx, v, &format!("a value of {what}")).map(str::to_owned)
    })
}

fn is_env_name(k: &str) -> bool {
    let mut chars = k.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Environment variables: keys are POSIX names, values strings.
fn env_map(ctx: &mut Ctx<'_>, node: &Node<'_>, what: &str) -> Option<SmallMap<String, String>> {
    let map = string_map(ctx, node, what)?;
    let mut ok = true;
    if let yaml::Value::Map(entries) = &node.value {
        for (k, _) in entries {
            if let yaml::Value::Str(key) = &k.value
                && !is_env_name(key)
            {
                ctx.error_hint(
                    Code::InvalidName,
                    k.pos,
                    format!("`{key}` is not a valid variable name"),
                    "use letters, digits and `_`, not starting with a digit",
                );
                ok = false;
            }
        }
    }
    ok.then_some(map)
}

fn globs(ctx: &mut Ctx<'_>, node: &Node<'_>, what: &str) -> Option<Vec<String>> {
    let list = strings(ctx, node, what)?;
    let mut ok = true;
    if let yaml::Value::Seq(items) = &node.value {
        for (g, item) in list.iter().zip(items) {
            if let Err(e) = globset::Glob::new(g) {
                ctx.error(
                    Code::InvalidGlob,
                    item.pos,
                    format!("`{g}` in {what} is not a glob: {}", e.kind()),
                );
                ok = false;
            }
        }
    }
    ok.then_some(list)
}

pub(crate) fn decode_metadata(ctx: &mut Ctx<'_>, node: &Node<'_>, kind: &str) -> Option<Metadata> {
    let what = format!("{kind} metadata");
    let f = Fields::new(ctx, node, &what, METADATA_FIELDS)?;
    let n = f
        .require(ctx, "name", &what)
        .and_then(|n| name(ctx, n, "`metadata.name`"));
    let labels = f
        .get("labels")
        .map_or(Some(SmallMap::new()), |l| string_map(ctx, l, "`metadata.labels`"));
    let annotations = f
        .get("annotations")
        .map_or(Some(SmallMap::new()), |a| string_map(ctx, a, "`metadata.annotations`"));
    Some(Metadata {
        name: n?,
        labels: labels?,
        annotations: annotations?,
    })
}

pub(crate) fn decode_repository(ctx: &mut Ctx<'_>, node: &Node<'_>, what: &str) -> Option<Repository> {
    let f = Fields::new(ctx, node, what, REPOSITORY_FIELDS)?;
    let base = f
        .require(ctx, "baseDomain", what)
        .and_then(|n| hostname(ctx, n, "`baseDomain`"));
    let preview = f.get("previewDomain").map(|n| hostname(ctx, n, "`previewDomain`"));
    let previews = f.get("previews").map(|n| decode_previews(ctx, n));
    let include = f
        .get("include")
        .map_or(Some(Vec::new()), |n| globs(ctx, n, "`include`"));
    let control = f
        .get("controlRecipient")
        .map(|n| string(ctx, n, "`controlRecipient`").and_then(|s| check_recipient(ctx, n, s)));
    if let (Some(p), None) = (f.get("previews"), f.get("previewDomain")) {
        ctx.error_hint(
            Code::MissingField,
            p.pos,
            "`previews` needs `previewDomain` in the Repository spec",
            "set `previewDomain`, e.g. `preview.example.com`",
        );
    }
    Some(Repository {
        base_domain: base?,
        preview_domain: present(preview)?,
        previews: present(previews)?,
        include: include?,
        control_recipient: present(control)?,
    })
}

fn decode_previews(ctx: &mut Ctx<'_>, node: &Node<'_>) -> Option<Previews> {
    let what = "`previews`";
    let f = Fields::new(ctx, node, what, PREVIEWS_FIELDS)?;
    let branches = f
        .require(ctx, "branches", what)
        .and_then(|n| globs(ctx, n, "`previews.branches`"));
    let pool = f
        .require(ctx, "pool", what)
        .and_then(|n| name(ctx, n, "`previews.pool`"));
    let ttl = f.get("ttlHours").map_or(Some(defaults::PREVIEW_TTL_HOURS), |n| {
        u32_in(ctx, n, "`previews.ttlHours`", 1, 8760)
    });
    Some(Previews {
        branches: branches?,
        pool: pool?,
        ttl_hours: ttl?,
    })
}

pub(crate) fn decode_environment(ctx: &mut Ctx<'_>, node: &Node<'_>, what: &str) -> Option<Environment> {
    let f = Fields::new(ctx, node, what, ENVIRONMENT_FIELDS)?;
    let project = f.require(ctx, "project", what).and_then(|n| name(ctx, n, "`project`"));
    let stage = f.require(ctx, "stage", what).and_then(|n| {
        one_of(
            ctx,
            n,
            "`stage`",
            &[("production", Stage::Production), ("preview", Stage::Preview)],
        )
    });
    let pool = f.require(ctx, "pool", what).and_then(|n| name(ctx, n, "`pool`"));
    let replicas = f.get("replicas").map_or(Some(SmallMap::new()), |n| {
        let m = map_of(ctx, n, "`replicas`", |ctx, v, key| {
            let r = u32_in(ctx, v, &format!("`replicas.{key}`"), 0, MAX_REPLICAS);
            let k = Name::new(key)
                .map_err(|inv| ctx.invalid(Code::InvalidName, v.pos, inv))
                .ok();
            Some((k?, r?))
        })?;
        Some(m.into_iter().map(|(_, v)| v).collect())
    });
    let env = f.get("env").map_or(Some(SmallMap::new()), |n| env_map(ctx, n, "`env`"));
    let img = f.get("image").map(|n| image(ctx, n));
    let host = f.get("hostname").map(|n| hostname(ctx, n, "`hostname`"));
    let tls = f.get("tls").map(|n| decode_tls(ctx, n));
    let backups = f.get("backups").map(|n| crate::volumes::decode_backups(ctx, n));
    // It moves the environment's own image: without one there is nothing of its own to move.
    let updates = f.get("imageUpdates").map(|n| match f.get("image") {
        Some(_) => decode_image_updates(ctx, n),
        None => {
            ctx.error_hint(
                Code::FieldNotAllowed,
                n.pos,
                "`imageUpdates` on an Environment moves its own `image`, and it has none",
                "put `imageUpdates` on the Project, or give the environment an `image`",
            );
            None
        }
    });
    Some(Environment {
        project: project?,
        stage: stage?,
        pool: pool?,
        replicas: replicas?,
        env: env?,
        image: present(img)?,
        hostname: present(host)?,
        tls: present(tls)?,
        backups: present(backups)?,
        image_updates: present(updates)?,
    })
}

fn decode_tls(ctx: &mut Ctx<'_>, node: &Node<'_>) -> Option<EnvironmentTls> {
    let f = Fields::new(ctx, node, "`tls`", TLS_FIELDS)?;
    // Certificates from an ACME CA are not served yet: until they are, `tls` names the
    // certificate to serve, so a tree never asks for HTTPS it would not get.
    let secret = match f.get("secret") {
        Some(n) => name(ctx, n, "`tls.secret`"),
        None => {
            ctx.error_hint(
                Code::MissingField,
                node.pos,
                "`tls` needs `secret`: certificates from an ACME CA are not served yet",
                "name a Secret with the keys CERT and KEY (see docs/state-format.md, Environment)",
            );
            None
        }
    };
    let hsts = f.get("hsts").map_or(Some(false), |n| boolean(ctx, n, "`tls.hsts`"));
    Some(EnvironmentTls {
        secret: secret?,
        hsts: hsts?,
    })
}

pub(crate) fn decode_domain(ctx: &mut Ctx<'_>, node: &Node<'_>, what: &str) -> Option<Domain> {
    let f = Fields::new(ctx, node, what, DOMAIN_FIELDS)?;
    let host = f
        .require(ctx, "hostname", what)
        .and_then(|n| hostname(ctx, n, "`hostname`"));
    let env = f
        .require(ctx, "environment", what)
        .and_then(|n| name(ctx, n, "`environment`"));
    let verification = f.get("verification").map_or(Some(Verification::Txt), |n| {
        one_of(
            ctx,
            n,
            "`verification`",
            &[("txt", Verification::Txt), ("cname", Verification::Cname)],
        )
    });
    let tls = f.get("tls").map(|n| {
        let t = Fields::new(ctx, n, "`tls`", DOMAIN_TLS_FIELDS)?;
        let secret = t
            .require(ctx, "secret", "`tls`")
            .and_then(|s| name(ctx, s, "`tls.secret`"));
        Some(DomainTls { secret: secret? })
    });
    Some(Domain {
        hostname: host?,
        environment: env?,
        verification: verification?,
        tls: present(tls)?,
    })
}

pub(crate) fn decode_pool(ctx: &mut Ctx<'_>, node: &Node<'_>, what: &str) -> Option<NodePool> {
    let f = Fields::new(ctx, node, what, NODEPOOL_FIELDS)?;
    let region = f
        .require(ctx, "region", what)
        .and_then(|n| name(ctx, n, "`region`"))
        .map(|n| n.to_string());
    let mut capabilities = f
        .get("capabilities")
        .map_or(Some(Vec::new()), |n| strings(ctx, n, "`capabilities`"));
    if let Some(c) = capabilities.as_mut() {
        c.sort();
        c.dedup();
    }
    let placement = f.get("placement").map_or(Some(Placement::Spread), |n| {
        one_of(
            ctx,
            n,
            "`placement`",
            &[("spread", Placement::Spread), ("pack", Placement::Pack)],
        )
    });
    let nodes = f.require(ctx, "nodes", what).and_then(|n| {
        let items = decode::seq(ctx, n, "`nodes`")?;
        let decoded: Vec<Option<PoolNode>> = items.iter().map(|i| decode_node(ctx, i)).collect();
        decoded.into_iter().collect::<Option<Vec<_>>>()
    });
    Some(NodePool {
        region: region?,
        capabilities: capabilities?,
        placement: placement?,
        nodes: nodes?,
    })
}

fn decode_node(ctx: &mut Ctx<'_>, node: &Node<'_>) -> Option<PoolNode> {
    let f = Fields::new(ctx, node, "a node", NODE_FIELDS)?;
    let n = f
        .require(ctx, "name", "a node")
        .and_then(|n| name(ctx, n, "node `name`"));
    let state = f.get("state").map_or(Some(NodeState::Active), |s| {
        one_of(
            ctx,
            s,
            "node `state`",
            &[
                ("active", NodeState::Active),
                ("draining", NodeState::Draining),
                ("retired", NodeState::Retired),
            ],
        )
    });
    let capacity = f.require(ctx, "capacity", "a node").and_then(|c| {
        let cf = Fields::new(ctx, c, "node `capacity`", CAPACITY_FIELDS)?;
        let cpu_v = cf
            .require(ctx, "cpu", "node `capacity`")
            .and_then(|v| cpu(ctx, v, "`capacity.cpu`"));
        let mem_v = cf
            .require(ctx, "memory", "node `capacity`")
            .and_then(|v| memory(ctx, v, "`capacity.memory`"));
        Some(Capacity {
            cpu: cpu_v?,
            memory: mem_v?,
        })
    });
    let address = f.get("address").map(|a| {
        checked(ctx, a, "node `address`", Code::InvalidValue, |s| {
            s.parse::<core::net::IpAddr>().map_err(|_| crate::values::Invalid {
                message: format!("node `address` {s:?} is not an IP address"),
                hint: Some(
                    "write the address other nodes reach this one at, e.g. 203.0.113.5: host names are not resolved"
                        .into(),
                ),
            })
        })
        .and_then(|ip| match crate::values::unreachable_node_address(ip) {
            Some(inv) => {
                ctx.invalid(Code::InvalidAddress, a.pos, inv);
                None
            }
            None => Some(ip),
        })
    });
    Some(PoolNode {
        name: n?,
        state: state?,
        capacity: capacity?,
        address: present(address)?,
    })
}

/// Shape check of a recipient: an X25519 `age1…` key or an `ssh-ed25519`/`ssh-rsa` public key.
pub fn recipient_shape_ok(s: &str) -> bool {
    if let Some(rest) = s.strip_prefix("age1") {
        return rest.len() == 58 && rest.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    }
    let mut parts = s.split_whitespace();
    match (parts.next(), parts.next()) {
        (Some("ssh-ed25519" | "ssh-rsa"), Some(b64)) => {
            b64.starts_with("AAAA") && b64.bytes().all(|c| c.is_ascii_alphanumeric() || b"+/=".contains(&c))
        }
        _ => false,
    }
}

fn check_recipient(ctx: &mut Ctx<'_>, node: &Node<'_>, s: &str) -> Option<String> {
    if recipient_shape_ok(s) {
        Some(s.to_owned())
    } else {
        ctx.error_hint(
            Code::InvalidSecret,
            node.pos,
            "recipient is not an age X25519 key (`age1…`) or an `ssh-ed25519`/`ssh-rsa` public key",
            "print one with `age-keygen -y KEYFILE` or `cat ~/.ssh/id_ed25519.pub`",
        );
        None
    }
}

pub(crate) fn decode_secret(ctx: &mut Ctx<'_>, node: &Node<'_>, what: &str) -> Option<Secret> {
    let f = Fields::new(ctx, node, what, SECRET_FIELDS)?;
    let recipients = f.require(ctx, "recipients", what).and_then(|n| {
        let items = decode::seq(ctx, n, "`recipients`")?;
        if items.is_empty() {
            ctx.error(
                Code::MissingField,
                n.pos,
                "`recipients` is empty; a secret needs at least one recipient",
            );
            return None;
        }
        let checked: Vec<Option<String>> = items
            .iter()
            .map(|i| string(ctx, i, "a recipient").and_then(|s| check_recipient(ctx, i, s)))
            .collect();
        checked.into_iter().collect::<Option<Vec<_>>>()
    });
    let data = f.get("data").map_or(Some(SmallMap::new()), |n| {
        let entries = match &n.value {
            yaml::Value::Map(e) => e.as_slice(),
            _ => &[],
        };
        for (k, _) in entries {
            if let yaml::Value::Str(key) = &k.value
                && !is_env_name(key)
            {
                ctx.error_hint(
                    Code::InvalidName,
                    k.pos,
                    format!("secret key `{key}` is not a valid name"),
                    "use letters, digits and `_`; the key becomes /run/secrets/<KEY>",
                );
            }
        }
        map_of(ctx, n, "`data`", |ctx, v, key| {
            let s = string(ctx, v, &format!("`data.{key}`"))?;
            Ciphertext::new(s)
                .map_err(|inv| ctx.invalid(Code::InvalidSecret, v.pos, inv))
                .ok()
        })
        .filter(|m| m.keys().all(|k| is_env_name(k)))
    });
    Some(Secret {
        recipients: recipients?,
        data: data?,
    })
}

#[cfg(test)]
mod tests {
    use crate::model::{Amount, Rolling};
    use crate::parse::parse_file;

    fn project(role: &str) -> String {
        format!(
            "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: api}}\nspec:\n  image: registry.example.invalid/api@sha256:{}\n  roles:\n    r: {role}\n",
            "0".repeat(64)
        )
    }

    fn problems(role: &str) -> Vec<(String, String)> {
        parse_file("p.yaml", project(role).as_bytes())
            .diagnostics
            .into_iter()
            .map(|d| {
                (
                    d.code.as_str().to_owned(),
                    format!("{}:{:?} {}", d.file, d.line, d.message),
                )
            })
            .collect()
    }

    #[test]
    fn a_rollout_watch_is_read_bounded_and_refused_where_no_release_replaces_replicas() {
        assert!(problems("{kind: web, rollout: {watchSeconds: 30}}").is_empty());
        let p = problems("{kind: web, rollout: {watchSeconds: 0}}");
        assert!(p.len() == 1 && p[0].1.contains("watchSeconds"), "{p:?}");
        let p = problems("{kind: web, rollout: {watchSeconds: 3601}}");
        assert_eq!(p.len(), 1, "{p:?}");
        let p = problems("{kind: cron, schedule: '* * * * *', rollout: {watchSeconds: 30}}");
        assert!(
            p.len() == 1 && p[0].1.contains("`rollout` does not apply to a cron role"),
            "{p:?}"
        );
        let p = problems("{kind: worker, rollout: {strategy: canary}}");
        assert!(
            p.len() == 1 && p[0].1.contains("`rollout.strategy: canary` is for a web role"),
            "{p:?}"
        );
    }

    #[test]
    fn a_canary_has_rising_weights_and_pauses_of_a_day_at_most() {
        let steps = |s: &str| format!("{{kind: web, rollout: {{strategy: canary, steps: {s}}}}}");
        assert!(
            problems(&steps(
                "[{weight: 10, pause: 90}, {weight: 50, pause: 5m}, {weight: 90}]"
            ))
            .is_empty()
        );
        assert!(problems(&steps("[{weight: 10, pause: 1h}]")).is_empty());
        assert!(problems("{kind: web, rollout: {strategy: switch}}").is_empty());
        for (bad, code, says) in [
            (
                "[{weight: 50}, {weight: 50}]",
                "invalid-value",
                "not above the step before's 50",
            ),
            ("[{weight: 100}]", "out-of-range", "`weight` is 100"),
            ("[{weight: 0}]", "out-of-range", "`weight` is 0"),
            ("[{pause: 10s}]", "missing-field", "needs `weight`"),
            ("[{weight: 10, pause: 25h}]", "out-of-range", "`pause` is 90000 s"),
            (
                "[{weight: 10, pause: soon}]",
                "invalid-value",
                "`pause` is not a duration",
            ),
            ("[{weight: 10, pause: 0}]", "out-of-range", "`pause` is 0 s"),
            ("[]", "out-of-range", "has 0 steps"),
            ("[{weight: 10, wait: 5}]", "unknown-field", "wait"),
        ] {
            let p = problems(&steps(bad));
            assert!(p.len() == 1 && p[0].0 == code && p[0].1.contains(says), "{bad}: {p:?}");
        }
        let p = problems("{kind: web, rollout: {strategy: canary}}");
        assert!(p.len() == 1 && p[0].1.contains("needs `steps`"), "{p:?}");
        let p = problems("{kind: web, rollout: {steps: [{weight: 10}]}}");
        assert!(p.len() == 1 && p[0].1.contains("is for `strategy: canary`"), "{p:?}");
        let p = problems("{kind: web, rollout: {strategy: blue}}");
        assert!(
            p.len() == 1 && p[0].1.contains("one of switch, canary, rolling"),
            "{p:?}"
        );
    }

    #[test]
    fn a_rolling_rollout_takes_counts_or_percents_and_never_both_zero() {
        for fine in [
            "{kind: web, rollout: {strategy: rolling}}",
            "{kind: worker, rollout: {strategy: rolling, maxSurge: 2}}",
            "{kind: web, rollout: {strategy: rolling, maxSurge: 0, maxUnavailable: 1}}",
            "{kind: web, rollout: {strategy: rolling, maxSurge: '25%', maxUnavailable: '25%'}}",
        ] {
            assert!(problems(fine).is_empty(), "{fine}: {:?}", problems(fine));
        }
        for (bad, code, says) in [
            (
                "{kind: web, rollout: {strategy: rolling, maxSurge: 0}}",
                "invalid-value",
                "are both 0",
            ),
            (
                "{kind: web, rollout: {strategy: rolling, maxSurge: '0%', maxUnavailable: 0}}",
                "invalid-value",
                "are both 0",
            ),
            (
                "{kind: web, rollout: {strategy: rolling, maxSurge: '150%'}}",
                "invalid-value",
                "not a count or a percent",
            ),
            (
                "{kind: web, rollout: {strategy: rolling, maxSurge: 1001}}",
                "out-of-range",
                "`rollout.maxSurge`",
            ),
            (
                "{kind: web, rollout: {maxSurge: 1}}",
                "invalid-value",
                "is for `strategy: rolling`",
            ),
            (
                "{kind: web, rollout: {strategy: canary, steps: [{weight: 10}], maxUnavailable: 1}}",
                "invalid-value",
                "is for `strategy: rolling`",
            ),
            (
                "{kind: web, rollout: {strategy: rolling, steps: [{weight: 10}]}}",
                "invalid-value",
                "is for `strategy: canary`",
            ),
        ] {
            let p = problems(bad);
            assert!(p.len() == 1 && p[0].0 == code && p[0].1.contains(says), "{bad}: {p:?}");
        }
    }

    #[test]
    fn a_rolling_batch_rounds_surge_up_and_unavailable_down() {
        let r = |s, d| Rolling {
            max_surge: s,
            max_unavailable: d,
        };
        assert_eq!(r(Amount::Count(1), Amount::Count(0)).batch(10), (1, 0));
        assert_eq!(
            r(Amount::Percent(25), Amount::Percent(25)).batch(10),
            (5, 2),
            "3 up, 2 down"
        );
        assert_eq!(r(Amount::Count(0), Amount::Count(2)).batch(10), (2, 2));
        assert_eq!(
            r(Amount::Percent(10), Amount::Percent(0)).batch(3),
            (1, 0),
            "a surge rounds up"
        );
        assert_eq!(
            r(Amount::Count(0), Amount::Percent(10)).batch(3),
            (1, 0),
            "at least one at a time"
        );
        assert_eq!(
            r(Amount::Count(0), Amount::Count(5)).batch(2),
            (2, 2),
            "no more down than there are"
        );
    }

    #[test]
    fn a_canary_s_gates_set_a_threshold_at_least() {
        let gates =
            |g: &str| format!("{{kind: web, rollout: {{strategy: canary, steps: [{{weight: 10}}], gates: {g}}}}}");
        assert!(problems(&gates("{maxErrorPercent: 5, maxP95Ms: 500, minRequests: 50}")).is_empty());
        assert!(problems(&gates("{maxP95Ms: 800}")).is_empty());
        for (bad, says) in [
            ("{minRequests: 50}", "sets no threshold"),
            ("{maxErrorPercent: 101}", "`maxErrorPercent` is 101"),
            ("{maxP95Ms: 0}", "`maxP95Ms` is 0"),
        ] {
            let p = problems(&gates(bad));
            assert!(p.len() == 1 && p[0].1.contains(says), "{bad}: {p:?}");
        }
        let p = problems(&gates("{maxErrors: 5}"));
        assert!(p[0].0 == "unknown-field" && p[0].1.contains("maxErrors"), "{p:?}");
        let p = problems("{kind: web, rollout: {gates: {maxP95Ms: 800}}}");
        assert!(
            p.len() == 1 && p[0].1.contains("`rollout.gates` is for `strategy: canary`"),
            "{p:?}"
        );
    }
}
