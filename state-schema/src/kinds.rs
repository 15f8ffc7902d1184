//! Decoding each kind's spec: the per-kind field lists, defaults and single-object rules.
//! (`parse.rs` reads files into documents and hands each spec here.)

use crate::decode::{
    self, Ctx, Fields, boolean, checked, int_in, map_of, one_of, quantity_text, string, strings, u32_in,
};
use crate::diag::Code;
use crate::model::*;
use crate::values::SmallMap;
use crate::values::{Cpu, CronSchedule, Hostname, ImageRef, Memory, Name};
use crate::yaml::{self, Node};

pub const METADATA_FIELDS: &[&str] = &["name", "labels", "annotations"];
pub const REPOSITORY_FIELDS: &[&str] = &["baseDomain", "previewDomain", "previews", "include", "controlRecipient"];
pub const PREVIEWS_FIELDS: &[&str] = &["branches", "pool", "ttlHours"];
pub const PROJECT_FIELDS: &[&str] = &["image", "roles", "env", "secrets"];
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
    "project", "stage", "pool", "replicas", "env", "image", "hostname", "tls", "backups",
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

pub(crate) fn decode_project(ctx: &mut Ctx<'_>, node: &Node<'_>, what: &str) -> Option<Project> {
    let f = Fields::new(ctx, node, what, PROJECT_FIELDS)?;
    let img = f.require(ctx, "image", what).and_then(|n| image(ctx, n));
    let roles = f.require(ctx, "roles", what).and_then(|n| decode_roles(ctx, n));
    let env = f.get("env").map_or(Some(SmallMap::new()), |n| env_map(ctx, n, "`env`"));
    let secrets = f.get("secrets").map_or(Some(Vec::new()), |n| {
        let items = decode::seq(ctx, n, "`secrets`")?;
        let names: Vec<Option<Name>> = items.iter().map(|i| name(ctx, i, "an item of `secrets`")).collect();
        names.into_iter().collect()
    });
    Some(Project {
        image: img?,
        roles: roles?,
        env: env?,
        secrets: secrets?,
    })
}

fn decode_roles(ctx: &mut Ctx<'_>, node: &Node<'_>) -> Option<SmallMap<Name, Role>> {
    let yaml::Value::Map(entries) = &node.value else {
        ctx.wrong_type(node, "`roles`", "a mapping");
        return None;
    };
    if entries.is_empty() {
        ctx.error(
            Code::MissingField,
            node.pos,
            "`roles` is empty; a project needs at least one role",
        );
        return None;
    }
    let raw = map_of(ctx, node, "`roles`", |ctx, v, key| {
        let key_pos = entries
            .iter()
            .find(|(k, _)| matches!(&k.value, yaml::Value::Str(s) if s == key))
            .map_or(v.pos, |(k, _)| k.pos);
        let role_name = match Name::new(key) {
            Ok(n) => Some(n),
            Err(inv) => {
                ctx.invalid(Code::InvalidName, key_pos, inv);
                None
            }
        };
        let role = decode_role(ctx, v, key);
        Some((role_name?, role?))
    })?;
    Some(raw.into_iter().map(|(_, v)| v).collect())
}

