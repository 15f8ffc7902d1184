//! The HTTP server the surfaces share: TLS (and the agent API's client certificates), the
//! connection and time limits, bounded bodies, bearer tokens, and errors in the API's shape.
//! Every surface's router is served by [`serve`]; nothing here knows a route.

use crate::auth::{Denied, Tokens};
use crate::config::Role;
use crate::ops::agents::{Certified, NotIssued};
use crate::ops::{Answer, Kind, OpError};
use agent_proto::{MAX_AGENT_BODY_BYTES, Refusal, RefusalBody};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use operator_proto::ErrorBody;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

/// The largest request body accepted (webhooks are the only large bodies).
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// How long a client may take to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send a request's headers (and to start the next request on
/// a kept-alive connection).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send a request's body.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) fn refuse(d: Denied) -> Response {
    let status = match d {
        Denied::BadToken | Denied::BadSignature => StatusCode::UNAUTHORIZED,
        Denied::InsufficientRole => StatusCode::FORBIDDEN,
        Denied::WebhookNotConfigured => StatusCode::NOT_FOUND,
    };
    error(status, d.code(), d.message())
}

/// The ledger's trouble as the API answers it: one refusal, `ops`' own (logged there).
pub(crate) fn internal(e: impl std::fmt::Display) -> Response {
    refusal(&OpError::unavailable(e))
}

/// The name of the request's token, when it may do what `needs` asks.
pub(crate) fn authorized<'t>(tokens: &'t Tokens, headers: &HeaderMap, needs: Role) -> Result<&'t str, Denied> {
    let header = headers.get("authorization").and_then(|v| v.to_str().ok());
    tokens.authorize(header, needs)
}

pub(crate) fn too_many(code: &str, message: &str) -> Response {
    error(StatusCode::TOO_MANY_REQUESTS, code, message)
}

/// Why a request body was not read.
pub(crate) enum BodyError {
    TooLarge(usize),
    Timeout,
}

impl IntoResponse for BodyError {
    fn into_response(self) -> Response {
        match self {
            BodyError::TooLarge(limit) => error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                format!("the body is larger than {limit} bytes"),
            ),
            BodyError::Timeout => error(
                StatusCode::REQUEST_TIMEOUT,
                "body-timeout",
                "the body did not arrive in time",
            ),
        }
    }
}

/// Reads a request body up to `limit` bytes within [`BODY_TIMEOUT`].
pub(crate) async fn read_body(body: axum::body::Body, limit: usize) -> Result<Bytes, BodyError> {
    match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(_)) => Err(BodyError::TooLarge(limit)),
        Err(_) => Err(BodyError::Timeout),
    }
}

/// A refusal as the agent protocol answers it.
pub(crate) fn refused(r: Refusal, message: &str) -> Response {
    let status = match r {
        Refusal::TokenUnknown
        | Refusal::TokenUsed
        | Refusal::TokenExpired
        | Refusal::TokenWrongNode
        | Refusal::CertificateRevoked
        | Refusal::CertificateExpired => StatusCode::UNAUTHORIZED,
        Refusal::NodeNotDeclared => StatusCode::NOT_FOUND,
        Refusal::NodeRetired | Refusal::NodeDraining | Refusal::NotYourJob => StatusCode::FORBIDDEN,
        Refusal::CsrInvalid
        | Refusal::CsrNameMismatch
        | Refusal::RecipientInvalid
        | Refusal::MalformedRequest
        | Refusal::SecretInResult => StatusCode::BAD_REQUEST,
        Refusal::StaleFencingToken => StatusCode::CONFLICT,
        Refusal::LogStreamGone => StatusCode::GONE,
        Refusal::NoControlCa => StatusCode::SERVICE_UNAVAILABLE,
    };
    let body = RefusalBody {
        code: r,
        message: message.to_owned(),
    };
    (status, axum::Json(body)).into_response()
}

/// A bounded JSON body.
pub(crate) async fn json<T: serde::de::DeserializeOwned>(body: axum::body::Body) -> Result<T, Response> {
    let bytes = read_body(body, MAX_AGENT_BODY_BYTES)
        .await
        .map_err(IntoResponse::into_response)?;
    serde_json::from_slice(&bytes).map_err(|_| refused(Refusal::MalformedRequest, "the body is not the expected JSON"))
}

/// The client certificate a connection presented: its fingerprint (SHA-256 of the DER, hex),
/// which nodes are known by, and the DER (read only for a certificate the ledger does not
/// hold, by a control plane that re-admits nodes: `ops::agents::readmit`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerCert {
    pub fingerprint: String,
    pub der: Arc<[u8]>,
}

/// The address a connection came from.
#[derive(Clone, Copy, Debug)]
pub struct PeerAddr(pub std::net::SocketAddr);

/// The request's peer address (unspecified when served without [`serve`], as in a bench).
pub struct Peer(pub std::net::SocketAddr);

