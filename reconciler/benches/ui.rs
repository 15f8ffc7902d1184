//! The web view's server time, on SQLite and PostgreSQL in the same run, over a ledger that
//! applied a synthetic 10,000-environment repository (`state_schema::synthetic`, as the
//! reconcile bench's memory measure):
//! - the overview's first page (50 environments, each with its commit, signer and state in
//!   words), a page from the middle, a search by name and a state filter, each rendered to
//!   HTML, beside the same page of the operator API (`GET /v1/deployments?limit=50`, JSON), the
//!   baseline the view is built on;
//! - one environment's page;
//! - an event into an open page: from the event's write to the live stream's message (woken
//!   by this daemon's write, and by the 250 ms watch when another replica wrote it), and then
//!   the page's refetch, which is what the browser shows;
//! - the fleet's releases page over its most: 50,000 releases live in the last 7 days;
//! - `/metrics` when its service level indicators are read afresh (every environment's
//!   standing, the counters, the nodes), as once every 15 s whatever the scrapes.
//!
//! Requests go through the routers in-process (`tower::ServiceExt::oneshot`): server time,
//! without TLS or a socket. Run: `cargo bench -p reconciler --bench ui` (`-- --samples 50`).

#[path = "../tests/support/dump.rs"]
mod dump;
#[path = "../tests/support/postgres.rs"]
mod postgres_support;
#[path = "../tests/support/repo.rs"]
mod repo_support;
#[path = "../tests/support/synthetic.rs"]
mod synthetic;

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use reconciler::auth::{Tokens, new_token};
use reconciler::config::{Role, TokenConfig};
use reconciler::http::operator::{self, Operator};
use reconciler::http::streams::watch_events;
use reconciler::http::ui::{self, Ui};
use reconciler::hub::Hub;
use reconciler::ops::Ops;
use reconciler::reconcile::Reconciler;
use reconciler::store::Ledger;
use repo_support::Repo;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use synthetic::{shared_config, synthetic_repo};
use tower::ServiceExt;

const ENVIRONMENTS: usize = 10_000;