fn decode_role(ctx: &mut Ctx<'_>, node: &Node<'_>, role: &str) -> Option<Role> {
    let what = format!("role `{role}`");
    let f = Fields::new(ctx, node, &what, ROLE_FIELDS)?;
    let kind = f.require(ctx, "kind", &what).and_then(|n| {
        one_of(
            ctx,
            n,
            "`kind`",
            &[
                ("web", "web"),
                ("worker", "worker"),
                ("cron", "cron"),
                ("job", "job"),
                ("release", "release"),
                ("service", "service"),
            ],
        )
    });
    let command = f.get("command").map_or(Some(Vec::new()), |n| {
        if matches!(n.value, yaml::Value::Str(_)) {
            ctx.error_hint(
                Code::WrongType,
                n.pos,
                "`command` must be a sequence (argv), found a string",
                "write it as a list: `[\"bin/server\", \"--port\", \"8080\"]`",
            );
            return None;
        }
        strings(ctx, n, "`command`")
    });
    let resources = f
        .get("resources")
        .map_or(Some(default_resources()), |n| decode_resources(ctx, n));
    let port = f.get("port").map(|n| match &n.value {
        yaml::Value::Int(p) if !(1..=65535).contains(p) => {
            ctx.error(Code::InvalidPort, n.pos, format!("port {p} is outside 1-65535"));
            None
        }
        _ => int_in(ctx, n, "`port`", 1, 65535).and_then(|p| u16::try_from(p).ok()),
    });
    let health = f.get("health").map(|n| decode_health(ctx, n));
    let replicas = f.get("replicas").map(|n| u32_in(ctx, n, "`replicas`", 0, MAX_REPLICAS));
    let schedule = f
        .get("schedule")
        .map(|n| checked(ctx, n, "`schedule`", Code::InvalidCron, CronSchedule::parse));
    let logs = f.get("logs").map(|n| decode_logs(ctx, n));
    let ports = f.get("ports").map(|n| decode_ports(ctx, n));
    let volumes = f.get("volumes").map(|n| crate::volumes::decode_volumes(ctx, n));
    let rollout = f.get("rollout").map(|n| decode_rollout(ctx, n, kind == Some("web")));

    let kind = kind?;
    let mut not_for = |field: &str, present: bool| {
        if present {
            let pos = f.get(field).map_or(f.pos, |n| n.pos);
            ctx.error_hint(
                Code::FieldNotAllowed,
                pos,
                format!("`{field}` does not apply to a {kind} role"),
                field_hint(field),
            );
        }
    };
    // Long-running roles serve ports; web and worker ones run replicas (a service runs one).
    let long_running = matches!(kind, "web" | "worker" | "service");
    let scaled = matches!(kind, "web" | "worker");
    not_for("port", kind != "web" && port.is_some());
    not_for("health", kind != "web" && health.is_some());
    not_for("replicas", !scaled && replicas.is_some());
    not_for("schedule", kind != "cron" && schedule.is_some());
    not_for("ports", !long_running && ports.is_some());
    not_for("volumes", kind == "cron" && volumes.is_some());
    not_for("rollout", !long_running && rollout.is_some());
    let misplaced = !scaled && replicas.is_some()
        || !long_running && rollout.is_some()
        || !long_running && ports.is_some()
        || kind != "web" && (port.is_some() || health.is_some())
        || kind != "cron" && schedule.is_some()
        || kind == "cron" && volumes.is_some();
    let workload = match kind {
        "web" => Workload::Web {
            port: port.unwrap_or(Some(defaults::WEB_PORT))?,
            health: health.unwrap_or_else(|| Some(default_health()))?,
            replicas: replicas.unwrap_or(Some(defaults::REPLICAS))?,
        },
        "worker" => Workload::Worker {
            replicas: replicas.unwrap_or(Some(defaults::REPLICAS))?,
        },
        "cron" => match schedule {
            Some(s) => Workload::Cron { schedule: s? },
            None => {
                ctx.error_hint(
                    Code::MissingField,
                    f.pos,
                    format!("{what} is a cron role and needs `schedule`"),
                    "five fields, e.g. `schedule: \"*/15 * * * *\"`",
                );
                return None;
            }
        },
        "job" => Workload::Job {},
        "service" => Workload::Service {},
        _ => Workload::Release {},
    };
    if misplaced {
        return None;
    }
    let ports = match ports {
        Some(p) => p?,
        None => Vec::new(),
    };
    if let (Workload::Web { port, .. }, Some(n)) = (&workload, f.get("ports"))
        && ports.contains(port)
    {
        ctx.error_hint(
            Code::InvalidPort,
            n.pos,
            format!("port {port} is the role's web `port`, which other roles reach already"),
            "list only the ports it serves besides `port`",
        );
        return None;
    }
    let volumes = match volumes {
        Some(v) => v?,
        None => Vec::new(),
    };
    // One writer: a volume is mounted by one container at a time.
    if let (Some(n), false) = (workload.replicas(), volumes.is_empty())
        && n > 1
    {
        let pos = f.get("replicas").map_or(f.pos, |n| n.pos);
        ctx.error_hint(
            Code::VolumeOneWriter,
            pos,
            format!("{what} mounts volumes and asks for {n} replicas; a volume has one writer"),
            "run one replica, or keep the data in a `kind: service` role the replicas reach by name",
        );
        return None;
    }
    Some(Role {
        workload,
        ports,
        volumes,
        command: command?,
        resources: resources?,
        logs: match logs {
            Some(l) => Some(l?),
            None => None,
        },
        rollout: match rollout {
            Some(r) => Some(r?),
            None => None,
        },
    })
}

