//! `pl-reconciler snapshot save | restore`: the control plane's state as one archive, for
//! disaster recovery. An archive is a tar, encrypted with age to the recipients the operator
//! names, holding `manifest.json` (each file's original path, size, mode and SHA-256), a
//! consistent copy of a SQLite ledger taken while the daemon serves (`VACUUM INTO`), and the
//! files the configuration names (the configuration itself, the control CA and its key, the
//! age identity, the API's certificate, trust files, webhook secrets, the ACME account). A
//! PostgreSQL ledger is not in it: `pg_dump` is its pair (docs/operations.md).
//!
//! Restore refuses before it writes anything: an archive that does not decrypt with the
//! identity given, a manifest that does not read or a file whose digest or size differs from
//! it, and any file (the ledger included) that already exists where it would go: it never
//! writes over a live ledger or a key in use.

use crate::config::Config;
use crate::store::Ledger;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// What an archive says of itself.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Manifest {
    /// 1.
    pub format: u32,
    pub created_at_ms: i64,
    /// `sqlite` (its copy is `ledger`) or `postgres` (not in the archive).
    pub backend: String,
    /// The SQLite ledger's copy, kept at `path` (the ledger's file).
    pub ledger: Option<Entry>,
    pub files: Vec<Entry>,
}

/// One file of an archive: its name in the tar (`files/N`, `ledger.sqlite`), where it came
/// from and goes back to, its size, mode and SHA-256 (hex).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Entry {
    pub name: String,
    pub path: PathBuf,
    pub bytes: u64,
    pub mode: u32,
    pub sha256: String,
}

/// Why a snapshot was not saved or restored; each with a stable code.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("no recipient: name at least one age or SSH public key to encrypt the snapshot to")]
    NoRecipients,
    #[error("{0}")]
    BadRecipient(String),
    #[error("{0} exists: a snapshot never replaces a file")]
    OutputExists(PathBuf),
    #[error("the snapshot does not decrypt with this identity: {0}")]
    Undecryptable(String),
    #[error("the snapshot is not one pl-reconciler wrote: {0}")]
    Malformed(String),
    #[error("{name} does not match the manifest: {why}")]
    ManifestMismatch { name: String, why: String },
    #[error("{0} exists: restore writes only where nothing is (stop the daemon and move the old state away first)")]
    WouldOverwrite(PathBuf),
    #[error("the ledger: {0}")]
    Ledger(String),
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
}

impl SnapshotError {
    pub fn code(&self) -> &'static str {
        match self {
            SnapshotError::NoRecipients => "snapshot-no-recipients",
            SnapshotError::BadRecipient(_) => "snapshot-bad-recipient",
            SnapshotError::OutputExists(_) => "snapshot-output-exists",
            SnapshotError::Undecryptable(_) => "snapshot-undecryptable",
            SnapshotError::Malformed(_) => "snapshot-malformed",
            SnapshotError::ManifestMismatch { .. } => "snapshot-manifest-mismatch",
            SnapshotError::WouldOverwrite(_) => "restore-would-overwrite",
            SnapshotError::Ledger(_) => "snapshot-ledger-failed",
            SnapshotError::Io { .. } => "snapshot-io",
        }
    }
}

/// A private work folder, removed when dropped.
struct WorkDir(PathBuf);

