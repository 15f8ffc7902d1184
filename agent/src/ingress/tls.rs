//! HTTPS at the ingress: the certificate a lease brings (sealed to this node's age key), opened
//! and checked before anything changes, kept in files only Caddy's user reads, and the parts
//! of Caddy's configuration that serve it.
//!
//! Layout: a second server of ours, `pushleft-tls`, listens on `ingress_tls_listen` and holds
//! each HTTPS hostname's proxy route (`pl-https.<control plane>.<hostname>`, the same upstream
//! slot files as plain HTTP, so a generation switch still reloads nothing). The plain server's
//! route of that hostname then answers a permanent redirect to HTTPS.
//!
//! Certificates are served without ever being in Caddy's configuration, and change without a
//! reload: each hostname has one automation policy of Caddy's `tls` app
//! (`pl-certpolicy.<control plane>.<hostname>`; Caddy refuses two for one name, so the nodes of
//! a machine share it) whose `get_certificate` manager fetches
//! `<tls dir>/<hostname>/<control plane>.serving.pem` (chain and key) at each handshake from a
//! third server of ours, `pushleft-certs`: Caddy's own file server on a loopback address
//! (`ingress_certs_listen`), behind a route per control plane (`pl-certs.<control plane>`) that
//! answers only paths under that control plane's random token (256 bits, kept 0600 in the TLS
//! folder) and only to loopback peers. A new certificate is a rename of the serving file: the
//! next handshake shows it, and no configuration changes. Why: every change of Caddy's
//! configuration is a reload, and a reload loses a few requests arriving at that instant (Go's
//! `net/http` closes a just-accepted connection of the old server: docs/agent.md, "HTTPS"); a
//! certificate renewal must not. The file server answers from the page cache and Caddy merges
//! concurrent handshakes' fetches of one name, so the handshake rate stays Caddy's
//! (docs/benchmarks.md). Agents before this one loaded certificates with `load_files` entries
//! (`pl-cert.<control plane>_<node>.<hostname>`); a publish or removal deletes them.
//!
//! Why files and not `load_pem`: Caddy saves its configuration to disk (`autosave.json`) and
//! answers it to `GET /config/`; a key inside it would be in both. The key and the serving
//! file are 0600, owned by the user that owns Caddy's admin socket folder (Caddy's user) when the
//! agent runs as root.

use crate::outcome::{Failure, permanent, retryable};
use agent_proto::IngressTls;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// The HTTPS server of ours in Caddy's HTTP app.
pub const TLS_SERVER: &str = "pushleft-tls";
/// A hostname's HTTPS route: `pl-https.<control plane>.<hostname>` (differs from `pl-host.`
/// and `pl-builtin.` before either ends).
pub const HTTPS_ROUTE: &str = "pl-https.";
/// A node's certificate for a hostname as earlier agents loaded it (a `load_files` entry):
/// `pl-cert.<control plane>_<node>.<hostname>`. Deleted where found.
pub const CERT_ENTRY: &str = "pl-cert.";
/// A hostname's certificate policy: `pl-certpolicy.<control plane>.<hostname>` (one per
/// hostname: Caddy refuses two policies for one name, so the nodes of a machine share it).
pub const CERT_POLICY: &str = "pl-certpolicy.";
/// The loopback server of ours that hands Caddy's handshakes their certificate files.
pub const CERTS_SERVER: &str = "pushleft-certs";
/// A control plane's route on it: `pl-certs.<control plane>`.
pub const CERTS_ROUTE: &str = "pl-certs.";
/// The certificates server's catch-all.
pub const CERTS_FALLBACK: &str = "pl-builtin.certs-fallback-404";
/// The file a hostname's certificate policy serves, `<tls dir>/<hostname>/<control
/// plane>.serving.pem`: chain, then key, of the node that published it last.
pub const SERVING: &str = "serving.pem";

/// The name of a control plane's serving file in a hostname's folder.
pub fn serving_file(control_plane: &str) -> String {
    format!("{control_plane}.{SERVING}")
}
/// The HTTPS server's catch-all.
pub const TLS_FALLBACK: &str = "pl-builtin.tls-fallback-404";
/// What HSTS says when an environment asks for it: a year, as browsers' preload lists expect.
pub const HSTS: &str = "max-age=31536000";

