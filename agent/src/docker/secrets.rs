//! A replica's secrets: opened with the node's age identity and written to a tmpfs folder
//! only the container reads, never to a disk.

use super::*;

impl Engine {
    /// Writes the secrets, opened with the node's identity, as files of their own folder
    /// (0700, files 0400) for a read-only bind at `/run/secrets`. Returns the folder.
    pub(super) fn write_secrets(&self, app: &ApplicationSpec) -> Result<Option<PathBuf>, Failure> {
        if app.secrets.is_empty() {
            return Ok(None);
        }
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let identities = pushleft_secrets::load_identities(&self.identity)
            .map_err(|e| permanent("node-identity-unreadable", e.code().to_owned()))?;
        let dir = self.secrets_dir.join(&app.container);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| retryable("secrets-dir-failed", e.to_string()))?;
        for s in &app.secrets {
            if s.key.is_empty() || s.key.contains('/') || s.key.starts_with('.') {
                return Err(permanent("secret-key-invalid", "a secret key is not a plain file name"));
            }
            let plaintext = pushleft_secrets::decrypt(&s.sealed, &identities)
                .map_err(|e| permanent("secret-unopenable", e.code().to_owned()))?;
            let path = dir.join(&s.key);
            let _ = std::fs::remove_file(&path);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o444)
                .open(&path)
                .map_err(|e| retryable("secrets-write-failed", e.to_string()))?;
            use std::io::Write;
            f.write_all(&plaintext)
                .map_err(|e| retryable("secrets-write-failed", e.to_string()))?;
        }
        Ok(Some(dir))
    }
}
