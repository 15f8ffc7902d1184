//! The distribution protocol's content, as both ends of a push read it: digests, the manifests
//! an image is made of and the blobs they reference, the error body every `/v2` refusal
//! carries, and the manifest Pushleft writes for an image `docker save` gave in its older
//! layout (one uncompressed tar per layer, which the digest of stays the layer's diff id).
//! Pure: bytes in, values out.

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

/// The largest manifest or index read (the distribution spec's registries use 4 MiB).
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;
/// Most blobs one manifest, or manifests one index, may reference.
pub const MAX_REFERENCES: usize = 1_000;

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// An uncompressed layer: what `docker save` holds, and what a push sends unchanged (so its
/// digest is the layer's diff id, and a node's engine knows it without a download).
pub const OCI_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// The manifest types this side stores and serves.
pub const MANIFEST_TYPES: [&str; 4] = [OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST];

/// A `sha256:` digest, 64 lowercase hex digits: the only algorithm accepted.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest(String);

impl Digest {
    /// Reads `sha256:<64 hex>`; anything else (another algorithm, capitals, a path) is `None`,
    /// so a digest can always be a file name.
    pub fn parse(s: &str) -> Option<Digest> {
        let hex = s.strip_prefix("sha256:")?;
        (hex.len() == 64 && hex.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))).then(|| Digest(s.to_owned()))
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest::from_hasher(sha2::Sha256::new_with_prefix(bytes))
    }

    /// What a running hash has seen.
    pub fn from_hasher(h: sha2::Sha256) -> Digest {
        Digest(format!("sha256:{}", hex::encode(h.finalize())))
    }

    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A repository name as the distribution spec allows it (lowercase path components of
/// letters, digits and single separators, at most 255 characters).
pub fn valid_name(name: &str) -> bool {
    name.len() <= 255
        && !name.is_empty()
        && name.split('/').all(|c| {
            !c.is_empty()
                && c.bytes()
                    .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-'))
                && c.as_bytes()[0].is_ascii_alphanumeric()
                && c.as_bytes()[c.len() - 1].is_ascii_alphanumeric()
        })
}

/// One blob or manifest a manifest points at.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: String,
    pub size: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AnyManifest {
    #[serde(default)]
    schema_version: Option<u32>,
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Option<Vec<Descriptor>>,
    #[serde(default)]
    manifests: Option<Vec<Descriptor>>,
}

/// What a manifest's bytes say: whether it is an index, and what it references.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parsed {
    pub media_type: String,
    /// Blobs (a config and layers) for an image manifest; manifests for an index.
    pub references: Vec<(Digest, u64)>,
    pub index: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ManifestError {
    #[error("the manifest is larger than {MAX_MANIFEST_BYTES} bytes")]
    TooLarge,
    #[error("the manifest is not JSON of a known kind: {0}")]
    Unreadable(String),
    #[error("the manifest type `{0}` is not one this store keeps (OCI or Docker v2 image manifests and indexes)")]
    UnknownType(String),
    #[error("the manifest references `{0}`, which is not a sha256 digest")]
    BadReference(String),
    #[error("the manifest references more than {MAX_REFERENCES} blobs")]
    TooManyReferences,
}

/// Reads a manifest's bytes, sent as `content_type` (the body's own `mediaType` wins).
pub fn parse_manifest(bytes: &[u8], content_type: Option<&str>) -> Result<Parsed, ManifestError> {
    if bytes.len() > MAX_MANIFEST_BYTES {
        return Err(ManifestError::TooLarge);
    }
    let m: AnyManifest = serde_json::from_slice(bytes).map_err(|e| ManifestError::Unreadable(e.to_string()))?;
    if m.schema_version != Some(2) {
        return Err(ManifestError::Unreadable("schemaVersion is not 2".into()));
    }
    let media_type = m
        .media_type
        .or_else(|| content_type.map(|c| c.split(';').next().unwrap_or(c).trim().to_owned()))
        .unwrap_or_else(|| if m.manifests.is_some() { OCI_INDEX } else { OCI_MANIFEST }.to_owned());
    let index = match media_type.as_str() {
        OCI_INDEX | DOCKER_LIST => true,
        OCI_MANIFEST | DOCKER_MANIFEST => false,
        other => return Err(ManifestError::UnknownType(other.to_owned())),
    };
    let descriptors: Vec<Descriptor> = if index {
        m.manifests.unwrap_or_default()
    } else {
        let config = m
            .config
            .ok_or_else(|| ManifestError::Unreadable("an image manifest without a config".into()))?;
        std::iter::once(config).chain(m.layers.unwrap_or_default()).collect()
    };
    if descriptors.len() > MAX_REFERENCES {
        return Err(ManifestError::TooManyReferences);
    }
    let references = descriptors
        .into_iter()
        .map(|d| match Digest::parse(&d.digest) {
            Some(digest) => Ok((digest, d.size)),
            None => Err(ManifestError::BadReference(d.digest)),
        })
        .collect::<Result<_, _>>()?;
    Ok(Parsed {
        media_type,
        references,
        index,
    })
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ImageManifest<'a> {
    schema_version: u32,
    media_type: &'a str,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

/// The OCI image manifest of a config and uncompressed layers, in one fixed serialisation: the
/// same image always gets the same digest, whichever machine pushes it.
pub fn image_manifest(config: (&Digest, u64), layers: &[(Digest, u64)]) -> Vec<u8> {
    let m = ImageManifest {
        schema_version: 2,
        media_type: OCI_MANIFEST,
        config: Descriptor {
            media_type: OCI_CONFIG.into(),
            digest: config.0.to_string(),
            size: config.1,
        },
        layers: layers
            .iter()
            .map(|(d, size)| Descriptor {
                media_type: OCI_LAYER_TAR.into(),
                digest: d.to_string(),
                size: *size,
            })
            .collect(),
    };
    // Serialising a struct of strings and numbers cannot fail.
    serde_json::to_vec(&m).unwrap_or_default()
}

/// The body of every `/v2` refusal, as the distribution spec gives it. `detail` carries
/// Pushleft's own stable code (`image-digest-mismatch`, `image-quota-exceeded`, …).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Errors {
    pub errors: Vec<ErrorItem>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorItem {
    /// The spec's code: `BLOB_UNKNOWN`, `DIGEST_INVALID`, `MANIFEST_INVALID`, `DENIED`, …
    pub code: String,
    pub message: String,
    #[serde(default)]
    pub detail: Option<String>,
}

impl Errors {
    pub fn one(code: &str, ours: &str, message: impl Into<String>) -> Errors {
        Errors {
            errors: vec![ErrorItem {
                code: code.into(),
                message: message.into(),
                detail: Some(ours.into()),
            }],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_sha256_lowercase_only() {
        let d = Digest::of(b"");
        assert_eq!(
            d.as_str(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(Digest::parse(d.as_str()), Some(d.clone()));
        assert!(Digest::parse(&d.as_str().to_uppercase()).is_none());
        assert!(Digest::parse("sha512:00").is_none());
        assert!(Digest::parse("sha256:../../etc/passwd").is_none());
        assert_eq!(d.hex().len(), 64);
    }

    #[test]
    fn names_follow_the_distribution_spec() {
        assert!(valid_name("web") && valid_name("shop/web-2") && valid_name("a.b_c"));
        for bad in ["", "Web", "/web", "web/", "a//b", "-a", "a-", "../x", &"a".repeat(256)] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn a_written_manifest_reads_back_with_its_references() {
        let config = Digest::of(b"{}");
        let layer = Digest::of(b"layer");
        let bytes = image_manifest((&config, 2), &[(layer.clone(), 5)]);
        assert_eq!(
            bytes,
            image_manifest((&config, 2), &[(layer.clone(), 5)]),
            "one serialisation"
        );
        let p = parse_manifest(&bytes, None).expect("parses");
        assert_eq!(p.media_type, OCI_MANIFEST);
        assert!(!p.index);
        assert_eq!(p.references, vec![(config, 2), (layer, 5)]);
    }

    #[test]
    fn indexes_and_refusals() {
        let m = Digest::of(b"m");
        let index = format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_INDEX}","manifests":[{{"mediaType":"{OCI_MANIFEST}","digest":"{m}","size":3}}]}}"#
        );
        let p = parse_manifest(index.as_bytes(), None).expect("an index");
        assert!(p.index);
        assert_eq!(p.references, vec![(m, 3)]);
        assert!(matches!(
            parse_manifest(br#"{"schemaVersion":1}"#, None),
            Err(ManifestError::Unreadable(_))
        ));
        assert!(matches!(
            parse_manifest(br#"{"schemaVersion":2,"mediaType":"text/plain"}"#, None),
            Err(ManifestError::UnknownType(_))
        ));
        let bad = format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","config":{{"mediaType":"x","digest":"md5:00","size":1}},"layers":[]}}"#
        );
        assert_eq!(
            parse_manifest(bad.as_bytes(), None),
            Err(ManifestError::BadReference("md5:00".into()))
        );
        assert_eq!(
            parse_manifest(&vec![b' '; MAX_MANIFEST_BYTES + 1], None),
            Err(ManifestError::TooLarge)
        );
    }
}
