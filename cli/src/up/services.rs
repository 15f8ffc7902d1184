//! The services of a local control plane: `pl-reconciler` with its configuration, Caddy with
//! its admin socket in a private folder, and one `pl-agent` per node, enrolled once.

use super::local::{Local, Ports, Trust};
use super::processes::{alive, caddy_program, run_daemon, spawn_detached, stop, tail, tool};
use crate::client::Client;
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

impl Local {
    /// The reconciler, started when it does not run; waits until it answers.
    pub(crate) fn reconciler(&self, ports: Ports, trust: &Trust, previews: &[String]) -> Result<Client> {
        // HTTPS: certificates from a CA of the control plane's own, for `.localhost` names.
        let certificates = if ports.https != 0 {
            format!(
                "\n[certificates]\nissuer = \"local\"\nidentity = {:?}\n",
                super::local::CERTIFICATES_IDENTITY
            )
        } else {
            String::new()
        };
        let config = format!(
            "[source]\npath = {:?}\nbranch = \"main\"\npreview_branches = {:?}\n\n{}\n[ledger]\nurl = \"sqlite://{}\"\n\n[reconcile]\ninterval_seconds = 2\n\n[control]\nca_cert = \"tls/ca.crt\"\nca_key = \"tls/ca.key\"\n{}\n[agent_api]\nlisten = \"127.0.0.1:{}\"\n\n[api]\nlisten = \"127.0.0.1:{}\"\ntls_cert = \"tls/api.crt\"\ntls_key = \"tls/api.key\"\n\n[images]\ndir = \"images\"\n\n{}\n",
            self.path("mirror.git"),
            previews,
            trust.table(),
            self.path("ledger.db").display(),
            if self.path("age-identity").exists() {
                "age_identity = \"age-identity\"\n"
            } else {
                ""
            },
            ports.agent,
            ports.api,
            std::fs::read_to_string(self.path("tokens.toml"))?
        ) + &certificates;
        let pid = self.path("reconciler.pid");
        // A running reconciler with another configuration (the trust changed) starts anew.
        if std::fs::read_to_string(self.path("reconciler.toml")).ok().as_deref() != Some(config.as_str()) {
            stop(&pid, "pl-reconciler");
        }
        std::fs::write(self.path("reconciler.toml"), config)?;
        let mut started = run_daemon(
            "pl-reconciler",
            &self.path("reconciler.toml"),
            &self.path("reconciler.log"),
            &pid,
        )?;
        let client = Client::new(&self.server(ports))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if client.status().is_ok() {
                return Ok(client);
            }
            // (Just after the start, /proc may still show `pl`'s own command line: the child
            // itself says whether it ended.)
            let ended = match started.as_mut() {
                Some(child) => child.try_wait().ok().flatten().is_some(),
                None => alive(&pid, "pl-reconciler").is_none(),
            };
            if ended || Instant::now() > deadline {
                bail!(
                    "the local reconciler did not start; its log ({}) ends:\n{}",
                    self.path("reconciler.log").display(),
                    tail(&self.path("reconciler.log"))
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Caddy's admin socket, `caddy-admin/admin.sock` in the state folder: a folder of its own,
    /// 0700 like the state folder, so only this user reaches Caddy's unauthenticated admin API
    /// (on a TCP port every local user could rewrite its routes).
    pub(crate) fn caddy_admin(&self) -> Result<String> {
        let socket = self.path("caddy-admin").join("admin.sock");
        let text = socket.display().to_string();
        // sockaddr_un holds 107 bytes and a NUL.
        if text.len() > 107 || text.contains(['"', '\\']) {
            bail!(
                "Caddy's admin socket {text} is too long a path for a unix socket (or has a quote): set PL_STATE_DIR to a shorter folder"
            );
        }
        Ok(format!("unix/{text}"))
    }

    /// Caddy (≥ 2.8) for ingress, started when it does not run, its admin API on a unix socket
    /// in a 0700 folder.
    pub(crate) fn caddy(&self) -> Result<()> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let pid = self.path("caddy.pid");
        if alive(&pid, "caddy").is_some() {
            return Ok(());
        }
        let caddy = caddy_program()?;
        let admin = self.caddy_admin()?;
        let folder = self.path("caddy-admin");
        std::fs::DirBuilder::new().mode(0o700).recursive(true).create(&folder)?;
        std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o700))?;
        let socket = folder.join("admin.sock");
        let _ = std::fs::remove_file(&socket);
        std::fs::write(
            self.path("caddy.json"),
            serde_json::json!({"admin": {"listen": admin}}).to_string(),
        )?;
        spawn_detached(
            Command::new(caddy)
                .args(["run", "--config"])
                .arg(self.path("caddy.json"))
                .env("XDG_DATA_HOME", self.path("caddy-data"))
                .env("XDG_CONFIG_HOME", self.path("caddy-config")),
            &self.path("caddy.log"),
            &pid,
        )?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            if Instant::now() > deadline {
                bail!("Caddy did not start; its log ends:\n{}", tail(&self.path("caddy.log")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// The folder of `node`'s agent: its enrolment (`node/`), configuration, pid, log, state
    /// and secrets. Each node this machine runs has one; they share Caddy and its upstreams.
    pub(crate) fn agent_dir(&self, node: &str) -> PathBuf {
        self.path("agents").join(node)
    }

    /// The nodes enrolled here before, by name.
    pub(crate) fn enrolled_nodes(&self) -> Vec<String> {
        let mut out: Vec<String> = std::fs::read_dir(self.path("agents"))
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().join("node").join(pushleft_agent_files::CERT).exists())
                    .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        out.sort();
        out
    }

    /// The pid files of every agent this state folder started.
    pub(crate) fn agent_pids(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.path("agents"))
            .map(|d| d.flatten().map(|e| e.path().join("agent.pid")).collect())
            .unwrap_or_default()
    }

    /// A node's agent: enrolled once, started when it does not run; whether it was started now.
    pub(crate) fn agent(&self, client: &Client, ports: Ports, node: &str, docker: &Path) -> Result<bool> {
        let home = self.agent_dir(node);
        std::fs::create_dir_all(&home)?;
        let enrolled = home.join("node");
        if enrolled.join(pushleft_agent_files::CERT).exists()
            && !enrolled.join(pushleft_agent_files::CONTROL_PLANE).exists()
        {
            // Enrolled before control planes had ids: what that agent made names none, so it
            // enrols again (its old folder kept aside) and its objects are foreign from now on.
            let aside = home.join("node.before-control-plane-id");
            let _ = std::fs::remove_dir_all(&aside);
            std::fs::rename(&enrolled, &aside)?;
        }
        if !enrolled.join(pushleft_agent_files::CERT).exists() {
            let deadline = Instant::now() + Duration::from_secs(30);
            let token = loop {
                match client.node_token(node) {
                    Ok(t) => break zeroize::Zeroizing::new(t.token),
                    Err(e) if Instant::now() > deadline => {
                        return Err(e.context(format!("no enrolment token for node {node}")));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(200)),
                }
            };
            let fingerprint = std::fs::read_to_string(self.path("ca.fingerprint"))?;
            let mut enroll = Command::new(tool("pl-agent")?);
            enroll
                .args(["enroll", "--control", &format!("https://localhost:{}", ports.api)])
                .args(["--ca-fingerprint", fingerprint.trim(), "--node", node, "--dir"])
                .arg(&enrolled)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            let mut child = enroll.spawn().context("pl-agent enroll")?;
            if let Some(mut stdin) = child.stdin.take() {
                use std::io::Write;
                stdin.write_all(token.as_bytes())?;
            }
            let o = child.wait_with_output()?;
            if !o.status.success() {
                bail!("enrolling node {node}: {}", String::from_utf8_lossy(&o.stderr).trim());
            }
        }
        // One machine: its agent joins no mesh between nodes (no WireGuard listener).
        let config = format!(
            "control = \"https://localhost:{}\"\ndir = \"node\"\ndocker_socket = {:?}\nsecrets_dir = \"secrets\"\nstate_dir = \"state\"\nheartbeat_seconds = 1\nparallel_environments = 16\ncaddy_admin = {:?}\ningress_listen = [\"127.0.0.1:{}\"]\ningress_upstreams = {:?}\ningress_host_suffix = \".localhost\"\ningress_tls_listen = [{}]\ningress_tls_dir = {:?}\ningress_certs_listen = \"127.0.0.1:{}\"\nbackup_roots = [{:?}, \"/var/backups/pushleft\"]\nmesh = false\n",
            ports.agent,
            docker.display().to_string(),
            self.caddy_admin()?,
            ports.http,
            self.path("ingress").display().to_string(),
            if ports.https != 0 {
                format!("\"127.0.0.1:{}\"", ports.https)
            } else {
                String::new()
            },
            self.path("ingress-tls").display().to_string(),
            ports.certs,
            // Repositories on this machine: under the state folder (`<state>/backups/...`),
            // or where a node's agent keeps them by default.
            self.path("backups").display().to_string(),
        );
        // A running agent with another configuration (HTTPS turned on, say) starts anew.
        if std::fs::read_to_string(home.join("agent.toml")).ok().as_deref() != Some(config.as_str()) {
            stop(&home.join("agent.pid"), "pl-agent");
        }
        std::fs::write(home.join("agent.toml"), config)?;
        let started = run_daemon(
            "pl-agent",
            &home.join("agent.toml"),
            &home.join("agent.log"),
            &home.join("agent.pid"),
        )?;
        Ok(started.is_some())
    }
}

/// Names of the enrolment folder's files (the agent's own, repeated: `pl` links no agent).
mod pushleft_agent_files {
    pub const CERT: &str = "node.crt";
    pub const CONTROL_PLANE: &str = "control-plane";
}
