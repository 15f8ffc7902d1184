//! A role's `volumes: [{name, path, size?, retainDays?, backup?}]`: the single-object rules (a
//! clean absolute path the role owns, names and paths unique, at most [`MAX_VOLUMES`]), the
//! one-writer rule a role's replicas and an environment's overrides must keep, and backups (a
//! volume's `backup` and an Environment's `backups` repository).

use crate::decode::{self, Ctx, Fields, checked, quantity_text, string};
use crate::diag::Code;
use crate::model::{BackupVerify, EnvironmentBackups, Volume, VolumeBackup};
use crate::values::{CronSchedule, Memory, Name};
use crate::yaml::{self, Node};

pub const VOLUME_FIELDS: &[&str] = &["name", "path", "size", "retainDays", "backup"];
pub const BACKUP_FIELDS: &[&str] = &["schedule", "keep", "command", "restore", "verify"];
/// A backup's restore drill: `verify`.
pub const VERIFY_FIELDS: &[&str] = &["schedule", "command"];
/// An Environment's `backups`.
pub const BACKUPS_FIELDS: &[&str] = &["repository", "secret"];
/// Most snapshots `keep` keeps.
pub const MAX_KEEP: u32 = 1000;
/// Most arguments of a backup's `command`, and the longest one.
pub const MAX_COMMAND_ARGS: usize = 64;
pub const MAX_COMMAND_ARG: usize = 1024;
/// Longest repository location.
pub const MAX_REPOSITORY: usize = 512;
/// restic backends a repository may name. Not `rclone:` (it runs a program of the URL's
/// choosing) nor anything else restic may add later.
const BACKENDS: &[&str] = &["sftp:", "s3:", "rest:", "b2:", "azure:", "gs:", "swift:"];
/// The key of a backups Secret restic opens the repository with.
pub const RESTIC_PASSWORD: &str = "RESTIC_PASSWORD";

/// Why `location` cannot be a backups repository, if it cannot.
pub fn repository_problem(location: &str) -> Option<String> {
    if location.len() > MAX_REPOSITORY {
        return Some(format!("it is {} bytes; at most {MAX_REPOSITORY}", location.len()));
    }
    if location.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Some("it has a control character or a space".into());
    }
    if location.starts_with('/') {
        return (location.split('/').any(|c| c == "." || c == "..") || location == "/")
            .then(|| format!("`{location}` is not a clean absolute path below `/`"));
    }
    match BACKENDS.iter().find(|b| location.starts_with(**b)) {
        Some(b) if location.len() > b.len() => None,
        Some(b) => Some(format!("`{b}` names no repository")),
        None => Some(format!(
            "`{location}` is neither an absolute path on the node nor one of {}",
            BACKENDS.join(" ")
        )),
    }
}

/// `backups: {repository, secret}` of an Environment.
pub(crate) fn decode_backups(ctx: &mut Ctx<'_>, node: &Node<'_>) -> Option<EnvironmentBackups> {
    let f = Fields::new(ctx, node, "`backups`", BACKUPS_FIELDS)?;
    let repository = f.require(ctx, "repository", "`backups`").and_then(|n| {
        let s = string(ctx, n, "`backups.repository`")?;
        match repository_problem(s) {
            Some(problem) => {
                ctx.error_hint(
                    Code::InvalidBackup,
                    n.pos,
                    format!("`backups.repository`: {problem}"),
                    "a restic repository: `/var/backups/pushleft/shop`, `sftp:backup@host.example:/srv/restic`, `s3:https://s3.example/bucket`",
                );
                None
            }
            None => Some(s.to_owned()),
        }
    });
    let secret = f
        .require(ctx, "secret", "`backups`")
        .and_then(|n| checked(ctx, n, "`backups.secret`", Code::InvalidName, Name::new));
    Some(EnvironmentBackups {
        repository: repository?,
        secret: secret?,
    })
}

/// `backup: {schedule, keep, command?}` of a volume.
fn decode_backup(ctx: &mut Ctx<'_>, node: &Node<'_>) -> Option<VolumeBackup> {
    let f = Fields::new(ctx, node, "`backup`", BACKUP_FIELDS)?;
    let schedule = f
        .require(ctx, "schedule", "`backup`")
        .and_then(|n| checked(ctx, n, "`backup.schedule`", Code::InvalidCron, CronSchedule::parse));
    let keep = f
        .require(ctx, "keep", "`backup`")
        .and_then(|n| decode::u32_in(ctx, n, "`backup.keep`", 1, MAX_KEEP));
    let command = match f.get("command") {
        None => Some(None),
        Some(n) => argv(ctx, n, "`backup.command`", "[\"pg_dump\", \"-U\", \"app\", \"app\"]").map(Some),
    };
    let restore = match f.get("restore") {
        None => Some(None),
        // Files are restored as they were; only a command's dump needs loading.
        Some(n) if f.get("command").is_none() => {
            ctx.error_hint(
                Code::InvalidBackup,
                n.pos,
                "`backup.restore` loads a `command`'s dump, and this backup has no `command`",
                "without `command` the volume's files are saved and restored as they were: remove `restore`",
            );
            None
        }
        Some(n) => argv(
            ctx,
            n,
            "`backup.restore`",
            "[\"pg_restore\", \"--clean\", \"--if-exists\", \"-d\", \"app\"]",
        )
        .map(Some),
    };
    let verify = match f.get("verify") {
        None => Some(None),
        Some(n) => decode_verify(ctx, n).map(Some),
    };
    Some(VolumeBackup {
        schedule: schedule?,
        keep: keep?,
        command: command?,
        restore: restore?,
        verify: verify?,
    })
}