impl<S: Send + Sync> FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Peer(parts.extensions.get::<PeerAddr>().map_or_else(
            || std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
            |p| p.0,
        )))
    }
}

/// Loads the API's TLS certificate chain and key (PEM).
pub fn tls_config(cert: &std::path::Path, key: &std::path::Path) -> Result<rustls::ServerConfig, String> {
    tls_config_with(cert, key, &[])
}

/// The operator listener's TLS: the API's certificate, offering HTTP/2 before HTTP/1.1 by
/// ALPN. A browser opens at most six HTTP/1.1 connections to a host, and each open page of
/// the web view holds one for its live stream: over HTTP/2 every page shares one connection.
pub fn operator_tls_config(cert: &std::path::Path, key: &std::path::Path) -> Result<rustls::ServerConfig, String> {
    let mut tls = tls_config(cert, key)?;
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tls)
}

/// The agent API's TLS: a client certificate signed by the control CA (`client_ca`) is
/// required to finish the handshake.
pub fn tls_config_with(
    cert: &std::path::Path,
    key: &std::path::Path,
    client_cas: &[&std::path::Path],
) -> Result<rustls::ServerConfig, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("{}: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = if client_cas.is_empty() {
        builder.with_no_client_auth()
    } else {
        {
            let mut roots = rustls::RootCertStore::empty();
            for ca in client_cas {
                for c in CertificateDer::pem_file_iter(ca).map_err(|e| format!("{}: {e}", ca.display()))? {
                    roots
                        .add(c.map_err(|e| format!("{}: {e}", ca.display()))?)
                        .map_err(|e| format!("{}: {e}", ca.display()))?;
                }
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| e.to_string())?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    builder.with_single_cert(certs, key).map_err(|e| e.to_string())
}

/// Serves the API over TLS on `listener` until `shutdown` turns true, at most
/// `max_connections` at once: past that a new connection is closed as soon as it is
/// accepted, so held-open sockets cannot exhaust the daemon's file descriptors. Each
/// connection gets [`HANDSHAKE_TIMEOUT`] for TLS and then speaks what ALPN chose: HTTP/2
/// (the operator listener offers it, [`operator_tls_config`]) with the limits of
/// [`serve_h2`], or HTTP/1.1 with [`HEADER_TIMEOUT`] for each request's headers.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: rustls::ServerConfig,
    app: Router,
    max_connections: usize,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let slots = Arc::new(tokio::sync::Semaphore::new(max_connections));
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and friends: back off a little; connections in progress finish
                    // or time out and free descriptors.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => break,
        };
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::debug!(%peer, "connection limit reached; closing");
            drop(tcp);
            continue;
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(t)) => t,
                _ => {
                    tracing::debug!(%peer, "TLS handshake failed or timed out");
                    return;
                }
            };
            // The client certificate (the agent API requires one): its SHA-256, for handlers to
            // look the node up by.
            let peer_cert = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| PeerCert {
                    fingerprint: agent_proto::cert_fingerprint(c.as_ref()),
                    der: Arc::from(c.as_ref()),
                });
            // Each request gets the peer's certificate and address as extensions. Not as
            // layers on the router: `Router::layer` rebuilds every route, an allocation per
            // route per connection, which ten thousand agents' connections each kept.
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
            let app = hyper_util::service::TowerToHyperService::new(app);
            let service = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(peer_cert.clone());
                req.extensions_mut().insert(PeerAddr(peer));
                hyper::service::Service::call(&app, req)
            });
            let io = hyper_util::rt::TokioIo::new(tls);
            let ended = if h2 {
                serve_h2(io, service).await
            } else {
                hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .max_buf_size(MAX_HEADER_BYTES)
                    .serve_connection(io, service)
                    .await
            };
            if let Err(e) = ended {
                tracing::debug!(%peer, h2, error = %e, "connection ended");
            }
        });
    }
}

/// The most bytes of headers a request may send, on either protocol.
const MAX_HEADER_BYTES: usize = 64 * 1024;
/// The most requests at once on one HTTP/2 connection (a browser's open pages of the view and
/// what they fetch; the live streams are limited per session besides).
pub const H2_MAX_STREAMS: u32 = 64;
/// How long one HTTP/2 connection lasts before it is asked to close (in-flight requests
/// finish; the browser opens a new one): HTTP/2 has no header timeout between requests, so
/// an idle connection that answers pings would otherwise hold its slot for ever.
pub const H2_MAX_AGE: Duration = Duration::from_secs(600);

/// One HTTP/2 connection: bounded streams, header size and age, pings to find a peer gone
/// quiet (hyper bounds reset floods on its own).
async fn serve_h2<I, S>(io: I, service: S) -> Result<(), hyper::Error>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::HttpService<hyper::body::Incoming> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::ResBody: Send + 'static,
    <S::ResBody as axum::body::HttpBody>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    <S::ResBody as axum::body::HttpBody>::Data: Send,
{
    let conn = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
        .timer(hyper_util::rt::TokioTimer::new())
        .max_concurrent_streams(H2_MAX_STREAMS)
        .max_header_list_size(MAX_HEADER_BYTES as u32)
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(HEADER_TIMEOUT)
        .serve_connection(io, service);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => return r,
        _ = tokio::time::sleep(H2_MAX_AGE) => {}
    }
    conn.as_mut().graceful_shutdown();
    conn.await
}

