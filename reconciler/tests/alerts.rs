//! The shipped Prometheus rules (`deploy/prometheus/`): Prometheus's own `promtool` checks them
//! and runs their unit cases (each alert quiet, then firing); every alert names a runbook
//! section that `docs/operations.md` has, and has a firing case. Then a real Prometheus
//! scrapes a real `pl-reconciler` (SQLite ledger, loopback TLS) through a release that
//! succeeds and one that fails, and the deployment-success page reaches
//! `ALERTS{alertstate="firing"}`; `/metrics` and `/v1/status` say what the agents reported.
//! Agents are played by the test through the ledger (leases and completions, as
//! `tests/daemon.rs` does). Every packet stays on loopback.

#[path = "support/daemon.rs"]
mod daemon_support;
#[path = "support/play.rs"]
mod play;
#[path = "support/repo.rs"]
mod repo_support;

use daemon_support::{Daemon, config, free_port, setup};
use reconciler::store::{Ledger, Outcome};
use repo_support::{Repo, environment, project};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn promtool(args: &[&str]) -> String {
    let o = Command::new("promtool")
        .args(args)
        .current_dir(root())
        .output()
        .expect("promtool (Debian's `prometheus` package; scripts/test installs it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn the_shipped_rules_pass_promtools_checks_and_unit_cases() {
    let checked = promtool(&["check", "rules", "deploy/prometheus/pushleft.rules.yml"]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = promtool(&["test", "rules", "deploy/prometheus/tests/pushleft.test.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// Each `- alert: NAME` of the rules with its `runbook:` anchor.
fn alerts() -> Vec<(String, String)> {
    let rules = std::fs::read_to_string(root().join("deploy/prometheus/pushleft.rules.yml")).expect("rules");
    let mut out: Vec<(String, String)> = Vec::new();
    for line in rules.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("- alert: ") {
            out.push((name.to_owned(), String::new()));
        } else if let Some(r) = line.strip_prefix("runbook: \"docs/operations.md#")
            && let Some(last) = out.last_mut()
        {
            last.1 = r.trim_end_matches('"').to_owned();
        }
    }
    out
}

#[test]
fn every_alert_has_a_runbook_section_and_a_firing_case() {
    let alerts = alerts();
    assert!(alerts.len() >= 20, "{alerts:?}");
    let ops = std::fs::read_to_string(root().join("docs/operations.md")).expect("docs/operations.md");
    // GitHub's anchors: a heading's text lowercased, spaces as dashes, other punctuation gone.
    let anchors: Vec<String> = ops
        .lines()
        .filter_map(|l| l.strip_prefix("### ").or_else(|| l.strip_prefix("## ")))
        .map(|h| {
            h.to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-')
                .collect::<String>()
                .replace(' ', "-")
        })
        .collect();
    let cases = std::fs::read_to_string(root().join("deploy/prometheus/tests/pushleft.test.yml")).expect("cases");
    for (name, runbook) in &alerts {
        assert!(
            anchors.iter().any(|a| a == runbook),
            "{name}'s runbook #{runbook} is no heading of docs/operations.md"
        );
        assert!(ops.contains(&format!("`{name}`")), "docs/operations.md names {name}");
        // A case that expects it to fire: its name, then a non-empty `exp_alerts`.
        let fires = cases
            .split("- eval_time:")
            .any(|case| case.contains(&format!("alertname: {name}\n")) && case.contains("exp_labels:"));
        assert!(fires, "{name} has no firing case in the unit cases");
    }
}

/// Prometheus on a loopback port, scraping the daemon's `/metrics` every second with the
/// shipped rules evaluated every second.
struct Prometheus {
    child: Child,
    port: u16,
}

impl Prometheus {
    fn start(dir: &Path, api_port: u16) -> Prometheus {
        let port = free_port();
        let rules = root().join("deploy/prometheus/pushleft.rules.yml");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {rules:?}\nscrape_configs:\n  - job_name: pushleft\n    scheme: https\n    tls_config:\n      ca_file: {:?}\n      server_name: localhost\n    static_configs:\n      - targets: ['127.0.0.1:{api_port}']\n",
            dir.join("tls/ca.crt")
        );
        std::fs::write(dir.join("prometheus.yml"), config).expect("config");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).expect("log"))
            .spawn()
            .expect("prometheus (Debian's `prometheus` package)");
        Prometheus { child, port }
    }

    /// An instant query's result, as JSON text.
    fn query(&self, q: &str) -> String {
        let url = format!("http://127.0.0.1:{}/api/v1/query", self.port);
        match ureq::get(&url).query("query", q).call() {
            Ok(mut r) => r.body_mut().read_to_string().unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// Waits (at most `within`) until `q` returns at least one series.
    fn until_some(&self, q: &str, within: Duration) -> String {
        let start = Instant::now();
        loop {
            let r = self.query(q);
            if r.contains("\"result\":[{") {
                return r;
            }
            assert!(
                start.elapsed() < within,
                "{q} returned nothing within {within:?}: {r}\nthe ratios: {}\n{}\nthe counters: {}",
                self.query("pushleft:deployment_errors:ratio_5m"),
                self.query("pushleft:deployment_errors:ratio_1h"),
                self.query("pushleft_deployments_ended_total")
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Plays node `n1`'s agent until `done` holds of `/metrics` (at most 60 s): every job it can
/// lease is completed, those `fails` picks with a permanent failure of `code`.
async fn play_n1(ledger: &Ledger, d: &Daemon, fails: &dyn Fn(&str) -> bool, code: &str, done: &dyn Fn(&str) -> bool) {
    let start = Instant::now();
    loop {
        play::round(ledger, "n1", &|key| {
            if fails(key) {
                Outcome::Permanent(format!("{code}: not healthy within 30 s"))
            } else {
                Outcome::Succeeded
            }
        })
        .await;
        let (_, metrics) = d.get("/metrics", None);
        if done(&metrics) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "not there in 60 s:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_release_pages_through_a_real_prometheus() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    std::fs::write(dir.path().join("allowed_signers"), &repo.signers).expect("signers");
    repo.write("projects/api.yaml", &project("api", 2));
    repo.write("envs/api-production.yaml", &environment("api-production", "api"));
    repo.commit("the first release", true);
    let s = setup(dir.path());
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let port = free_port();
    let cfg = config(&s, "d", &repo.dir, &url, port, "");
    let mut d = Daemon::start(&s, &cfg, port);
    d.wait_ready(Duration::from_secs(20));
    let ledger = Ledger::connect(&url, 2).await.expect("ledger");

    // The first release succeeds: a rollout completed, its commit-to-live observed.
    play_n1(&ledger, &d, &|_| false, "", &|m| {
        m.contains("pushleft_rollouts_total{outcome=\"completed\"} 1")
    })
    .await;
    let (_, metrics) = d.get("/metrics", None);
    for want in [
        "pushleft_deployments_ended_total{outcome=\"succeeded\"} 1",
        "pushleft_deployments_ended_total{outcome=\"failed\"} 0",
        "pushleft_commit_to_live_seconds_count 1",
        "pushleft_commit_to_live_seconds_bucket{le=\"600\"} 1",
        "pushleft_environment_info{environment=\"api-production\",sync=\"synced\",health=\"missing\"} 1",
        "pushleft_jobs_ended_total{kind=\"app-ensure\",outcome=\"succeeded\",code=\"none\"} 2",
        "pushleft_node_last_seen_age_seconds{node=\"n1\"}",
    ] {
        assert!(metrics.contains(want), "{want} missing from:\n{metrics}");
    }
    // Prometheus starts scraping now: it sees the counters from here on (the first release's
    // success is before its first sample), and no page fires while nothing fails.
    let prometheus = Prometheus::start(dir.path(), port);
    prometheus.until_some(
        "pushleft_deployments_ended_total{job=\"pushleft\",outcome=\"failed\"}",
        Duration::from_secs(30),
    );
    // The rules have been evaluated over those samples (0 of 0 ended: no ratio to burn).
    prometheus.until_some("pushleft:deployment_errors:ratio_5m", Duration::from_secs(30));
    let quiet = prometheus.query("ALERTS{alertname=\"PushleftDeploymentSuccessBurningFast\"}");
    assert!(quiet.contains("\"result\":[]"), "{quiet}");

    // The second release (a new image) never gets healthy: the deployment fails.
    let other = format!("sha256:{}", "f".repeat(64));
    repo.write(
        "projects/api.yaml",
        &project("api", 2).replace(repo_support::DIGEST, &other),
    );
    repo.commit("a new image", true);
    play_n1(
        &ledger,
        &d,
        &|key| key.starts_with("app:api-production/web/") && key.contains(":g2:ensure"),
        "health-deadline",
        &|m| m.contains("pushleft_deployments_ended_total{outcome=\"failed\"} 1"),
    )
    .await;
    let (_, metrics) = d.get("/metrics", None);
    assert!(
        metrics.contains("pushleft_jobs_ended_total{kind=\"app-ensure\",outcome=\"failed\",code=\"health-deadline\"}"),
        "the failure counted by its code:\n{metrics}"
    );

    // The page fires in Prometheus, from the daemon's own counts: every deployment that ended
    // in its windows failed.
    let firing = prometheus.until_some(
        "ALERTS{alertname=\"PushleftDeploymentSuccessBurningFast\",alertstate=\"firing\"}",
        Duration::from_secs(60),
    );
    assert!(firing.contains("\"severity\":\"page\""), "{firing}");

    // `pl status`'s objectives over the last day: one deployment of two ended failed.
    let (code, body) = d.get("/v1/status", Some(&s.viewer));
    assert_eq!(code, 200, "{body}");
    let status: operator_proto::status::Status = serde_json::from_str(&body).expect("status");
    let by = |n: &str| status.slos.iter().find(|x| x.name == n).expect("an slo").clone();
    let success = by("deployment-success");
    assert_eq!(
        (success.state, success.measured),
        (operator_proto::status::SloState::Burning, Some(0.5)),
        "{success:?}"
    );
    assert_eq!(by("commit-to-live").state, operator_proto::status::SloState::Met);
    assert_eq!(by("lease-freshness").state, operator_proto::status::SloState::Met);
    drop(prometheus);
    d.term();
}
