//! The one kernel setting the ingress needs: `net.ipv4.tcp_migrate_req`.
//!
//! Caddy applies every admin-API change as a new configuration, and its listening sockets are
//! `SO_REUSEPORT`: the new configuration binds a socket beside the old one, then closes the old
//! one. The kernel resets every connection still waiting in the closed socket's accept queue,
//! unless `tcp_migrate_req` is 1 (Linux ≥ 5.14), which moves them to the socket that stays.
//! Those resets are failed requests to every site on the node, and an ACME CA's validation
//! request that meets one fails the order. Docker sets `ip_forward` for the same reason (a
//! host-wide setting its work needs); this one only changes what happens to connections a
//! closing `SO_REUSEPORT` socket would otherwise drop, so it is safe for every other program.
//! It is per network namespace: the agent sets it in its own, which is Caddy's.

use std::path::Path;

/// Where the setting lives.
pub const MIGRATE_REQ: &str = "/proc/sys/net/ipv4/tcp_migrate_req";

/// What [`migrate_requests`] found and did.
#[derive(Debug, PartialEq, Eq)]
pub enum Migrate {
    /// It was 1 already.
    AlreadyOn,
    /// It was 0; the agent set it to 1.
    TurnedOn,
    /// This kernel has no such setting (older than 5.14).
    Unsupported,
    /// It could not be read or written (the agent is not root, or `/proc/sys` is read-only).
    Failed(String),
}

/// Sets the setting at `path` to 1 when it is 0 (never to anything else).
pub fn migrate_requests(path: &Path) -> Migrate {
    let current = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Migrate::Unsupported,
        Err(e) => return Migrate::Failed(format!("reading {}: {e}", path.display())),
    };
    if current.trim() == "1" {
        return Migrate::AlreadyOn;
    }
    match std::fs::write(path, "1\n") {
        Ok(()) => Migrate::TurnedOn,
        Err(e) => Migrate::Failed(format!("writing {}: {e}", path.display())),
    }
}

/// [`migrate_requests`] on the real setting, logged.
pub fn ensure_migrate_requests() {
    match migrate_requests(Path::new(MIGRATE_REQ)) {
        Migrate::AlreadyOn => tracing::debug!(setting = "net.ipv4.tcp_migrate_req", "already 1"),
        Migrate::TurnedOn => tracing::info!(
            setting = "net.ipv4.tcp_migrate_req",
            value = 1,
            "set, so Caddy's reloads move waiting connections instead of resetting them"
        ),
        Migrate::Unsupported => tracing::warn!(
            setting = "net.ipv4.tcp_migrate_req",
            "this kernel (older than 5.14) cannot move waiting connections: each Caddy reload may reset a few"
        ),
        Migrate::Failed(error) => tracing::warn!(
            setting = "net.ipv4.tcp_migrate_req",
            %error,
            "not set: each Caddy reload may reset a few connections (set it to 1, or run the agent as root)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_the_setting_on_only_when_off() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tcp_migrate_req");
        assert_eq!(migrate_requests(&path), Migrate::Unsupported);
        std::fs::write(&path, "0\n").expect("write");
        assert_eq!(migrate_requests(&path), Migrate::TurnedOn);
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "1\n");
        assert_eq!(migrate_requests(&path), Migrate::AlreadyOn);
    }
}
