//! The OCI distribution protocol, the part Pushleft reads: a repository's tags
//! (`GET /v2/<name>/tags/list`, paged by its `Link` header) and a tag's manifest digest (`HEAD
//! /v2/<name>/manifests/<tag>`, its `Docker-Content-Digest`, or the digest of the manifest's
//! bytes when a registry does not say). Registries that ask for a token (`WWW-Authenticate:
//! Bearer realm=…`) get one from their realm, with basic credentials when given; those that
//! ask for basic credentials get them.
//!
//! Every answer is bounded: bytes per body, pages per listing, tags in all, time per request.
//! A registry on a loopback address is spoken to over plain HTTP (as Docker does for
//! `localhost`); any other over HTTPS with the system's roots.

pub mod archive;
pub mod oci;
pub mod push;

use sha2::Digest;
use std::time::Duration;
use zeroize::Zeroizing;

/// Most bytes read of one answer (a tag page, a manifest, a token).
pub const MAX_BODY_BYTES: u64 = 4 << 20;
/// Most tags read of one repository.
pub const MAX_TAGS: usize = 10_000;
/// Most pages a tag listing may take.
pub const MAX_PAGES: usize = 100;
/// Each request's whole time.
pub const TIMEOUT: Duration = Duration::from_secs(15);

/// The manifest types a digest is asked for: indexes first, as `docker pull` resolves them.
const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("`{0}` names no registry: write it as `host[:port]/name` (Docker Hub's short names are not read)")]
    NoRegistry(String),
    #[error("{url}: {detail}")]
    Unreachable { url: String, detail: String },
    #[error("{url}: the registry answered {status}")]
    Status { url: String, status: u16 },
    #[error("{url}: {detail}")]
    Malformed { url: String, detail: String },
    #[error("{url}: the registry asks for credentials, and none were given or they were refused")]
    Unauthorized { url: String },
}

impl RegistryError {
    /// The stable code `pl` reports it with.
    pub fn code(&self) -> &'static str {
        match self {
            RegistryError::NoRegistry(_) => "image-registry-unnamed",
            RegistryError::Unreachable { .. } => "image-registry-unreachable",
            RegistryError::Status { status: 404, .. } => "image-not-found",
            RegistryError::Status { .. } | RegistryError::Malformed { .. } => "image-registry-refused",
            RegistryError::Unauthorized { .. } => "image-registry-unauthorized",
        }
    }
}

/// A client of one registry.
pub struct Registry {
    agent: ureq::Agent,
    /// `http://127.0.0.1:5000` or `https://registry.example.com`.
    base: String,
    /// `user:password`, for basic authentication and token realms.
    credentials: Option<Zeroizing<String>>,
    /// The bearer token the registry last handed out, reused while it is accepted.
    token: std::cell::RefCell<Option<Zeroizing<String>>>,
}

/// A repository reference split: `host[:port]` and the name within it.
pub fn split(repository: &str) -> Result<(&str, &str), RegistryError> {
    let (host, name) = repository
        .split_once('/')
        .ok_or_else(|| RegistryError::NoRegistry(repository.to_owned()))?;
    if !(host.contains('.') || host.contains(':') || host == "localhost") || name.is_empty() {
        return Err(RegistryError::NoRegistry(repository.to_owned()));
    }
    Ok((host, name))
}

