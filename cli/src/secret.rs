//! `pl secret`: set, show, edit and re-key the values of a Secret document. Values come from
//! stdin or an editor, never from arguments; files are replaced atomically; every refusal
//! happens before anything is written.

use anyhow::{Context, bail};
use pushleft_secrets::{self as secrets, SecretError};
use state_repo::load::load;
use state_repo::source::{Rev, StateRepo};
use state_schema::canonical::{self, Secrets};
use state_schema::model::{Ciphertext, Kind, Object, Spec};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// A refusal with its stable code in the message: `[code] message`.
fn refused(e: SecretError) -> anyhow::Error {
    anyhow::anyhow!("[{}] {e}", e.code())
}

/// The Secret `name` of the working tree, with the file it lives in.
struct Located {
    root: PathBuf,
    file: String,
    line: u32,
    object: Object,
    control: Option<String>,
}

fn locate(dir: &Path, name: &str) -> anyhow::Result<Located> {
    let repo = StateRepo::open(dir)?;
    let loaded = load(&repo, &Rev::WorkTree)?;
    let Some(loc) = loaded.state.get(Kind::Secret, name) else {
        bail!("no Secret `{name}` in {}", dir.display());
    };
    if let Some(d) = loaded.diagnostics.iter().find(|d| d.file == loc.file) {
        bail!("{} has problems to fix first: {d}", loc.file);
    }
    Ok(Located {
        root: repo.root().to_owned(),
        file: loc.file.clone(),
        line: loc.pos.line,
        object: loc.object.clone(),
        control: loaded.state.repository().and_then(|r| r.control_recipient.clone()),
    })
}

fn secret_of(o: &Object) -> &state_schema::model::Secret {
    match &o.spec {
        Spec::Secret(s) => s,
        _ => unreachable!("located by kind Secret"),
    }
}

/// Writes the updated Secret back into its file, replacing only its document, atomically.
fn write_back(at: &Located, updated: Object) -> anyhow::Result<()> {
    let path = at.root.join(&at.file);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let doc = canonical::to_yaml(&canonical::document(&updated, Secrets::Ciphertext));
    let new_text = state_schema::edit::replace_document(&text, at.line, &doc)
        .context("the Secret's document moved while editing; run the command again")?;
    // Re-read what we are about to write: it must still be a valid Secret of that name.
    let check = state_schema::parse::parse_file(&at.file, new_text.as_bytes());
    if !check.diagnostics.is_empty() || !check.objects.iter().any(|l| l.object == updated) {
        bail!("internal check failed: the rewritten file would not hold the Secret; nothing was written");
    }
    let dir = path.parent().context("a file has a folder")?;
    let mut tmp =
        tempfile::NamedTempFile::new_in(dir).with_context(|| format!("creating a file in {}", dir.display()))?;
    tmp.write_all(new_text.as_bytes()).context("writing the new file")?;
    if let Ok(meta) = std::fs::metadata(&path) {
        let _ = std::fs::set_permissions(tmp.path(), meta.permissions());
    }
    tmp.persist(&path)
        .with_context(|| format!("replacing {}", path.display()))?;
    Ok(())
}

fn with_data(
    o: &Object,
    data: state_schema::values::SmallMap<String, Ciphertext>,
    recipients: Option<Vec<String>>,
) -> Object {
    let s = secret_of(o);
    Object {
        metadata: o.metadata.clone(),
        spec: Spec::Secret(state_schema::model::Secret {
            recipients: recipients.unwrap_or_else(|| s.recipients.clone()),
            data,
        }),
    }
}

fn check_key(key: &str) -> anyhow::Result<()> {
    let mut c = key.chars();
    let ok = c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_');
    if !ok {
        bail!("[invalid-name] `{key}` is not a valid key: use letters, digits and `_` (it becomes /run/secrets/{key})");
    }
    Ok(())
}

fn ciphertext(armored: &str) -> anyhow::Result<Ciphertext> {
    Ciphertext::new(armored).map_err(|i| anyhow::anyhow!("[malformed-armor] {}", i.message))
}

/// `pl secret set NAME KEY`: the value is read from stdin, byte for byte.
pub fn set(dir: &Path, name: &str, key: &str) -> anyhow::Result<u8> {
    check_key(key)?;
    let at = locate(dir, name)?;
    let mut value = Zeroizing::new(Vec::new());
    std::io::stdin()
        .lock()
        .take(secrets::MAX_VALUE_BYTES as u64 + 1)
        .read_to_end(&mut value)
        .context("reading the value from stdin")?;
    if value.len() > secrets::MAX_VALUE_BYTES {
        return Err(refused(SecretError::ValueTooLarge(value.len())));
    }
    let s = secret_of(&at.object);
    let armored = secrets::encrypt(&value, &s.recipients).map_err(refused)?;
    let mut data = s.data.clone();
    data.insert(key.to_owned(), ciphertext(&armored)?);
    write_back(&at, with_data(&at.object, data, None))?;
    eprintln!(
        "set {key} in Secret {name} ({}), encrypted to {} recipients",
        at.file,
        s.recipients.len()
    );
    Ok(0)
}

