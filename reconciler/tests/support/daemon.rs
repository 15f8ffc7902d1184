//! Runs `pl-reconciler` as a real process for the end-to-end and fault tests, and talks to
//! its API over TLS with the CA `tls-init` made.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The `pl-reconciler` binary: cargo's own path for the reconciler's tests; for other
/// packages' tests, the one beside them in the target folder (built on demand when missing;
/// `cargo test --workspace`, as CI runs it, builds it fresh with everything else, while a
/// `cargo test -p` of another package after changing the daemon wants a
/// `cargo build -p reconciler` first). `PLBENCH_DAEMON` names another build's daemon, so one
/// bench binary can measure two builds side by side.
pub fn bin() -> PathBuf {
    if let Some(p) = std::env::var_os("PLBENCH_DAEMON") {
        return p.into();
    }
    if let Some(p) = option_env!("CARGO_BIN_EXE_pl-reconciler") {
        return p.into();
    }
    let exe = std::env::current_exe().expect("test binary path");
    let target = exe.parent().and_then(Path::parent).expect("target folder");
    let bin = target.join("pl-reconciler");
    if !bin.exists() {
        let s = Command::new(env!("CARGO"))
            .args(["build", "-q", "-p", "reconciler", "--bin", "pl-reconciler"])
            .status()
            .expect("cargo builds pl-reconciler");
        assert!(s.success());
    }
    bin
}

pub use test_ports::free_port;

/// Makes the CA and API certificate once per folder, and tokens for each role.
pub struct Setup {
    pub dir: PathBuf,
    pub viewer: String,
    pub operator: String,
    pub admin: String,
    pub token_lines: String,
}

pub fn setup(dir: &Path) -> Setup {
    let tls = dir.join("tls");
    if !tls.join("ca.crt").exists() {
        let o = Command::new(bin())
            .args(["tls-init", "--dir"])
            .arg(&tls)
            .output()
            .expect("tls-init");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let mut lines = String::new();
    let mut tokens = Vec::new();
    for role in ["viewer", "operator", "admin"] {
        let out = dir.join(format!("{role}.token"));
        let _ = std::fs::remove_file(&out);
        let o = Command::new(bin())
            .args(["token", "--name", role, "--role", role, "--out"])
            .arg(&out)
            .output()
            .expect("token");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        lines.push_str(&String::from_utf8_lossy(&o.stdout));
        lines.push('\n');
        tokens.push(std::fs::read_to_string(&out).expect("token file").trim().to_owned());
    }
    Setup {
        dir: dir.to_owned(),
        viewer: tokens[0].clone(),
        operator: tokens[1].clone(),
        admin: tokens[2].clone(),
        token_lines: lines,
    }
}

/// A configuration file for a daemon on `port`. A daemon without a control CA (`extra` names
/// none) has no agents to hear from: its ledger is migrated now and the pool's node `n1`
/// marked as a heartbeating agent, so placement has a node to use (`n2` stays unseen).
pub fn config(s: &Setup, name: &str, repo: &Path, ledger_url: &str, port: u16, extra: &str) -> PathBuf {
    if !extra.contains("ca_cert") {
        nodes_up(ledger_url, &["n1"]);
    }
    let text = format!(
        "[source]\npath = {repo:?}\npreview_branches = [\"feature/*\"]\n\n[trust]\nallowed_signers = \"allowed_signers\"\n\n[ledger]\nurl = {ledger_url:?}\nmax_connections = 4\n\n[reconcile]\ninterval_seconds = 2\n\n{extra}\n[api]\nlisten = \"127.0.0.1:{port}\"\ntls_cert = \"tls/api.crt\"\ntls_key = \"tls/api.key\"\n\n{}",
        s.token_lines
    );
    let path = s.dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).expect("config");
    path
}

/// The `[control]` table naming the CA `setup` made: what enrolment and the agent API need.
pub const CONTROL_CA: &str = "[control]\nca_cert = \"tls/ca.crt\"\nca_key = \"tls/ca.key\"\n";

pub struct Daemon {
    pub child: Child,
    pub port: u16,
    agent: ureq::Agent,
    tls: ureq::tls::TlsConfig,
    pub log: PathBuf,
}

impl Daemon {
    pub fn start(s: &Setup, config: &Path, port: u16) -> Daemon {
        Daemon::start_with(s, config, port, None)
    }

