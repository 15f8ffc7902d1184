//! The web view in a real browser: Debian's Chromium, headless, driven through chromedriver
//! (WebDriver, fantoccini), in a namespace of its own beside a simulated host's (no route out) where
//! `pl up` runs the quickstart with a real dockerd, ledger, agent and Caddy:
//! - `pl up` prints the view's URL and a one-time sign-in link; opening it signs in, and the
//!   overview shows `hello-production` in sync;
//! - a new release (`pl up` of a changed Project) appears in the open page without a reload;
//!   a rollback from the page (confirmed) holds the environment, and releasing the hold from
//!   the page brings Git's release back; a failing release shows its job's code;
//! - a viewer whose token's name is markup sees it as text (no alert, no script node but the
//!   view's own), no action, and a forged action from its page is refused;
//! - the plan between two accepted commits reads as `pl plan` prints it; a role's log tail
//!   shows the lines its replicas wrote;
//! - keyboard navigation reaches every action; axe-core (from the npm registry, injected by
//!   the test) finds no serious or critical violation on any screen.
//!
//! Screenshots of every screen are saved in `target/ui-screenshots/`; with
//! `PL_UPDATE_SCREENSHOTS=1` three of them (overview, environment, plan) replace `docs/ui/*.png` (docs/ui.md shows them).

mod browser;
mod common;
#[path = "../../agent/tests/support/host.rs"]
mod host_support;

use common::{siblings, workspace};

use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::{Client, ClientBuilder, Locator};
use host_support::Host;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const AXE: &str = "/opt/pushleft-tools/axe/node_modules/axe-core/axe.min.js";

fn pl(state: &Path, socket: &Path, args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_pl"))
        .env("PL_STATE_DIR", state)
        .env("PL_DOCKER_SOCKET", socket)
        .args(args)
        .output()
        .expect("pl");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Kills what `pl up` left running if the test ends early.
struct Detached(PathBuf, Option<Child>);
impl Drop for Detached {
    fn drop(&mut self) {
        if let Some(c) = self.1.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for pid in [
            "agents/n1/agent.pid",
            "agents/node-1/agent.pid",
            "caddy.pid",
            "registry.pid",
            "reconciler.pid",
        ] {
            if let Ok(pid) = std::fs::read_to_string(self.0.join(pid)) {
                let _ = Command::new("kill").args(["-9", pid.trim()]).status();
            }
        }
    }
}

/// The SHA-256 of a certificate's public key, base64: what Chromium's
/// `--ignore-certificate-errors-spki-list` pins (the API's own key, not every certificate).
fn spki(cert: &Path) -> String {
    use base64::Engine;
    use sha2::Digest;
    let pem = std::fs::read(cert).expect("the API's certificate");
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).expect("PEM");
    let (_, parsed) = x509_parser::parse_x509_certificate(&pem.contents).expect("a certificate");
    let digest = sha2::Sha256::digest(parsed.tbs_certificate.subject_pki.raw);
    base64::engine::general_purpose::STANDARD.encode(digest)
}

use test_ports::free_port;

