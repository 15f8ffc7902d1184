//! A real ACME CA and a real DNS server for the HTTPS tests, both on loopback (inside the
//! test's network namespace when it runs there): Debian's `pebble` (validation without its
//! random sleeps, no nonce rejections, external account binding required, short-lived
//! certificates) with its resolver pointed at Debian's `dnsmasq`, which serves only the
//! records the test gives it (`--no-resolv`: nothing is forwarded anywhere). `scripts/test`
//! installs both.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// The key id and the base64url HMAC key pebble requires accounts to bind to.
pub const EAB_KID: &str = "kid-pushleft";
pub const EAB_KEY: &str = "zWNDZM6eQGHWpSRTPal5eIUYFTu7EajVIoguysqZ9wG44nMEtx3MUAsUDkMTQ12W";

fn wait_tcp(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "{what} never listened on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub struct Pebble {
    child: Child,
    /// The directory URL.
    pub directory: String,
    /// The PEM root the directory's HTTPS is signed by (what `ca_root` names).
    pub https_root: PathBuf,
    management: u16,
}

impl Pebble {
    /// Pebble on loopback ports of its own, validating HTTP-01 on `http_port` of whatever
    /// address `dns_port`'s server gives, issuing certificates valid for `validity_seconds`.
    pub fn start(dir: &Path, http_port: u16, dns_port: u16, validity_seconds: u64) -> Pebble {
        let (listen, management) = (crate::support::free_port(), crate::support::free_port());
        let (ca, cert, key) = crate::tls_support::certificate(&["localhost", "127.0.0.1"]);
        std::fs::create_dir_all(dir).expect("pebble dir");
        let https_root = dir.join("https-root.pem");
        std::fs::write(&https_root, ca).expect("root");
        std::fs::write(dir.join("cert.pem"), cert).expect("cert");
        std::fs::write(dir.join("key.pem"), key).expect("key");
        let config = serde_json::json!({"pebble": {
            "listenAddress": format!("127.0.0.1:{listen}"),
            "managementListenAddress": format!("127.0.0.1:{management}"),
            "certificate": dir.join("cert.pem"),
            "privateKey": dir.join("key.pem"),
            "httpPort": http_port,
            "tlsPort": crate::support::free_port(),
            "ocspResponderURL": "",
            "externalAccountBindingRequired": true,
            "externalAccountMACKeys": { EAB_KID: EAB_KEY },
            "certificateValidityPeriod": validity_seconds,
        }});
        std::fs::write(dir.join("pebble.json"), config.to_string()).expect("config");
        let log = std::fs::File::create(dir.join("pebble.log")).expect("log");
        let child = Command::new("pebble")
            .arg("-config")
            .arg(dir.join("pebble.json"))
            .args(["-dnsserver", &format!("127.0.0.1:{dns_port}")])
            .env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_WFE_NONCEREJECT", "0")
            .env("PEBBLE_AUTHZREUSE", "0")
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("pebble (scripts/test installs it)");
        wait_tcp(listen, "pebble");
        Pebble {
            child,
            directory: format!("https://127.0.0.1:{listen}/dir"),
            https_root,
            management,
        }
    }

    /// The root pebble issues under (made at its start), PEM.
    pub fn issuing_root(&self) -> String {
        let pem = std::fs::read(&self.https_root).expect("root");
        let roots = pushleft_agent::client::ca_bundle(&pem).expect("pem");
        let tls = ureq::tls::TlsConfig::builder()
            .root_certs(ureq::tls::RootCerts::Specific(std::sync::Arc::new(roots)))
            .build();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .tls_config(tls)
            .timeout_global(Some(Duration::from_secs(5)))
            .build()
            .into();
        agent
            .get(&format!("https://127.0.0.1:{}/roots/0", self.management))
            .call()
            .expect("pebble's root")
            .body_mut()
            .read_to_string()
            .expect("pem")
    }

    pub fn log(dir: &Path) -> String {
        std::fs::read_to_string(dir.join("pebble.log")).unwrap_or_default()
    }
}

impl Drop for Pebble {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A record the DNS server answers.
#[derive(Clone, Debug)]
pub enum Record {
    A(String, String),
    Txt(String, String),
    Cname(String, String),
}

/// dnsmasq on a loopback UDP and TCP port, authoritative for nothing but what it is given.
pub struct Dns {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
}

impl Dns {
    pub fn start(dir: &Path, records: &[Record]) -> Dns {
        let mut dns = Dns {
            child: None,
            port: crate::support::free_port(),
            dir: dir.to_owned(),
        };
        dns.set(records);
        dns
    }

    /// Serves `records` from now on (dnsmasq reads TXT and CNAME records at start only, so it
    /// is started again on the same port).
    pub fn set(&mut self, records: &[Record]) {
        self.stop();
        let mut args = vec![
            "--keep-in-foreground".to_owned(),
            "--no-resolv".into(),
            "--no-hosts".into(),
            "--no-poll".into(),
            "--conf-file=/dev/null".into(),
            "--pid-file=".into(),
            "--bind-interfaces".into(),
            "--listen-address=127.0.0.1".into(),
            format!("--port={}", self.port),
            "--user=root".into(),
            "--cache-size=0".into(),
            "--local=/test/".into(),
            "--local=/example.com/".into(),
        ];
        for r in records {
            args.push(match r {
                Record::A(name, ip) => format!("--host-record={name},{ip}"),
                Record::Txt(name, value) => format!("--txt-record={name},{value}"),
                Record::Cname(name, target) => format!("--cname={name},{target}"),
            });
        }
        std::fs::create_dir_all(&self.dir).expect("dns dir");
        let log = std::fs::File::create(self.dir.join("dnsmasq.log")).expect("log");
        self.child = Some(
            Command::new("dnsmasq")
                .args(&args)
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .expect("dnsmasq (scripts/test installs dnsmasq-base)"),
        );
        wait_tcp(self.port, "dnsmasq");
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Dns {
    fn drop(&mut self) {
        self.stop();
    }
}
