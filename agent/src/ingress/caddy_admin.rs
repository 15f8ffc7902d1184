//! Caddy's admin API, reached only through a unix socket in a folder private to the agent's
//! user.
//!
//! Why not TCP: Caddy's admin endpoint has no authentication. On `127.0.0.1:2019` every local
//! user could read and rewrite the configuration; the hardening review did exactly that as
//! `nobody`, adding a file server over the state folder through which it read the control CA's
//! key, the age identity and the admin token (Caddy runs as root). A unix socket is reachable
//! only by who may search its folder and write the socket, so the agent refuses any admin
//! address that is not `unix//<absolute path>` (Caddy's own notation) in a folder owned by the
//! agent's user and closed to group and others.
//!
//! The client is hyper's HTTP/1 connection API over a tokio unix stream, on a current-thread
//! runtime of each call: the ingress executor is blocking code (it holds file locks and sleeps
//! through drains), and every call site runs off the async threads.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How Caddy's admin listener is written for a unix socket.
pub const UNIX_PREFIX: &str = "unix/";
/// Longest an admin call may take, connection and body included.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// Largest answer read from Caddy (its whole configuration, with every route of ours).
pub const MAX_REPLY_BYTES: usize = 16 * 1024 * 1024;
/// A unix socket's path must fit `sockaddr_un` (108 bytes with its terminating NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Caddy's admin endpoint: the path of its unix socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admin {
    socket: PathBuf,
}

/// An answer: its status and body.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Bytes,
}

/// Why an admin call got no answer.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The socket could not be reached (Caddy down, or restarting its admin endpoint).
    #[error("connecting to {socket}: {source}")]
    Connect { socket: String, source: std::io::Error },
    #[error("{0}")]
    Http(String),
    /// The connection closed before the answer came (Caddy restarts its admin endpoint while
    /// it loads a configuration): a request may or may not have been applied.
    #[error("{0}")]
    Cut(String),
    #[error("no answer within {} s", TIMEOUT.as_secs())]
    Timeout,
    /// The socket's folder lets other local users in ([`Admin::check_private`]): not used.
    #[error("{0}")]
    Exposed(String),
}

impl AdminError {
    /// Whether a second try of `method` may succeed and is safe: the connection was refused
    /// (nothing was sent), or cut before the answer for a method that may be repeated (every
    /// one but `POST`, which appends).
    pub fn may_retry(&self, method: &str) -> bool {
        match self {
            AdminError::Connect { .. } => true,
            AdminError::Cut(_) => method != "POST",
            _ => false,
        }
    }
}

impl Admin {
    /// `unix//<absolute path>`, as Caddy's `admin.listen` takes it. A TCP address is refused:
    /// every local user could reach it.
    pub fn parse(address: &str) -> Result<Admin, String> {
        let Some(path) = address.strip_prefix(UNIX_PREFIX) else {
            return Err(format!(
                "caddy_admin {address:?} is not a unix socket: Caddy's admin API has no authentication, so on TCP every local user could rewrite its routes; use `unix//<absolute path>` in a folder only the agent's user can open (docs/security.md)"
            ));
        };
        let socket = PathBuf::from(path);
        if !socket.is_absolute() || socket.file_name().is_none() {
            return Err(format!("caddy_admin {address:?} must name an absolute socket path"));
        }
        if path.len() > MAX_SOCKET_PATH {
            return Err(format!(
                "caddy_admin {address:?} is longer than a unix socket path may be ({MAX_SOCKET_PATH} bytes)"
            ));
        }
        Ok(Admin { socket })
    }

    /// Caddy's notation of this endpoint (for its `admin.listen`).
    pub fn listen(&self) -> String {
        format!("{UNIX_PREFIX}{}", self.socket.display())
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The socket's folder must give group and others nothing (not even search), and belong to
    /// the agent's user, root, or the socket's owner (Caddy's own user, which may differ from
    /// the agent's): then no other local user can reach the socket, whatever mode Caddy gives
    /// it.
    pub fn check_private(&self) -> Result<(), String> {
        let dir = self.socket.parent().unwrap_or(Path::new("/"));
        let meta = std::fs::metadata(dir).map_err(|e| format!("the caddy_admin folder {}: {e}", dir.display()))?;
        let me = rustix::process::geteuid().as_raw();
        let caddy = std::fs::symlink_metadata(&self.socket).map(|m| m.uid()).ok();
        let owner_ok = meta.uid() == me || meta.uid() == 0 || Some(meta.uid()) == caddy;
        if !owner_ok || meta.mode() & 0o077 != 0 {
            return Err(format!(
                "the caddy_admin folder {} has mode {:o} and owner uid {}: it must be closed to group and others (chmod 700) and belong to the agent's user ({me}), root or Caddy's user, or other local users could reach Caddy's admin API",
                dir.display(),
                meta.mode() & 0o7777,
                meta.uid()
            ));
        }
        Ok(())
    }

    /// One request (`body` as JSON), on a connection of its own, within [`TIMEOUT`], its
    /// answer read up to [`MAX_REPLY_BYTES`]. Refused while the socket's folder is open to
    /// other users (checked on every call: a stat costs microseconds, and a folder's mode can
    /// change while the agent runs).
    pub fn call(&self, method: &str, path: &str, body: Option<&serde_json::Value>) -> Result<Reply, AdminError> {
        self.check_private().map_err(AdminError::Exposed)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| AdminError::Http(e.to_string()))?;
        let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        runtime.block_on(async {
            tokio::time::timeout(TIMEOUT, self.exchange(method, path, body))
                .await
                .unwrap_or(Err(AdminError::Timeout))
        })
    }

