//! HTTPS at the ingress: the certificate a lease brings (sealed to this node's age key), opened
//! and checked before anything changes, kept in files only Caddy's user reads, and the parts
//! of Caddy's configuration that serve it.
//!
//! Layout: a second server of ours, `pushleft-tls`, listens on `ingress_tls_listen` and holds
//! each HTTPS hostname's proxy route (`pl-https.<control plane>.<hostname>`, the same upstream
//! slot files as plain HTTP, so a generation switch still reloads nothing). The plain server's
//! route of that hostname then answers a permanent redirect to HTTPS. Certificates are
//! `load_files` entries of Caddy's `tls` app, one per node and hostname
//! (`pl-cert.<control plane>_<node>.<hostname>`), whose files are named by the content's
//! digest: a new certificate is a new path, so Caddy loads it with the configuration change
//! that names it (a changed file under an unchanged path would never be read again).
//!
//! Why files and not `load_pem`: Caddy saves its configuration to disk (`autosave.json`) and
//! answers it to `GET /config/`; a key inside it would be in both. The key file is 0600, owned
//! by the user that owns Caddy's admin socket folder (Caddy's user) when the agent runs as root.

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
/// A node's certificate for a hostname: `pl-cert.<control plane>_<node>.<hostname>`.
pub const CERT_ENTRY: &str = "pl-cert.";
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

/// A `load_files` entry of Caddy's `tls` app.
pub fn cert_entry(id: &str, crt: &Path, key: &Path) -> Value {
    json!({"@id": id, "certificate": crt, "key": key, "tags": [id]})
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
        };
        assert_eq!(at(":443").redirect_port(), "");
        assert_eq!(at("127.0.0.1:8443").redirect_port(), ":8443");
    }
}
