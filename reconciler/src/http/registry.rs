//! The image store's distribution endpoint on the operator listener (`/v2/`), for `pl image
//! push` (a bearer token) and `docker push` (`docker login` with a token as the password: basic
//! credentials): blobs asked for (`HEAD`), mounted from the store when held, uploaded (`POST`,
//! `PATCH`, `PUT ?digest=`) and read; manifests put (by digest, or under a tag, which is not
//! kept: Git names images by digest) and read by digest. Reading needs a viewer's token,
//! writing an operator's; a refused request reads no body. Refusals are the spec's error body,
//! with Pushleft's code in `detail`.
//! The agents' side is `agent_images.rs`.

use crate::auth::Tokens;
use crate::config::Role;
use crate::http::server::authorized;
use crate::images::store::{Store, StoreError};
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use registry::oci::{self, Digest, Errors};
use std::sync::Arc;
use std::time::Duration;

/// How long an upload's body may stall between two chunks.
pub const UPLOAD_STALL: Duration = Duration::from_secs(30);

/// The endpoint's own state.
pub struct Images {
    pub store: Arc<Store>,
    pub tokens: Arc<Tokens>,
}

/// `/v2/` on the operator listener; without a store, every path says so.
pub fn router(store: Option<&Arc<Store>>, tokens: &Arc<Tokens>) -> Router {
    let Some(store) = store else {
        let none = || async {
            oci_error(
                StatusCode::NOT_FOUND,
                "UNSUPPORTED",
                "images-not-configured",
                "this control plane keeps no images: add [images] to its configuration",
            )
        };
        return Router::new().route("/v2/", any(none)).route("/v2/{*path}", any(none));
    };
    let state = Arc::new(Images {
        store: Arc::clone(store),
        tokens: Arc::clone(tokens),
    });
    Router::new()
        .route("/v2/", get(ping))
        .route("/v2/{*path}", any(v2))
        .with_state(state)
}