fn identities(identity: Option<&Path>) -> anyhow::Result<Vec<Box<dyn age::Identity + Send + Sync>>> {
    let path = match identity {
        Some(p) => p.to_owned(),
        None => match std::env::var_os("PL_AGE_IDENTITY") {
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ => return Err(refused(SecretError::NoIdentity)),
        },
    };
    secrets::load_identities(&path).map_err(refused)
}

fn decrypt_all(
    at: &Located,
    ids: &[Box<dyn age::Identity + Send + Sync>],
) -> anyhow::Result<Vec<(String, Zeroizing<Vec<u8>>)>> {
    secret_of(&at.object)
        .data
        .iter()
        .map(|(k, c)| {
            secrets::decrypt(c.armored(), ids)
                .map(|v| (k.clone(), v))
                .map_err(|e| refused(e).context(format!("decrypting {k}")))
        })
        .collect()
}

/// `pl secret show NAME [KEY]`: one value as raw bytes, or every value as `KEY=value` lines
/// (values JSON-quoted when they are not plain).
pub fn show(dir: &Path, name: &str, key: Option<&str>, identity: Option<&Path>) -> anyhow::Result<u8> {
    let at = locate(dir, name)?;
    let ids = identities(identity)?;
    let mut out = std::io::stdout().lock();
    match key {
        Some(k) => {
            let c = secret_of(&at.object)
                .data
                .get(k)
                .with_context(|| format!("Secret {name} has no key `{k}`"))?;
            let v = secrets::decrypt(c.armored(), &ids).map_err(refused)?;
            out.write_all(&v)?;
        }
        None => {
            for (k, v) in decrypt_all(&at, &ids)? {
                let text = String::from_utf8_lossy(&v);
                let plain = text.chars().all(|c| c.is_ascii_graphic() && c != '"' && c != '\\');
                let shown = if plain {
                    Zeroizing::new(text.into_owned())
                } else {
                    Zeroizing::new(serde_json::to_string(&text)?)
                };
                writeln!(out, "{k}={}", shown.as_str())?;
            }
        }
    }
    out.flush()?;
    Ok(0)
}

/// `pl secret recipients NAME --add KEY --remove KEY`: re-encrypts every value to the new set.
pub fn recipients(
    dir: &Path,
    name: &str,
    add: &[String],
    remove: &[String],
    identity: Option<&Path>,
) -> anyhow::Result<u8> {
    let at = locate(dir, name)?;
    let s = secret_of(&at.object);
    for r in add {
        secrets::parse_recipient(r).map_err(refused)?;
    }
    let mut set: Vec<String> = s
        .recipients
        .iter()
        .filter(|r| !remove.iter().any(|x| x.trim() == r.trim()))
        .cloned()
        .collect();
    for r in add {
        if !set.iter().any(|x| x.trim() == r.trim()) {
            set.push(r.trim().to_owned());
        }
    }
    if let Some(c) = &at.control
        && !set.iter().any(|r| r.trim() == c.trim())
    {
        bail!(
            "[secret-control-key-missing] the control recipient must stay on every Secret, or the control host cannot deliver it"
        );
    }
    if set.is_empty() {
        return Err(refused(SecretError::NoRecipients));
    }
    let ids = identities(identity)?;
    let mut data = state_schema::values::SmallMap::new();
    for (k, v) in decrypt_all(&at, &ids)? {
        data.insert(k, ciphertext(&secrets::encrypt(&v, &set).map_err(refused)?)?);
    }
    let n = set.len();
    write_back(&at, with_data(&at.object, data, Some(set)))?;
    eprintln!(
        "Secret {name}: {} values re-encrypted to {n} recipients",
        secret_of(&at.object).data.len()
    );
    Ok(0)
}

/// The values as `KEY: value` lines, in a new 0600 file.
fn write_plain(file: &Path, values: &[(String, Zeroizing<Vec<u8>>)]) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut body = Zeroizing::new(String::from(
        "# One `KEY: value` per line. Save and quit to re-encrypt; an unchanged file changes nothing.\n",
    ));
    for (k, v) in values {
        let text = Zeroizing::new(
            String::from_utf8(v.to_vec()).context("a value is not UTF-8; use `pl secret set` for binary values")?,
        );
        let rendered = Zeroizing::new(canonical::to_yaml(&serde_json::json!({ k.as_str(): text.as_str() })));
        body.push_str(&rendered);
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(file)?
        .write_all(body.as_bytes())?;
    Ok(())
}

