//! Credentials for a registry: a file holding `username:password` on one line, mode 0600.
//!
//! `pl up --build` runs its registry on loopback, where every local user reaches it; with
//! credentials only the state folder's owner can list, pull or push its images. The agent
//! reads the file for each pull from that registry (`registry_auth` in its configuration) and
//! `pl-agent build` for its push (`--registry-auth`); the password travels to the engine in
//! the `X-Registry-Auth` header, never in an argument, a log line or an error.

use bollard::auth::DockerCredentials;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Largest credentials file read.
const MAX_BYTES: u64 = 4096;

/// The registry an image reference names (`127.0.0.1:5000` of `127.0.0.1:5000/a/b@sha256:…`),
/// when its first part is a host (it has a `.` or `:`, or is `localhost`), as Docker decides.
pub fn registry_of(image: &str) -> Option<&str> {
    let (first, _) = image.split_once('/')?;
    (first.contains(['.', ':']) || first == "localhost").then_some(first)
}

/// Reads `path`: `username:password`, for `registry`. Refused when group or others may read it
/// (the error names the file, never its content).
pub fn read(path: &Path, registry: &str) -> Result<DockerCredentials, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("registry credentials {}: {e}", path.display()))?;
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "registry credentials {} may be read by group or others (chmod 600)",
            path.display()
        ));
    }
    if meta.len() > MAX_BYTES {
        return Err(format!("registry credentials {} are larger than 4 KiB", path.display()));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("registry credentials {}: {e}", path.display()))?;
    let (username, password) = text
        .trim_end_matches('\n')
        .split_once(':')
        .filter(|(u, p)| !u.is_empty() && !p.is_empty())
        .ok_or_else(|| format!("registry credentials {} are not `username:password`", path.display()))?;
    Ok(DockerCredentials {
        username: Some(username.to_owned()),
        password: Some(password.to_owned()),
        serveraddress: Some(registry.to_owned()),
        ..DockerCredentials::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registries_are_named_as_docker_names_them() {
        assert_eq!(
            registry_of("127.0.0.1:5000/pl-build/api@sha256:00"),
            Some("127.0.0.1:5000")
        );
        assert_eq!(
            registry_of("registry.example.invalid/app@sha256:00"),
            Some("registry.example.invalid")
        );
        assert_eq!(registry_of("localhost/app"), Some("localhost"));
        assert_eq!(registry_of("library/busybox"), None);
        assert_eq!(registry_of("busybox"), None);
    }

    #[test]
    fn credentials_are_private_and_well_formed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("auth");
        std::fs::write(&file, "pl-up:s3cret\n").expect("write");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let e = read(&file, "127.0.0.1:1").expect_err("readable by others");
        assert!(e.contains("chmod 600") && !e.contains("s3cret"), "{e}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let c = read(&file, "127.0.0.1:1").expect("read");
        assert_eq!(
            (c.username.as_deref(), c.password.as_deref()),
            (Some("pl-up"), Some("s3cret"))
        );
        std::fs::write(&file, "no-colon\n").expect("write");
        let e = read(&file, "127.0.0.1:1").expect_err("malformed");
        assert!(e.contains("username:password"), "{e}");
    }
}
