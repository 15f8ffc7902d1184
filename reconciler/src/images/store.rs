//! The image store on disk: blobs by digest (`blobs/sha256/<hex>`, manifests among them, each
//! manifest's media type beside it in `manifests/<hex>`), uploads in progress in `uploads/`,
//! and an `owner` file naming the control plane the folder belongs to (another control plane's
//! folder is refused at start, so two on one machine never share or overwrite blobs).
//!
//! A blob is kept only after its bytes hashed to the digest the client named, by a rename of
//! the finished upload; a digest already kept is never written again. What the folder holds,
//! uploads included, stays under the quota: a write that would pass it is refused.

use registry::oci::{self, Digest};
use sha2::Digest as _;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};
use tokio::io::AsyncWriteExt;

/// Most uploads open at once.
pub const MAX_UPLOADS: usize = 64;
/// An upload nobody wrote to for this long is dropped.
pub const UPLOAD_IDLE: Duration = Duration::from_secs(3_600);

/// Why the store refused, each with its code (`image-…`) and the spec's code.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the store would pass its quota of {quota} bytes ({used} held)")]
    Quota { quota: u64, used: u64 },
    #[error("a blob may be at most {0} bytes")]
    BlobTooLarge(u64),
    #[error("the bytes hash to {actual}, not {expected}")]
    DigestMismatch { expected: Digest, actual: Digest },
    #[error("no upload {0} is open (it finished, failed, or was idle too long)")]
    UploadUnknown(String),
    #[error("{MAX_UPLOADS} uploads are open already")]
    TooManyUploads,
    #[error("the manifest references {0}, which the store does not hold: push its blobs first")]
    MissingReference(Digest),
    #[error("{0}")]
    Manifest(#[from] oci::ManifestError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{dir} belongs to the control plane `{owner}`, not this one: give each control plane its own images.dir")]
    Foreign { dir: PathBuf, owner: String },
}

impl StoreError {
    /// Pushleft's stable code.
    pub fn code(&self) -> &'static str {
        match self {
            StoreError::Quota { .. } => "image-quota-exceeded",
            StoreError::BlobTooLarge(_) => "image-blob-too-large",
            StoreError::DigestMismatch { .. } => "image-digest-mismatch",
            StoreError::UploadUnknown(_) => "image-upload-unknown",
            StoreError::TooManyUploads => "image-uploads-busy",
            StoreError::MissingReference(_) => "image-blob-missing",
            StoreError::Manifest(_) => "image-manifest-invalid",
            StoreError::Io(_) => "image-store-unavailable",
            StoreError::Foreign { .. } => "image-store-foreign",
        }
    }
}

struct Upload {
    hash: sha2::Sha256,
    written: u64,
    touched: std::time::Instant,
}

/// One control plane's store.
pub struct Store {
    dir: PathBuf,
    pub quota: u64,
    pub max_blob: u64,
    used: AtomicU64,
    uploads: Mutex<HashMap<String, Upload>>,
}

