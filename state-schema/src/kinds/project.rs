//! A Project document's decoding: its image, environment, secrets and roles, each role's
//! command, ports, health, logs and resources (its rollout in `rollout.rs`).

use super::*;

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
    let updates = f.get("imageUpdates").map(|n| super::decode_image_updates(ctx, n));
    Some(Project {
        image: img?,
        roles: roles?,
        env: env?,
        secrets: secrets?,
        image_updates: super::present(updates)?,
    })
}

pub(super) fn decode_roles(ctx: &mut Ctx<'_>, node: &Node<'_>) -> Option<SmallMap<Name, Role>> {
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

pub(super) fn decode_role(ctx: &mut Ctx<'_>, node: &Node<'_>, role: &str) -> Option<Role> {
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
    let command = f.get("command").map_or(Some(Vec::new()), |n| decode_command(ctx, n));
    let resources = f
        .get("resources")
        .map_or(Some(default_resources()), |n| decode_resources(ctx, n));
    let port = f.get("port").map(|n| decode_port(ctx, n));
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
    let present = Present {
        port: port.is_some(),
        health: health.is_some(),
        replicas: replicas.is_some(),
        schedule: schedule.is_some(),
        ports: ports.is_some(),
        volumes: volumes.is_some(),
        rollout: rollout.is_some(),
    };
    let misplaced = misplaced(ctx, &f, kind, present);
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
    let volumes = match volumes {
        Some(v) => v?,
        None => Vec::new(),
    };
    if !ports_and_volumes_fit(ctx, &f, &what, &workload, &ports, &volumes) {
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

/// `command`: an argv list (a string is refused, with how to write it).
fn decode_command(ctx: &mut Ctx<'_>, n: &Node<'_>) -> Option<Vec<String>> {
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
}

/// A web role's `port`: 1-65535.
fn decode_port(ctx: &mut Ctx<'_>, n: &Node<'_>) -> Option<u16> {
    match &n.value {
        yaml::Value::Int(p) if !(1..=65535).contains(p) => {
            ctx.error(Code::InvalidPort, n.pos, format!("port {p} is outside 1-65535"));
            None
        }
        _ => int_in(ctx, n, "`port`", 1, 65535).and_then(|p| u16::try_from(p).ok()),
    }
}

/// Which of the fields some kinds of role take a role sets.
#[derive(Clone, Copy)]
struct Present {
    port: bool,
    health: bool,
    replicas: bool,
    schedule: bool,
    ports: bool,
    volumes: bool,
    rollout: bool,
}

/// Whether a field is set that does not apply to a role of `kind` (each one said).
/// Long-running roles serve ports; web and worker ones run replicas (a service runs one).
fn misplaced(ctx: &mut Ctx<'_>, f: &Fields<'_>, kind: &str, present: Present) -> bool {
    let long_running = matches!(kind, "web" | "worker" | "service");
    let scaled = matches!(kind, "web" | "worker");
    let wrong = [
        ("port", kind != "web" && present.port),
        ("health", kind != "web" && present.health),
        ("replicas", !scaled && present.replicas),
        ("schedule", kind != "cron" && present.schedule),
        ("ports", !long_running && present.ports),
        ("volumes", kind == "cron" && present.volumes),
        ("rollout", !long_running && present.rollout),
    ];
    for (field, _) in wrong.iter().filter(|(_, w)| *w) {
        let pos = f.get(field).map_or(f.pos, |n| n.pos);
        ctx.error_hint(
            Code::FieldNotAllowed,
            pos,
            format!("`{field}` does not apply to a {kind} role"),
            field_hint(field),
        );
    }
    wrong.iter().any(|(_, w)| *w)
}

/// A web role's `ports` leave out its `port`, and a role with volumes runs one replica (a
/// volume has one writer); each problem said.
fn ports_and_volumes_fit(
    ctx: &mut Ctx<'_>,
    f: &Fields<'_>,
    what: &str,
    workload: &Workload,
    ports: &[u16],
    volumes: &[crate::model::Volume],
) -> bool {
    if let (Workload::Web { port, .. }, Some(n)) = (workload, f.get("ports"))
        && ports.contains(port)
    {
        ctx.error_hint(
            Code::InvalidPort,
            n.pos,
            format!("port {port} is the role's web `port`, which other roles reach already"),
            "list only the ports it serves besides `port`",
        );
        return false;
    }
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
        return false;
    }
    true
}

/// `ports: [...]`: what a role serves inside its environment besides a web role's `port`,
/// sorted; each 1-65535, none twice, at most [`MAX_PORTS`].
pub(super) fn decode_ports(ctx: &mut Ctx<'_>, node: &Node<'_>) -> Option<Vec<u16>> {
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
pub(super) fn decode_logs(ctx: &mut Ctx<'_>, node: &Node<'_>) -> Option<LogLimits> {
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

pub(super) fn field_hint(field: &str) -> &'static str {
    match field {
        "port" | "health" => "only web roles listen and have health checks",
        "rollout" => "only web, worker and service roles run replicas a release replaces",
        "replicas" => "only web and worker roles run replicas; a service runs one",
        "ports" => "only web, worker and service roles serve other roles; a run is reached by nothing",
        "volumes" => "a cron role's runs may overlap; mount the volume in a job or a service",
        _ => "only cron roles have a schedule",
    }
}

pub(super) fn default_health() -> Health {
    Health {
        path: defaults::HEALTH_PATH.to_owned(),
        timeout_seconds: defaults::HEALTH_TIMEOUT_SECONDS,
    }
}

pub(super) fn default_resources() -> Resources {
    Resources {
        cpu: Cpu::from_millis(defaults::CPU_MILLIS),
        memory: Memory::from_bytes(defaults::MEMORY_BYTES),
        pids: defaults::PIDS,
    }
}

pub(super) fn decode_health(ctx: &mut Ctx<'_>, node: &Node<'_>) -> Option<Health> {
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

pub(super) fn cpu(ctx: &mut Ctx<'_>, node: &Node<'_>, what: &str) -> Option<Cpu> {
    let Some(text) = quantity_text(node) else {
        ctx.wrong_type(node, what, "a quantity");
        return None;
    };
    Cpu::parse(&text)
        .map_err(|inv| ctx.invalid(Code::InvalidQuantity, node.pos, inv))
        .ok()
}

pub(super) fn memory(ctx: &mut Ctx<'_>, node: &Node<'_>, what: &str) -> Option<Memory> {
    let Some(text) = quantity_text(node) else {
        ctx.wrong_type(node, what, "a quantity");
        return None;
    };
    Memory::parse(&text)
        .map_err(|inv| ctx.invalid(Code::InvalidQuantity, node.pos, inv))
        .ok()
}

pub(super) fn decode_resources(ctx: &mut Ctx<'_>, node: &Node<'_>) -> Option<Resources> {
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
