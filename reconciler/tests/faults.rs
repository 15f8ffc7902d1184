//! Faults, with real processes and real databases:
//! - SIGKILL one daemon at random points, 50 times, while it works through a burst of commits:
//!   the ledger ends identical to an uninterrupted run's.
//! - Two daemons on PostgreSQL: SIGKILL the leader mid-reconcile; the other takes over within
//!   5 s, loses no accepted commit and duplicates no job (its ledger equals the uninterrupted
//!   SQLite run's, row for row), and comes back after a PostgreSQL restart.
//! - Restart PostgreSQL under a leasing load: no job is recorded twice, every lease that was
//!   superseded is refused, nothing is lost.

#[path = "support/daemon.rs"]
mod daemon_support;
#[path = "support/dump.rs"]
mod dump;
#[path = "support/postgres.rs"]
mod postgres_support;
#[path = "support/repo.rs"]
mod repo_support;

use daemon_support::{Daemon, Setup, config, free_port, setup};
use reconciler::store::now_ms;
use reconciler::store::{Completion, Ledger, NewJob, Outcome};
use repo_support::{Repo, environment, git, project};
use state_schema::task::Task;
use state_schema::values::Name;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Commits in the burst.
const BURST: usize = 300;

/// A history made once per test binary and copied for each run, so every run judges the same
/// commits (same shas): a first commit, a burst on `main` (scales, new and removed
/// environments, unsigned and invalid commits among them) and a preview branch.
struct History {
    dir: PathBuf,
    first: String,
    last: String,
    preview: String,
}

fn history() -> &'static History {
    static H: OnceLock<History> = OnceLock::new();
    H.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir").keep();
        let repo = Repo::new(&dir);
        std::fs::write(dir.join("allowed_signers"), &repo.signers).expect("signers");
        repo.write("projects/api.yaml", &project("api", 1));
        repo.write("projects/web.yaml", &project("web", 2));
        repo.write("envs/api-production.yaml", &environment("api-production", "api"));
        let first = repo.commit("first", true);
        for i in 1..=BURST {
            match i % 6 {
                0 => repo.write("projects/api.yaml", &project("api", (i % 4 + 1) as u32)),
                1 => {
                    let name = format!("web-{}", i % 5);
                    let text = environment(&name, "web")
                        .replace("pool: main}", &format!("pool: main, hostname: {name}.example.com}}"));
                    repo.write(&format!("envs/{name}.yaml"), &text);
                }
                2 => {
                    let f = format!("envs/web-{}.yaml", (i + 3) % 5);
                    if repo.dir.join(&f).exists() {
                        repo.remove(&f);
                    }
                }
                3 => repo.write("projects/web.yaml", &project("web", (i % 3 + 1) as u32)),
                4 => repo.write("envs/broken.yaml", &environment("broken", "missing")),
                _ => {
                    let _ = std::fs::remove_file(repo.dir.join("envs/broken.yaml"));
                }
            }
            repo.commit(&format!("burst {i}"), i % 7 != 0);
        }
        let _ = std::fs::remove_file(repo.dir.join("envs/broken.yaml"));
        let last = repo.commit("last", true);
        repo.git(&["checkout", "-q", "-b", "feature/x", &first]);
        repo.write("projects/api.yaml", &project("api", 2));
        let preview = repo.commit("preview", true);
        repo.git(&["checkout", "-q", "main"]);
        History {
            dir,
            first,
            last,
            preview,
        }
    })
}

/// A copy of the history's repository with `main` at the first commit and no preview branch.
fn fresh_copy(to: &Path) -> (PathBuf, Setup) {
    let h = history();
    let s = std::process::Command::new("cp")
        .arg("-a")
        .arg(h.dir.join("state"))
        .arg(to.join("state"))
        .status()
        .expect("cp");
    assert!(s.success());
    std::fs::copy(h.dir.join("allowed_signers"), to.join("allowed_signers")).expect("signers");
    let repo = to.join("state");
    git(&repo, &["checkout", "-q", "--detach", &h.first]);
    git(&repo, &["update-ref", "refs/heads/main", &h.first]);
    git(&repo, &["branch", "-q", "-D", "feature/x"]);
    (repo, setup(to))
}