/// Waits (at most 10 s) for the browser to be at `path`.
async fn wait_path(c: &Client, path: &str) {
    let start = Instant::now();
    loop {
        let now = c.current_url().await.expect("url");
        if now.path() == path {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "at {now}, not {path}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The text of the page's `<main>`.
async fn main_text(c: &Client) -> String {
    c.execute(
        "const m = document.getElementById('main'); return m ? m.innerText : '';",
        vec![],
    )
    .await
    .ok()
    .and_then(|v| v.as_str().map(str::to_owned))
    .unwrap_or_default()
}

/// Waits (at most `within`) for the page's `<main>` to hold `needle`, without navigating.
async fn wait_text(c: &Client, needle: &str, within: Duration) -> String {
    let start = Instant::now();
    loop {
        let text = main_text(c).await;
        if text.contains(needle) {
            return text;
        }
        if start.elapsed() > within {
            // Where the browser is and what it shows (a page with no <main> has no text above).
            let url = c
                .current_url()
                .await
                .map(|u| u.to_string())
                .unwrap_or_else(|e| e.to_string());
            let body = c
                .execute(
                    "return document.body ? document.body.innerText : document.documentElement.outerHTML;",
                    vec![],
                )
                .await
                .map(|v| v.as_str().unwrap_or_default().chars().take(3000).collect::<String>())
                .unwrap_or_else(|e| e.to_string());
            panic!("no {needle:?} within {within:?}: {text}\nat {url}:\n{body}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the page's script says its live stream is open (the stream opens after the
/// page has loaded).
async fn wait_live(c: &Client, what: &str) {
    let start = Instant::now();
    loop {
        let live = c
            .find(Locator::Id("live"))
            .await
            .expect("live marker")
            .text()
            .await
            .unwrap_or_default();
        if live.starts_with("Live") && !live.contains("reconnecting") {
            return;
        }
        if start.elapsed() > Duration::from_secs(10) {
            // What the page fetched (did its script load, was a stream asked for, and how did
            // each end), to tell a page whose script never ran from a stream never answered.
            let fetched = c
                .execute(
                    "return performance.getEntriesByType('resource').map(e => e.name + ' ' + e.responseStatus + ' ' + Math.round(e.duration) + 'ms ' + e.nextHopProtocol).join('\\n') + '\\nready: ' + document.readyState;",
                    vec![],
                )
                .await
                .map(|v| v.as_str().unwrap_or_default().to_owned())
                .unwrap_or_else(|e| e.to_string());
            panic!("{what} is not live: {live}\n{fetched}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn shot(c: &Client, name: &str) {
    let png = c.screenshot().await.expect("screenshot");
    let dir = workspace().join("target/ui-screenshots");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join(format!("{name}.png")), &png).expect("write");
    if std::env::var("PL_UPDATE_SCREENSHOTS").is_ok() && ["overview", "environment", "plan"].contains(&name) {
        let docs = workspace().join("docs/ui");
        std::fs::create_dir_all(&docs).expect("mkdir");
        std::fs::write(docs.join(format!("{name}.png")), &png).expect("write");
    }
}

/// axe-core's serious and critical violations on the page now.
async fn axe(c: &Client, axe_js: &str) -> Vec<String> {
    c.execute(&format!("{axe_js}\nreturn true;"), vec![])
        .await
        .expect("axe loads");
    let found = c
        .execute_async(
            "const done = arguments[arguments.length - 1];
             axe.run(document, { resultTypes: ['violations'] }).then(r => done(
               r.violations.filter(v => v.impact === 'serious' || v.impact === 'critical')
                 .map(v => v.id + ': ' + v.help + ' at ' + v.nodes.map(n => n.target.join(' ')).join(', '))));",
            vec![],
        )
        .await
        .expect("axe runs");
    serde_json::from_value(found).expect("a list")
}

/// Tabs through the page from its top: the `href` (or text) of each element focused, at most
/// `max` steps.
async fn tab_through(c: &Client, max: usize) -> Vec<String> {
    c.execute(
        "document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0);",
        vec![],
    )
    .await
    .expect("blur");
    let mut seen = Vec::new();
    for _ in 0..max {
        // Keys go to whatever has focus (no element handle to go stale when the page updates).
        let tab = KeyActions::new("keyboard".into())
            .then(KeyAction::Down { value: '\u{E004}' })
            .then(KeyAction::Up { value: '\u{E004}' });
        c.perform_actions(tab).await.expect("tab");
        let v = c
            .execute(
                "const e = document.activeElement; return e ? (e.getAttribute('href') || e.textContent.trim()) : '';",
                vec![],
            )
            .await
            .expect("focused");
        seen.push(v.as_str().unwrap_or_default().to_owned());
    }
    seen
}

#[test]
fn the_web_view_in_chromium_follows_the_quickstart_live() {
    siblings();
    assert!(
        Path::new(AXE).exists(),
        "axe-core is missing: scripts/test installs it (ensure_axe)"
    );
    let base = PathBuf::from(format!("/tmp/plui-{}", std::process::id()));
    let host = Host::start(&format!("plhost-ui-{}", std::process::id()), &base);
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, context, state) = common::quickstart_copy(dir.path());
    assert!(
        Command::new("git")
            .args(["init", "-q", "-b", "main"])
            .current_dir(&repo)
            .status()
            .expect("git")
            .success()
    );
    let socket = host.socket.clone();
    let profile = dir.path().join("chromium-profile");
    let token_file = dir.path().join("hostile.token");
    let axe_js = std::fs::read_to_string(AXE).expect("axe");
    host.run(move || {
        let build = format!("hello={}", context.display());
        let repo_arg = repo.to_string_lossy().into_owned();
        let up = |what: &str| {
            let (code, out, err) = pl(&state, &socket, &["up", "--port", "18190", "--https-port", "18543", "--build", &build, &repo_arg]);
            (code, format!("{what}: {out}\n{err}"))
        };
        let mut guard = Detached(state.clone(), None);
        let (code, out) = up("first");
        assert_eq!(code, 0, "{out}");
        let link = out
            .split_whitespace()
            .find(|w| w.starts_with("https://localhost:") && w.contains("/ui/sign-in/link?code="))
            .unwrap_or_else(|| panic!("no sign-in link in {out}"))
            .to_owned();
        assert!(out.contains("pl up: the web view: https://localhost:"), "{out}");
        // A viewer whose token's name is markup, added to the local control plane's tokens
        // (the next `pl up` restarts the reconciler with them).
        let hostile = "<script>alert('pushleft')</script>\"><img src=x onerror=alert(2)>";
        let reconciler = Path::new(env!("CARGO_BIN_EXE_pl")).with_file_name("pl-reconciler");
        let o = Command::new(&reconciler)
            .args(["token", "--name", hostile, "--role", "viewer", "--out"])
            .arg(&token_file)
            .output()
            .expect("token");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let mut tokens = std::fs::read_to_string(state.join("tokens.toml")).expect("tokens");
        tokens.push('\n');
        tokens.push_str(&String::from_utf8_lossy(&o.stdout));
        std::fs::write(state.join("tokens.toml"), tokens).expect("tokens");
        let viewer_token = std::fs::read_to_string(&token_file).expect("token").trim().to_owned();
        let (code, out) = up("restart with the viewer's token");
        assert_eq!(code, 0, "{out}");
        // The link was made before the restart; it is in the ledger, so it still works once.
        let spki = spki(&state.join("tls/api.crt"));

        // The browser in a namespace of its own (see `browser`), the view's port forwarded
        // to it.
        let net = browser::BrowserNet::new(&format!("plbrowser-{}", std::process::id()));
        let api_port: u16 = link
            .trim_start_matches("https://localhost:")
            .split('/')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {link}"));
        net.forward(api_port);
        let chromium = net.chromium(&state);
        let driver_port = free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={driver_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (Debian's chromium-driver)");
        guard.1 = Some(driver);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let log = state.join("reconciler.log");
        rt.block_on(async {
            let mut caps = serde_json::Map::new();
            caps.insert(
                "goog:chromeOptions".into(),
                serde_json::json!({
                    "binary": chromium,
                    "args": [
                        "--remote-debugging-pipe",
                        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                        "--disable-quic", "--no-first-run", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync", "--disable-extensions",
                        "--window-size=1280,900",
                        format!("--user-data-dir={}", profile.display()),
                        format!("--ignore-certificate-errors-spki-list={spki}"),
                    ]
                }),
            );
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            let start = Instant::now();
            let c = loop {
                match ClientBuilder::new(connector.clone())
                    .capabilities(caps.clone())
                    .connect(&format!("http://127.0.0.1:{driver_port}"))
                    .await
                {
                    Ok(c) => break c,
                    Err(e) => {
                        assert!(start.elapsed() < Duration::from_secs(20), "chromedriver: {e}");
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                }
            };
            let origin = link.split("/ui/").next().expect("origin").to_owned();
            assert!(net.processes() > 0, "Chromium runs in its own namespace");

            // One click of the printed link: signed in, on the overview, in sync.
            c.goto(&link).await.expect("the link");
            assert_eq!(c.current_url().await.expect("url").path(), "/ui/");
            let text = wait_text(&c, "in sync", Duration::from_secs(30)).await;
            assert!(text.contains("hello-production"), "{text}");
            wait_live(&c, "the overview").await;
            shot(&c, "overview").await;
            let found = axe(&c, &axe_js).await;
            assert!(found.is_empty(), "overview: {found:?}");

            // Eight open pages of the view, each live: over HTTP/2 they share one connection
            // (over HTTP/1.1 the sixth page's stream would take the browser's last connection
            // to the host, and the seventh page would never load).
            let first = c.window().await.expect("window");
            let proto = c
                .execute("return performance.getEntriesByType('navigation')[0].nextHopProtocol;", vec![])
                .await
                .expect("protocol");
            assert_eq!(proto.as_str(), Some("h2"), "the view is served over HTTP/2");
            let mut opened = Vec::new();
            for _ in 0..7 {
                let w = c.new_window(true).await.expect("a tab");
                c.switch_to_window(w.handle.clone()).await.expect("switch");
                c.goto(&format!("{origin}/ui/")).await.expect("the overview again");
                wait_live(&c, &format!("page {}", opened.len() + 2)).await;
                opened.push(w.handle);
            }
            for w in opened {
                c.switch_to_window(w).await.expect("switch");
                c.close_window().await.expect("close");
            }
            c.switch_to_window(first).await.expect("back to the first page");

            // A new release appears in the open page without a reload.
            c.execute("window.__kept = 'the same page';", vec![]).await.expect("mark");
            let project = repo.join("projects/hello.yaml");
            let text = std::fs::read_to_string(&project).expect("project");
            std::fs::write(&project, text.replace("LOG_LEVEL: info", "LOG_LEVEL: debug")).expect("write");
            let (code, out) = up("second release");
            assert_eq!(code, 0, "{out}");
            let text = wait_text(&c, "in sync", Duration::from_secs(10)).await;
            let row = text.lines().find(|l| l.contains("hello-production")).unwrap_or_default().to_owned();
            assert!(row.contains("\t2\t") || row.contains(" 2 "), "generation 2 in the row: {row:?} of {text}");
            let kept = c.execute("return window.__kept || '';", vec![]).await.expect("mark");
            assert_eq!(kept.as_str(), Some("the same page"), "no reload");

            // A rollback from the page, confirmed, holds the environment; releasing the hold
            // from the page follows Git again.
            c.goto(&format!("{origin}/ui/environments/hello-production")).await.expect("environment");
            c.find(Locator::LinkText("Roll back")).await.expect("a Roll back action").click().await.expect("click");
            assert!(c.current_url().await.expect("url").path().starts_with("/ui/confirm/rollback"));
            let focus = tab_through(&c, 25).await;
            assert!(focus.iter().any(|f| f == "Yes, roll back"), "the confirmation's button by keyboard: {focus:?}");
            c.find(Locator::Id("confirm")).await.expect("confirm").click().await.expect("click");
            let text = wait_text(&c, "held by a rollback", Duration::from_secs(30)).await;
            assert!(text.contains("asked by pl-up"), "{text}");
            // The releases' commit-to-live times, drawn and said in words.
            let chart = c
                .find(Locator::Css("svg.chart"))
                .await
                .expect("a commit-to-live chart")
                .attr("aria-label")
                .await
                .expect("label")
                .unwrap_or_default();
            assert!(chart.contains("generation 1: ") && chart.contains("generation 2: "), "{chart}");
            shot(&c, "environment").await;
            let found = axe(&c, &axe_js).await;
            assert!(found.is_empty(), "environment: {found:?}");
            // Every action on the page is reached by Tab.
            let actions: Vec<String> = c
                .execute("return [...document.querySelectorAll('a.action')].map(a => a.getAttribute('href'));", vec![])
                .await
                .ok()
                .and_then(|v| serde_json::from_value(v).ok())
                .unwrap_or_default();
            assert!(!actions.is_empty());
            let focus = tab_through(&c, 40).await;
            for a in &actions {
                assert!(focus.contains(a), "{a} is not reached by Tab: {focus:?}");
            }
            c.find(Locator::LinkText("Release the hold")).await.expect("release").click().await.expect("click");
            c.find(Locator::Id("confirm")).await.expect("confirm").click().await.expect("click");
            // Git's release again, at the next generation, once its replicas run.
            let text = wait_text(&c, "4 (done", Duration::from_secs(60)).await;
            assert!(text.contains("in sync"), "{text}");

            // A failing release shows its job's code, in the open page.
            let text = std::fs::read_to_string(&project).expect("project");
            std::fs::write(&project, text.replace("path: /healthz", "path: /missing")).expect("write");
            let (code, out) = up("failing release");
            assert_eq!(code, 1, "{out}");
            let text = wait_text(&c, "failing", Duration::from_secs(15)).await;
            assert!(text.contains("(job "), "the failing job is named: {text}");
            shot(&c, "failing").await;

            // The other screens, each checked by axe.
            for (path, name) in [
                ("/ui/revisions", "revisions"),
                ("/ui/nodes", "nodes"),
                // A hostile page cursor: it only filters (nodes after it by name), never shows.
                ("/ui/nodes?after=%3Cscript%3Ealert(1)%3C%2Fscript%3E", "nodes-after-hostile"),
                ("/ui/events", "events"),
                ("/ui/releases", "releases"),
            ] {
                c.goto(&format!("{origin}{path}")).await.expect("screen");
                shot(&c, name).await;
                let found = axe(&c, &axe_js).await;
                assert!(found.is_empty(), "{name}: {found:?}");
                let source = c.source().await.expect("source");
                assert!(!source.contains("alert(1)"), "{name} shows the cursor: {source}");
            }
            // The fleet's commit-to-live today: the quickstart's releases, drawn and named.
            let text = main_text(&c).await;
            assert!(text.contains("hello-production"), "the slowest releases: {text}");
            let chart = c
                .find(Locator::Css("svg.chart"))
                .await
                .expect("the fleet's chart")
                .attr("aria-label")
                .await
                .expect("label")
                .unwrap_or_default();
            assert!(chart.contains(" releases, median "), "{chart}");
            // The plan of the newest commit from the one before, as `pl plan` prints it.
            c.goto(&format!("{origin}/ui/revisions")).await.expect("revisions");
            c.find(Locator::XPath("//a[starts-with(normalize-space(.), 'from ')]"))
                .await
                .expect("a plan link")
                .click()
                .await
                .expect("click");
            wait_path(&c, "/ui/plan").await;
            let text = main_text(&c).await;
            assert!(
                text.contains("Pushleft plan:") && text.contains("path: /missing") && text.contains("path: /healthz"),
                "{text}"
            );
            shot(&c, "plan").await;
            let found = axe(&c, &axe_js).await;
            assert!(found.is_empty(), "plan: {found:?}");

            // A role's log tail: the lines its replicas wrote, then new ones as they come.
            c.goto(&format!("{origin}/ui/environments/hello-production")).await.expect("environment");
            c.find(Locator::LinkText("Logs of web")).await.expect("a log link").click().await.expect("click");
            let start = Instant::now();
            loop {
                let log = c.find(Locator::Id("log")).await.expect("log").text().await.unwrap_or_default();
                if log.contains("response:") {
                    break;
                }
                assert!(start.elapsed() < Duration::from_secs(20), "no log lines: {log:?}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            shot(&c, "logs").await;

            // The timeline filtered by kind: the rollback asked from the page names the token.
            c.goto(&format!("{origin}/ui/events?kind=rollback-asked")).await.expect("events");
            let text = main_text(&c).await;
            assert!(text.contains("rollback-asked") && text.contains("pl-up"), "the timeline: {text}");

            // Sign out; the viewer whose name is markup signs in with the form.
            c.find(Locator::Css("form[action='/ui/sign-out'] button")).await.expect("sign out").click().await.expect("click");
            wait_path(&c, "/ui/sign-in").await;
            let found = axe(&c, &axe_js).await;
            assert!(found.is_empty(), "sign-in: {found:?}");
            c.find(Locator::Id("token")).await.expect("field").send_keys(&viewer_token).await.expect("type");
            c.find(Locator::Css("form.sign-in button")).await.expect("button").click().await.expect("click");
            wait_path(&c, "/ui/").await;
            c.goto(&format!("{origin}/ui/environments/hello-production")).await.expect("environment");
            assert!(c.get_alert_text().await.is_err(), "no alert");
            let who = c.find(Locator::Css(".who strong")).await.expect("who").text().await.expect("text");
            assert_eq!(who, hostile, "the name as text");
            let scripts = c
                .execute("return [...document.scripts].map(s => s.getAttribute('src') || 'inline');", vec![])
                .await
                .expect("scripts");
            assert_eq!(scripts, serde_json::json!(["/ui/assets/ui.js"]), "no script node but the view's own");
            assert_eq!(
                c.execute("return document.querySelectorAll('img').length;", vec![]).await.expect("imgs"),
                serde_json::json!(0)
            );
            assert!(c.find(Locator::Css("a.action")).await.is_err(), "a viewer sees no action");
            // A forged action from the viewer's own page, with its CSRF token: refused.
            let status = c
                .execute_async(
                    "const done = arguments[arguments.length - 1];
                     const csrf = document.querySelector('input[name=csrf]').value;
                     fetch('/ui/actions/rollback', { method: 'POST', redirect: 'manual',
                       headers: { 'content-type': 'application/x-www-form-urlencoded' },
                       body: 'csrf=' + csrf + '&environment=hello-production' })
                       .then(r => r.text().then(t => done([r.status, t.includes('insufficient-role')])))
                       .catch(e => done(['failed', String(e)]));
                     setTimeout(() => done(['pending', performance.getEntriesByType('resource').map(e => e.name + ' ' + e.responseStatus).join(' ; ')]), 5000);",
                    vec![],
                )
                .await
                .expect("fetch");
            assert_eq!(
                status,
                serde_json::json!([403, true]),
                "{}",
                std::fs::read_to_string(&log).unwrap_or_default().lines().rev().take(30).collect::<Vec<_>>().join("\n")
            );
            assert!(c.get_alert_text().await.is_err(), "no alert");
            c.close().await.expect("close");
        });
        let (code, out, err) = pl(&state, &socket, &["down", &repo_arg]);
        let (_, events, _) = pl(&state, &socket, &["events", "--local", &repo_arg]);
        let (_, jobs, _) = pl(&state, &socket, &["jobs", "--local", &repo_arg]);
        assert_eq!(code, 0, "{out}\n{err}\n{}\n{jobs}", events.lines().rev().take(40).collect::<Vec<_>>().join("\n"));
        drop(guard);
    });
}