fn pct(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

struct Figures {
    overview: (f64, f64),
    middle: (f64, f64),
    search: (f64, f64),
    failing: (f64, f64),
    api: (f64, f64),
    environment: (f64, f64),
    event_woken: (f64, f64),
    event_polled: (f64, f64),
    page_after_event: (f64, f64),
    releases: (f64, f64),
    metrics: (f64, f64),
    bytes: usize,
}

/// Milliseconds of `samples` requests: (p50, p99), and the last body's length.
async fn time(router: &axum::Router, path: &str, header: (&str, &str), samples: usize) -> ((f64, f64), usize) {
    let mut ms = Vec::new();
    let mut bytes = 0;
    for _ in 0..samples {
        let req = Request::get(path)
            .header(header.0, header.1)
            .body(Body::empty())
            .expect("request");
        let start = Instant::now();
        let r = router.clone().oneshot(req).await.expect("answer");
        assert_eq!(r.status(), 200, "{path}");
        let body = r.into_body().collect().await.expect("body").to_bytes();
        ms.push(start.elapsed().as_secs_f64() * 1000.0);
        bytes = body.len();
    }
    ((pct(ms.clone(), 0.5), pct(ms, 0.99)), bytes)
}

/// From an event's write to the live stream's next message, `samples` times.
async fn event_latency(
    router: &axum::Router,
    cookie: &str,
    ops: &Ops,
    ledger: &Ledger,
    woken: bool,
    samples: usize,
) -> (f64, f64) {
    let req = Request::get("/ui/live")
        .header("cookie", cookie)
        .body(Body::empty())
        .expect("request");
    let r = router.clone().oneshot(req).await.expect("stream");
    assert_eq!(r.status(), 200);
    let mut body = r.into_body();
    let mut ms = Vec::new();
    for i in 0..samples {
        let start = Instant::now();
        if woken {
            ops.record_asked("bench", "bench", "bench", &format!("event {i}"))
                .await
                .expect("event");
        } else {
            // Another replica's write: nothing wakes this daemon's watcher.
            ledger
                .events()
                .record(reconciler::store::now_ms(), "bench", "bench", &format!("event {i}"))
                .await
                .expect("event");
        }
        loop {
            let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
                .await
                .expect("a message within 5 s")
                .expect("open")
                .expect("frame");
            if frame
                .data_ref()
                .is_some_and(|d| d.starts_with(b"id:") || d.starts_with(b"data:"))
            {
                break;
            }
        }
        ms.push(start.elapsed().as_secs_f64() * 1000.0);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (pct(ms.clone(), 0.5), pct(ms, 0.99))
}

async fn run(dir: &Path, repo: &Repo, base: &str, head: &str, url: &str, samples: usize) -> Figures {
    let ledger = Arc::new(Ledger::connect(url, 8).await.expect("connect"));
    ledger.migrate().await.expect("migrate");
    dump::nodes_up(url, &dump::SYNTHETIC_NODES).await;
    let config = Arc::new(shared_config(dir, &repo.dir, url));
    let hub = Arc::new(Hub::default());
    let reconciling =
        Arc::new(Reconciler::new(Arc::clone(&config), Arc::clone(&ledger), Arc::clone(&hub)).expect("reconciler"));
    repo.git(&["update-ref", "refs/heads/main", base]);
    reconciling.pass().await.expect("base pass");
    repo.git(&["update-ref", "refs/heads/main", head]);
    let r = reconciling.pass().await.expect("head pass");
    assert_eq!(r.accepted, 1, "the head is accepted");
    let (token, hash) = new_token().expect("token");
    let tokens = Arc::new(Tokens::new(&[TokenConfig {
        name: "bench".into(),
        role: Role::Viewer,
        sha256: hash.clone(),
    }]));
    let ops = Arc::new(Ops {
        ledger: Arc::clone(&ledger),
        hub: Arc::clone(&hub),
        branch: "main".into(),
        lost_after_ms: 30_000,
        issues_certificates: false,
        repo_dir: Some(repo.dir.clone()),
        plans: tokio::sync::Semaphore::new(1),
        images: None,
        images_grace_hours: 24,
        indicators: Default::default(),
        fleet_cursors: Default::default(),
    });
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let watcher = tokio::spawn(watch_events(Arc::clone(&ledger), Arc::clone(&hub), stopped));
    let view = ui::router(Ui::new(
        Arc::clone(&ops),
        Arc::clone(&hub),
        Arc::clone(&tokens),
        64,
        None,
    ));
    let api = operator::router(Arc::new(
        Operator::new(
            Arc::clone(&config),
            Arc::clone(&ops),
            Arc::clone(&hub),
            Arc::clone(&tokens),
        )
        .expect("operator"),
    ));
    let opened = ops.open_session(&hash, "bench", "bench").await.expect("session");
    let cookie = format!("{}={}", ui::COOKIE, opened.id.as_str());
    let c = ("cookie", cookie.as_str());
    let bearer = format!("Bearer {}", token.as_str());
    let (overview, bytes) = time(&view, "/ui/", c, samples).await;
    let first = ops
        .overview("", reconciler::ops::screens::StateFilter::Any, None)
        .await
        .expect("page");
    assert_eq!(first.rows.len(), 50, "a full first page of {ENVIRONMENTS}");
    let middle_name = format!("env-{:06}", ENVIRONMENTS / 2);
    let (middle, _) = time(&view, &format!("/ui/?after={middle_name}"), c, samples).await;
    let (search, _) = time(&view, "/ui/?q=env-00999", c, samples).await;
    let (failing, _) = time(&view, "/ui/?state=failing", c, samples).await;
    let (api_page, _) = time(&api, "/v1/deployments?limit=50", ("authorization", &bearer), samples).await;
    let env = &first.rows[0].deployment.environment;
    let (environment, _) = time(&view, &format!("/ui/environments/{env}"), c, samples).await;
    let event_woken = event_latency(&view, &cookie, &ops, &ledger, true, samples.min(30)).await;
    let event_polled = event_latency(&view, &cookie, &ops, &ledger, false, samples.min(30)).await;
    let (page_after_event, _) = time(&view, &format!("/ui/environments/{env}"), c, samples).await;
    fill_releases(url).await;
    let fleet = ops.fleet_to_live().await.expect("releases");
    assert!(fleet.capped, "the page reads its most");
    let (releases, _) = time(&view, "/ui/releases", c, samples).await;
    let mut scrapes = Vec::with_capacity(samples);
    for _ in 0..samples {
        // Each scrape reads afresh, as the first one after 15 s does.
        ops.indicators.lock().await.take();
        let start = Instant::now();
        let r = api
            .clone()
            .oneshot(Request::get("/metrics").body(Body::empty()).expect("request"))
            .await
            .expect("answer");
        let body = r.into_body().collect().await.expect("body").to_bytes();
        scrapes.push(start.elapsed().as_secs_f64() * 1000.0);
        assert!(
            body.windows(25).any(|w| w == b"pushleft_environment_info"),
            "the indicators are served"
        );
    }
    let metrics = (pct(scrapes.clone(), 0.5), pct(scrapes, 0.99));
    let _ = stop.send(true);
    let _ = watcher.await;
    ledger.close().await;
    Figures {
        overview,
        middle,
        search,
        failing,
        api: api_page,
        environment,
        event_woken,
        event_polled,
        page_after_event,
        releases,
        metrics,
        bytes,
    }
}

/// 50,000 releases live over the last 6 days (one every 10 s), beside the ledger's own.
async fn fill_releases(url: &str) {
    let now = reconciler::ops::now_ms();
    let n = reconciler::ops::releases::MOST_RELEASES;
    let q = if url.starts_with("postgres") {
        format!(
            "INSERT INTO releases_live (environment, generation, made_at, live_at) \
             SELECT 'bench-' || (i % 10000), 100000 + i, {now} - i * 10000 - (i % 97) * 1000, {now} - i * 10000 \
             FROM generate_series(1, {n}) AS i"
        )
    } else {
        format!(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {n}) \
             INSERT INTO releases_live (environment, generation, made_at, live_at) \
             SELECT 'bench-' || (i % 10000), 100000 + i, {now} - i * 10000 - (i % 97) * 1000, {now} - i * 10000 FROM n"
        )
    };
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(url).await.expect("connect");
    sqlx::query(sqlx::AssertSqlSafe(q))
        .execute(&pool)
        .await
        .expect("releases");
    pool.close().await;
}

fn main() {
    let mut samples = 50usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--samples" {
            samples = args.next().expect("n").parse().expect("number");
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let work = tempfile::tempdir().expect("tempdir");
    let (repo, base, head) = synthetic_repo(&work.path().join("repo"), ENVIRONMENTS);
    let sqlite_dir = work.path().join("sqlite");
    std::fs::create_dir_all(&sqlite_dir).expect("mkdir");
    let sqlite = rt.block_on(run(
        &work.path().join("repo"),
        &repo,
        &base,
        &head,
        &format!("sqlite://{}", sqlite_dir.join("ledger.db").display()),
        samples,
    ));
    let pg = postgres_support::Postgres::start();
    let postgres = rt.block_on(run(&work.path().join("repo"), &repo, &base, &head, &pg.url(), samples));
    println!("{ENVIRONMENTS} environments, {samples} samples each; server time in ms, p50 / p99:");
    println!("| measure | SQLite | PostgreSQL | target |");
    println!("|---|---:|---:|---:|");
    let row = |name: &str, f: &dyn Fn(&Figures) -> (f64, f64), target: &str| {
        let (a, b) = (f(&sqlite), f(&postgres));
        println!(
            "| {name} | {:.1} / {:.1} | {:.1} / {:.1} | {target} |",
            a.0, a.1, b.0, b.1
        );
    };
    row("overview, first page (HTML)", &|f| f.overview, "< 100");
    row("baseline: `GET /v1/deployments?limit=50` (JSON)", &|f| f.api, "-");
    row("overview, a page from the middle", &|f| f.middle, "< 100");
    row("overview, search by name", &|f| f.search, "< 100");
    row("overview, state filter (failing: none)", &|f| f.failing, "< 100");
    row("one environment's page", &|f| f.environment, "-");
    row(
        "event written → live message (this daemon's write)",
        &|f| f.event_woken,
        "-",
    );
    row(
        "event written → live message (another replica's write)",
        &|f| f.event_polled,
        "-",
    );
    row("the page's refetch after the message", &|f| f.page_after_event, "-");
    row(
        "the fleet's releases page (50,000 releases in 7 days)",
        &|f| f.releases,
        "-",
    );
    row(
        "`/metrics` with its indicators read afresh (every 15 s at most)",
        &|f| f.metrics,
        "-",
    );
    println!(
        "overview first page: {} bytes; ratio overview/API p50: SQLite {:.2}, PostgreSQL {:.2}",
        sqlite.bytes,
        sqlite.overview.0 / sqlite.api.0,
        postgres.overview.0 / postgres.api.0
    );
}