/// What a `/v2/<name>/…` path asks for.
#[derive(Debug, PartialEq, Eq)]
enum Target<'a> {
    Blob(&'a str),
    Uploads,
    Upload(&'a str),
    Manifest(&'a str),
}

fn target(path: &str) -> Option<(&str, Target<'_>)> {
    let path = path.trim_start_matches('/');
    let (name, t) = if let Some((n, rest)) = path.rsplit_once("/blobs/uploads/") {
        (
            n,
            if rest.is_empty() {
                Target::Uploads
            } else {
                Target::Upload(rest)
            },
        )
    } else if let Some(n) = path.strip_suffix("/blobs/uploads") {
        (n, Target::Uploads)
    } else if let Some((n, d)) = path.rsplit_once("/blobs/") {
        (n, Target::Blob(d))
    } else if let Some((n, r)) = path.rsplit_once("/manifests/") {
        (n, Target::Manifest(r))
    } else {
        return None;
    };
    oci::valid_name(name).then_some((name, t))
}

pub(crate) fn oci_error(status: StatusCode, code: &str, ours: &str, message: impl Into<String>) -> Response {
    (status, axum::Json(Errors::one(code, ours, message))).into_response()
}

fn store_error(e: StoreError) -> Response {
    let (status, spec) = match &e {
        StoreError::Quota { .. } | StoreError::BlobTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "SIZE_INVALID"),
        StoreError::DigestMismatch { .. } => (StatusCode::BAD_REQUEST, "DIGEST_INVALID"),
        StoreError::UploadUnknown(_) => (StatusCode::NOT_FOUND, "BLOB_UPLOAD_UNKNOWN"),
        StoreError::TooManyUploads => (StatusCode::TOO_MANY_REQUESTS, "TOOMANYREQUESTS"),
        StoreError::MissingReference(_) => (StatusCode::BAD_REQUEST, "MANIFEST_BLOB_UNKNOWN"),
        StoreError::Manifest(_) => (StatusCode::BAD_REQUEST, "MANIFEST_INVALID"),
        StoreError::Io(_) | StoreError::Foreign { .. } => (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE"),
    };
    if matches!(e, StoreError::Io(_)) {
        tracing::warn!(error = %e, "image store");
    }
    oci_error(status, spec, e.code(), e.to_string())
}

fn unauthorized() -> Response {
    let mut r = oci_error(
        StatusCode::UNAUTHORIZED,
        "UNAUTHORIZED",
        "image-store-unauthorized",
        "send an operator token to push, a viewer's to read (Authorization: Bearer, or `docker login` with the token as the password)",
    );
    // Basic: the challenge `docker login` answers with its credentials (a token as password).
    r.headers_mut()
        .insert("www-authenticate", HeaderValue::from_static("Basic realm=\"pushleft\""));
    r
}

/// The caller's token name when it may do what `role` asks: a bearer token, or basic
/// credentials whose password is one (the user name is not read).
fn caller(tokens: &Tokens, headers: &HeaderMap, role: Role) -> Option<String> {
    let header = headers.get("authorization").and_then(|v| v.to_str().ok())?;
    if header.starts_with("Bearer ") {
        return authorized(tokens, headers, role).ok().map(str::to_owned);
    }
    use base64::Engine;
    let raw = header.strip_prefix("Basic ")?;
    let decoded = zeroize::Zeroizing::new(base64::engine::general_purpose::STANDARD.decode(raw.trim()).ok()?);
    let text = std::str::from_utf8(&decoded).ok()?;
    let (_, token) = text.split_once(':')?;
    let bearer = zeroize::Zeroizing::new(format!("Bearer {token}"));
    tokens.authorize(Some(bearer.as_str()), role).ok().map(str::to_owned)
}

async fn ping(State(s): State<Arc<Images>>, headers: HeaderMap) -> Response {
    if caller(&s.tokens, &headers, Role::Viewer).is_none() {
        return unauthorized();
    }
    ([("docker-distribution-api-version", "registry/2.0")], "{}").into_response()
}

#[derive(serde::Deserialize)]
struct DigestQuery {
    digest: Option<String>,
    /// A cross-repository mount (`docker push`'s): a blob the store holds needs no upload.
    mount: Option<String>,
}

async fn v2(
    State(s): State<Arc<Images>>,
    method: Method,
    Path(path): Path<String>,
    Query(q): Query<DigestQuery>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let reads = method == Method::GET || method == Method::HEAD;
    let role = if reads { Role::Viewer } else { Role::Operator };
    let Some(who) = caller(&s.tokens, &headers, role) else {
        return unauthorized();
    };
    let Some((name, t)) = target(&path) else {
        return oci_error(
            StatusCode::NOT_FOUND,
            "NAME_INVALID",
            "image-name-invalid",
            "not a repository path of this store",
        );
    };
    let digest = |d: &str| Digest::parse(d);
    match (method.as_str(), t) {
        ("GET" | "HEAD", Target::Blob(d)) => match digest(d) {
            Some(d) => serve_blob(&s.store, &d, None, method == Method::HEAD).await,
            None => bad_digest(d),
        },
        ("GET" | "HEAD", Target::Manifest(r)) => match digest(r) {
            Some(d) => serve_manifest(&s.store, &d, method == Method::HEAD).await,
            None => tag_refused(r),
        },
        ("POST", Target::Uploads) => {
            // The store is content-addressed: any name holds every blob it keeps.
            if let Some(d) = q.mount.as_deref().and_then(Digest::parse)
                && s.store.blob_size(&d).await.is_some()
            {
                return created(&format!("/v2/{name}/blobs/{d}"), &d);
            }
            let id = match s.store.begin().await {
                Ok(id) => id,
                Err(e) => return store_error(e),
            };
            match q.digest {
                // A whole blob in one request.
                Some(d) => finish(&s.store, name, &id, &d, body, &who).await,
                None => upload_accepted(name, &id, 0),
            }
        }
        ("PATCH", Target::Upload(id)) => match s.store.append(id, body.into_data_stream(), UPLOAD_STALL).await {
            Ok(n) => upload_accepted(name, id, n),
            Err(e) => store_error(e),
        },
        ("PUT", Target::Upload(id)) => match q.digest {
            Some(d) => finish(&s.store, name, id, &d, body, &who).await,
            None => bad_digest(""),
        },
        ("DELETE", Target::Upload(id)) => {
            s.store.abort(id).await;
            StatusCode::NO_CONTENT.into_response()
        }
        ("PUT", Target::Manifest(r)) => {
            let bytes = match crate::http::server::read_body(body, oci::MAX_MANIFEST_BYTES).await {
                Ok(b) => b,
                Err(e) => return e.into_response(),
            };
            // Under a tag (`docker push`): kept by its digest, the tag not kept.
            let d = match digest(r) {
                Some(d) => d,
                None if valid_tag(r) => Digest::of(&bytes),
                None => return tag_refused(r),
            };
            let content_type = headers.get("content-type").and_then(|v| v.to_str().ok());
            match s.store.put_manifest(&d, &bytes, content_type).await {
                Ok(p) => {
                    tracing::info!(token = %who, repository = name, digest = %d, media_type = %p.media_type, "image manifest pushed");
                    created(&format!("/v2/{name}/manifests/{d}"), &d)
                }
                Err(e) => store_error(e),
            }
        }
        _ => oci_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "UNSUPPORTED",
            "image-method-unsupported",
            "not a method this store answers here (deletes are `pl image gc`'s)",
        ),
    }
}

async fn finish(store: &Store, name: &str, id: &str, digest: &str, body: Body, who: &str) -> Response {
    let Some(d) = Digest::parse(digest) else {
        store.abort(id).await;
        return bad_digest(digest);
    };
    if let Err(e) = store.append(id, body.into_data_stream(), UPLOAD_STALL).await {
        return store_error(e);
    }
    match store.finish(id, &d).await {
        Ok(bytes) => {
            tracing::info!(token = %who, repository = name, digest = %d, bytes, "image blob pushed");
            created(&format!("/v2/{name}/blobs/{d}"), &d)
        }
        Err(e) => store_error(e),
    }
}

fn created(location: &str, d: &Digest) -> Response {
    let mut r = StatusCode::CREATED.into_response();
    if let (Ok(l), Ok(dv)) = (HeaderValue::from_str(location), HeaderValue::from_str(d.as_str())) {
        r.headers_mut().insert("location", l);
        r.headers_mut().insert("docker-content-digest", dv);
    }
    r
}

fn upload_accepted(name: &str, id: &str, written: u64) -> Response {
    let mut r = StatusCode::ACCEPTED.into_response();
    let range = format!("0-{}", written.saturating_sub(1));
    if let (Ok(l), Ok(u), Ok(rg)) = (
        HeaderValue::from_str(&format!("/v2/{name}/blobs/uploads/{id}")),
        HeaderValue::from_str(id),
        HeaderValue::from_str(&range),
    ) {
        r.headers_mut().insert("location", l);
        r.headers_mut().insert("docker-upload-uuid", u);
        r.headers_mut().insert("range", rg);
    }
    r
}

pub(crate) fn bad_digest(d: &str) -> Response {
    oci_error(
        StatusCode::BAD_REQUEST,
        "DIGEST_INVALID",
        "image-digest-invalid",
        format!("`{d}` is not a sha256 digest (sha256:<64 lowercase hex>)"),
    )
}

fn tag_refused(r: &str) -> Response {
    oci_error(
        StatusCode::BAD_REQUEST,
        "MANIFEST_INVALID",
        "image-tag-unsupported",
        format!("`{r}`: this store reads manifests by digest only, as Git names images"),
    )
}

/// A tag as the distribution spec writes it.
fn valid_tag(t: &str) -> bool {
    let b = t.as_bytes();
    (1..=128).contains(&b.len())
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || b"._-".contains(c))
}

