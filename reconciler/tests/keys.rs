//! Keys and the files that hold them, through the real `pl-reconciler` binary: `tls-init` makes
//! a CA of at most 10 years that can sign only leaves and an API certificate of at most 398
//! days, `tls-renew` replaces the API pair from the same CA, the daemon refuses private files
//! that group or others can read (naming them) and files the configuration names that are
//! missing, and it runs with core dumps off.

#[path = "support/daemon.rs"]
mod daemon_support;
#[path = "support/repo.rs"]
mod repo_support;

use daemon_support::{Daemon, bin, config, free_port, setup};
use repo_support::Repo;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use x509_parser::prelude::{FromDer, X509Certificate};

const DAY: i64 = 86_400;

fn der(path: &Path) -> Vec<u8> {
    let pem = std::fs::read(path).expect("read pem");
    let (_, p) = x509_parser::pem::parse_x509_pem(&pem).expect("pem");
    p.contents
}

fn lifetime_days(c: &X509Certificate<'_>) -> f64 {
    let v = c.validity();
    (v.not_after.timestamp() - v.not_before.timestamp()) as f64 / DAY as f64
}

/// `pl-reconciler tls-init|tls-renew --dir DIR`.
fn tls_command(command: &str, dir: &Path) -> std::process::Output {
    Command::new(bin())
        .args([command, "--dir"])
        .arg(dir)
        .output()
        .expect("runs")
}

#[test]
fn tls_init_and_renew_make_short_lived_constrained_certificates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tls = dir.path().join("tls");
    let o = tls_command("tls-init", &tls);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ca_der = der(&tls.join("ca.crt"));
    let (_, ca) = X509Certificate::from_der(&ca_der).expect("ca parses");
    assert!(lifetime_days(&ca) <= 3650.0 + 1.0 / 24.0, "{}", lifetime_days(&ca));
    let bc = ca.basic_constraints().expect("ext").expect("basic constraints").value;
    assert!(bc.ca);
    assert_eq!(bc.path_len_constraint, Some(0), "the CA signs leaves only");
    let api_der = der(&tls.join("api.crt"));
    let (_, api) = X509Certificate::from_der(&api_der).expect("api parses");
    assert!(lifetime_days(&api) <= 398.0, "{}", lifetime_days(&api));
    assert!(api.basic_constraints().ok().flatten().is_none_or(|b| !b.value.ca));
    api.verify_signature(Some(ca.public_key())).expect("signed by the CA");
    assert!(api.validity().is_valid(), "valid now");
    for key in ["ca.key", "api.key"] {
        let mode = std::fs::metadata(tls.join(key)).expect("key").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{key}");
    }

    // Renewal: a new pair from the same CA, the CA untouched.
    let o = tls_command("tls-renew", &tls);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let renewed_der = der(&tls.join("api.crt"));
    assert_ne!(renewed_der, api_der, "a new certificate");
    let (_, renewed) = X509Certificate::from_der(&renewed_der).expect("parses");
    assert_ne!(renewed.raw_serial(), api.raw_serial());
    renewed.verify_signature(Some(ca.public_key())).expect("the same CA");
    assert_eq!(der(&tls.join("ca.crt")), ca_der);
    let mode = std::fs::metadata(tls.join("api.key"))
        .expect("key")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    assert!(!tls.join("api.key.new").exists() && !tls.join("api.crt.new").exists());

    // A CA key others can read is refused, naming it.
    std::fs::set_permissions(tls.join("ca.key"), std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let o = tls_command("tls-renew", &tls);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("ca.key") && err.contains("chmod 600"), "{err}");
}

/// Starts the daemon and returns its exit status and log when it stops by itself in 10 s.
fn start_fails(s: &daemon_support::Setup, cfg: &Path, port: u16) -> String {
    let mut d = Daemon::start(s, cfg, port);
    for _ in 0..100 {
        if let Ok(Some(status)) = d.child.try_wait() {
            assert!(!status.success());
            return std::fs::read_to_string(&d.log).unwrap_or_default();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the daemon started with a bad file");
}

#[test]
fn the_daemon_refuses_exposed_or_missing_private_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    std::fs::write(dir.path().join("allowed_signers"), &repo.signers).expect("signers");
    repo.commit("initial", true);
    let s = setup(dir.path());
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let port = free_port();

    let with = |extra: &str| config(&s, "d", &repo.dir, &url, port, extra);

    // An API key that others can read.
    let cfg = with("");
    let key = dir.path().join("tls/api.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let log = start_fails(&s, &cfg, port);
    assert!(
        log.contains("api.key") && log.contains("[private-file-exposed]"),
        "{log}"
    );
    let o = Command::new(bin())
        .args(["check-config", "--config"])
        .arg(&cfg)
        .output()
        .expect("runs");
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("[private-file-exposed]"));
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");

    // A webhook secret others can read.
    std::fs::write(dir.path().join("gh.secret"), "s3cret-value\n").expect("secret");
    std::fs::set_permissions(dir.path().join("gh.secret"), std::fs::Permissions::from_mode(0o640)).expect("chmod");
    let cfg = with("[webhooks]\ngithub_secret_file = \"gh.secret\"\n");
    let log = start_fails(&s, &cfg, port);
    assert!(log.contains("gh.secret") && log.contains("0640"), "{log}");
    assert!(!log.contains("s3cret-value"));

    // A CA key that the configuration names but that is not there (checked at start, as the
    // reference says).
    let cfg = with("[control]\nca_cert = \"tls/ca.crt\"\nca_key = \"tls/missing-ca.key\"\n");
    let log = start_fails(&s, &cfg, port);
    assert!(log.contains("missing-ca.key"), "{log}");

    // With the files in order, it runs, and with core dumps off.
    let cfg = with("[control]\nca_cert = \"tls/ca.crt\"\nca_key = \"tls/ca.key\"\n");
    let mut d = Daemon::start(&s, &cfg, port);
    d.wait_ready(Duration::from_secs(20));
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", d.child.id())).expect("limits");
    let core = limits
        .lines()
        .find(|l| l.starts_with("Max core file size"))
        .expect("core line");
    assert_eq!(
        core.split_whitespace().skip(4).take(2).collect::<Vec<_>>(),
        ["0", "0"],
        "{core}"
    );
}