impl WorkDir {
    fn new(near: &Path, what: &str) -> Result<WorkDir, SnapshotError> {
        use std::os::unix::fs::DirBuilderExt;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = near.join(format!(".pl-{what}-{}-{nanos}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(io(format!("making {}", dir.display())))?;
        Ok(WorkDir(dir))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> SnapshotError {
    let what = what.into();
    move |source| SnapshotError::Io { what, source }
}

/// The most files an archive holds, and the largest manifest: a crafted archive cannot make a
/// restore read without end.
pub const MAX_FILES: usize = 256;
const MAX_MANIFEST_BYTES: u64 = 256 * 1024;

/// The path of a `sqlite://` ledger's file (its query dropped).
pub fn sqlite_file(url: &str) -> Option<PathBuf> {
    let rest = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:"))?;
    Some(PathBuf::from(rest.split('?').next().unwrap_or(rest)))
}

/// A file's size, mode and SHA-256.
fn digest(path: &Path) -> Result<(u64, u32, String), SnapshotError> {
    use std::os::unix::fs::PermissionsExt;
    let mut f = std::fs::File::open(path).map_err(io(format!("reading {}", path.display())))?;
    let mode = f
        .metadata()
        .map_err(io(format!("reading {}", path.display())))?
        .permissions()
        .mode()
        & 0o7777;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut bytes = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(io(format!("reading {}", path.display())))?;
        if n == 0 {
            break;
        }
        bytes += n as u64;
        h.update(&buf[..n]);
    }
    Ok((bytes, mode, hex::encode(h.finalize())))
}

/// Saves the state `config` (read from `config_path`) names, with a copy of `ledger`, to `out`,
/// encrypted to `recipients`. The copy is taken while the daemon serves.
pub async fn save(
    config_path: &Path,
    config: &Config,
    ledger: &Ledger,
    out: &Path,
    recipients: &[String],
    now_ms: i64,
) -> Result<Manifest, SnapshotError> {
    if recipients.is_empty() {
        return Err(SnapshotError::NoRecipients);
    }
    let parsed = recipients
        .iter()
        .map(|r| pushleft_secrets::parse_recipient(r).map_err(|e| SnapshotError::BadRecipient(e.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    if out.exists() {
        return Err(SnapshotError::OutputExists(out.to_owned()));
    }
    let beside = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let work = WorkDir::new(beside, "snapshot")?;
    let ledger_copy = copy_ledger(config, ledger, work.path()).await?;
    let mut sources: Vec<PathBuf> = vec![std::path::absolute(config_path).map_err(io("the configuration's path"))?];
    sources.extend(config.state_files());
    sources.truncate(MAX_FILES);
    let mut files = Vec::new();
    for (i, path) in sources.iter().enumerate() {
        let (bytes, mode, sha256) = digest(path)?;
        files.push(Entry {
            name: format!("files/{i}"),
            path: path.clone(),
            bytes,
            mode,
            sha256,
        });
    }
    let manifest = Manifest {
        format: 1,
        created_at_ms: now_ms,
        backend: if ledger_copy.is_some() { "sqlite" } else { "postgres" }.into(),
        ledger: ledger_copy.as_ref().map(|(_, e)| e.clone()),
        files,
    };
    // Written in the work folder beside `out`, then linked into place: a snapshot is whole
    // or absent, and never replaces a file.
    let partial = work.path().join("snapshot.age");
    let mut from: Vec<(PathBuf, &Entry)> = ledger_copy.iter().map(|(p, e)| (p.clone(), e)).collect();
    from.extend(sources.iter().cloned().zip(&manifest.files));
    write_archive(&partial, &parsed, &manifest, &from)?;
    std::fs::hard_link(&partial, out).map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => SnapshotError::OutputExists(out.to_owned()),
        _ => SnapshotError::Io {
            what: format!("writing {}", out.display()),
            source: e,
        },
    })?;
    Ok(manifest)
}

/// A SQLite ledger's consistent copy in `work`, with its entry; none for PostgreSQL.
async fn copy_ledger(config: &Config, ledger: &Ledger, work: &Path) -> Result<Option<(PathBuf, Entry)>, SnapshotError> {
    if ledger.backend() != crate::store::Backend::Sqlite {
        return Ok(None);
    }
    let copy = work.join("ledger.sqlite");
    ledger
        .copy_into(&copy)
        .await
        .map_err(|e| SnapshotError::Ledger(e.to_string()))?;
    let (bytes, mode, sha256) = digest(&copy)?;
    let path =
        sqlite_file(&config.ledger.url).ok_or_else(|| SnapshotError::Ledger("no file in the ledger's URL".into()))?;
    // A relative file is the daemon's working folder's, as SQLite opens it.
    let path = std::path::absolute(&path).map_err(io("the ledger's path"))?;
    let entry = Entry {
        name: "ledger.sqlite".into(),
        path,
        bytes,
        mode: mode | 0o600,
        sha256,
    };
    Ok(Some((copy, entry)))
}

/// The archive at `partial` (0600): the manifest, then each file `from` names, as a tar
/// encrypted to `recipients`.
fn write_archive(
    partial: &Path,
    recipients: &[Box<dyn age::Recipient + Send>],
    manifest: &Manifest,
    from: &[(PathBuf, &Entry)],
) -> Result<(), SnapshotError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(partial)
        .map_err(io("writing the snapshot"))?;
    let encryptor = age::Encryptor::with_recipients(recipients.iter().map(|r| r.as_ref() as &dyn age::Recipient))
        .map_err(|_| SnapshotError::NoRecipients)?;
    let sealed = encryptor.wrap_output(file).map_err(io("encrypting"))?;
    let mut tar = tar::Builder::new(sealed);
    let json = serde_json::to_vec_pretty(manifest).map_err(|e| SnapshotError::Malformed(e.to_string()))?;
    append(&mut tar, "manifest.json", &mut json.as_slice(), json.len() as u64)?;
    for (path, e) in from {
        let mut f = std::fs::File::open(path).map_err(io(format!("reading {}", path.display())))?;
        append(&mut tar, &e.name, &mut f, e.bytes)?;
    }
    let sealed = tar.into_inner().map_err(io("writing the snapshot"))?;
    sealed
        .finish()
        .map_err(io("encrypting"))?
        .sync_all()
        .map_err(io("writing the snapshot"))
}

fn append<W: Write>(
    tar: &mut tar::Builder<W>,
    name: &str,
    data: &mut dyn Read,
    bytes: u64,
) -> Result<(), SnapshotError> {
    let mut header = tar::Header::new_gnu();
    header.set_size(bytes);
    header.set_mode(0o600);
    header.set_cksum();
    tar.append_data(&mut header, name, data.take(bytes))
        .map_err(io(format!("writing {name}")))
}

/// Restores the archive at `archive`, decrypted with the identities in `identity`: every file
/// back where it came from, once every one of them was read whole and matched the manifest and
/// none of them exists. Returns the manifest.
pub fn restore(archive: &Path, identity: &Path) -> Result<Manifest, SnapshotError> {
    let identities =
        pushleft_secrets::load_identities(identity).map_err(|e| SnapshotError::Undecryptable(e.to_string()))?;
    let file = std::fs::File::open(archive).map_err(io(format!("reading {}", archive.display())))?;
    let decryptor =
        age::Decryptor::new(std::io::BufReader::new(file)).map_err(|e| SnapshotError::Undecryptable(e.to_string()))?;
    let reader = decryptor
        .decrypt(identities.iter().map(|i| i.as_ref() as &dyn age::Identity))
        .map_err(|e| SnapshotError::Undecryptable(e.to_string()))?;
    let mut tar = tar::Archive::new(reader);
    let mut entries = tar.entries().map_err(|e| SnapshotError::Malformed(e.to_string()))?;
    let manifest = read_manifest(&mut entries)?;
    let expected: Vec<&Entry> = manifest.ledger.iter().chain(&manifest.files).collect();
    // Each file read whole into a private folder, checked, and put in place only once all are.
    let staged = WorkDir::new(&std::env::temp_dir(), "restore")?;
    let mut ready: Vec<(PathBuf, &Entry)> = Vec::new();
    for (entry, want) in entries.zip(expected.iter()) {
        let entry = entry.map_err(|e| SnapshotError::Malformed(e.to_string()))?;
        let at = staged.path().join(ready.len().to_string());
        stage(entry, want, &at)?;
        ready.push((at, want));
    }
    if ready.len() != expected.len() {
        return Err(SnapshotError::ManifestMismatch {
            name: "the archive".into(),
            why: format!("{} files of the manifest's {}", ready.len(), expected.len()),
        });
    }
    for (at, e) in ready {
        put_in_place(&at, e)?;
    }
    Ok(manifest)
}

/// The archive's first entry, its manifest, read within its bound and checked: a known format,
/// at most [`MAX_FILES`] files, each going to an absolute path where nothing is.
fn read_manifest<R: Read>(entries: &mut tar::Entries<'_, R>) -> Result<Manifest, SnapshotError> {
    let mut first = entries
        .next()
        .ok_or_else(|| SnapshotError::Malformed("empty".into()))?
        .map_err(|e| SnapshotError::Malformed(e.to_string()))?;
    if first.path().ok().as_deref() != Some(Path::new("manifest.json")) || first.size() > MAX_MANIFEST_BYTES {
        return Err(SnapshotError::Malformed("no manifest first".into()));
    }
    let mut json = Vec::new();
    first
        .read_to_end(&mut json)
        .map_err(|e| SnapshotError::Malformed(e.to_string()))?;
    let manifest: Manifest = serde_json::from_slice(&json).map_err(|e| SnapshotError::Malformed(e.to_string()))?;
    let count = manifest.files.len() + usize::from(manifest.ledger.is_some());
    if manifest.format != 1 || count > MAX_FILES + 1 {
        return Err(SnapshotError::Malformed(format!(
            "format {}, {count} files",
            manifest.format
        )));
    }
    for e in manifest.ledger.iter().chain(&manifest.files) {
        if !e.path.is_absolute() {
            return Err(SnapshotError::Malformed(format!(
                "{} is not an absolute path",
                e.path.display()
            )));
        }
        if e.path.exists() {
            return Err(SnapshotError::WouldOverwrite(e.path.clone()));
        }
    }
    Ok(manifest)
}

/// One entry copied to `at` (0600), refused unless it is the file `want` names, whole.
fn stage<R: Read>(mut entry: tar::Entry<'_, R>, want: &Entry, at: &Path) -> Result<(), SnapshotError> {
    use std::os::unix::fs::OpenOptionsExt;
    let name = entry
        .path()
        .map_err(|e| SnapshotError::Malformed(e.to_string()))?
        .into_owned();
    if name != Path::new(&want.name) {
        return Err(SnapshotError::ManifestMismatch {
            name: name.display().to_string(),
            why: format!("expected {} here", want.name),
        });
    }
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(at)
        .map_err(io("staging"))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut bytes = 0u64;
    loop {
        let n = entry
            .read(&mut buf)
            .map_err(|e| SnapshotError::Malformed(e.to_string()))?;
        if n == 0 {
            break;
        }
        bytes += n as u64;
        h.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(io("staging"))?;
    }
    let sha = hex::encode(h.finalize());
    if bytes != want.bytes || sha != want.sha256 {
        return Err(SnapshotError::ManifestMismatch {
            name: want.name.clone(),
            why: format!(
                "{bytes} bytes with SHA-256 {sha}, the manifest says {} and {}",
                want.bytes, want.sha256
            ),
        });
    }
    Ok(())
}

/// A staged file copied to where it was saved from (the staging folder may be on another file
/// system), created 0600 and never over a file, then given its saved mode.
fn put_in_place(at: &Path, e: &Entry) -> Result<(), SnapshotError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    if let Some(dir) = e.path.parent() {
        std::fs::create_dir_all(dir).map_err(io(format!("making {}", dir.display())))?;
    }
    let mut dest = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&e.path)
        .map_err(|err| match err.kind() {
            std::io::ErrorKind::AlreadyExists => SnapshotError::WouldOverwrite(e.path.clone()),
            _ => SnapshotError::Io {
                what: format!("writing {}", e.path.display()),
                source: err,
            },
        })?;
    let mut src = std::fs::File::open(at).map_err(io("staging"))?;
    std::io::copy(&mut src, &mut dest).map_err(io(format!("writing {}", e.path.display())))?;
    dest.set_permissions(std::fs::Permissions::from_mode(e.mode & 0o777))
        .map_err(io("setting a mode"))?;
    dest.sync_all().map_err(io(format!("writing {}", e.path.display())))
}

/// How often the schedule looks whether a snapshot is due (and whether this daemon leads).
const LOOK_EVERY: std::time::Duration = std::time::Duration::from_secs(60);
/// How long after a failed attempt the next is made.
const RETRY_AFTER_MS: i64 = 3_600_000;

/// The leader's scheduled snapshots (`[snapshots]`): one every `every_hours` (the first at
/// start when none is that recent), written to `dir` as `pushleft-<UTC time>.snapshot`, each
/// attempt recorded in the ledger (its age is a metric), the oldest archives past `keep`
/// removed. A failure is retried after an hour. Runs until `stop` turns true.
pub async fn run_schedule(
    config_path: PathBuf,
    config: std::sync::Arc<Config>,
    ledger: std::sync::Arc<Ledger>,
    hub: std::sync::Arc<crate::hub::Hub>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let Some(plan) = config.snapshots.clone() else { return };
    let every_ms = i64::try_from(plan.every_hours).unwrap_or(24).saturating_mul(3_600_000);
    loop {
        // A standby looks every few seconds whether it leads now; the leader every minute.
        let leads = hub.leader.load(std::sync::atomic::Ordering::Relaxed);
        if leads {
            let now = crate::store::now_ms();
            match ledger.backups().snapshot_health().await {
                Ok((success, attempt, _)) if due(now, success, attempt, every_ms) => {
                    take_scheduled(&config_path, &config, &ledger, &plan, now).await;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "cannot read the snapshots' schedule"),
            }
        }
        let wait = if leads {
            LOOK_EVERY
        } else {
            std::time::Duration::from_secs(2)
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Whether a snapshot is due at `now`: none succeeded within `every_ms`, and no attempt failed
/// within the last hour.
pub fn due(now: i64, success: Option<i64>, attempt: Option<i64>, every_ms: i64) -> bool {
    let stale = success.is_none_or(|s| now - s >= every_ms);
    let failed_recently = attempt.is_some_and(|a| Some(a) != success && now - a < RETRY_AFTER_MS);
    stale && !failed_recently
}

async fn take_scheduled(
    config_path: &Path,
    config: &Config,
    ledger: &Ledger,
    plan: &crate::config::SnapshotsConfig,
    now: i64,
) {
    let name = format!("pushleft-{}.snapshot", utc_stamp(now));
    let out = plan.dir.join(&name);
    let (bytes, error) = match save(config_path, config, ledger, &out, &plan.recipients, now).await {
        Ok(_) => (std::fs::metadata(&out).map_or(0, |m| m.len()), String::new()),
        Err(e) => (0, format!("{e} [{}]", e.code())),
    };
    if error.is_empty() {
        tracing::info!(archive = %out.display(), bytes, "snapshot taken");
        let mut names: Vec<String> = std::fs::read_dir(&plan.dir)
            .map(|d| d.flatten().filter_map(|e| e.file_name().into_string().ok()).collect())
            .unwrap_or_default();
        names.sort();
        for old in to_prune(&names, plan.keep) {
            if let Err(e) = std::fs::remove_file(plan.dir.join(old)) {
                tracing::warn!(archive = %old, error = %e, "cannot remove an old snapshot");
            }
        }
    } else {
        tracing::warn!(archive = %out.display(), error = %error, "snapshot failed");
    }
    let path = out.display().to_string();
    if let Err(e) = ledger
        .backups()
        .record_snapshot(now, &path, i64::try_from(bytes).unwrap_or(i64::MAX), &error)
        .await
    {
        tracing::warn!(error = %e, "cannot record the snapshot");
    }
}

/// The archives of the schedule to remove: of the sorted names in the folder, those named
/// `pushleft-….snapshot` (no other file is touched) past the newest `keep`.
pub fn to_prune(sorted: &[String], keep: usize) -> Vec<&str> {
    let ours: Vec<&str> = sorted
        .iter()
        .map(String::as_str)
        .filter(|n| n.starts_with("pushleft-") && n.ends_with(".snapshot"))
        .collect();
    ours[..ours.len().saturating_sub(keep)].to_vec()
}

/// `20261206T071500Z` for a time in ms since the epoch (sortable as text).
fn utc_stamp(ms: i64) -> String {
    match time::OffsetDateTime::from_unix_timestamp(ms.div_euclid(1000)) {
        Ok(t) => format!(
            "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        ),
        Err(_) => format!("{ms}ms"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_is_due_when_none_is_recent_and_no_attempt_just_failed() {
        let h = 3_600_000;
        assert!(due(10 * h, None, None, 24 * h), "never taken");
        assert!(!due(10 * h, Some(9 * h), Some(9 * h), 24 * h), "taken an hour ago");
        assert!(due(40 * h, Some(9 * h), Some(9 * h), 24 * h), "a day and more ago");
        assert!(
            !due(40 * h, Some(9 * h), Some(40 * h - 60_000), 24 * h),
            "failed a minute ago"
        );
        assert!(due(42 * h, Some(9 * h), Some(40 * h), 24 * h), "failed two hours ago");
    }

    #[test]
    fn only_the_schedules_oldest_archives_are_pruned() {
        let names: Vec<String> = [
            "notes.txt",
            "pushleft-20261201T000000Z.snapshot",
            "pushleft-20261202T000000Z.snapshot",
            "pushleft-20261203T000000Z.snapshot",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(to_prune(&names, 2), ["pushleft-20261201T000000Z.snapshot"]);
        assert!(to_prune(&names, 5).is_empty());
        assert_eq!(utc_stamp(1_796_540_278_931), "20261206T065758Z");
        assert_eq!(utc_stamp(951_782_400_000), "20000229T000000Z", "a leap day");
        assert_eq!(utc_stamp(0), "19700101T000000Z");
    }
}