/// Where HTTPS is served and where certificates are kept.
#[derive(Clone, Debug)]
pub struct TlsConfig {
    /// `ingress_tls_listen`: where the HTTPS server listens (`[":443"]`).
    pub listen: Vec<String>,
    /// `ingress_tls_dir`: the certificate files, a folder per hostname.
    pub dir: PathBuf,
    /// `ingress_certs_listen`: the loopback `ip:port` where Caddy's certificate file server
    /// of ours listens (`127.0.0.1:2021`).
    pub certs_listen: String,
    /// The node's age identity, which opens what the lease sealed to it.
    pub identity: PathBuf,
}

impl TlsConfig {
    /// The port redirects name: `:<port>` unless it is 443 (or unknown).
    pub fn redirect_port(&self) -> String {
        let port = self
            .listen
            .first()
            .and_then(|l| l.rsplit_once(':'))
            .and_then(|(_, p)| p.parse::<u16>().ok());
        match port {
            Some(p) if p != 443 => format!(":{p}"),
            _ => String::new(),
        }
    }
}

/// A certificate opened and checked for one hostname.
pub struct Certificate {
    chain: Vec<u8>,
    key: Zeroizing<Vec<u8>>,
    pub hsts: bool,
    /// The first 16 hex digits of the SHA-256 of chain and key: names its files.
    pub digest: String,
    /// When the leaf expires (Unix seconds), for status and metrics.
    pub not_after: i64,
}

fn unusable(secret: &str, why: impl std::fmt::Display) -> Failure {
    permanent("tls-certificate-invalid", format!("secret {secret}: {why}"))
}

/// Whether a certificate name (`*.example.com` or `app.example.com`) covers `hostname`: a
/// wildcard covers exactly one label, and only below a name of two labels or more (clients
/// refuse `*.com`, so it would never be served).
pub fn covers(name: &str, hostname: &str) -> bool {
    let (name, hostname) = (name.to_ascii_lowercase(), hostname.to_ascii_lowercase());
    match name.strip_prefix("*.") {
        Some(parent) => hostname
            .split_once('.')
            .is_some_and(|(label, rest)| !label.is_empty() && rest == parent && parent.contains('.')),
        None => name == hostname,
    }
}

