//! `pl image sign`: an image's signature, made in process and kept in the state tree beside the
//! YAML (`image-signatures/sha256-<hex>.sig`), for nodes to check before they pull or run it.

use anyhow::{Context, Result, anyhow};
use state_repo::source::StateRepo;
use state_schema::image_signatures::{self, MAX_SIGNATURES};
use std::path::Path;

/// Signs `image`'s digest with the signing key and adds the signature to its file (once: a
/// signature already there is not added again). Prints the file's path.
pub fn sign(dir: &Path, image: &str, key: Option<&Path>) -> Result<u8> {
    let digest = match image_trust::digest_of(image) {
        Some(d) => d,
        None if image_trust::is_digest(image) => image,
        None => {
            eprintln!(
                "pl image sign: error[image-not-pinned]: `{image}` is not pinned to a digest\n  hint: sign `name@sha256:<64 hex>` (from `docker buildx imagetools inspect`, or `pl up --build`'s output)"
            );
            return Ok(1);
        }
    };
    let repo = StateRepo::open(dir)?;
    let key = crate::rollback_commit::signing_key(&repo, key)?;
    let signature = image_trust::sign(&key, digest)?;
    let relative = image_signatures::path_of(digest).ok_or_else(|| anyhow!("{digest} is not a sha256 digest"))?;
    let path = dir.join(&relative);
    let mut text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let blocks = image_signatures::blocks(&text)
        .map_err(|(line, why)| anyhow!("{}:{line}: {why}; fix or remove the file first", relative))?;
    if blocks.iter().any(|(_, b)| *b == signature) {
        println!("{relative}: already signed by this key");
        return Ok(0);
    }
    if blocks.len() >= MAX_SIGNATURES {
        eprintln!(
            "pl image sign: error[image-signature-invalid]: {relative} holds {MAX_SIGNATURES} signatures already, the most one image may carry\n  hint: remove the signatures of keys no longer trusted"
        );
        return Ok(1);
    }
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&signature);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    println!("{relative}");
    Ok(0)
}