/// A held manifest (or, for `HEAD`, its size) under the media type it was pushed with.
pub(crate) async fn serve_manifest(store: &Store, d: &Digest, head: bool) -> Response {
    match store.manifest_type(d).await {
        Some(t) => serve_blob(store, d, Some(t), head).await,
        None => oci_error(
            StatusCode::NOT_FOUND,
            "MANIFEST_UNKNOWN",
            "image-not-found",
            format!("no manifest {d}"),
        ),
    }
}

/// A held blob's bytes (or, for `HEAD`, its size), with the headers the spec gives them.
pub(crate) async fn serve_blob(store: &Store, d: &Digest, media_type: Option<String>, head: bool) -> Response {
    let Some(size) = store.blob_size(d).await else {
        return oci_error(
            StatusCode::NOT_FOUND,
            "BLOB_UNKNOWN",
            "image-not-found",
            format!("no blob {d}"),
        );
    };
    let content_type = media_type.unwrap_or_else(|| "application/octet-stream".to_owned());
    let body = if head {
        Body::empty()
    } else {
        match tokio::fs::File::open(store.blob_path(d)).await {
            Ok(f) => Body::from_stream(chunks(f)),
            Err(e) => return store_error(e.into()),
        }
    };
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert("content-length", HeaderValue::from(size));
    if let Ok(v) = HeaderValue::from_str(&content_type) {
        h.insert("content-type", v);
    }
    if let Ok(v) = HeaderValue::from_str(d.as_str()) {
        h.insert("docker-content-digest", v);
    }
    r
}

/// A file read in 256 KiB chunks.
fn chunks(f: tokio::fs::File) -> impl futures_util::Stream<Item = std::io::Result<axum::body::Bytes>> {
    futures_util::stream::unfold(Some(f), |f| async move {
        use tokio::io::AsyncReadExt;
        let mut f = f?;
        let mut buf = vec![0u8; 256 * 1024];
        match f.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(axum::body::Bytes::from(buf)), Some(f)))
            }
            Err(e) => Some((Err(e), None)),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_into_name_and_target() {
        let d = format!("sha256:{}", "a".repeat(64));
        assert_eq!(
            target(&format!("shop/web/blobs/{d}")),
            Some(("shop/web", Target::Blob(&d)))
        );
        assert_eq!(target("web/blobs/uploads/"), Some(("web", Target::Uploads)));
        assert_eq!(target("web/blobs/uploads/abc"), Some(("web", Target::Upload("abc"))));
        assert_eq!(target("web/manifests/v1"), Some(("web", Target::Manifest("v1"))));
        assert_eq!(target("Web/manifests/v1"), None, "names are lowercase");
        assert_eq!(target("../x/blobs/y"), None);
        assert_eq!(target("web/tags/list"), None);
    }
}