/// `verify: {schedule, command}` of a volume's backup: a restore drill.
fn decode_verify(ctx: &mut Ctx<'_>, node: &Node<'_>) -> Option<BackupVerify> {
    let f = Fields::new(ctx, node, "`backup.verify`", VERIFY_FIELDS)?;
    let schedule = f.require(ctx, "schedule", "`backup.verify`").and_then(|n| {
        checked(
            ctx,
            n,
            "`backup.verify.schedule`",
            Code::InvalidCron,
            CronSchedule::parse,
        )
    });
    let command = f.require(ctx, "command", "`backup.verify`").and_then(|n| {
        argv(
            ctx,
            n,
            "`backup.verify.command`",
            "[\"psql\", \"-c\", \"select count(*) from orders\"]",
        )
    });
    Some(BackupVerify {
        schedule: schedule?,
        command: command?,
    })
}

/// A command as argv: a non-empty sequence of at most [`MAX_COMMAND_ARGS`] strings of at most
/// [`MAX_COMMAND_ARG`] bytes, none with a NUL.
fn argv(ctx: &mut Ctx<'_>, n: &Node<'_>, what: &str, example: &str) -> Option<Vec<String>> {
    if matches!(n.value, yaml::Value::Str(_)) {
        ctx.error_hint(
            Code::WrongType,
            n.pos,
            format!("{what} must be a sequence (argv), found a string"),
            format!("write it as a list: `{example}`"),
        );
        return None;
    }
    let argv = decode::strings(ctx, n, what)?;
    let problem = if argv.is_empty() {
        Some("is empty".to_owned())
    } else if argv.len() > MAX_COMMAND_ARGS {
        Some(format!("has {} arguments; at most {MAX_COMMAND_ARGS}", argv.len()))
    } else if argv.iter().any(|a| a.len() > MAX_COMMAND_ARG || a.contains('\0')) {
        Some(format!("has an argument over {MAX_COMMAND_ARG} bytes or with a NUL"))
    } else {
        None
    };
    match problem {
        Some(p) => {
            ctx.error(Code::InvalidBackup, n.pos, format!("{what} {p}"));
            None
        }
        None => Some(argv),
    }
}
/// Days a volume is kept after its environment is torn down (`retainDays`).
pub const RETAIN_DAYS: u32 = 7;
/// Longest `retainDays`.
pub const MAX_RETAIN_DAYS: u32 = 3650;
/// Most volumes one role mounts.
pub const MAX_VOLUMES: usize = 8;
/// Longest mount path.
pub const MAX_PATH: usize = 256;
/// Paths the agent mounts itself or the kernel owns: a volume there would hide them.
const RESERVED: &[&str] = &["/run/secrets", "/tmp", "/proc", "/sys", "/dev", "/etc/resolv.conf"];

/// Why `path` cannot be a volume's mount point, if it cannot.
pub fn path_problem(path: &str) -> Option<String> {
    if !path.starts_with('/') {
        return Some(format!("`{path}` is not an absolute path"));
    }
    if path == "/" {
        return Some("`/` would hide the image's whole file system".into());
    }
    if path.len() > MAX_PATH {
        return Some(format!("the path is {} bytes; at most {MAX_PATH}", path.len()));
    }
    if path.ends_with('/') || path.contains("//") {
        return Some(format!("`{path}` has an empty component (a `//` or a trailing `/`)"));
    }
    if path.split('/').any(|c| c == "." || c == "..") {
        return Some(format!("`{path}` has a `.` or `..` component"));
    }
    if path.chars().any(|c| c.is_control() || c == ':' || c == ',') {
        return Some(format!("`{path}` has a control character, `:` or `,`"));
    }
    RESERVED
        .iter()
        .find(|r| path == **r || path.strip_prefix(**r).is_some_and(|rest| rest.starts_with('/')))
        .map(|r| format!("`{path}` is under `{r}`, which the container gets from the agent or the kernel"))
}