    async fn exchange(&self, method: &str, path: &str, body: Bytes) -> Result<Reply, AdminError> {
        let http = |e: &dyn std::fmt::Display| AdminError::Http(format!("caddy admin {method} {path}: {e}"));
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(|source| AdminError::Connect {
                socket: self.socket.display().to_string(),
                source,
            })?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| http(&e))?;
        let driver = tokio::spawn(connection);
        let request = hyper::Request::builder()
            .method(method)
            .uri(path)
            // Caddy requires a Host header; on a unix socket it checks no origin.
            .header(hyper::header::HOST, "localhost")
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .map_err(|e| http(&e))?;
        let answer = sender.send_request(request).await.map_err(|e| {
            if e.is_incomplete_message() || e.is_canceled() || e.is_closed() {
                AdminError::Cut(format!("caddy admin {method} {path}: {e}"))
            } else {
                http(&e)
            }
        })?;
        let status = answer.status().as_u16();
        let body = Limited::new(answer.into_body(), MAX_REPLY_BYTES)
            .collect()
            .await
            .map_err(|e| http(&e))?
            .to_bytes();
        driver.abort();
        Ok(Reply { status, body })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_absolute_unix_sockets_are_taken() {
        let a = Admin::parse("unix//run/pushleft/caddy/admin.sock").expect("unix");
        assert_eq!(a.socket(), Path::new("/run/pushleft/caddy/admin.sock"));
        assert_eq!(a.listen(), "unix//run/pushleft/caddy/admin.sock");
        for bad in [
            "http://127.0.0.1:2019",
            "127.0.0.1:2019",
            "localhost:2019",
            "unix/relative.sock",
            "unix//",
            &format!("unix//{}", "a".repeat(120)),
        ] {
            assert!(Admin::parse(bad).is_err(), "{bad} is refused");
        }
        let tcp = Admin::parse("http://127.0.0.1:2019").expect_err("tcp");
        assert!(tcp.contains("every local user"), "{tcp}");
    }

    #[test]
    fn a_folder_open_to_others_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let admin = Admin::parse(&format!("unix/{}/admin.sock", dir.path().display())).expect("parse");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");
        assert_eq!(admin.check_private(), Ok(()));
        for mode in [0o711, 0o750, 0o755, 0o701] {
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(mode)).expect("chmod");
            let e = admin.check_private().expect_err("open folder");
            assert!(e.contains("chmod 700"), "{mode:o}: {e}");
        }
    }

    #[test]
    fn nothing_listening_is_a_connection_error() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let admin = Admin::parse(&format!("unix/{}/admin.sock", dir.path().display())).expect("parse");
        let e = admin.call("GET", "/config/", None).expect_err("no socket");
        assert!(e.may_retry("GET") && e.may_retry("POST"), "nothing was sent: {e}");
    }

    #[test]
    fn a_cut_answer_is_retried_unless_it_appended() {
        // A server that reads the request and closes without answering, as Caddy's admin
        // endpoint does while it restarts.
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let socket = dir.path().join("admin.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
        std::thread::spawn(move || {
            for mut c in listener.incoming().take(2).flatten() {
                use std::io::Read;
                let mut buf = [0u8; 1024];
                let _ = c.read(&mut buf);
            }
        });
        let admin = Admin::parse(&format!("unix/{}", socket.display())).expect("parse");
        for method in ["GET", "POST"] {
            let e = admin.call(method, "/config/", None).expect_err("cut");
            assert!(matches!(e, AdminError::Cut(_)), "{e}");
            assert_eq!(e.may_retry(method), method != "POST", "{method}: {e}");
        }
    }
}