/// A typed answer with its status.
pub(crate) fn answer<T: serde::Serialize>(status: StatusCode, body: &T) -> Response {
    (status, axum::Json(body)).into_response()
}

/// A typed refusal: a stable code and the daemon's words.
pub(crate) fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    answer(
        status,
        &ErrorBody {
            code: code.to_owned(),
            message: message.into(),
        },
    )
}

pub(crate) fn malformed(message: impl Into<String>) -> Response {
    error(StatusCode::BAD_REQUEST, "malformed-request", message)
}

/// A use case's result on the wire: its answer with `ok`, or its refusal with the status of
/// its kind.
pub(crate) fn reply<T: serde::Serialize>(ok: StatusCode, result: Answer<T>) -> Response {
    match result {
        Ok(body) => answer(ok, &body),
        Err(e) => refusal(&e),
    }
}

pub(crate) fn refusal(e: &OpError) -> Response {
    error(status_of(e.kind), e.code, e.message.clone())
}

/// The status a use case's refusal answers with, for the API and the web view alike.
pub(crate) fn status_of(kind: Kind) -> StatusCode {
    match kind {
        Kind::NotFound => StatusCode::NOT_FOUND,
        Kind::Conflict => StatusCode::CONFLICT,
        Kind::Malformed => StatusCode::BAD_REQUEST,
        Kind::Forbidden => StatusCode::FORBIDDEN,
        Kind::FailedOnNode => StatusCode::BAD_GATEWAY,
        Kind::Pending => StatusCode::GATEWAY_TIMEOUT,
        Kind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        Kind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// The role a route needs, as a type (`Caller<Operators>`).
pub(crate) trait Needs {
    const ROLE: Role;
}

pub(crate) struct Viewers;
pub(crate) struct Operators;
pub(crate) struct Admins;

impl Needs for Viewers {
    const ROLE: Role = Role::Viewer;
}
impl Needs for Operators {
    const ROLE: Role = Role::Operator;
}
impl Needs for Admins {
    const ROLE: Role = Role::Admin;
}

/// The caller's token name, once its bearer token holds `R`'s role. An extractor of the
/// request's head: a refused request (401, 403) is answered before its body is read, and
/// reads and writes nothing.
pub(crate) struct Caller<R> {
    pub name: String,
    role: PhantomData<R>,
}

/// A surface's state that knows the API's tokens.
pub(crate) trait HasTokens {
    fn tokens(&self) -> &Tokens;
}

impl<S: HasTokens + Send + Sync, R: Needs> FromRequestParts<S> for Caller<R> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        match authorized(state.tokens(), &parts.headers, R::ROLE) {
            Ok(name) => Ok(Caller {
                name: name.to_owned(),
                role: PhantomData,
            }),
            Err(d) => Err(refuse(d)),
        }
    }
}

/// The most an operator's JSON request may be: every one is a few names.
pub const MAX_ASK_BYTES: usize = 4096;

/// A small JSON request of the operator surface: at most [`MAX_ASK_BYTES`] within
/// [`BODY_TIMEOUT`], read as `T` (else `400 malformed-request`, saying what did not read).
/// Taken after [`Caller`], so an unauthorised body is never read.
pub(crate) struct Ask<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for Ask<T> {
    type Rejection = Response;

    async fn from_request(req: Request, _: &S) -> Result<Self, Response> {
        let bytes = read_body(req.into_body(), MAX_ASK_BYTES)
            .await
            .map_err(IntoResponse::into_response)?;
        serde_json::from_slice::<T>(&bytes).map(Ask).map_err(|e| {
            let name = std::any::type_name::<T>().rsplit("::").next().unwrap_or("request");
            malformed(format!("expected a {name} (GET /v1/openapi.json): {e}"))
        })
    }
}

/// A route's query parameters, read as `T` (else `400 malformed-request`, in the API's shape).
pub(crate) struct Params<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequestParts<S> for Params<T> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(q)) => Ok(Params(q)),
            Err(e) => Err(malformed(e.body_text())),
        }
    }
}

/// A node's new certificate (enrolment or renewal) as the agent wire answers it, or why not.
pub fn certified(r: Result<Certified, NotIssued>) -> Response {
    match r {
        Ok(c) => axum::Json(agent_proto::EnrollResponse {
            certificate: c.issued.pem,
            ca: c.bundle,
            not_after_ms: c.issued.not_after_ms,
            control_plane: c.control_plane,
        })
        .into_response(),
        Err(NotIssued::Refused(r, message)) => refused(r, message),
        Err(NotIssued::Failed(e)) => internal(e),
    }
}
