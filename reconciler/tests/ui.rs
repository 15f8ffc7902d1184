//! The web view over HTTP against a real daemon (SQLite ledger, loopback TLS), as a browser's
//! requests would be, without a browser (`cli/tests/ui.rs` drives Chromium):
//! - every answer carries the Content-Security-Policy (no inline script, no third-party origin),
//!   `X-Frame-Options: DENY` and `nosniff`; a page without a session sends the browser to the
//!   sign-in page; the assets are our own, served from the binary;
//! - a pasted token becomes a `__Host-` cookie (HttpOnly, Secure, SameSite=Strict); an unknown
//!   token is refused, and the eleventh attempt in a minute from one address is refused with
//!   429 even with a good token;
//! - `POST /v1/ui/sign-in-link` gives a link that signs in once; a second use is refused;
//! - a viewer sees no action and is refused one anyway (403 insufficient-role); an operator's
//!   action needs the session's CSRF token and a same-origin request, and is recorded as an
//!   event naming the token; signing out ends the session on the server;
//! - a token named like a script, and a signed commit refused for a file named like one,
//!   render as text in the events and revisions screens;
//! - the overview filters by name and state; live streams are limited per session;
//! - a follower replica on the same ledger knows the leader's sessions and says it reads only.

#[path = "support/daemon.rs"]
mod daemon_support;
#[path = "support/repo.rs"]
mod repo_support;

use daemon_support::{Daemon, bin, config, free_port, setup};
use repo_support::{Repo, environment, project};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `/ui/` asked over HTTP/2 (ALPN `h2` only) with a session's cookie: its status, and the
/// most streams at once the server's SETTINGS allow.
fn over_h2(ca: &std::path::Path, port: u16, cookie: &str) -> (u16, usize) {
    use rustls::pki_types::pem::PemObject;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls::pki_types::CertificateDer::pem_file_iter(ca).expect("ca") {
            roots.add(c.expect("pem")).expect("root");
        }
        let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect(name, tcp)
            .await
            .expect("handshake");
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]), "the server chose h2");
        let (send, conn) = h2::client::handshake(tls).await.expect("h2 handshake");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut send = send.ready().await.expect("ready");
        let req = axum::http::Request::get(format!("https://localhost:{port}/ui/"))
            .header("cookie", cookie)
            .body(())
            .expect("request");
        let (answer, _) = send.send_request(req, true).expect("send");
        let answer = answer.await.expect("answer");
        let status = answer.status().as_u16();
        let mut body = answer.into_body();
        let mut html = Vec::new();
        while let Some(piece) = body.data().await {
            let piece = piece.expect("body");
            let _ = body.flow_control().release_capacity(piece.len());
            html.extend_from_slice(&piece);
        }
        assert!(String::from_utf8_lossy(&html).contains("<main"), "a whole page");
        (status, send.current_max_send_streams())
    })
}

/// A browser-like client: no redirects followed, the cookie kept by hand.
struct Browser {
    agent: ureq::Agent,
    base: String,
    cookie: Option<String>,
}

struct Answer {
    status: u16,
    location: String,
    set_cookie: String,
    csp: String,
    frame: String,
    body: String,
}

impl Browser {
    fn new(ca: &std::path::Path, port: u16) -> Browser {
        let pem = std::fs::read(ca).expect("ca");
        let ca = ureq::tls::Certificate::from_pem(&pem).expect("pem").to_owned();
        let tls = ureq::tls::TlsConfig::builder()
            .root_certs(ureq::tls::RootCerts::Specific(Arc::new(vec![ca])))
            .build();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .tls_config(tls)
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .into();
        Browser {
            agent,
            base: format!("https://localhost:{port}"),
            cookie: None,
        }
    }