impl Store {
    /// Opens (or makes) `dir` for `control_plane`, counting what it holds; uploads a previous
    /// run left are dropped.
    pub fn open(dir: &Path, control_plane: &str, quota: u64, max_blob: u64) -> Result<Store, StoreError> {
        for sub in ["blobs/sha256", "manifests", "uploads"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let owner = dir.join("owner");
        match std::fs::read_to_string(&owner) {
            Ok(o) if o.trim() == control_plane => {}
            Ok(o) => {
                return Err(StoreError::Foreign {
                    dir: dir.to_owned(),
                    owner: o.trim().to_owned(),
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::write(&owner, format!("{control_plane}\n"))?,
            Err(e) => return Err(e.into()),
        }
        for e in std::fs::read_dir(dir.join("uploads"))? {
            std::fs::remove_file(e?.path())?;
        }
        let mut used = 0;
        for e in std::fs::read_dir(dir.join("blobs/sha256"))? {
            used += e?.metadata()?.len();
        }
        Ok(Store {
            dir: dir.to_owned(),
            quota,
            max_blob,
            used: AtomicU64::new(used),
            uploads: Mutex::new(HashMap::new()),
        })
    }

    /// Bytes held, uploads in progress included.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    pub fn blob_path(&self, d: &Digest) -> PathBuf {
        self.dir.join("blobs/sha256").join(d.hex())
    }

    /// A blob's size, when the store holds it.
    pub async fn blob_size(&self, d: &Digest) -> Option<u64> {
        tokio::fs::metadata(self.blob_path(d)).await.ok().map(|m| m.len())
    }

    /// A manifest's media type, when the store holds it as a manifest.
    pub async fn manifest_type(&self, d: &Digest) -> Option<String> {
        let t = tokio::fs::read_to_string(self.dir.join("manifests").join(d.hex()))
            .await
            .ok()?;
        let t = t.trim().to_owned();
        (self.blob_size(d).await.is_some() && oci::MANIFEST_TYPES.contains(&t.as_str())).then_some(t)
    }

    /// Opens an upload; its id names it in the next requests.
    pub async fn begin(&self) -> Result<String, StoreError> {
        let mut raw = [0u8; 16];
        getrandom::fill(&mut raw).map_err(|e| std::io::Error::other(e.to_string()))?;
        let id = hex::encode(raw);
        {
            let mut u = self.uploads.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            u.retain(|_, up| up.touched.elapsed() < UPLOAD_IDLE);
            if u.len() >= MAX_UPLOADS {
                return Err(StoreError::TooManyUploads);
            }
            u.insert(
                id.clone(),
                Upload {
                    hash: sha2::Sha256::new(),
                    written: 0,
                    touched: std::time::Instant::now(),
                },
            );
        }
        tokio::fs::File::create(self.upload_path(&id)).await?;
        Ok(id)
    }

    /// An upload's file; an id that is not one [`Store::begin`] could make names nothing
    /// (ids come from requests' paths).
    fn upload_path(&self, id: &str) -> PathBuf {
        let ok = id.len() == 32 && id.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
        self.dir.join("uploads").join(if ok { id } else { "invalid" })
    }

    /// Reserves `n` more bytes under the quota and the blob limit for upload `id`, whose
    /// running hash takes `chunk`.
    fn take(&self, id: &str, chunk: &[u8]) -> Result<(), StoreError> {
        let n = chunk.len() as u64;
        let mut uploads = self.uploads.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let up = uploads
            .get_mut(id)
            .ok_or_else(|| StoreError::UploadUnknown(id.to_owned()))?;
        if up.written + n > self.max_blob {
            return Err(StoreError::BlobTooLarge(self.max_blob));
        }
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                (u + n <= self.quota).then_some(u + n)
            })
            .map_err(|used| StoreError::Quota {
                quota: self.quota,
                used,
            })?;
        up.hash.update(chunk);
        up.written += n;
        up.touched = std::time::Instant::now();
        Ok(())
    }

    /// Appends a body, chunk by chunk, to upload `id`. Returns the bytes written so far.
    pub async fn append<S, E>(&self, id: &str, mut body: S, idle: Duration) -> Result<u64, StoreError>
    where
        S: futures_util::Stream<Item = Result<axum::body::Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        use futures_util::StreamExt;
        if !self.open_upload(id) {
            return Err(StoreError::UploadUnknown(id.to_owned()));
        }
        let mut file = tokio::fs::OpenOptions::new()
            .append(true)
            .open(self.upload_path(id))
            .await?;
        loop {
            let next = match tokio::time::timeout(idle, body.next()).await {
                Ok(n) => n,
                Err(_) => {
                    let e = std::io::Error::new(std::io::ErrorKind::TimedOut, "the body stalled");
                    self.abort(id).await;
                    return Err(e.into());
                }
            };
            let Some(chunk) = next else { break };
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    self.abort(id).await;
                    return Err(std::io::Error::other(e.to_string()).into());
                }
            };
            if let Err(e) = self.take(id, &chunk) {
                self.abort(id).await;
                return Err(e);
            }
            if let Err(e) = file.write_all(&chunk).await {
                self.abort(id).await;
                return Err(e.into());
            }
        }
        file.flush().await?;
        Ok(self.written(id))
    }

    fn open_upload(&self, id: &str) -> bool {
        self.uploads.lock().map(|u| u.contains_key(id)).unwrap_or(false)
    }

    fn written(&self, id: &str) -> u64 {
        self.uploads
            .lock()
            .ok()
            .and_then(|u| u.get(id).map(|up| up.written))
            .unwrap_or(0)
    }

    /// Drops an upload and gives its bytes back to the quota.
    pub async fn abort(&self, id: &str) {
        let gone = self.uploads.lock().ok().and_then(|mut u| u.remove(id));
        if let Some(up) = gone {
            self.used.fetch_sub(up.written, Ordering::AcqRel);
        }
        let _ = tokio::fs::remove_file(self.upload_path(id)).await;
    }

    /// Ends upload `id`: kept as `expected` if its bytes hash to it, refused (and dropped)
    /// otherwise. A blob the store holds already is not written again.
    pub async fn finish(&self, id: &str, expected: &Digest) -> Result<u64, StoreError> {
        let up = self
            .uploads
            .lock()
            .ok()
            .and_then(|mut u| u.remove(id))
            .ok_or_else(|| StoreError::UploadUnknown(id.to_owned()))?;
        let actual = Digest::from_hasher(up.hash);
        let path = self.upload_path(id);
        if &actual != expected {
            self.used.fetch_sub(up.written, Ordering::AcqRel);
            let _ = tokio::fs::remove_file(&path).await;
            return Err(StoreError::DigestMismatch {
                expected: expected.clone(),
                actual,
            });
        }
        // A link, not a rename: it never replaces a blob, so two uploads of one digest that
        // finish together keep one file and count it once.
        tokio::fs::File::open(&path).await?.sync_all().await?;
        match tokio::fs::hard_link(&path, self.blob_path(expected)).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                self.used.fetch_sub(up.written, Ordering::AcqRel);
            }
            Err(e) => {
                self.used.fetch_sub(up.written, Ordering::AcqRel);
                let _ = tokio::fs::remove_file(&path).await;
                return Err(e.into());
            }
        }
        tokio::fs::remove_file(&path).await?;
        Ok(up.written)
    }

    /// Keeps a manifest's bytes under `digest` (which they must hash to), once every blob (or,
    /// for an index, every manifest) it references is here.
    pub async fn put_manifest(
        &self,
        digest: &Digest,
        bytes: &[u8],
        content_type: Option<&str>,
    ) -> Result<oci::Parsed, StoreError> {
        let actual = Digest::of(bytes);
        if &actual != digest {
            return Err(StoreError::DigestMismatch {
                expected: digest.clone(),
                actual,
            });
        }
        let parsed = oci::parse_manifest(bytes, content_type)?;
        for (r, _) in &parsed.references {
            let held = match parsed.index {
                true => self.manifest_type(r).await.is_some(),
                false => self.blob_size(r).await.is_some(),
            };
            if !held {
                return Err(StoreError::MissingReference(r.clone()));
            }
        }
        let id = self.begin().await?;
        let once = futures_util::stream::iter([Ok::<_, std::io::Error>(axum::body::Bytes::copy_from_slice(bytes))]);
        self.append(&id, once, Duration::from_secs(10)).await?;
        self.finish(&id, digest).await?;
        // A push renews what it names: blobs a push found held (and so did not send) are as
        // young as the push for the collection's grace, which a commit naming them follows.
        for d in parsed.references.iter().map(|(r, _)| r).chain([digest]) {
            self.touch(d);
        }
        let tmp = self.dir.join("manifests").join(format!("{}.new", digest.hex()));
        tokio::fs::write(&tmp, &parsed.media_type).await?;
        tokio::fs::rename(&tmp, self.dir.join("manifests").join(digest.hex())).await?;
        Ok(parsed)
    }

    /// Makes a held blob as young as now (a failure only shortens its stay to the grace).
    fn touch(&self, d: &Digest) {
        if let Ok(f) = std::fs::File::options().write(true).open(self.blob_path(d)) {
            let _ = f.set_modified(SystemTime::now());
        }
    }

    /// Every blob held, with its size and age.
    pub fn list(&self) -> Result<Vec<(Digest, u64, Duration)>, StoreError> {
        let now = SystemTime::now();
        let mut out = Vec::new();
        for e in std::fs::read_dir(self.dir.join("blobs/sha256"))? {
            let e = e?;
            let Some(d) = e
                .file_name()
                .to_str()
                .and_then(|n| Digest::parse(&format!("sha256:{n}")))
            else {
                continue;
            };
            let m = e.metadata()?;
            let age = m
                .modified()
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .unwrap_or_default();
            out.push((d, m.len(), age));
        }
        out.sort();
        Ok(out)
    }

    /// What a held manifest references (empty when `d` is no manifest of this store).
    pub fn references(&self, d: &Digest) -> Vec<Digest> {
        let Ok(t) = std::fs::read_to_string(self.dir.join("manifests").join(d.hex())) else {
            return Vec::new();
        };
        std::fs::read(self.blob_path(d))
            .ok()
            .and_then(|b| oci::parse_manifest(&b, Some(t.trim())).ok())
            .map(|p| p.references.into_iter().map(|(r, _)| r).collect())
            .unwrap_or_default()
    }

    /// Removes a blob (and its manifest type, if it was one); returns the bytes freed.
    pub fn remove(&self, d: &Digest) -> Result<u64, StoreError> {
        let path = self.blob_path(d);
        let size = match std::fs::metadata(&path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e.into()),
        };
        let _ = std::fs::remove_file(self.dir.join("manifests").join(d.hex()));
        std::fs::remove_file(&path)?;
        self.used.fetch_sub(size, Ordering::AcqRel);
        Ok(size)
    }
}