/// `rollout: {watchSeconds: N, strategy: switch | canary, steps: [...]}`: how long after a new
/// release's switch its replicas are watched (one found unhealthy meanwhile rolls the
/// environment back), and for a web role, whether a canary comes before the switch.
fn decode_rollout(ctx: &mut Ctx<'_>, node: &Node<'_>, web: bool) -> Option<RolloutPolicy> {
    let f = Fields::new(ctx, node, "`rollout`", ROLLOUT_FIELDS)?;
    let watch = f.get("watchSeconds").map_or(Some(0), |n| {
        u32_in(ctx, n, "`rollout.watchSeconds`", 1, defaults::MAX_WATCH_SECONDS)
    });
    // Some(true): a canary; Some(false): switch or rolling; None: refused.
    let mut rolling_asked = false;
    let canary = match f.get("strategy") {
        None => Some(false),
        Some(n) => match crate::decode::string(ctx, n, "`rollout.strategy`")? {
            "switch" => Some(false),
            "canary" if web => Some(true),
            "canary" => {
                ctx.error_hint(
                    Code::InvalidValue,
                    n.pos,
                    "`rollout.strategy: canary` is for a web role: the ingress splits its requests".to_owned(),
                    "leave `strategy` out: the new release starts beside the old one and takes over once healthy",
                );
                None
            }
            "rolling" => {
                rolling_asked = true;
                Some(false)
            }
            other => {
                ctx.error_hint(
                    Code::InvalidValue,
                    n.pos,
                    format!("`rollout.strategy` is `{other}`; it must be one of switch, canary, rolling"),
                    "`strategy: canary` with `steps: [{weight: 10, pause: 60s}, {weight: 50}]`, or `strategy: rolling` with `maxSurge: 1`",
                );
                None
            }
        },
    };
    let rolling = decode_rolling(ctx, &f, rolling_asked);
    let steps = match (canary, f.get("steps")) {
        (Some(true), Some(n)) => decode_canary_steps(ctx, n),
        (Some(true), None) => {
            ctx.error_hint(
                Code::MissingField,
                f.pos,
                "`rollout.strategy: canary` needs `steps`".to_owned(),
                "e.g. `steps: [{weight: 10, pause: 60s}, {weight: 50}]`: a step without `pause` waits for `pl rollout promote`",
            );
            None
        }
        (Some(false), Some(n)) => {
            ctx.error_hint(
                Code::InvalidValue,
                n.pos,
                "`rollout.steps` is for `strategy: canary`".to_owned(),
                "add `strategy: canary`, or leave `steps` out",
            );
            None
        }
        (Some(false), None) => Some(Vec::new()),
        (None, _) => None,
    };
    let gates = match (canary, f.get("gates")) {
        (_, None) => Some(None),
        (Some(true), Some(n)) => decode_gates(ctx, n).map(Some),
        (Some(false), Some(n)) => {
            ctx.error_hint(
                Code::InvalidValue,
                n.pos,
                "`rollout.gates` is for `strategy: canary`".to_owned(),
                "add `strategy: canary` with its `steps`, or leave `gates` out",
            );
            None
        }
        (None, Some(_)) => None,
    };
    Some(RolloutPolicy {
        watch_seconds: watch?,
        steps: steps?,
        gates: gates?,
        rolling: rolling?,
    })
}