    /// Starts the daemon, with its open-file limit set to `nofile` when given (through
    /// util-linux's `prlimit`), as systemd's default of 1,024 would.
    pub fn start_with(s: &Setup, config: &Path, port: u16, nofile: Option<u64>) -> Daemon {
        let log = config.with_extension(format!("{}.log", std::process::id()));
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("log");
        let mut command = match nofile {
            Some(n) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={n}:{n}")).arg("--").arg(bin());
                c
            }
            None => Command::new(bin()),
        };
        let child = command
            .args(["run", "--config"])
            .arg(config)
            // A bench may ask for more (`PLBENCH_LOG=info,reconciler::ops::group=debug`).
            .env(
                "PL_LOG",
                std::env::var("PLBENCH_LOG").unwrap_or_else(|_| "info".to_owned()),
            )
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("pl-reconciler starts");
        let pem = std::fs::read(s.dir.join("tls/ca.crt")).expect("ca");
        let ca = ureq::tls::Certificate::from_pem(&pem).expect("pem").to_owned();
        let tls = ureq::tls::TlsConfig::builder()
            .root_certs(ureq::tls::RootCerts::Specific(Arc::new(vec![ca])))
            .build();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .tls_config(tls.clone())
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .into();
        Daemon {
            child,
            port,
            agent,
            tls,
            log,
        }
    }

    /// The agent this daemon's requests go through (TLS to its CA, 10 s per request).
    pub fn agent(&self) -> &ureq::Agent {
        &self.agent
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.port)
    }

    /// GET with an optional token: (status, body).
    pub fn get(&self, path: &str, token: Option<&str>) -> (u16, String) {
        let mut req = self.agent.get(&self.url(path));
        if let Some(t) = token {
            req = req.header("authorization", &format!("Bearer {t}"));
        }
        match req.call() {
            Ok(mut r) => (r.status().as_u16(), r.body_mut().read_to_string().unwrap_or_default()),
            Err(_) => (0, String::new()),
        }
    }

    /// GET with an `Authorization` header as given: (status, body).
    pub fn get_with_header(&self, path: &str, authorization: &str) -> (u16, String) {
        match self
            .agent
            .get(&self.url(path))
            .header("authorization", authorization)
            .call()
        {
            Ok(mut r) => (r.status().as_u16(), r.body_mut().read_to_string().unwrap_or_default()),
            Err(_) => (0, String::new()),
        }
    }

    /// GET with a token and headers: (status, the `ETag` header, body).
    pub fn get_with(&self, path: &str, token: &str, headers: &[(&str, &str)]) -> (u16, Option<String>, String) {
        let mut req = self
            .agent
            .get(&self.url(path))
            .header("authorization", &format!("Bearer {token}"));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        match req.call() {
            Ok(mut r) => {
                let etag = r.headers().get("etag").and_then(|v| v.to_str().ok()).map(str::to_owned);
                (
                    r.status().as_u16(),
                    etag,
                    r.body_mut().read_to_string().unwrap_or_default(),
                )
            }
            Err(_) => (0, None, String::new()),
        }
    }

    pub fn post(&self, path: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, String) {
        let mut req = self.agent.post(&self.url(path));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        match req.send(body) {
            Ok(mut r) => (r.status().as_u16(), r.body_mut().read_to_string().unwrap_or_default()),
            Err(_) => (0, String::new()),
        }
    }

    /// Opens an event stream (`/v1/events/stream…`): the status and, on 200, a line reader.
    /// Every read is bounded (30 s in all), so a stream that stops sending fails the test
    /// instead of hanging it.
    pub fn stream(&self, path: &str, token: &str) -> (u16, Option<Box<dyn std::io::BufRead + Send>>) {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .tls_config(self.tls.clone())
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .into();
        match agent
            .get(&self.url(path))
            .header("authorization", &format!("Bearer {token}"))
            .call()
        {
            Ok(r) if r.status() == 200 => {
                let reader = r.into_body().into_reader();
                (200, Some(Box::new(std::io::BufReader::new(reader))))
            }
            Ok(r) => (r.status().as_u16(), None),
            Err(_) => (0, None),
        }
    }

    /// A one-time enrolment token for `node`, asked for with `operator`'s token, retried (for
    /// at most 10 s) until the commit declaring the node is accepted.
    pub fn enrolment_token(&self, node: &str, operator: &str) -> String {
        let auth = format!("Bearer {operator}");
        for _ in 0..200 {
            let (status, body) = self.post(
                &format!("/v1/nodes/{node}/token"),
                &[("authorization", auth.as_str())],
                b"",
            );
            if status == 200 {
                let v: serde_json::Value = serde_json::from_str(&body).expect("token JSON");
                return v["token"].as_str().expect("token").to_owned();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("no enrolment token for {node}");
    }

    /// Waits until `/readyz` answers 200.
    pub fn wait_ready(&mut self, within: Duration) {
        let start = Instant::now();
        while start.elapsed() < within {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!(
                    "the daemon exited ({st}): {}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            if self.get("/readyz", None).0 == 200 {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "not ready in {within:?}: {}",
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }

    pub fn is_leader(&self, token: &str) -> bool {
        let (code, body) = self.get("/v1/status", Some(token));
        code == 200 && body.contains("\"leader\":true")
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait: the exit status.
    pub fn term(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        self.child.wait().expect("wait")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes a file only its owner can read (a webhook secret, a key), as the daemon requires.
pub fn write_private(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
}

/// Migrates the ledger at `url` (the same migrations the daemon runs) and marks `nodes` as
/// enrolled agents that heartbeat: seen in the year 2100 (never silent while a test runs) and
/// able to run every task. Runs on a thread of its own, so it can be called from inside a
/// runtime; uses sqlx directly, so crates that must not link the reconciler can use it.
pub fn nodes_up(url: &str, nodes: &[&str]) {
    let url = url.to_owned();
    let nodes: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
    block_on(async move {
        sqlx::any::install_default_drivers();
        let sqlite = url.starts_with("sqlite:");
        let connect = if sqlite && !url.contains("mode=") {
            format!("{url}?mode=rwc")
        } else {
            url.clone()
        };
        let pool = sqlx::AnyPool::connect(&connect).await.expect("connect");
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../migrations")
            .join(if sqlite { "sqlite" } else { "postgres" });
        sqlx::migrate::Migrator::new(dir)
            .await
            .expect("migrations")
            .run(&pool)
            .await
            .expect("migrate");
        for node in &nodes {
            // Any valid X25519 recipient: nothing is ever sealed to it in these tests.
            let sql = format!(
                "INSERT INTO nodes (name, age_recipient, enrolled_at, last_seen, capabilities) \
                     VALUES ('{node}', '{TEST_RECIPIENT}', 0, 4102444800000, 'docker,ingress,nftables,routes') \
                     ON CONFLICT (name) DO UPDATE SET last_seen = excluded.last_seen, capabilities = excluded.capabilities"
            );
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&pool)
                .await
                .expect("node up");
        }
        pool.close().await;
    })
}

/// A valid age recipient for nodes the tests mark up.
pub const TEST_RECIPIENT: &str = "age1yps55uerg0zakklqmyf0lmwnc25htzz0zpz9j9paepqrty8d9a3q6xx2ul";

/// Runs `work` to its end on a runtime and a thread of its own, so that it can be called
/// from inside a runtime too.
pub fn block_on<T: Send + 'static>(work: impl std::future::Future<Output = T> + Send + 'static) -> T {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(work)
    })
    .join()
    .expect("the work ran")
}

/// Runs one statement on the ledger at `url` (a test's way to set what no API sets directly).
pub fn execute(url: &str, statement: &str) {
    let (url, statement) = (url.to_owned(), statement.to_owned());
    block_on(async move {
        sqlx::any::install_default_drivers();
        let pool = sqlx::AnyPool::connect(&url).await.expect("connect");
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(&pool)
            .await
            .expect("statement");
        pool.close().await;
    })
}

/// The first column of each row `sql` returns from the ledger at `url`, as text.
pub fn rows(url: &str, sql: &str) -> Vec<String> {
    use sqlx::Row;
    let (url, sql) = (url.to_owned(), sql.to_owned());
    block_on(async move {
        sqlx::any::install_default_drivers();
        let pool = sqlx::AnyPool::connect(&url).await.expect("connect");
        let out = sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(&pool)
            .await
            .expect("query")
            .iter()
            .map(|r| {
                r.try_get::<String, _>(0)
                    .unwrap_or_else(|_| r.get::<i64, _>(0).to_string())
            })
            .collect();
        pool.close().await;
        out
    })
}
