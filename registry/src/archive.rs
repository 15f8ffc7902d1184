//! An image as `docker save` writes it, pushed to a control plane's store as it streams: each
//! blob asked for first, so only what the store lacks is sent. `pl image push` and `pl-agent
//! build` (for `pl up --build`) both push through here.
//!
//! Both layouts are read: the OCI layout (Docker 25 and later: blobs named by digest, so a blob
//! the store holds is skipped without hashing it) and the older one (a `layer.tar` per layer,
//! hashed on the way through into a spool file before the store is asked, since its digest is
//! known only at its end). Layers stay uncompressed, so their digests are the diff ids engines
//! know, and the same image always gets the same manifest digest.

use crate::oci::{self, Digest};
use crate::push::{PushError, Pusher};
use sha2::Digest as _;
use std::collections::HashMap;
use std::io::{Read, Seek, Write};

/// What one push sent and found held.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pushed {
    /// The image's manifest digest.
    pub digest: Option<Digest>,
    pub sent: u64,
    pub sent_bytes: u64,
    pub held: u64,
    pub held_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("{0}")]
    Push(#[from] PushError),
    #[error("reading the image archive: {0}")]
    Read(#[from] std::io::Error),
    #[error("{0}")]
    Invalid(String),
    #[error("the archive holds {0} images; save one image per push")]
    Several(usize),
}

impl ArchiveError {
    pub fn code(&self) -> &str {
        match self {
            ArchiveError::Push(p) => p.code(),
            ArchiveError::Read(_) | ArchiveError::Invalid(_) => "image-archive-invalid",
            ArchiveError::Several(_) => "image-push-several",
        }
    }
}

/// The small files of a save kept to read after the stream (manifests, configs, indexes).
const SMALL: u64 = oci::MAX_MANIFEST_BYTES as u64;

/// Pushes the archive `reader` holds to `name` in the store; its manifest goes last, by digest.
pub fn push_archive(pusher: &Pusher, name: &str, reader: impl Read) -> Result<Pushed, ArchiveError> {
    let mut tally = Pushed::default();
    let mut small: HashMap<String, Vec<u8>> = HashMap::new();
    // The older layout: a layer's path in the archive → its digest and size.
    let mut layers: HashMap<String, (Digest, u64)> = HashMap::new();
    let mut archive = tar::Archive::new(reader);
    for entry in archive.entries()? {
        let mut entry = entry?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let path = entry.path()?.to_string_lossy().into_owned();
        let size = entry.size();
        if let Some(d) = path
            .strip_prefix("blobs/sha256/")
            .and_then(|h| Digest::parse(&format!("sha256:{h}")))
        {
            let kept = (size <= SMALL).then(|| read_all(&mut entry)).transpose()?;
            if pusher.has_blob(name, &d)? {
                tally.held += 1;
                tally.held_bytes += size;
            } else {
                match &kept {
                    Some(bytes) => pusher.upload(name, &d, size, bytes.as_slice()),
                    None => pusher.upload(name, &d, size, &mut entry),
                }?;
                tally.sent += 1;
                tally.sent_bytes += size;
            }
            if let Some(bytes) = kept {
                small.insert(path, bytes);
            }
        } else if path.ends_with("/layer.tar") {
            let (digest, spool) = spool(&mut entry)?;
            send(pusher, name, &digest, size, spool, &mut tally)?;
            layers.insert(path, (digest, size));
        } else if size <= SMALL && (path.ends_with(".json") || path == "repositories") {
            small.insert(path.clone(), read_all(&mut entry)?);
        }
    }
    let (manifest, media_type) = match small.get("index.json") {
        Some(index) => oci_manifest(index, &small)?,
        None => {
            let (m, config, path) = legacy_manifest(&small, &layers)?;
            let bytes = small.get(&path).map(Vec::as_slice).unwrap_or_default();
            if pusher.has_blob(name, &config)? {
                tally.held += 1;
                tally.held_bytes += bytes.len() as u64;
            } else {
                pusher.upload(name, &config, bytes.len() as u64, bytes)?;
                tally.sent += 1;
                tally.sent_bytes += bytes.len() as u64;
            }
            (m, oci::OCI_MANIFEST.to_owned())
        }
    };
    let digest = Digest::of(&manifest);
    pusher.put_manifest(name, digest.as_str(), &media_type, &manifest)?;
    tally.digest = Some(digest);
    Ok(tally)
}

fn read_all(r: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let mut v = Vec::new();
    r.read_to_end(&mut v)?;
    Ok(v)
}

/// A layer copied to a spool file while it is hashed.
fn spool(entry: &mut impl Read) -> std::io::Result<(Digest, std::fs::File)> {
    let mut file = tempfile::tempfile()?;
    let mut hash = sha2::Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = entry.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        file.write_all(&buf[..n])?;
    }
    file.rewind()?;
    Ok((Digest::from_hasher(hash), file))
}