/// `maxSurge` and `maxUnavailable` of `strategy: rolling` (`asked`): each a count (0-1000) or
/// a percent (`25%`, 0-100%); by default one new replica at a time beside every old one
/// (`maxSurge: 1, maxUnavailable: 0`), and never both zero. Refused without `rolling`.
fn decode_rolling(ctx: &mut Ctx<'_>, f: &Fields<'_>, asked: bool) -> Option<Option<Rolling>> {
    let (surge, down) = (f.get("maxSurge"), f.get("maxUnavailable"));
    if !asked {
        let mut fine = true;
        for (n, name) in [(surge, "maxSurge"), (down, "maxUnavailable")] {
            if let Some(n) = n {
                ctx.error_hint(
                    Code::InvalidValue,
                    n.pos,
                    format!("`rollout.{name}` is for `strategy: rolling`"),
                    "add `strategy: rolling`, or leave it out",
                );
                fine = false;
            }
        }
        return fine.then_some(None);
    }
    let max_surge = surge.map_or(Some(Amount::Count(1)), |n| amount(ctx, n, "`rollout.maxSurge`"));
    let max_unavailable = down.map_or(Some(Amount::Count(0)), |n| amount(ctx, n, "`rollout.maxUnavailable`"));
    let (max_surge, max_unavailable) = (max_surge?, max_unavailable?);
    let zero = |a: Amount| matches!(a, Amount::Count(0) | Amount::Percent(0));
    if zero(max_surge) && zero(max_unavailable) {
        ctx.error_hint(
            Code::InvalidValue,
            surge.or(down).map_or(f.pos, |n| n.pos),
            "`rollout.maxSurge` and `rollout.maxUnavailable` are both 0: no replica could be replaced".to_owned(),
            "`maxSurge: 1` starts one new replica beside the old ones at a time",
        );
        return None;
    }
    Some(Some(Rolling {
        max_surge,
        max_unavailable,
    }))
}

/// A count of replicas (0-1000) or a percent of them (`25%`, 0-100%).
fn amount(ctx: &mut Ctx<'_>, node: &Node<'_>, what: &str) -> Option<Amount> {
    if let yaml::Value::Str(s) = &node.value {
        let s: &str = s.as_ref();
        if let Some(p) = s
            .strip_suffix('%')
            .and_then(|d| d.parse::<u8>().ok())
            .filter(|p| *p <= 100)
        {
            return Some(Amount::Percent(p));
        }
        ctx.error_hint(
            Code::InvalidValue,
            node.pos,
            format!("{what} is `{s}`, not a count or a percent"),
            "a number of replicas (`1`) or a percent of them (`25%`, 0-100%)",
        );
        return None;
    }
    u32_in(ctx, node, what, 0, 1000).map(Amount::Count)
}

/// `gates: {maxErrorPercent: 5, maxP95Ms: 500, minRequests: 20}`: at least one threshold.
fn decode_gates(ctx: &mut Ctx<'_>, node: &Node<'_>) -> Option<CanaryGate> {
    let f = Fields::new(ctx, node, "`rollout.gates`", GATE_FIELDS)?;
    let errors = match f.get("maxErrorPercent") {
        None => Some(None),
        Some(n) => crate::decode::int_in(ctx, n, "`maxErrorPercent`", 0, 100)
            .and_then(|v| u8::try_from(v).ok())
            .map(Some),
    };
    let p95 = match f.get("maxP95Ms") {
        None => Some(None),
        Some(n) => u32_in(ctx, n, "`maxP95Ms`", 1, 600_000).map(Some),
    };
    let min = f.get("minRequests").map_or(Some(defaults::GATE_MIN_REQUESTS), |n| {
        u32_in(ctx, n, "`minRequests`", 1, 1_000_000)
    });
    let (errors, p95, min) = (errors?, p95?, min?);
    if errors.is_none() && p95.is_none() {
        ctx.error_hint(
            Code::MissingField,
            f.pos,
            "`rollout.gates` sets no threshold".to_owned(),
            "`maxErrorPercent` (5xx of the new release's requests), `maxP95Ms`, or both",
        );
        return None;
    }
    Some(CanaryGate {
        max_error_percent: errors,
        max_p95_ms: p95,
        min_requests: min,
    })
}