    fn answer(r: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Answer {
        let mut r = r.expect("the daemon answers");
        let h = |k: &str| {
            r.headers()
                .get(k)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let (location, set_cookie, csp, frame) = (
            h("location"),
            h("set-cookie"),
            h("content-security-policy"),
            h("x-frame-options"),
        );
        Answer {
            status: r.status().as_u16(),
            location,
            set_cookie,
            csp,
            frame,
            body: r.body_mut().read_to_string().unwrap_or_default(),
        }
    }

    fn get(&self, path: &str) -> Answer {
        let mut req = self.agent.get(&format!("{}{path}", self.base));
        if let Some(c) = &self.cookie {
            req = req.header("cookie", c);
        }
        Self::answer(req.call())
    }

    fn post(&self, path: &str, form: &[(&str, &str)], site: &str) -> Answer {
        let mut req = self
            .agent
            .post(&format!("{}{path}", self.base))
            .header("sec-fetch-site", site);
        if let Some(c) = &self.cookie {
            req = req.header("cookie", c);
        }
        Self::answer(req.send_form(form.iter().copied()))
    }

    /// Signs in with a token; keeps the cookie.
    fn sign_in(&mut self, token: &str) -> Answer {
        let a = self.post("/ui/sign-in", &[("token", token)], "same-origin");
        if a.status == 303 {
            self.cookie = a.set_cookie.split(';').next().map(str::to_owned);
        }
        a
    }

    /// The CSRF token a page's forms carry.
    fn csrf(&self, page: &str) -> String {
        let body = self.get(page).body;
        body.split("name=\"csrf\" value=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .expect("a form with the CSRF token")
            .to_owned()
    }
}

/// A fresh viewer session.
fn viewer_again(ca: &std::path::Path, port: u16, token: &str) -> Browser {
    let mut b = Browser::new(ca, port);
    assert_eq!(b.sign_in(token).status, 303);
    b
}

fn until(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < within {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

#[test]
fn the_web_view_signs_in_escapes_and_refuses_as_the_api_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    std::fs::write(dir.path().join("allowed_signers"), &repo.signers).expect("signers");
    repo.write("projects/api.yaml", &project("api", 1));
    repo.write(
        "environments/api-production.yaml",
        &environment("api-production", "api"),
    );
    repo.write(
        "environments/api-staging.yaml",
        &environment("api-staging", "api").replace("pool: main}", "pool: main, hostname: staging.example.com}"),
    );
    let first = repo.commit("api in two environments", true);
    let mut s = setup(dir.path());
    // A token whose name is markup: it is shown (who is signed in, the sign-in event) as text.
    let hostile = "<script>alert('t')</script>";
    let out = dir.path().join("hostile.token");
    let o = std::process::Command::new(bin())
        .args(["token", "--name", hostile, "--role", "viewer", "--out"])
        .arg(&out)
        .output()
        .expect("token");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    s.token_lines.push_str(&String::from_utf8_lossy(&o.stdout));
    s.token_lines.push('\n');
    let hostile_token = std::fs::read_to_string(&out).expect("token").trim().to_owned();
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let port = free_port();
    let cfg = config(&s, "d", &repo.dir, &url, port, "");
    let mut daemon = Daemon::start(&s, &cfg, port);
    daemon.wait_ready(Duration::from_secs(20));
    let ca = dir.path().join("tls/ca.crt");

    // Without a session: the sign-in page, hardened like every answer.
    let mut viewer = Browser::new(&ca, port);
    let a = viewer.get("/ui/");
    assert_eq!((a.status, a.location.as_str()), (303, "/ui/sign-in"));
    let a = viewer.get("/ui/sign-in");
    assert_eq!(a.status, 200);
    assert!(
        a.csp.contains("script-src 'self'") && a.csp.contains("frame-ancestors 'none'") && !a.csp.contains("unsafe"),
        "{}",
        a.csp
    );
    assert_eq!(a.frame, "DENY");
    assert!(!a.body.contains("<script>") && a.body.contains("<script src=\"/ui/assets/ui.js\""));
    let js = viewer.get("/ui/assets/ui.js");
    assert_eq!(js.status, 200);
    assert!(
        js.body.contains("EventSource") && !js.body.contains("innerHTML ="),
        "no HTML from strings"
    );
    assert_eq!(viewer.get("/ui/assets/../main.rs").status, 404);

    // A wrong token is refused; a right one becomes a hardened cookie.
    let a = viewer.sign_in("plt_0000");
    assert_eq!(a.status, 401);
    assert!(a.body.contains("not one of this control plane"), "{}", a.body);
    let a = viewer.sign_in(&s.viewer);
    assert_eq!(a.status, 303, "{}", a.body);
    for part in ["__Host-pl-session=", "HttpOnly", "Secure", "SameSite=Strict", "Path=/"] {
        assert!(a.set_cookie.contains(part), "{part}: {}", a.set_cookie);
    }
    assert!(!a.set_cookie.contains(&s.viewer), "the cookie is not the token");

    // Over HTTP/2, offered by ALPN: the page answers, and the connection announces its limit
    // of requests at once.
    let (status, streams) = over_h2(&ca, port, viewer.cookie.as_deref().unwrap_or_default());
    assert_eq!((status, streams), (200, 64));

    // The overview: both environments, their commit and signer; filters narrow it.
    assert!(
        until(Duration::from_secs(20), || viewer
            .get("/ui/")
            .body
            .contains("api-staging")),
        "the first pass applies the commit: {} {:?} {}",
        viewer.get("/ui/").body,
        daemon.get("/v1/deployments", Some(&s.viewer)),
        std::fs::read_to_string(&daemon.log).unwrap_or_default()
    );
    let a = viewer.get("/ui/");
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(
        a.body.contains("api-production") && a.body.contains("api-staging"),
        "{}",
        a.body
    );
    assert!(a.body.contains("ops-alice"), "the signer: {}", a.body);
    // n1 was marked up with no protocol (as an agent from before agents said it): the nodes
    // screen says it is behind this control plane, where an operator plans the upgrade.
    let a = viewer.get("/ui/nodes");
    assert!(
        a.body
            .contains(r#"<span class="state degraded">older protocol 0</span>"#),
        "{}",
        a.body
    );
    let a = viewer.get("/ui/?q=stag&state=any");
    assert!(
        a.body.contains("api-staging") && !a.body.contains(">api-production<"),
        "{}",
        a.body
    );
    let a = viewer.get("/ui/?q=%25&state=any");
    assert!(
        a.body.contains("No environment matches"),
        "LIKE's wildcard is a character: {}",
        a.body
    );
    assert_eq!(viewer.get("/ui/?state=nonsense").status, 400);
    // The fleet's releases: none is live yet (no agent ran them), and the page says so.
    let a = viewer.get("/ui/releases");
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.body.contains("No release went live in these days."), "{}", a.body);
    assert!(
        a.body.contains(r#"href="/ui/releases" aria-current="page""#),
        "{}",
        a.body
    );

    // A viewer sees no action, and is refused one anyway.
    let a = viewer.get("/ui/environments/api-production");
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(!a.body.contains("/ui/confirm/"), "{}", a.body);
    assert_eq!(viewer.get("/ui/confirm/reconcile").status, 403);
    let csrf = viewer.csrf("/ui/");
    let a = viewer.post("/ui/actions/reconcile", &[("csrf", &csrf)], "same-origin");
    assert_eq!(a.status, 403);
    assert!(a.body.contains("insufficient-role"), "{}", a.body);
    assert_eq!(viewer.get("/ui/environments/nope").status, 404);

    // An operator: a confirmation, then a POST with the session's CSRF token from the view.
    let mut operator = Browser::new(&ca, port);
    assert_eq!(operator.sign_in(&s.operator).status, 303);
    let a = operator.get("/ui/environments/api-production");
    assert!(
        a.body.contains("/ui/confirm/reconcile?environment=api-production"),
        "{}",
        a.body
    );
    let a = operator.get("/ui/confirm/reconcile?environment=api-production");
    assert_eq!(a.status, 200);
    assert!(a.body.contains("method=\"post\""), "{}", a.body);
    let csrf = operator.csrf("/ui/confirm/reconcile?environment=api-production");
    let a = operator.post(
        "/ui/actions/reconcile",
        &[("environment", "api-production")],
        "same-origin",
    );
    assert_eq!(
        a.status, 422,
        "no CSRF field: the form is refused before anything: {}",
        a.body
    );
    let a = operator.post(
        "/ui/actions/reconcile",
        &[("csrf", "0".repeat(64).as_str()), ("environment", "api-production")],
        "same-origin",
    );
    assert_eq!(a.status, 403);
    assert!(a.body.contains("bad-csrf-token"), "{}", a.body);
    let a = operator.post(
        "/ui/actions/reconcile",
        &[("csrf", &csrf), ("environment", "api-production")],
        "cross-site",
    );
    assert_eq!(a.status, 403);
    assert!(a.body.contains("cross-site-request"), "{}", a.body);
    let a = operator.post(
        "/ui/actions/reconcile",
        &[("csrf", &csrf), ("environment", "api-production")],
        "same-origin",
    );
    assert_eq!(
        (a.status, a.location.as_str()),
        (303, "/ui/environments/api-production")
    );
    let (status, events) = daemon.get("/v1/events?limit=1000", Some(&s.viewer));
    assert_eq!(status, 200);
    assert!(
        events.contains("reconcile-asked") && events.contains("(by operator)"),
        "the action names the token: {events}"
    );

    // A second replica on the same ledger (a follower) knows the session: one sign-in serves
    // both, and its view says it reads only.
    let port2 = free_port();
    let cfg2 = config(&s, "d2", &repo.dir, &url, port2, "");
    let mut follower = Daemon::start(&s, &cfg2, port2);
    follower.wait_ready(Duration::from_secs(20));
    let mut other = Browser::new(&ca, port2);
    other.cookie = operator.cookie.clone();
    let a = other.get("/ui/");
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(
        a.body.contains("follows (reads only)") && a.body.contains("api-production"),
        "{}",
        a.body
    );
    follower.term();

    // A one-time link signs in once.
    let (status, body) = daemon.post(
        "/v1/ui/sign-in-link",
        &[("authorization", &format!("Bearer {}", s.admin))],
        b"",
    );
    assert_eq!(status, 200, "{body}");
    let link: operator_proto::ui::SignInLink = serde_json::from_str(&body).expect("a SignInLink");
    assert!(link.path.starts_with("/ui/sign-in/link?code="));
    let mut admin = Browser::new(&ca, port);
    let a = admin.get(&link.path);
    assert_eq!((a.status, a.location.as_str()), (303, "/ui/"));
    admin.cookie = a.set_cookie.split(';').next().map(str::to_owned);
    let a = admin.get("/ui/");
    assert!(a.body.contains("Signed in as <strong>admin</strong>"), "{}", a.body);
    let again = Browser::new(&ca, port).get(&link.path);
    assert_eq!(again.status, 401, "a link works once");
    assert!(again.set_cookie.is_empty());

    // The plan between two accepted commits, as `pl plan` prints it; a commit not accepted,
    // or not a commit id, is refused before any tree is read.
    repo.write("projects/api.yaml", &project("api", 2));
    let second = repo.commit("api: two replicas", true);
    assert!(
        until(Duration::from_secs(20), || {
            let (_, r) = daemon.get("/v1/revisions", Some(&s.viewer));
            r.contains(&second)
        }),
        "the second commit is judged"
    );
    // (One more session: sign-ins count against the address's limit, tested below.)
    let v2 = viewer_again(&ca, port, &s.viewer);
    let a = v2.get("/ui/revisions");
    assert!(
        a.body.contains(&format!("/ui/plan?base={first}&amp;head={second}")),
        "each accepted commit links to its plan: {}",
        a.body
    );
    let plan = v2.get(&format!("/ui/plan?base={first}&head={second}"));
    assert_eq!(plan.status, 200, "{}", plan.body);
    assert!(
        plan.body.contains("Pushleft plan:")
            && plan.body.contains("replicas: 2")
            && plan.body.contains("class=\"ins\""),
        "{}",
        plan.body
    );
    let refused = v2.get(&format!("/ui/plan?base={first}&head={}", "0".repeat(40)));
    assert_eq!(refused.status, 404);
    assert!(refused.body.contains("revision-not-accepted"), "{}", refused.body);
    assert_eq!(v2.get("/ui/plan?base=HEAD&head=main").status, 400);

    // Hostile content renders as text: a token named like a script, and a signed commit
    // refused for a file whose name is markup.
    let mut h = Browser::new(&ca, port);
    assert_eq!(h.sign_in(&hostile_token).status, 303);
    let a = h.get("/ui/events");
    assert_eq!(a.status, 200);
    assert!(!a.body.contains("<script>alert"), "{}", a.body);
    assert!(a.body.contains("&lt;script&gt;alert('t')&lt;/script&gt;"), "{}", a.body);
    repo.write("projects/\"><script>alert(1)<\\script>.yaml", "kind: [unclosed\n");
    let sha = repo.commit("a file named like markup", true);
    assert!(
        until(Duration::from_secs(20), || {
            let (_, r) = daemon.get("/v1/revisions", Some(&s.viewer));
            r.contains(&sha) && r.contains("rejected")
        }),
        "the commit is judged"
    );
    let a = h.get("/ui/revisions");
    assert!(a.body.contains(&sha[..12]), "{}", a.body);
    assert!(!a.body.contains("<script>alert(1)"), "{}", a.body);
    assert!(
        a.body.contains("&lt;script&gt;alert(1)"),
        "the reason names the file, as text: {}",
        a.body
    );

    // Live streams: eight per session, the ninth refused.
    let streams: Vec<_> = (0..8)
        .map(|_| {
            let mut req = h.agent.get(&format!("{}/ui/live", h.base));
            if let Some(c) = &h.cookie {
                req = req.header("cookie", c);
            }
            req.call().expect("a stream")
        })
        .collect();
    assert!(streams.iter().all(|r| r.status() == 200));
    assert_eq!(h.get("/ui/live").status, 429);
    drop(streams);

    // Signing out ends the session on the server: the old cookie no longer signs in.
    let csrf = viewer.csrf("/ui/");
    let a = viewer.post("/ui/sign-out", &[("csrf", &csrf)], "same-origin");
    assert_eq!(a.status, 303);
    assert!(a.set_cookie.contains("Max-Age=0"));
    assert_eq!(viewer.get("/ui/").status, 303, "the session is over");

    // Sign-in attempts are limited per address: the eleventh in a minute is refused, even a good one.
    let mut many = Browser::new(&ca, port);
    let mut refused = 0;
    for _ in 0..12 {
        if many.sign_in("plt_wrong").status == 429 {
            refused += 1;
        }
    }
    assert!(refused >= 2, "attempts past the limit are refused");
    assert_eq!(many.sign_in(&s.viewer).status, 429);
    daemon.term();
}