/// `volumes: [...]` of one role.
pub(crate) fn decode_volumes(ctx: &mut Ctx<'_>, node: &Node<'_>) -> Option<Vec<Volume>> {
    let items = decode::seq(ctx, node, "`volumes`")?;
    if items.len() > MAX_VOLUMES {
        ctx.error(
            Code::InvalidVolume,
            node.pos,
            format!(
                "`volumes` lists {} volumes; a role mounts at most {MAX_VOLUMES}",
                items.len()
            ),
        );
        return None;
    }
    let mut out: Vec<Volume> = Vec::with_capacity(items.len());
    let mut ok = true;
    for item in items {
        let Some(v) = decode_volume(ctx, item) else {
            ok = false;
            continue;
        };
        if out.iter().any(|o| o.name == v.name) {
            ctx.error(
                Code::InvalidVolume,
                item.pos,
                format!("volume `{}` is listed twice", v.name),
            );
            ok = false;
        } else if out.iter().any(|o| o.path == v.path) {
            ctx.error_hint(
                Code::InvalidVolume,
                item.pos,
                format!("two volumes are mounted at `{}`", v.path),
                "give each volume its own path",
            );
            ok = false;
        } else {
            out.push(v);
        }
    }
    ok.then_some(out)
}

fn decode_volume(ctx: &mut Ctx<'_>, node: &Node<'_>) -> Option<Volume> {
    let f = Fields::new(ctx, node, "a volume", VOLUME_FIELDS)?;
    let name = f.require(ctx, "name", "a volume").and_then(|n| {
        let s = string(ctx, n, "a volume's `name`")?;
        Name::new(s)
            .map_err(|inv| ctx.invalid(Code::InvalidName, n.pos, inv))
            .ok()
    });
    let path = f.require(ctx, "path", "a volume").and_then(|n| {
        let s = string(ctx, n, "a volume's `path`")?;
        match path_problem(s) {
            Some(problem) => {
                ctx.error_hint(
                    Code::InvalidVolume,
                    n.pos,
                    format!("a volume's `path`: {problem}"),
                    "an absolute, clean path of the container, e.g. `/var/lib/postgresql/data`",
                );
                None
            }
            None => Some(s.to_owned()),
        }
    });
    let size = match f.get("size") {
        None => Some(None),
        Some(n) => {
            let Some(text) = quantity_text(n) else {
                ctx.wrong_type(n, "a volume's `size`", "a quantity");
                return None;
            };
            match Memory::parse(&text) {
                Ok(m) if m.bytes() >= 1 << 20 => Some(Some(m)),
                Ok(_) => {
                    ctx.error_hint(
                        Code::InvalidQuantity,
                        n.pos,
                        format!("a volume's `size` {text} is under 1Mi"),
                        "a size with a unit, e.g. `10Gi`",
                    );
                    None
                }
                Err(inv) => {
                    ctx.invalid(Code::InvalidQuantity, n.pos, inv);
                    None
                }
            }
        }
    };
    let retain_days = f.get("retainDays").map_or(Some(RETAIN_DAYS), |n| {
        decode::u32_in(ctx, n, "a volume's `retainDays`", 0, MAX_RETAIN_DAYS)
    });
    let backup = match f.get("backup") {
        None => Some(None),
        Some(n) => decode_backup(ctx, n).map(Some),
    };
    Some(Volume {
        name: name?,
        path: path?,
        size: size?,
        retain_days: retain_days?,
        backup: backup?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_path_is_absolute_clean_and_not_the_agents_or_the_kernels() {
        for ok in ["/data", "/var/lib/postgresql/data", "/srv/tmpfiles", "/runx"] {
            assert_eq!(path_problem(ok), None, "{ok}");
        }
        for bad in [
            "data",
            "/",
            "/data/",
            "/a//b",
            "/a/../etc",
            "/a/./b",
            "/tmp",
            "/tmp/x",
            "/run/secrets/db",
            "/proc/1",
            "/etc/resolv.conf",
            "/a:b",
            "/a,b",
            "/a\nb",
        ] {
            assert!(path_problem(bad).is_some(), "{bad:?}");
        }
        assert!(path_problem(&format!("/{}", "a".repeat(MAX_PATH))).is_some());
    }

    #[test]
    fn a_repository_is_a_clean_node_path_or_a_known_backend() {
        for ok in [
            "/var/backups/pushleft/shop",
            "sftp:backup@host.example:/srv/restic",
            "s3:https://s3.example.invalid/bucket",
            "rest:https://restic.example.invalid/",
        ] {
            assert_eq!(repository_problem(ok), None, "{ok}");
        }
        for bad in [
            "backups",
            "/",
            "/a/../etc",
            "rclone:remote:path",
            "s3:",
            "local:/x",
            "/a b",
            "/a\nb",
        ] {
            assert!(repository_problem(bad).is_some(), "{bad:?}");
        }
    }
}