fn send(
    pusher: &Pusher,
    name: &str,
    digest: &Digest,
    size: u64,
    spool: std::fs::File,
    tally: &mut Pushed,
) -> Result<(), PushError> {
    if pusher.has_blob(name, digest)? {
        tally.held += 1;
        tally.held_bytes += size;
        return Ok(());
    }
    pusher.upload(name, digest, size, spool)?;
    tally.sent += 1;
    tally.sent_bytes += size;
    Ok(())
}

/// The OCI layout's image: `index.json`'s one entry, a manifest (or index) among the blobs.
fn oci_manifest(index: &[u8], small: &HashMap<String, Vec<u8>>) -> Result<(Vec<u8>, String), ArchiveError> {
    let parsed = oci::parse_manifest(index, Some(oci::OCI_INDEX))
        .map_err(|e| ArchiveError::Invalid(format!("index.json: {e}")))?;
    let [(d, _)] = parsed.references.as_slice() else {
        return Err(ArchiveError::Several(parsed.references.len()));
    };
    let bytes = small
        .get(&format!("blobs/sha256/{}", d.hex()))
        .ok_or_else(|| ArchiveError::Invalid(format!("index.json names {d}, which the archive does not hold")))?;
    let m = oci::parse_manifest(bytes, None).map_err(|e| ArchiveError::Invalid(format!("{d}: {e}")))?;
    Ok((bytes.clone(), m.media_type))
}

/// The older layout's image (`manifest.json`: a config file and layer files) as an OCI
/// manifest, with the config's digest and path in the archive.
fn legacy_manifest(
    small: &HashMap<String, Vec<u8>>,
    layers: &HashMap<String, (Digest, u64)>,
) -> Result<(Vec<u8>, Digest, String), ArchiveError> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Entry {
        config: String,
        layers: Vec<String>,
    }
    let invalid = |m: String| ArchiveError::Invalid(m);
    let text = small
        .get("manifest.json")
        .ok_or_else(|| invalid("not an archive `docker save` writes: no index.json or manifest.json".into()))?;
    let entries: Vec<Entry> = serde_json::from_slice(text).map_err(|e| invalid(format!("manifest.json: {e}")))?;
    let [entry] = entries.as_slice() else {
        return Err(ArchiveError::Several(entries.len()));
    };
    let config = small.get(&entry.config).ok_or_else(|| {
        invalid(format!(
            "manifest.json names {}, which the archive does not hold",
            entry.config
        ))
    })?;
    let config_digest = Digest::of(config);
    let mut listed = Vec::new();
    for l in &entry.layers {
        let found = layers
            .get(l)
            .ok_or_else(|| invalid(format!("manifest.json names {l}, which the archive does not hold")))?;
        listed.push(found.clone());
    }
    let manifest = oci::image_manifest((&config_digest, config.len() as u64), &listed);
    Ok((manifest, config_digest, entry.config.clone()))
}
