//! What the agent's tests share: reading the ledger file directly, for facts the API does not
//! show (the agent itself never sees SQL).
#![allow(dead_code)]

/// Runs `q` on the ledger at `url`: an `UPDATE` returns nothing, a query its first column as text.
pub fn sql(url: &str, q: &str) -> Vec<String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    rt.block_on(async {
        sqlx::any::install_default_drivers();
        let pool = sqlx::AnyPool::connect(url).await.expect("ledger");
        if q.starts_with("UPDATE") {
            sqlx::query(sqlx::AssertSqlSafe(q.to_owned()))
                .execute(&pool)
                .await
                .expect("update");
            return Vec::new();
        }
        let rows: Vec<(String,)> = sqlx::query_as(sqlx::AssertSqlSafe(q.to_owned()))
            .fetch_all(&pool)
            .await
            .expect("rows");
        rows.into_iter().map(|r| r.0).collect()
    })
}

/// A new age identity made by `age-keygen` at `path` (mode 0600): its recipient.
pub fn age_keygen(path: &std::path::Path) -> String {
    use std::os::unix::fs::PermissionsExt;
    let o = std::process::Command::new("age-keygen")
        .arg("-o")
        .arg(path)
        .output()
        .expect("age-keygen");
    assert!(o.status.success());
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    std::fs::read_to_string(path)
        .expect("key")
        .lines()
        .find_map(|l| l.strip_prefix("# public key: "))
        .expect("public key")
        .to_owned()
}

/// Runs `age ARGS` with `input` on stdin: its stdout when it succeeds.
fn age(args: &[&std::ffi::OsStr], input: &str) -> Option<String> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("age")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("age");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write");
    let o = child.wait_with_output().expect("age");
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

/// `age --armor -r RECIPIENT` of `plaintext` (the real CLI, through stdin).
pub fn age_encrypt(plaintext: &str, recipient: &str) -> String {
    age(&["--armor".as_ref(), "-r".as_ref(), recipient.as_ref()], plaintext).expect("age encrypts")
}

/// `age -d -i IDENTITY` of `armored`, or `None` when that identity cannot open it.
pub fn age_decrypt(armored: &str, identity: &std::path::Path) -> Option<String> {
    age(&["-d".as_ref(), "-i".as_ref(), identity.as_os_str()], armored)
}

/// The `--ca-fingerprint` of a PEM CA, as `pl-agent enroll` takes it: `SHA256:<hex>`.
pub fn ca_pin(pem: &str) -> String {
    use sha2::Digest;
    let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).expect("pem");
    let hex: String = sha2::Sha256::digest(&p.contents)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("SHA256:{hex}")
}

/// One request for `host` to a server on loopback `port`, on a connection of its own (as
/// `curl` in a loop): (status, trimmed body), or why not. Bounded at 2 s.
pub fn get_host(port: u16, host: &str) -> Result<(u16, String), String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_idle_connections(0)
        .timeout_global(Some(std::time::Duration::from_secs(2)))
        .build()
        .into();
    let mut r = agent
        .get(&format!("http://127.0.0.1:{port}/"))
        .header("Host", host)
        .call()
        .map_err(|e| e.to_string())?;
    let status = r.status().as_u16();
    Ok((
        status,
        r.body_mut().read_to_string().unwrap_or_default().trim().to_owned(),
    ))
}

/// `pl-agent run --config CONFIG` (the binary `bin`), its log appended to `log`, in a process
/// group of its own: SIGKILL to the group takes the agent and its `nft` at once, as systemd's
/// `KillMode=control-group` does.
pub fn spawn_agent(bin: &str, config: &std::path::Path, log: &std::path::Path) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let err = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log");
    std::process::Command::new(bin)
        .args(["run", "--config"])
        .arg(config)
        .env("PL_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(err)
        .process_group(0)
        .spawn()
        .expect("pl-agent run")
}
