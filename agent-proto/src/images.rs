//! Images from the control plane's own store: how a reference names one, and where a node
//! fetches its manifests and blobs over the agent API (the agent serves them to its engine on
//! loopback; see `docs/images.md`).

/// The registry host that names the control plane's store in an image reference
/// (`pushleft.invalid/web@sha256:…`). Under `.invalid`, so a reference copied elsewhere never
/// resolves: only an agent pulls it, through its control plane.
pub const STORE_HOST: &str = "pushleft.invalid";

/// The repository and digest of a reference to the store (`pushleft.invalid/<name>@sha256:<hex>`),
/// or `None` for any other image.
pub fn in_store(image: &str) -> Option<(&str, &str)> {
    let rest = image.strip_prefix(STORE_HOST)?.strip_prefix('/')?;
    let (name, digest) = rest.split_once('@')?;
    let hex = digest.strip_prefix("sha256:")?;
    let ok = !name.is_empty()
        && !name.contains(':')
        && hex.len() == 64
        && hex.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
    ok.then_some((name, digest))
}

/// The agent API's path of a manifest (`kind` = `manifests`) or blob (`blobs`) by digest.
pub fn fetch_path(kind: Fetch, digest: &str) -> String {
    let kind = match kind {
        Fetch::Manifest => "manifests",
        Fetch::Blob => "blobs",
    };
    format!("/v1/agent/images/{kind}/{digest}")
}

/// What a node fetches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fetch {
    Manifest,
    Blob,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_digest_references_to_the_store() {
        let d = format!("sha256:{}", "a".repeat(64));
        assert_eq!(
            in_store(&format!("pushleft.invalid/web@{d}")),
            Some(("web", d.as_str()))
        );
        assert_eq!(
            in_store(&format!("pushleft.invalid/shop/web@{d}")),
            Some(("shop/web", d.as_str()))
        );
        assert_eq!(in_store("pushleft.invalid/web:latest"), None);
        assert_eq!(in_store(&format!("pushleft.invalid.example/web@{d}")), None);
        assert_eq!(in_store(&format!("registry.example.invalid/web@{d}")), None);
        assert_eq!(in_store("pushleft.invalid/web@sha256:ABC"), None);
        assert_eq!(fetch_path(Fetch::Blob, &d), format!("/v1/agent/images/blobs/{d}"));
    }
}
