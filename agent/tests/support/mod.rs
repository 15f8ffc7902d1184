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
    get_host_path(port, host, "/")
}

/// [`get_host`] for `path`.
pub fn get_host_path(port: u16, host: &str, path: &str) -> Result<(u16, String), String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_idle_connections(0)
        .timeout_global(Some(std::time::Duration::from_secs(2)))
        .build()
        .into();
    let mut r = agent
        .get(&format!("http://127.0.0.1:{port}{path}"))
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

/// One call to Caddy's admin API on its unix socket, as HTTP/1.0 so the answer is plain and
/// ends with the connection (tests only; the agent uses `caddy_admin::Admin`): (status, body).
pub fn caddy_admin(socket: &std::path::Path, method: &str, path: &str) -> std::io::Result<(u16, String)> {
    caddy_admin_with(socket, method, path, "")
}

/// `POST /load` of a whole configuration (JSON) to Caddy's admin API.
pub fn caddy_admin_post_load(socket: &std::path::Path, config: &str) -> std::io::Result<(u16, String)> {
    caddy_admin_with(socket, "POST", "/load", config)
}

fn caddy_admin_with(socket: &std::path::Path, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(socket)?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
    let kind = if body.is_empty() {
        ""
    } else {
        "Content-Type: application/json\r\n"
    };
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: localhost\r\n{kind}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut answer = String::new();
    s.take(16 * 1024 * 1024).read_to_string(&mut answer)?;
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// A folder for Caddy's admin socket (0700, as the agent requires) and the address the agent
/// and Caddy take: `unix//<folder>/admin.sock`.
pub fn caddy_admin_address(folder: &std::path::Path) -> (std::path::PathBuf, String) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(folder).expect("admin folder");
    std::fs::set_permissions(folder, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let socket = folder.join("admin.sock");
    (socket.clone(), format!("unix/{}", socket.display()))
}

/// What a local unprivileged user gets: a probe run as `nobody` (uid and gid 65534) by
/// `python3` (std drops root's supplementary groups with the uid), one of
/// - `unix PATH`: a request to the unix socket at PATH (its status, or `denied`);
/// - `tcp PORT [HOST [PATH]]`: a request to 127.0.0.1:PORT (its status, or `refused`);
/// - `tls PORT PATH`: a request over TLS (the server's certificate unchecked, no client
///   certificate, no token) to 127.0.0.1:PORT (its status, or `handshake-refused`);
/// - `read PATH`: reading a file (`read`, or `denied`).
///
/// Bounded at 5 s; every address is loopback or a file of this machine.
pub fn as_nobody(args: &[&str]) -> String {
    use std::os::unix::process::CommandExt;
    const PROBE: &str = r#"
import socket, ssl, sys
what, target = sys.argv[1], sys.argv[2]
def ask(s, host, path="/config/"):
    s.settimeout(5)
    s.sendall(("GET %s HTTP/1.0\r\nHost: %s\r\n\r\n" % (path, host)).encode())
    head = s.recv(64).split(b" ")
    print(head[1].decode() if len(head) > 1 else "no-answer")
try:
    if what == "unix":
        s = socket.socket(socket.AF_UNIX)
        s.connect(target)
        ask(s, "localhost")
    elif what == "tcp":
        host = sys.argv[3] if len(sys.argv) > 3 else "nobody.localhost"
        ask(socket.create_connection(("127.0.0.1", int(target)), timeout=5), host, sys.argv[4] if len(sys.argv) > 4 else "/config/")
    elif what == "tls":
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        raw = socket.create_connection(("127.0.0.1", int(target)), timeout=5)
        try:
            s = context.wrap_socket(raw, server_hostname="localhost")
            ask(s, "localhost", sys.argv[3])
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
            print("handshake-refused")
    elif what == "read":
        open(target, "rb").read(1)
        print("read")
except PermissionError:
    print("denied")
except ConnectionRefusedError:
    print("refused")
except OSError as e:
    print("error", e.errno)
"#;
    let o = std::process::Command::new("python3")
        .arg("-c")
        .arg(PROBE)
        .args(args)
        .uid(65534)
        .gid(65534)
        .current_dir("/")
        .output()
        .expect("python3 as nobody");
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

/// The control plane id the tests that run an executor alone (no control plane) give it.
pub const TEST_CONTROL_PLANE: &str = "0123abcd";

/// The id of the control plane whose ledger is at `url` (made when its first node enrolled).
/// `pl`, built by the same `cargo test` (or built now when a test runs alone).
pub fn pl_binary() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let target = exe.parent().and_then(std::path::Path::parent).expect("target folder");
    let pl = target.join("pl");
    if !pl.exists() {
        let built = std::process::Command::new(env!("CARGO"))
            .args(["build", "-q", "-p", "pushleft-cli", "--bin", "pl"])
            .status()
            .expect("cargo builds pl");
        assert!(built.success());
    }
    pl
}

pub fn control_plane(url: &str) -> String {
    let ids = sql(url, "SELECT id FROM control_plane");
    assert_eq!(ids.len(), 1, "one control plane id in {url}");
    ids[0].clone()
}

/// The multi-threaded runtime (two workers) the executors run on in these tests.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Caddy run with `config` (JSON) written to `dir/caddy.json`, its data and configuration
/// homes inside `dir`.
pub fn spawn_caddy(dir: &std::path::Path, config: &str) -> std::process::Child {
    std::fs::create_dir_all(dir).expect("dir");
    let path = dir.join("caddy.json");
    std::fs::write(&path, config).expect("config");
    std::process::Command::new("caddy")
        .args(["run", "--config"])
        .arg(&path)
        .env("HOME", dir)
        .env("XDG_DATA_HOME", dir.join("data"))
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("caddy on PATH (scripts/test installs it)")
}

/// Caddy with its admin API on a unix socket in `dir`'s `caddy-admin` folder (0700), once the
/// API answers (the socket appears before Caddy has loaded its first configuration, and it
/// restarts its admin endpoint then): the socket, the address the agent takes, the process.
pub fn caddy_with_admin(dir: &std::path::Path) -> (std::path::PathBuf, String, std::process::Child) {
    let (socket, admin) = caddy_admin_address(&dir.join("caddy-admin"));
    let child = spawn_caddy(dir, &format!("{{\"admin\": {{\"listen\": \"{admin}\"}}}}"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !caddy_admin(&socket, "GET", "/config/").is_ok_and(|r| r.0 == 200) {
        assert!(std::time::Instant::now() < deadline, "Caddy's admin API never answered");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    (socket, admin, child)
}

/// A port on loopback for a test's listener (one counter per test process).
pub use test_ports::free_port;

/// Waits (10 s at most) until something listens on 127.0.0.1:`port`.
pub fn wait_port(port: u16) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Processes started in groups of their own (the agent, Caddy, a registry), killed with their
/// whole group when dropped.
pub struct KillGroups(pub Vec<std::process::Child>);

impl Drop for KillGroups {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = std::process::Command::new("kill")
                .args(["-9", "--", &format!("-{}", c.id())])
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The addresses in busybox `nslookup` output: those after the queried name (the server's own
/// address, `Address: 127.0.0.11:53`, comes before it).
pub fn nslookup_addresses(out: &str) -> Vec<String> {
    out.split_once("Name:")
        .map(|(_, answers)| answers)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Address:"))
        .map(|a| a.trim().to_owned())
        .collect()
}

/// A busybox httpd on a free loopback port serving `text` (plus a newline) as its index, from
/// a folder of `dir` named after it: the process and its `127.0.0.1:port`.
#[allow(dead_code)] // (the ingress tests' and the canary bench's)
pub fn text_server(dir: &std::path::Path, text: &str) -> (std::process::Child, String) {
    let www = dir.join(text.replace(' ', "-"));
    std::fs::create_dir_all(&www).expect("www");
    std::fs::write(www.join("index.html"), format!("{text}\n")).expect("index");
    let port = free_port();
    let child = std::process::Command::new("busybox")
        .args(["httpd", "-f", "-p", &format!("127.0.0.1:{port}"), "-h"])
        .arg(&www)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("busybox httpd");
    wait_port(port);
    (child, format!("127.0.0.1:{port}"))
}