impl Certificate {
    /// Opens the sealed chain and key with the node's identity and checks them for `hosts`
    /// (the hostname, and with `pl up` its `.localhost` name): PEM that parses, a key that
    /// matches the leaf, a leaf that names one of them (a DNS name of its subject alternative
    /// names) and is valid now. Nothing of the key is in any error.
    pub fn open(tls: &IngressTls, identity: &Path, hosts: &[String], now: i64) -> Result<Certificate, Failure> {
        let hostname = hosts.first().map_or("", String::as_str);
        let ids = pushleft_secrets::load_identities(identity)
            .map_err(|e| permanent("node-identity-unreadable", e.code().to_owned()))?;
        let chain = pushleft_secrets::decrypt(&tls.cert, &ids)
            .map_err(|e| permanent("secret-unopenable", format!("{} CERT: {}", tls.secret, e.code())))?;
        let key = pushleft_secrets::decrypt(&tls.key, &ids)
            .map_err(|e| permanent("secret-unopenable", format!("{} KEY: {}", tls.secret, e.code())))?;
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&chain)
            .collect::<Result<_, _>>()
            .map_err(|_| unusable(&tls.secret, "CERT is not a PEM certificate chain"))?;
        let Some(leaf) = certs.first() else {
            return Err(unusable(&tls.secret, "CERT holds no certificate"));
        };
        let private =
            PrivateKeyDer::from_pem_slice(&key).map_err(|_| unusable(&tls.secret, "KEY is not a PEM private key"))?;
        rustls::sign::CertifiedKey::from_der(certs.clone(), private, &rustls::crypto::ring::default_provider())
            .map_err(|e| match e {
                rustls::Error::InconsistentKeys(_) => {
                    unusable(&tls.secret, "KEY does not belong to the first certificate of CERT")
                }
                _ => unusable(&tls.secret, "KEY is of a kind the ingress cannot use"),
            })?;
        let (_, parsed) = x509_parser::parse_x509_certificate(leaf)
            .map_err(|_| unusable(&tls.secret, "the first certificate of CERT does not parse"))?;
        let names: Vec<String> = parsed
            .subject_alternative_name()
            .ok()
            .flatten()
            .map(|san| {
                san.value
                    .general_names
                    .iter()
                    .filter_map(|n| match n {
                        x509_parser::extensions::GeneralName::DNSName(d) => Some((*d).to_owned()),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        if !names.iter().any(|n| hosts.iter().any(|h| covers(n, h))) {
            return Err(unusable(
                &tls.secret,
                format!(
                    "the certificate does not name {hostname} (it names: {})",
                    names.join(", ")
                ),
            ));
        }
        let validity = parsed.validity();
        let (not_before, not_after) = (validity.not_before.timestamp(), validity.not_after.timestamp());
        if now < not_before || now > not_after {
            return Err(unusable(
                &tls.secret,
                format!("the certificate is valid from {not_before} to {not_after} (Unix time), not now ({now})"),
            ));
        }
        let mut h = Sha256::new();
        h.update(&chain);
        h.update(&key);
        let digest = hex::encode(&h.finalize()[..8]);
        Ok(Certificate {
            chain: chain.to_vec(),
            key,
            hsts: tls.hsts,
            digest,
            not_after,
        })
    }

    /// Writes the chain and key under `folder` as `<digest>.crt` and `<digest>.key` (0600,
    /// made by a rename; kept when present), owned by `owner` when given. Returns both paths.
    pub fn write(&self, folder: &Path, owner: Option<u32>) -> Result<(PathBuf, PathBuf), Failure> {
        let disk = |e: std::io::Error| retryable("ingress-write-failed", e.to_string());
        std::fs::create_dir_all(folder).map_err(disk)?;
        let crt = folder.join(format!("{}.crt", self.digest));
        let key = folder.join(format!("{}.key", self.digest));
        for (path, bytes) in [(&crt, &self.chain[..]), (&key, &self.key[..])] {
            if path.exists() {
                continue;
            }
            let tmp = path.with_extension("tmp");
            let _ = std::fs::remove_file(&tmp);
            pushleft_secrets::write_private(&tmp, bytes).map_err(disk)?;
            if let Some(uid) = owner {
                std::os::unix::fs::chown(&tmp, Some(uid), None).map_err(disk)?;
            }
            std::fs::rename(&tmp, path).map_err(disk)?;
        }
        Ok((crt, key))
    }
}

/// Writes the certificate files `<digest>.crt` and `<digest>.key` of `folder` together to
/// `path` (a hostname's serving file, 0600, owned by `owner` when given), replaced by a rename
/// so a handshake reads the old pair or the new one, never half of either; left alone when it
/// holds them already.
pub fn serve(folder: &Path, digest: &str, path: &Path, owner: Option<u32>) -> Result<(), Failure> {
    let disk = |e: std::io::Error| retryable("ingress-write-failed", e.to_string());
    let chain = std::fs::read(folder.join(format!("{digest}.crt"))).map_err(disk)?;
    let key = Zeroizing::new(std::fs::read(folder.join(format!("{digest}.key"))).map_err(disk)?);
    let bundle: Zeroizing<Vec<u8>> = Zeroizing::new([&chain[..], b"\n", &key[..]].concat());
    if std::fs::read(path).is_ok_and(|b| Zeroizing::new(b)[..] == bundle[..]) {
        return Ok(());
    }
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    pushleft_secrets::write_private(&tmp, &bundle).map_err(disk)?;
    if let Some(uid) = owner {
        std::os::unix::fs::chown(&tmp, Some(uid), None).map_err(disk)?;
    }
    std::fs::rename(&tmp, path).map_err(disk)
}

/// The user Caddy's files must belong to: the owner of its admin socket's folder, when the
/// agent runs as root and that owner is another user; `None` otherwise (the agent's own files
/// are Caddy's when both run as one user).
pub fn caddy_owner(admin_folder: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let owner = std::fs::metadata(admin_folder).ok()?.uid();
    let me = rustix::process::geteuid().as_raw();
    (me == 0 && owner != me).then_some(owner)
}

/// The `@id` of a hostname's HTTPS route.
pub fn https_route_id(control_plane: &str, hostname: &str) -> String {
    format!("{HTTPS_ROUTE}{control_plane}.{hostname}")
}

/// The `@id` of a node's certificate entry for a hostname (`node` is `<control plane>_<node>`).
pub fn cert_entry_id(node: &str, hostname: &str) -> String {
    format!("{CERT_ENTRY}{node}.{hostname}")
}

/// The `@id` of a hostname's certificate policy.
pub fn cert_policy_id(control_plane: &str, hostname: &str) -> String {
    format!("{CERT_POLICY}{control_plane}.{hostname}")
}

/// The `@id` of a control plane's route on the certificates server.
pub fn certs_route_id(control_plane: &str) -> String {
    format!("{CERTS_ROUTE}{control_plane}")
}

/// An automation policy of Caddy's `tls` app: handshakes for `hosts` take the certificate
/// `url` answers (fetched at each handshake, never kept in the configuration). The manager
/// never answers 204 (Caddy's "not mine"), so Caddy never falls back to ordering one itself.
pub fn cert_policy(id: &str, hosts: &[String], url: &str) -> Value {
    json!({"@id": id, "subjects": hosts, "get_certificate": [{"via": "http", "url": url}]})
}

/// The certificates server: `listen` (loopback), a 404 catch-all, nothing automatic.
pub fn certs_server(listen: &str) -> Value {
    json!({
        "listen": [listen],
        "routes": [{"@id": CERTS_FALLBACK, "handle": [{"handler": "static_response", "status_code": 404}]}],
        "automatic_https": {"disable": true},
    })
}

/// A control plane's route on the certificates server: files under `root` for paths under
/// `/<token>/`, to loopback peers only.
pub fn certs_route(id: &str, token: &str, root: &Path) -> Value {
    json!({
        "@id": id,
        "match": [{"path": [format!("/{token}/*")], "remote_ip": {"ranges": ["127.0.0.1/32", "::1/128"]}}],
        "handle": [
            {"handler": "rewrite", "strip_path_prefix": format!("/{token}")},
            {"handler": "file_server", "root": root},
        ],
        "terminal": true,
    })
}

/// `ingress_certs_listen` must be a loopback `ip:port`: the server hands out private keys to
/// whoever knows a control plane's token, so no one off the machine may even reach it.
pub fn check_certs_listen(listen: &str) -> Result<(), String> {
    match listen.parse::<std::net::SocketAddr>() {
        Ok(a) if a.ip().is_loopback() && a.port() != 0 => Ok(()),
        _ => Err(format!(
            "ingress_certs_listen {listen:?} must be a loopback address with a port (127.0.0.1:2021)"
        )),
    }
}

/// A control plane's token for the certificates server: `<dir>/.<control plane>.token`
/// (0600), made once; its nodes on the machine share it (the first one makes it: a link that
/// fails when another node made it first, then every node reads the same file).
pub fn certs_token(dir: &Path, control_plane: &str) -> Result<String, Failure> {
    let disk = |e: std::io::Error| retryable("ingress-write-failed", e.to_string());
    let path = dir.join(format!(".{control_plane}.token"));
    let read = || {
        std::fs::read_to_string(&path)
            .ok()
            .filter(|t| t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    if let Some(t) = read() {
        return Ok(t);
    }
    std::fs::create_dir_all(dir).map_err(disk)?;
    let mut raw = Zeroizing::new([0u8; 32]);
    getrandom::fill(raw.as_mut()).map_err(|e| retryable("ingress-write-failed", e.to_string()))?;
    let token = hex::encode(&raw[..]);
    // A name of this call's own (its token's start): concurrent first publishes each write
    // their own file, and the first link wins.
    let tmp = dir.join(format!(".{control_plane}.token.{}", &token[..16]));
    let _ = std::fs::remove_file(&tmp);
    pushleft_secrets::write_private(&tmp, token.as_bytes()).map_err(disk)?;
    let linked = std::fs::hard_link(&tmp, &path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(token),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            read().ok_or_else(|| retryable("ingress-write-failed", format!("{} is not a token", path.display())))
        }
        Err(e) => Err(disk(e)),
    }
}

/// The plain server's route for an HTTPS hostname: a permanent redirect (308 keeps the method
/// and body) to the same host and path over HTTPS.
pub fn redirect_route(id: &str, hosts: &[String], port: &str) -> Value {
    json!({
        "@id": id,
        "match": [{"host": hosts}],
        "handle": [{
            "handler": "static_response",
            "status_code": 308,
            "headers": {"Location": [format!("https://{{http.request.host}}{port}{{http.request.uri}}")]},
        }],
        "terminal": true,
    })
}

/// The HTTPS server, with its 404 catch-all: certificates chosen by SNI from those loaded
/// (`tls_connection_policies`), Caddy's automatic HTTPS off (it would order certificates for
/// every hostname of every route).
pub fn tls_server(listen: &[String]) -> Value {
    json!({
        "listen": listen,
        "routes": [{"@id": TLS_FALLBACK, "handle": [{"handler": "static_response", "status_code": 404}]}],
        "tls_connection_policies": [{}],
        "automatic_https": {"disable": true},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_cover_one_label() {
        assert!(covers("app.example.com", "APP.example.com"));
        assert!(covers("*.example.com", "app.example.com"));
        assert!(!covers("*.example.com", "example.com"));
        assert!(!covers("*.example.com", "a.b.example.com"));
        assert!(!covers("*.test", "app.test"));
        assert!(!covers("app.example.com", "app.example.com.evil"));
    }

    #[test]
    fn redirects_name_the_port_unless_443() {
        let at = |l: &str| TlsConfig {
            listen: vec![l.to_owned()],
            dir: PathBuf::new(),
            identity: PathBuf::new(),
            certs_listen: "127.0.0.1:2021".into(),
        };
        assert_eq!(at(":443").redirect_port(), "");
        assert_eq!(at("127.0.0.1:8443").redirect_port(), ":8443");
    }

    #[test]
    fn the_certificates_server_listens_on_loopback_only() {
        assert!(check_certs_listen("127.0.0.1:2021").is_ok());
        assert!(check_certs_listen("[::1]:2021").is_ok());
        for bad in [
            "0.0.0.0:2021",
            "10.0.0.1:2021",
            "localhost:2021",
            "127.0.0.1:0",
            ":2021",
        ] {
            assert!(check_certs_listen(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_control_plane_keeps_its_token_and_another_gets_its_own() {
        let dir = tempfile::tempdir().expect("tmp");
        // Eight first callers at once agree on one token.
        let racing: Vec<String> = std::thread::scope(|s| {
            let all: Vec<_> = (0..8)
                .map(|_| s.spawn(|| certs_token(dir.path(), "cp0").expect("token")))
                .collect();
            all.into_iter().map(|t| t.join().expect("thread")).collect()
        });
        assert!(racing.iter().all(|t| t == &racing[0]), "{racing:?}");
        let a = certs_token(dir.path(), "cp_n1").expect("token");
        assert_eq!(a.len(), 64);
        assert_eq!(certs_token(dir.path(), "cp_n1").expect("again"), a);
        assert_ne!(certs_token(dir.path(), "cp_n2").expect("n2"), a);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(".cp_n1.token"))
            .expect("file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn the_certificates_route_answers_only_under_the_token_and_to_loopback() {
        let r = certs_route("pl-certs.cp_n1", "abc", Path::new("/var/lib/pushleft-ingress-tls"));
        assert_eq!(r["match"][0]["path"][0], "/abc/*");
        assert_eq!(r["match"][0]["remote_ip"]["ranges"][0], "127.0.0.1/32");
        assert_eq!(r["handle"][0]["strip_path_prefix"], "/abc");
        let p = cert_policy(
            "pl-certpolicy.cp_n1.shop.test",
            &["shop.test".into()],
            "http://127.0.0.1:2021/abc/x",
        );
        assert!(!p.to_string().contains("PRIVATE"));
        assert_eq!(p["get_certificate"][0]["via"], "http");
    }
}
