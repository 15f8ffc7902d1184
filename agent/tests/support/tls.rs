//! HTTPS and plain requests to the ingress on loopback, for the agent's TLS tests (a file of its
//! own: `pl`'s tests share `mod.rs` and do not link rustls).
#![allow(dead_code)]

/// One HTTPS request to `host` at 127.0.0.1:`port` (SNI `host`), trusting `ca` alone: the
/// status, the response head and the leaf certificate the server showed.
pub fn get_tls(port: u16, host: &str, ca: &str) -> Result<(u16, String, Vec<u8>), String> {
    get_tls_at([127, 0, 0, 1], port, host, ca)
}

/// [`get_tls`] to another loopback address.
pub fn get_tls_at(ip: [u8; 4], port: u16, host: &str, ca: &str) -> Result<(u16, String, Vec<u8>), String> {
    get_tls_path(ip, port, host, "/", ca)
}

/// [`get_tls_at`] of `path`.
pub fn get_tls_path(
    ip: [u8; 4],
    port: u16,
    host: &str,
    path: &str,
    ca: &str,
) -> Result<(u16, String, Vec<u8>), String> {
    use rustls::pki_types::pem::PemObject;
    use std::io::{Read, Write};
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(c.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    }
    let config =
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|e| e.to_string())?;
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).map_err(|e| e.to_string())?;
    let tcp = std::net::TcpStream::connect((std::net::Ipv4Addr::from(ip), port)).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    tls.write_all(format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut text = Vec::new();
    let _ = (&mut tls).take(1 << 20).read_to_end(&mut text);
    let leaf = tls
        .conn
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&text).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in {text:?}"))?;
    Ok((status, text, leaf))
}

/// The head of a plain HTTP answer for `host` (a redirect's `Location` is in it).
pub fn head_plain(port: u16, host: &str) -> String {
    head_plain_result(port, host).expect("connect")
}

/// [`head_plain`], or why nothing answered.
pub fn head_plain_result(port: u16, host: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    s.write_all(format!("GET /path?q=1 HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes())?;
    let mut text = String::new();
    let _ = s.take(1 << 16).read_to_string(&mut text);
    Ok(text)
}

/// A CA and a certificate it signs for `names`: (CA PEM, leaf chain PEM, key PEM).
pub fn certificate(names: &[&str]) -> (String, String, String) {
    let ca_key = rcgen::KeyPair::generate().expect("ca key");
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).expect("ca");
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().expect("key");
    let leaf = rcgen::CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
        .expect("params")
        .signed_by(&key, &issuer)
        .expect("leaf");
    (ca_cert.pem(), leaf.pem(), key.serialize_pem())
}