/// `steps: [{weight: 10, pause: 60s}, …]`: weights 1-99 percent, each above the one before,
/// at most [`defaults::MAX_CANARY_STEPS`]; `pause` in seconds (`90`, `90s`, `5m`, `1h`), at
/// most a day; none: until `pl rollout promote`.
fn decode_canary_steps(ctx: &mut Ctx<'_>, node: &Node<'_>) -> Option<Vec<CanaryStep>> {
    let items = crate::decode::seq(ctx, node, "`rollout.steps`")?;
    if items.is_empty() || items.len() > defaults::MAX_CANARY_STEPS {
        ctx.error(
            Code::OutOfRange,
            node.pos,
            format!(
                "`rollout.steps` has {} steps; a canary has 1-{}",
                items.len(),
                defaults::MAX_CANARY_STEPS
            ),
        );
        return None;
    }
    let mut out = Some(Vec::with_capacity(items.len()));
    let mut last = 0u8;
    for item in items {
        let step = (|| {
            let f = Fields::new(ctx, item, "a step of `rollout.steps`", CANARY_STEP_FIELDS)?;
            let Some(w) = f.get("weight") else {
                ctx.error_hint(
                    Code::MissingField,
                    f.pos,
                    "a step of `rollout.steps` needs `weight`".to_owned(),
                    "the percent of requests the new release gets at this step, 1-99",
                );
                return None;
            };
            let weight = u8::try_from(crate::decode::int_in(ctx, w, "`weight`", 1, 99)?).ok()?;
            if weight <= last {
                ctx.error_hint(
                    Code::InvalidValue,
                    w.pos,
                    format!("`weight` is {weight}, not above the step before's {last}"),
                    "each step sends more requests to the new release than the one before",
                );
                return None;
            }
            last = weight;
            let pause_seconds = match f.get("pause") {
                None => None,
                Some(p) => Some(pause(ctx, p)?),
            };
            Some(CanaryStep { weight, pause_seconds })
        })();
        match (step, out.as_mut()) {
            (Some(s), Some(v)) => v.push(s),
            _ => out = None,
        }
    }
    out
}

/// A pause: seconds as an integer, or a number with `s`, `m` or `h`; 1 s to a day.
fn pause(ctx: &mut Ctx<'_>, node: &Node<'_>) -> Option<u32> {
    let what = "`pause`";
    let seconds = match &node.value {
        yaml::Value::Int(v) => Some(*v),
        yaml::Value::Str(s) => {
            let s: &str = s.as_ref();
            let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
            let scale = match unit {
                "" | "s" => Some(1),
                "m" => Some(60),
                "h" => Some(3600),
                _ => None,
            };
            digits.parse::<i64>().ok().zip(scale).map(|(n, k)| n.saturating_mul(k))
        }
        _ => None,
    };
    let max = i64::from(defaults::MAX_PAUSE_SECONDS);
    match seconds {
        Some(n) if (1..=max).contains(&n) => u32::try_from(n).ok(),
        Some(n) => {
            ctx.error(
                Code::OutOfRange,
                node.pos,
                format!("{what} is {n} s; it must be 1-{max} s"),
            );
            None
        }
        None => {
            ctx.error_hint(
                Code::InvalidValue,
                node.pos,
                format!("{what} is not a duration"),
                "seconds (`90`), or a number with s, m or h (`90s`, `5m`, `1h`); leave it out to wait for `pl rollout promote`",
            );
            None
        }
    }
}

/// `ports: [...]`: what a role serves inside its environment besides a web role's `port`,
/// sorted; each 1-65535, none twice, at most [`MAX_PORTS`].
fn decode_ports(ctx: &mut Ctx<'_>, node: &Node<'_>) -> Option<Vec<u16>> {
    let items = decode::seq(ctx, node, "`ports`")?;
    if items.len() > MAX_PORTS {
        ctx.error(
            Code::InvalidPort,
            node.pos,
            format!(
                "`ports` lists {} ports; a role declares at most {MAX_PORTS}",
                items.len()
            ),
        );
        return None;
    }
    let mut out: Vec<u16> = Vec::with_capacity(items.len());
    let mut ok = true;
    for item in items {
        let port = match item.value {
            yaml::Value::Int(p) if !(1..=65535).contains(&p) => {
                ctx.error(Code::InvalidPort, item.pos, format!("port {p} is outside 1-65535"));
                None
            }
            _ => int_in(ctx, item, "an item of `ports`", 1, 65535).and_then(|p| u16::try_from(p).ok()),
        };
        match port {
            Some(p) if out.contains(&p) => {
                ctx.error(Code::InvalidPort, item.pos, format!("port {p} is listed twice"));
                ok = false;
            }
            Some(p) => out.push(p),
            None => ok = false,
        }
    }
    out.sort_unstable();
    ok.then_some(out)
}