/// Runs `$EDITOR` on `file` until it ends. While it runs, we must live to remove the file,
/// whatever ends the session: Ctrl-C goes to the editor and to us (the editor decides), and a
/// closed terminal (SIGHUP), a `kill` (SIGTERM) or Ctrl-\ (SIGQUIT) ends the editor and then
/// us, after the caller's private folder is removed.
fn run_editor(editor: &str, file: &Path) -> anyhow::Result<()> {
    let interrupted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let terminated = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut hooks = vec![
        signal_hook::flag::register(signal_hook::consts::SIGINT, interrupted.clone())
            .context("guarding against Ctrl-C")?,
    ];
    for sig in [
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
        signal_hook::consts::SIGQUIT,
    ] {
        hooks.push(signal_hook::flag::register(sig, terminated.clone()).context("guarding against signals")?);
    }
    let mut parts = editor.split_whitespace();
    let child = std::process::Command::new(parts.next().context("$EDITOR is empty")?)
        .args(parts)
        .arg(file)
        .spawn();
    let status = child.and_then(|mut c| {
        loop {
            if terminated.load(std::sync::atomic::Ordering::SeqCst) {
                let _ = c.kill();
                let _ = c.wait();
                return Err(std::io::Error::other("ended by a signal"));
            }
            if let Some(status) = c.try_wait()? {
                return Ok(status);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    });
    for hook in hooks {
        signal_hook::low_level::unregister(hook);
    }
    if terminated.load(std::sync::atomic::Ordering::SeqCst) {
        bail!("ended by a signal; the decrypted file was removed and nothing was changed");
    }
    let status = status.context("starting $EDITOR")?;
    if !status.success() || interrupted.load(std::sync::atomic::Ordering::SeqCst) {
        bail!("the editor did not finish cleanly; nothing was changed");
    }
    Ok(())
}

/// The edited `KEY: value` lines, each key checked.
fn read_edited(file: &Path) -> anyhow::Result<Vec<(String, Zeroizing<Vec<u8>>)>> {
    let edited = Zeroizing::new(std::fs::read_to_string(file).context("reading the edited values")?);
    let docs = state_schema::yaml::load_str(&edited)
        .map_err(|e| anyhow::anyhow!("the edited values are not YAML ({e}); nothing was changed"))?;
    let mut new_values: Vec<(String, Zeroizing<Vec<u8>>)> = Vec::new();
    if let Some(doc) = docs.first() {
        let state_schema::yaml::Value::Map(entries) = &doc.value else {
            bail!("the edited values must be `KEY: value` lines; nothing was changed")
        };
        for (k, v) in entries {
            let (state_schema::yaml::Value::Str(k), state_schema::yaml::Value::Str(v)) = (&k.value, &v.value) else {
                bail!(
                    "line {}: values must be strings (quote numbers); nothing was changed",
                    k.pos.line
                );
            };
            check_key(k)?;
            new_values.push((k.to_string(), Zeroizing::new(v.as_bytes().to_vec())));
        }
    }
    Ok(new_values)
}

/// `pl secret edit NAME`: the values in `$EDITOR`, from a 0600 file in a private folder that
/// is removed on every way out (success, error, panic, and Ctrl-C while the editor runs).
pub fn edit(dir: &Path, name: &str, identity: Option<&Path>) -> anyhow::Result<u8> {
    use std::os::unix::fs::PermissionsExt;
    let at = locate(dir, name)?;
    let ids = identities(identity)?;
    let values = decrypt_all(&at, &ids)?;
    let editor = std::env::var("VISUAL")
        .or_else(|_| std::env::var("EDITOR"))
        .context("set $EDITOR to edit secrets")?;
    let private = tempfile::Builder::new()
        .prefix("pl-secret-")
        .tempdir()
        .context("creating a private folder")?;
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700))?;
    let file = private.path().join(format!("{name}.yaml"));
    write_plain(&file, &values)?;
    run_editor(&editor, &file)?;
    let new_values = read_edited(&file)?;
    drop(private);
    // Keep the ciphertext of unchanged values, so re-saving an unchanged file is a no-op.
    let s = secret_of(&at.object);
    let mut data = state_schema::values::SmallMap::new();
    for (k, v) in &new_values {
        let old = values.iter().find(|(ok, ov)| ok == k && ov.as_slice() == v.as_slice());
        let c = match (old, s.data.get(k)) {
            (Some(_), Some(c)) => c.clone(),
            _ => ciphertext(&secrets::encrypt(v, &s.recipients).map_err(refused)?)?,
        };
        data.insert(k.clone(), c);
    }
    if data == s.data {
        eprintln!("no changes");
        return Ok(0);
    }
    write_back(&at, with_data(&at.object, data, None))?;
    eprintln!("Secret {name} updated");
    Ok(0)
}