fn loopback(host: &str) -> bool {
    let bare = host.rsplit_once(':').map_or(host, |(h, _)| h);
    let bare = bare.trim_start_matches('[').trim_end_matches(']');
    bare == "localhost" || bare.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

impl Registry {
    /// A client of the registry `host` (`127.0.0.1:5000`), with `user:password` when given.
    pub fn new(host: &str, credentials: Option<Zeroizing<String>>) -> Registry {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(TIMEOUT))
            .max_redirects(3)
            .build()
            .into();
        let scheme = if loopback(host) { "http" } else { "https" };
        Registry {
            agent,
            base: format!("{scheme}://{host}"),
            credentials,
            token: std::cell::RefCell::new(None),
        }
    }

    /// Every tag of `name` (at most [`MAX_TAGS`]), in the registry's order.
    pub fn tags(&self, name: &str) -> Result<Vec<String>, RegistryError> {
        #[derive(serde::Deserialize)]
        struct Page {
            #[serde(default)]
            tags: Option<Vec<String>>,
        }
        let mut out = Vec::new();
        let mut path = format!("/v2/{name}/tags/list?n=1000");
        for _ in 0..MAX_PAGES {
            let url = format!("{}{path}", self.base);
            let mut resp = self.send("GET", &url, None)?;
            let next = resp
                .headers()
                .get("link")
                .and_then(|v| v.to_str().ok())
                .and_then(next_link);
            let page: Page = read(&url, &mut resp).and_then(|b| {
                serde_json::from_slice(&b).map_err(|e| RegistryError::Malformed {
                    url: url.clone(),
                    detail: format!("a tag list that is not JSON: {e}"),
                })
            })?;
            out.extend(page.tags.unwrap_or_default());
            if out.len() >= MAX_TAGS {
                out.truncate(MAX_TAGS);
                return Ok(out);
            }
            match next {
                // Only a path on this registry is followed, never another host.
                Some(p) if p.starts_with("/v2/") => path = p,
                _ => return Ok(out),
            }
        }
        Ok(out)
    }

    /// The digest `name:tag` resolves to (an index's when the tag names one).
    pub fn digest(&self, name: &str, tag: &str) -> Result<String, RegistryError> {
        let url = format!("{}/v2/{name}/manifests/{tag}", self.base);
        let resp = self.send("HEAD", &url, Some(ACCEPT))?;
        if let Some(d) = said_digest(&resp) {
            return Ok(d);
        }
        let mut resp = self.send("GET", &url, Some(ACCEPT))?;
        if let Some(d) = said_digest(&resp) {
            return Ok(d);
        }
        let body = read(&url, &mut resp)?;
        Ok(format!("sha256:{}", hex::encode(sha2::Sha256::digest(&body))))
    }

    /// One request, authenticated as the registry asks (once), its answer when it succeeded.
    fn send(
        &self,
        method: &str,
        url: &str,
        accept: Option<&str>,
    ) -> Result<ureq::http::Response<ureq::Body>, RegistryError> {
        let mut resp = self.attempt(method, url, accept)?;
        if resp.status().as_u16() == 401 {
            let challenge = resp
                .headers()
                .get("www-authenticate")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            self.authenticate(url, &challenge)?;
            resp = self.attempt(method, url, accept)?;
        }
        match resp.status().as_u16() {
            200..=299 => Ok(resp),
            401 | 403 => Err(RegistryError::Unauthorized { url: url.to_owned() }),
            status => Err(RegistryError::Status {
                url: url.to_owned(),
                status,
            }),
        }
    }

    fn attempt(
        &self,
        method: &str,
        url: &str,
        accept: Option<&str>,
    ) -> Result<ureq::http::Response<ureq::Body>, RegistryError> {
        let authorization = match (self.token.borrow().as_ref(), &self.credentials) {
            (Some(t), _) => Some(Zeroizing::new(format!("Bearer {}", t.as_str()))),
            (None, Some(c)) => Some(Zeroizing::new(format!("Basic {}", basic(c)))),
            (None, None) => None,
        };
        let unreachable = |e: ureq::Error| RegistryError::Unreachable {
            url: url.to_owned(),
            detail: e.to_string(),
        };
        let request = match method {
            "HEAD" => self.agent.head(url),
            _ => self.agent.get(url),
        };
        let request = match accept {
            Some(a) => request.header("accept", a),
            None => request,
        };
        match authorization {
            Some(a) => request.header("authorization", a.as_str()).call(),
            None => request.call(),
        }
        .map_err(unreachable)
    }

    /// Answers a `WWW-Authenticate` challenge: a bearer token from its realm (with the
    /// credentials, when given), or basic credentials.
    fn authenticate(&self, url: &str, challenge: &str) -> Result<(), RegistryError> {
        let unauthorized = || RegistryError::Unauthorized { url: url.to_owned() };
        let Some(params) = challenge.strip_prefix("Bearer ") else {
            // Basic: the credentials were sent already, or there are none.
            return Err(unauthorized());
        };
        let field = |key: &str| -> Option<String> {
            params.split(',').find_map(|kv| {
                let (k, v) = kv.trim().split_once('=')?;
                (k == key).then(|| v.trim_matches('"').to_owned())
            })
        };
        let realm = field("realm").ok_or_else(unauthorized)?;
        if !(realm.starts_with("https://") || (realm.starts_with("http://") && self.base.starts_with("http://"))) {
            return Err(RegistryError::Malformed {
                url: url.to_owned(),
                detail: format!("a token realm `{realm}` that is not HTTPS"),
            });
        }
        let mut query = Vec::new();
        for key in ["service", "scope"] {
            if let Some(v) = field(key) {
                query.push(format!("{key}={}", encode(&v)));
            }
        }
        let token_url = match query.is_empty() {
            true => realm,
            false => format!("{realm}?{}", query.join("&")),
        };
        let request = self.agent.get(&token_url);
        let mut resp = match &self.credentials {
            Some(c) => request
                .header("authorization", Zeroizing::new(format!("Basic {}", basic(c))).as_str())
                .call(),
            None => request.call(),
        }
        .map_err(|e| RegistryError::Unreachable {
            url: token_url.clone(),
            detail: e.to_string(),
        })?;
        if resp.status().as_u16() != 200 {
            return Err(unauthorized());
        }
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let body = Zeroizing::new(read(&token_url, &mut resp)?);
        let t: Token = serde_json::from_slice(&body).map_err(|_| unauthorized())?;
        let token = t.token.or(t.access_token).ok_or_else(unauthorized)?;
        *self.token.borrow_mut() = Some(Zeroizing::new(token));
        Ok(())
    }
}