/// `logs: {maxSize, maxFiles}`: how much of its output a role's container keeps on its node.
fn decode_logs(ctx: &mut Ctx<'_>, node: &Node<'_>) -> Option<LogLimits> {
    let f = Fields::new(ctx, node, "`logs`", LOGS_FIELDS)?;
    let (low, high) = defaults::LOG_MAX_BYTES_RANGE;
    let size = f
        .get("maxSize")
        .map_or(Some(Memory::from_bytes(defaults::LOG_MAX_BYTES)), |n| {
            let m = memory(ctx, n, "`logs.maxSize`")?;
            if !(low..=high).contains(&m.bytes()) {
                ctx.error_hint(
                    Code::InvalidValue,
                    n.pos,
                    format!("`logs.maxSize` {} is outside 1Mi to 1Gi", m.bytes()),
                    "a size with a unit, e.g. `10Mi`",
                );
                return None;
            }
            Some(m)
        });
    let (low, high) = defaults::LOG_MAX_FILES_RANGE;
    let files = f.get("maxFiles").map_or(Some(defaults::LOG_MAX_FILES), |n| {
        u32_in(ctx, n, "`logs.maxFiles`", low, high)
    });
    Some(LogLimits {
        max_size: size?,
        max_files: files?,
    })
}

fn field_hint(field: &str) -> &'static str {
    match field {
        "port" | "health" => "only web roles listen and have health checks",
        "rollout" => "only web, worker and service roles run replicas a release replaces",
        "replicas" => "only web and worker roles run replicas; a service runs one",
        "ports" => "only web, worker and service roles serve other roles; a run is reached by nothing",
        "volumes" => "a cron role's runs may overlap; mount the volume in a job or a service",
        _ => "only cron roles have a schedule",
    }
}

fn default_health() -> Health {
    Health {
        path: defaults::HEALTH_PATH.to_owned(),
        timeout_seconds: defaults::HEALTH_TIMEOUT_SECONDS,
    }
}

fn default_resources() -> Resources {
    Resources {
        cpu: Cpu::from_millis(defaults::CPU_MILLIS),
        memory: Memory::from_bytes(defaults::MEMORY_BYTES),
        pids: defaults::PIDS,
    }
}

fn decode_health(ctx: &mut Ctx<'_>, node: &Node<'_>) -> Option<Health> {
    let f = Fields::new(ctx, node, "`health`", HEALTH_FIELDS)?;
    let path = f.get("path").map_or(Some(defaults::HEALTH_PATH.to_owned()), |n| {
        let p = string(ctx, n, "`health.path`")?;
        if !p.starts_with('/') || p.chars().any(char::is_whitespace) {
            ctx.error_hint(
                Code::InvalidValue,
                n.pos,
                format!("health path `{p}` is not an absolute URL path"),
                "start it with `/`, e.g. `/healthz`",
            );
            return None;
        }
        Some(p.to_owned())
    });
    let timeout = f
        .get("timeoutSeconds")
        .map_or(Some(defaults::HEALTH_TIMEOUT_SECONDS), |n| {
            u32_in(ctx, n, "`health.timeoutSeconds`", 1, 300)
        });
    Some(Health {
        path: path?,
        timeout_seconds: timeout?,
    })
}

fn cpu(ctx: &mut Ctx<'_>, node: &Node<'_>, what: &str) -> Option<Cpu> {
    let Some(text) = quantity_text(node) else {
        ctx.wrong_type(node, what, "a quantity");
        return None;
    };
    Cpu::parse(&text)
        .map_err(|inv| ctx.invalid(Code::InvalidQuantity, node.pos, inv))
        .ok()
}

fn memory(ctx: &mut Ctx<'_>, node: &Node<'_>, what: &str) -> Option<Memory> {
    let Some(text) = quantity_text(node) else {
        ctx.wrong_type(node, what, "a quantity");
        return None;
    };
    Memory::parse(&text)
        .map_err(|inv| ctx.invalid(Code::InvalidQuantity, node.pos, inv))
        .ok()
}

fn decode_resources(ctx: &mut Ctx<'_>, node: &Node<'_>) -> Option<Resources> {
    let f = Fields::new(ctx, node, "`resources`", RESOURCES_FIELDS)?;
    let c = f.get("cpu").map_or(Some(Cpu::from_millis(defaults::CPU_MILLIS)), |n| {
        cpu(ctx, n, "`resources.cpu`")
    });
    let m = f
        .get("memory")
        .map_or(Some(Memory::from_bytes(defaults::MEMORY_BYTES)), |n| {
            memory(ctx, n, "`resources.memory`")
        });
    let p = f
        .get("pids")
        .map_or(Some(defaults::PIDS), |n| u32_in(ctx, n, "`resources.pids`", 8, 65536));
    Some(Resources {
        cpu: c?,
        memory: m?,
        pids: p?,
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
