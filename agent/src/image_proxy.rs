//! The control plane's image store, served to this node's engine: a read-only distribution
//! endpoint on a loopback port, whose every manifest and blob comes from the agent API over the
//! node's mutual-TLS connection (`AgentClient::fetch`), streamed, never kept. The engine pulls
//! `127.0.0.1:<port>/<name>@sha256:…` for an image Git names `pushleft.invalid/<name>@…`, and
//! asks only for the blobs it lacks, so only those travel.
//!
//! Who may reach it: anything on this machine can connect to a loopback port, so every request
//! must carry the basic credentials this process made at start (random, never written down),
//! which the agent hands to the engine with each pull; anyone else gets 401 and nothing is
//! fetched. Requests are `GET`/`HEAD` of `/v2/`, a manifest or a blob by digest; nothing else.

use crate::client::AgentClient;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use std::net::SocketAddr;
use std::sync::Arc;
use zeroize::Zeroizing;

/// Most connections served at once (an engine pulls a few layers in parallel).
pub const MAX_CONNECTIONS: usize = 32;

/// Where the engine reaches the store, and with what.
#[derive(Clone)]
pub struct StoreProxy {
    pub addr: SocketAddr,
    pub username: String,
    pub password: Arc<Zeroizing<String>>,
    /// Bytes streamed to the engine since the start (what the control plane sent this node).
    served: Arc<std::sync::atomic::AtomicU64>,
}

impl StoreProxy {
    /// The reference the engine pulls for an image of the store (`None` for any other image).
    pub fn local_reference(&self, image: &str) -> Option<String> {
        let (name, digest) = agent_proto::images::in_store(image)?;
        Some(format!("{}/{name}@{digest}", self.addr))
    }

    /// Bytes of manifests and blobs streamed to the engine since the start.
    pub fn bytes_served(&self) -> u64 {
        self.served.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The registry address the engine's credentials name.
    pub fn server(&self) -> String {
        self.addr.to_string()
    }
}

type Body = BoxBody<Bytes, std::io::Error>;

/// Starts the proxy on an ephemeral loopback port.
pub async fn start(client: Arc<AgentClient>) -> std::io::Result<StoreProxy> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let mut raw = [0u8; 24];
    getrandom::fill(&mut raw).map_err(|e| std::io::Error::other(e.to_string()))?;
    let proxy = StoreProxy {
        addr,
        username: "pushleft".to_owned(),
        password: Arc::new(Zeroizing::new(hex::encode(raw))),
        served: Arc::default(),
    };
    let served = Arc::clone(&proxy.served);
    let expected = Arc::new(Zeroizing::new(format!(
        "Basic {}",
        base64_encode(format!("{}:{}", proxy.username, proxy.password.as_str()).as_bytes())
    )));
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
                continue; // dropped: the engine retries
            };
            let (client, expected, served) = (Arc::clone(&client), Arc::clone(&expected), Arc::clone(&served));
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let (client, expected, served) = (Arc::clone(&client), Arc::clone(&expected), Arc::clone(&served));
                    async move { Ok::<_, std::convert::Infallible>(handle(&client, &expected, &served, req).await) }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .header_read_timeout(std::time::Duration::from_secs(10))
                    .timer(hyper_util::rt::TokioTimer::new())
                    .serve_connection(io, service)
                    .await;
                drop(permit);
            });
        }
    });
    tracing::info!(listen = %addr, "serving the control plane's image store to the engine");
    Ok(proxy)
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::from_static(text.as_bytes()))
            .map_err(|e| match e {})
            .boxed(),
    );
    *r.status_mut() = status;
    r
}

/// Equal in time whatever the bytes (the credentials are the only secret here).
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn handle(
    client: &Arc<AgentClient>,
    expected: &str,
    served: &Arc<std::sync::atomic::AtomicU64>,
    req: Request<Incoming>,
) -> Response<Body> {
    let auth = req
        .headers()
        .get("authorization")
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    if !same(auth, expected.as_bytes()) {
        let mut r = plain(StatusCode::UNAUTHORIZED, "credentials required\n");
        r.headers_mut().insert(
            "www-authenticate",
            hyper::header::HeaderValue::from_static("Basic realm=\"pushleft-agent\""),
        );
        return r;
    }
    let head = req.method() == Method::HEAD;
    if !(head || req.method() == Method::GET) {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "read only\n");
    }
    let path = req.uri().path();
    if path == "/v2/" || path == "/v2" {
        let mut r = plain(StatusCode::OK, "{}");
        r.headers_mut().insert(
            "docker-distribution-api-version",
            hyper::header::HeaderValue::from_static("registry/2.0"),
        );
        return r;
    }
    use agent_proto::images::Fetch;
    let target = path
        .rsplit_once("/manifests/")
        .map(|(_, d)| (Fetch::Manifest, d))
        .or_else(|| {
            path.rsplit_once("/blobs/")
                .filter(|(_, d)| !d.contains('/'))
                .map(|(_, d)| (Fetch::Blob, d))
        });
    let Some((kind, digest)) = target.filter(|(_, d)| {
        agent_proto::images::in_store(&format!("{}/x@{d}", agent_proto::images::STORE_HOST)).is_some()
    }) else {
        return plain(StatusCode::NOT_FOUND, "by digest only\n");
    };
    fetch(Arc::clone(client), kind, digest.to_owned(), head, Arc::clone(served)).await
}

/// One fetch through the agent API on a blocking thread, its body handed over in chunks (a
/// bounded channel: the engine's pace sets the fetch's).
async fn fetch(
    client: Arc<AgentClient>,
    kind: agent_proto::images::Fetch,
    digest: String,
    head: bool,
    served: Arc<std::sync::atomic::AtomicU64>,
) -> Response<Body> {
    let (parts_tx, parts_rx) = tokio::sync::oneshot::channel();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(4);
    tokio::task::spawn_blocking(move || {
        let resp = match client.fetch(kind, &digest, head) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(digest = %digest, error = %e, "image fetch failed");
                let _ = parts_tx.send(None);
                return;
            }
        };
        let (parts, body) = resp.into_parts();
        let _ = parts_tx.send(Some(parts));
        if head {
            return;
        }
        let mut reader = body.into_reader();
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            match std::io::Read::read(&mut reader, &mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    served.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                    if tx
                        .blocking_send(Ok(Frame::data(Bytes::copy_from_slice(&buf[..n]))))
                        .is_err()
                    {
                        return; // the engine went away
                    }
                }
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    return;
                }
            }
        }
    });
    let Ok(Some(parts)) = parts_rx.await else {
        return plain(StatusCode::BAD_GATEWAY, "the control plane did not answer\n");
    };
    let stream = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|f| (f, rx)) });
    let body: Body = if head {
        Full::new(Bytes::new()).map_err(|e| match e {}).boxed()
    } else {
        BodyExt::boxed(StreamBody::new(stream))
    };
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::from_u16(parts.status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    for name in ["content-type", "content-length", "docker-content-digest"] {
        if let Some(v) = parts.headers.get(name)
            && let Ok(v) = hyper::header::HeaderValue::from_bytes(v.as_bytes())
        {
            r.headers_mut().insert(name, v);
        }
    }
    r
}