/// Moves the refs to the burst: the preview branch first, then `main`.
fn push_burst(repo: &Path) {
    let h = history();
    // main first: a pass that starts between the two updates judges main before the preview,
    // as a pass that sees both does (the applied branch comes first).
    git(repo, &["update-ref", "refs/heads/main", &h.last]);
    git(repo, &["update-ref", "refs/heads/feature/x", &h.preview]);
}

async fn judged(url: &str, branch: &str) -> Option<String> {
    let l = Ledger::connect(url, 1).await.ok()?;
    let r = l.revisions().last_judged(branch).await.ok().flatten();
    l.close().await;
    r
}

async fn wait_judged(url: &str, branch: &str, sha: &str, within: Duration) {
    let start = Instant::now();
    while judged(url, branch).await.as_deref() != Some(sha) {
        assert!(
            start.elapsed() < within,
            "{branch} not judged up to {sha} in {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The ledger of an uninterrupted run over the history (SQLite), once per test binary.
async fn reference() -> Vec<String> {
    static R: tokio::sync::OnceCell<Vec<String>> = tokio::sync::OnceCell::const_new();
    R.get_or_init(|| async {
        let dir = tempfile::tempdir().expect("tempdir");
        let (repo, s) = fresh_copy(dir.path());
        let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
        let port = free_port();
        let cfg = config(&s, "ref", &repo, &url, port, "");
        let mut d = Daemon::start(&s, &cfg, port);
        d.wait_ready(Duration::from_secs(20));
        wait_judged(&url, "main", &history().first, Duration::from_secs(20)).await;
        push_burst(&repo);
        wait_judged(&url, "main", &history().last, Duration::from_secs(120)).await;
        wait_judged(&url, "feature/x", &history().preview, Duration::from_secs(20)).await;
        assert!(d.term().success());
        dump::snapshot(&url).await
    })
    .await
    .clone()
}

/// A small deterministic generator for kill delays; the seed is printed for replay.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % bound
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_fifty_times_during_a_burst_changes_nothing() {
    let want = reference().await;
    assert!(want.iter().filter(|r| r.starts_with("revisions:")).count() >= BURST);
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, s) = fresh_copy(dir.path());
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let port = free_port();
    let cfg = config(&s, "k", &repo, &url, port, "");
    let mut d = Daemon::start(&s, &cfg, port);
    d.wait_ready(Duration::from_secs(20));
    wait_judged(&url, "main", &history().first, Duration::from_secs(20)).await;
    d.kill9();
    push_burst(&repo);
    let seed = now_ms() as u64;
    eprintln!("kill delays seeded with {seed}");
    let mut rng = Lcg(seed);
    // Kill until 50 kills have landed while the burst was still being processed.
    let total = BURST + 3;
    let mut progress: Vec<usize> = Vec::new();
    while progress.iter().filter(|&&n| n < total).count() < 50 && progress.len() < 120 {
        let mut d = Daemon::start(&s, &cfg, port);
        tokio::time::sleep(Duration::from_millis(20 + rng.next(180))).await;
        d.kill9();
        let n = dump::rows(&url, "SELECT COUNT(*) FROM revisions").await.join("");
        progress.push(n.parse().expect("count"));
    }
    eprintln!("revisions after each kill: {progress:?}");
    let mid_burst = progress.iter().filter(|&&n| n < total).count();
    assert!(mid_burst >= 50, "only {mid_burst} kills landed mid-burst: {progress:?}");
    let mut d = Daemon::start(&s, &cfg, port);
    d.wait_ready(Duration::from_secs(20));
    wait_judged(&url, "main", &history().last, Duration::from_secs(120)).await;
    wait_judged(&url, "feature/x", &history().preview, Duration::from_secs(20)).await;
    assert!(d.term().success());
    let got = dump::snapshot(&url).await;
    assert!(
        got == want,
        "the ledgers differ: {}",
        dump::first_difference(&got, &want)
    );
    assert_eq!(got.iter().filter(|r| r.starts_with("revisions:")).count(), total);
}

/// Two daemons on the ledger at `url`: `a` started first and leading, then `b`, ready and
/// following.
async fn two_daemons(s: &Setup, repo: &Path, url: &str) -> (Daemon, Daemon) {
    let (pa, pb) = (free_port(), free_port());
    let mut a = Daemon::start(s, &config(s, "a", repo, url, pa, ""), pa);
    a.wait_ready(Duration::from_secs(20));
    let start = Instant::now();
    while !a.is_leader(&s.viewer) {
        assert!(start.elapsed() < Duration::from_secs(10), "a never led");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut b = Daemon::start(s, &config(s, "b", repo, url, pb, ""), pb);
    b.wait_ready(Duration::from_secs(20));
    assert!(!b.is_leader(&s.viewer), "one leader at a time");
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_sigkill_fails_over_within_five_seconds() {
    let want = reference().await;
    let pg = postgres_support::Postgres::start();
    let url = pg.url();
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, s) = fresh_copy(dir.path());
    let (mut a, mut b) = two_daemons(&s, &repo, &url).await;
    wait_judged(&url, "main", &history().first, Duration::from_secs(20)).await;

    push_burst(&repo);
    // Mid-reconcile: some of the burst judged, not all.
    let start = Instant::now();
    loop {
        let n: usize = dump::rows(&url, "SELECT COUNT(*) FROM revisions")
            .await
            .join("")
            .parse()
            .expect("count");
        if n >= 5 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the leader never started on the burst"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    a.kill9();
    let killed = Instant::now();
    while !b.is_leader(&s.viewer) {
        assert!(killed.elapsed() < Duration::from_secs(5), "no takeover within 5 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("takeover after {:?}", killed.elapsed());
    wait_judged(&url, "main", &history().last, Duration::from_secs(120)).await;
    wait_judged(&url, "feature/x", &history().preview, Duration::from_secs(20)).await;
    let got = dump::snapshot(&url).await;
    assert!(
        got == want,
        "PostgreSQL after a failover differs from the uninterrupted SQLite run: {}",
        dump::first_difference(&got, &want)
    );

    // The survivor comes back after PostgreSQL restarts: ready again, leading again.
    tokio::task::block_in_place(|| pg.restart());
    let restarted = Instant::now();
    loop {
        if b.get("/readyz", None).0 == 200 && b.is_leader(&s.viewer) {
            break;
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(20),
            "no recovery after the restart"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(b.term().success());
}

/// Two daemons on one PostgreSQL that restarts: sampled every 20 ms through the restart and
/// until one leads again, they never both report themselves leader (`/v1/status`), and then
/// exactly one does. Leadership is what the lock says at that moment: the old leader's lock
/// ends with PostgreSQL's session, and it stops saying it leads within `LEADERSHIP_CHECK`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn across_a_postgres_restart_two_daemons_never_both_lead() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let pg = postgres_support::Postgres::start();
    let url = pg.url();
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, s) = fresh_copy(dir.path());
    let (mut a, mut b) = two_daemons(&s, &repo, &url).await;
    let (both, samples, stop) = (AtomicUsize::new(0), AtomicUsize::new(0), AtomicBool::new(false));
    tokio::task::block_in_place(|| {
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let end = Instant::now() + Duration::from_secs(60);
                while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                    if a.is_leader(&s.viewer) && b.is_leader(&s.viewer) {
                        both.fetch_add(1, Ordering::Relaxed);
                    }
                    samples.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(20));
                }
            });
            pg.restart();
            let restarted = Instant::now();
            while !(a.is_leader(&s.viewer) || b.is_leader(&s.viewer)) {
                assert!(
                    restarted.elapsed() < Duration::from_secs(20),
                    "nobody leads after the restart"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            // A little longer: a daemon that still believed it led would show now.
            std::thread::sleep(Duration::from_secs(2));
            stop.store(true, Ordering::Relaxed);
        });
    });
    assert!(samples.load(Ordering::Relaxed) > 20, "sampled through the restart");
    assert_eq!(
        both.load(Ordering::Relaxed),
        0,
        "both daemons reported themselves leader at once"
    );
    assert_ne!(a.is_leader(&s.viewer), b.is_leader(&s.viewer), "exactly one leads");
    a.kill9();
    b.kill9();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restart_under_leasing_load_loses_and_doubles_nothing() {
    let pg = postgres_support::Postgres::start();
    let ledger = Arc::new(Ledger::connect(&pg.url(), 16).await.expect("connect"));
    ledger.migrate().await.expect("migrate");
    let nodes = ["n1", "n2", "n3", "n4"];
    let jobs: Vec<NewJob> = (0..2000u32)
        .map(|i| NewJob {
            task: Task::EnsureApplication {
                environment: Name::new("load").expect("name"),
                role: Name::new("web").expect("name"),
                instance: i,
                generation: 1,
                spec_hash: String::new(),
                repair: 0,
            },
            target_node: nodes[(i % 4) as usize].to_owned(),
            max_attempts: 100,
            not_before_ms: 0,
        })
        .collect();
    assert_eq!(ledger.jobs().enqueue(&jobs, now_ms()).await.expect("enqueue"), 2000);
    // Every lease handed out: (job, fencing token, lease token).
    let leases: Arc<Mutex<Vec<reconciler::store::LeaseToken>>> = Arc::default();
    let errors = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut workers = Vec::new();
    for w in 0..8 {
        let (ledger, leases, errors) = (Arc::clone(&ledger), Arc::clone(&leases), Arc::clone(&errors));
        workers.push(tokio::spawn(async move {
            let node = nodes[w % 4];
            let deadline = Instant::now() + Duration::from_secs(90);
            while Instant::now() < deadline {
                let got = match ledger.jobs().lease(node, 16, 1500, now_ms()).await {
                    Ok(g) => g,
                    Err(_) => {
                        errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if got.is_empty() {
                    let left = ledger
                        .views()
                        .jobs(Some("queued"), None, None, 1)
                        .await
                        .map(|j| j.len())
                        .unwrap_or(1)
                        + ledger
                            .views()
                            .jobs(Some("leased"), None, None, 1)
                            .await
                            .map(|j| j.len())
                            .unwrap_or(1);
                    if left == 0 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                leases.lock().expect("lock").extend(got.iter().map(|l| l.token.clone()));
                let done: Vec<Completion> = got
                    .iter()
                    .map(|l| Completion {
                        token: l.token.clone(),
                        outcome: Outcome::Succeeded,
                    })
                    .collect();
                if ledger.jobs().complete(&done, now_ms()).await.is_err() {
                    errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::task::block_in_place(|| pg.restart());
    for w in workers {
        w.await.expect("worker");
    }
    let url = pg.url();
    assert_eq!(
        dump::rows(&url, "SELECT state, COUNT(*) FROM jobs GROUP BY state").await,
        ["succeeded|2000"],
        "nothing lost"
    );
    assert_eq!(
        dump::rows(&url, "SELECT COUNT(*) FROM job_results").await,
        ["2000"],
        "each job's success recorded once"
    );
    assert!(
        errors.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "the restart happened under load"
    );
    // A job leased more than once (its lease expired during the restart): every earlier
    // lease is refused now, and the fencing tokens only grew.
    let leases = leases.lock().expect("lock").clone();
    let mut by_job: std::collections::BTreeMap<i64, Vec<reconciler::store::LeaseToken>> = Default::default();
    for l in leases {
        by_job.entry(l.job_id).or_default().push(l);
    }
    let mut stale = Vec::new();
    for (_, ls) in by_job.iter() {
        for pair in ls.windows(2) {
            assert!(
                pair[1].fencing_token > pair[0].fencing_token,
                "fencing tokens only grow"
            );
        }
        stale.extend(ls.iter().map(|t| Completion {
            token: t.clone(),
            outcome: Outcome::Permanent("late".into()),
        }));
    }
    let results = ledger.jobs().complete(&stale, now_ms()).await.expect("complete");
    assert!(
        results.iter().all(|r| r.is_err()),
        "no lease is valid any more: all were completed or superseded"
    );
    assert_eq!(
        dump::rows(&url, "SELECT COUNT(*) FROM job_results").await,
        ["2000"],
        "refusals record nothing"
    );
    ledger.close().await;
}