/// The tag `choose` picks among `repository`'s tags (`host[:port]/name`), with the digest it
/// resolves to; `None` when it picks none. `credentials` by registry host.
pub fn pick(
    repository: &str,
    credentials: &std::collections::HashMap<String, Zeroizing<String>>,
    choose: impl for<'t> Fn(&'t [String]) -> Option<&'t str>,
) -> Result<Option<(String, String)>, RegistryError> {
    let (host, name) = split(repository)?;
    let client = Registry::new(host, credentials.get(host).cloned());
    let tags = client.tags(name)?;
    match choose(&tags) {
        Some(tag) => Ok(Some((tag.to_owned(), client.digest(name, tag)?))),
        None => Ok(None),
    }
}

fn basic(credentials: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(credentials)
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn said_digest(resp: &ureq::http::Response<ureq::Body>) -> Option<String> {
    resp.headers()
        .get("docker-content-digest")
        .and_then(|v| v.to_str().ok())
        .filter(|d| {
            d.strip_prefix("sha256:")
                .is_some_and(|h| h.len() == 64 && h.bytes().all(|c| c.is_ascii_hexdigit()))
        })
        .map(str::to_ascii_lowercase)
}

fn read(url: &str, resp: &mut ureq::http::Response<ureq::Body>) -> Result<Vec<u8>, RegistryError> {
    resp.body_mut()
        .with_config()
        .limit(MAX_BODY_BYTES)
        .read_to_vec()
        .map_err(|e| RegistryError::Malformed {
            url: url.to_owned(),
            detail: format!("reading the answer: {e}"),
        })
}

/// The path of a `Link: </v2/…?last=x&n=1000>; rel="next"` header.
fn next_link(header: &str) -> Option<String> {
    header.split(',').find_map(|part| {
        let (target, params) = part.split_once(';')?;
        params
            .contains("rel=\"next\"")
            .then(|| target.trim().trim_start_matches('<').trim_end_matches('>').to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_and_links() {
        assert_eq!(
            split("127.0.0.1:5000/team/api").ok(),
            Some(("127.0.0.1:5000", "team/api"))
        );
        assert_eq!(
            split("registry.example.invalid/api").ok(),
            Some(("registry.example.invalid", "api"))
        );
        assert!(split("library/nginx").is_err(), "Docker Hub's short names are refused");
        assert!(split("nginx").is_err());
        assert!(loopback("127.0.0.1:5000") && loopback("localhost:5000") && loopback("[::1]:5000"));
        assert!(!loopback("registry.example.invalid") && !loopback("10.0.0.1:5000"));
        assert_eq!(
            next_link("</v2/api/tags/list?last=b&n=2>; rel=\"next\"").as_deref(),
            Some("/v2/api/tags/list?last=b&n=2")
        );
        assert_eq!(next_link("<https://elsewhere.invalid/x>; rel=\"prev\""), None);
        assert_eq!(encode("repository:api:pull"), "repository%3Aapi%3Apull");
    }
}
