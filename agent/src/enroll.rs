//! `pl-agent enroll`: the node makes its own TLS key and age identity (files 0600 in a 0700
//! folder; neither ever leaves the node), asks the control plane for a client certificate with
//! the one-time token an operator gave it (read from standard input, never an argument), and
//! trusts the control plane only through the CA fingerprint it was given.

use agent_proto::{EnrollRequest, EnrollResponse, RefusalBody};
use anyhow::{Context, Result, anyhow, bail};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use zeroize::Zeroizing;

pub use crate::folder::{AGE, CA, CERT, CONTROL_PLANE, KEY};

/// `SHA256:<64 hex>` (colons allowed, any case) as 32 bytes of hex, lowercase.
pub fn parse_fingerprint(s: &str) -> Result<String> {
    let hex: String = s
        .trim()
        .strip_prefix("SHA256:")
        .or_else(|| s.trim().strip_prefix("sha256:"))
        .ok_or_else(|| anyhow!("--ca-fingerprint is SHA256:<64 hex digits>"))?
        .chars()
        .filter(|c| *c != ':')
        .collect::<String>()
        .to_ascii_lowercase();
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("--ca-fingerprint is SHA256:<64 hex digits>");
    }
    Ok(hex)
}

/// The DER of every certificate in a PEM bundle.
fn ders_of(pem: &str) -> Result<Vec<Vec<u8>>> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let ders: Vec<Vec<u8>> = CertificateDer::pem_slice_iter(pem.as_bytes())
        .map(|c| c.map(|c| c.to_vec()))
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow!("the CA is not a PEM certificate: {e}"))?;
    if ders.is_empty() {
        bail!("the control plane sent no CA certificate");
    }
    Ok(ders)
}

fn agent(tls: ureq::tls::TlsConfig) -> ureq::Agent {
    ureq::Agent::config_builder()
        .tls_config(tls)
        .http_status_as_error(false)
        .timeout_global(Some(std::time::Duration::from_secs(30)))
        .build()
        .into()
}

/// The control CA, fetched without trusting the connection and accepted only when its
/// fingerprint is the pinned one.
fn pinned_ca(control: &str, fingerprint: &str) -> Result<String> {
    let blind = agent(ureq::tls::TlsConfig::builder().disable_verification(true).build());
    let mut resp = blind
        .get(&format!("{control}/v1/ca"))
        .call()
        .map_err(|e| anyhow!("reaching {control}: {e}"))?;
    if resp.status() != 200 {
        bail!("{control}/v1/ca answered {}", resp.status());
    }
    let pem = resp
        .body_mut()
        .with_config()
        .limit(64 * 1024)
        .read_to_string()
        .map_err(|e| anyhow!("reading the CA: {e}"))?;
    // During a CA rotation the bundle holds the new CA and the old one: the pin may name
    // either, and the whole bundle is trusted once one of them matches.
    let got: Vec<String> = ders_of(&pem)?
        .iter()
        .map(|der| agent_proto::cert_fingerprint(der))
        .collect();
    if !got.iter().any(|g| g == fingerprint) {
        bail!(
            "the control plane's CA is SHA256:{}, not the one given: refusing to enrol [ca-fingerprint-mismatch]",
            got.join(", SHA256:")
        );
    }
    Ok(pem)
}

fn private_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        let mode = std::fs::metadata(dir)?.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            bail!(
                "{} is readable by others (mode {mode:04o}); use a 0700 folder",
                dir.display()
            );
        }
        for f in [KEY, CERT, AGE] {
            if dir.join(f).exists() {
                bail!(
                    "{} exists: this node is enrolled already; enrolment never overwrites keys",
                    dir.join(f).display()
                );
            }
        }
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    pushleft_secrets::write_private(path, bytes).with_context(|| format!("creating {}", path.display()))
}

/// A new key and a signing request naming `node`, for enrolment and renewal.
pub fn signing_request(node: &str) -> Result<(rcgen::KeyPair, String)> {
    let key = rcgen::KeyPair::generate().context("making the node's key")?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(rcgen::DnType::CommonName, node);
    let csr = params.serialize_request(&key)?.pem()?;
    Ok((key, csr))
}

/// Enrols `node` with `control`. Returns the answer (certificate, CA, expiry).
pub fn enroll(control: &str, fingerprint: &str, node: &str, dir: &Path, token: &str) -> Result<EnrollResponse> {
    let control = control.trim_end_matches('/');
    if !control.starts_with("https://") {
        bail!("--control must be an https:// URL");
    }
    let fingerprint = parse_fingerprint(fingerprint)?;
    let ca_pem = pinned_ca(control, &fingerprint)?;
    private_dir(dir)?;
    let (key, csr) = signing_request(node)?;
    let identity = age::x25519::Identity::generate();
    let recipient = identity.to_public().to_string();
    let request = EnrollRequest {
        node: node.to_owned(),
        token: token.to_owned(),
        csr,
        age_recipient: recipient,
    };
    let cas = crate::client::ca_bundle(ca_pem.as_bytes()).map_err(|e| anyhow!("the CA: {e}"))?;
    let trusted = agent(
        ureq::tls::TlsConfig::builder()
            .root_certs(ureq::tls::RootCerts::Specific(Arc::new(cas)))
            .build(),
    );
    let mut resp = trusted
        .post(&format!("{control}/v1/enroll"))
        .send_json(&request)
        .map_err(|e| anyhow!("enrolling: {e}"))?;
    let status = resp.status().as_u16();
    let body = resp
        .body_mut()
        .with_config()
        .limit(256 * 1024)
        .read_to_string()
        .map_err(|e| anyhow!("reading the answer: {e}"))?;
    if status != 200 {
        let refusal: RefusalBody =
            serde_json::from_str(&body).map_err(|_| anyhow!("enrolment refused with HTTP {status}"))?;
        bail!("{} [{}]", refusal.message, refusal.code.code());
    }
    let answer: EnrollResponse = serde_json::from_str(&body).context("the enrolment answer")?;
    anyhow::ensure!(
        agent_proto::valid_control_plane(&answer.control_plane),
        "the control plane gave no id of its own (it is older than this agent): upgrade it first"
    );
    // Only now, with a certificate in hand, are the keys written: a refusal leaves nothing.
    write_private(&dir.join(KEY), key.serialize_pem().as_bytes())?;
    let secret = Zeroizing::new(age::secrecy::ExposeSecret::expose_secret(&identity.to_string()).to_owned());
    write_private(&dir.join(AGE), format!("{}\n", secret.as_str()).as_bytes())?;
    write_private(&dir.join(CERT), answer.certificate.as_bytes())?;
    write_private(&dir.join(CA), ca_pem.as_bytes())?;
    write_private(
        &dir.join(CONTROL_PLANE),
        format!("{}\n", answer.control_plane).as_bytes(),
    )?;
    Ok(answer)
}

/// The control plane this enrolment folder belongs to (written at enrolment from its answer).
pub fn control_plane_of(dir: &Path) -> Result<String> {
    let path = dir.join(CONTROL_PLANE);
    let id = std::fs::read_to_string(&path)
        .with_context(|| {
            format!(
                "reading {} (an enrolment older than control plane ids: enrol this node again with pl-agent enroll)",
                path.display()
            )
        })?
        .trim()
        .to_owned();
    anyhow::ensure!(
        agent_proto::valid_control_plane(&id),
        "{} holds {id:?}, not a control plane id",
        path.display()
    );
    Ok(id)
}

/// The node this enrolment folder is: its certificate's common name (the control plane signed
/// it for that name only).
pub fn node_of(dir: &Path) -> Result<String> {
    let pem =
        std::fs::read_to_string(dir.join(CERT)).with_context(|| format!("reading {}", dir.join(CERT).display()))?;
    let (_, block) =
        x509_parser::pem::parse_x509_pem(pem.as_bytes()).map_err(|e| anyhow!("the node's certificate: {e}"))?;
    let cert = block.parse_x509().map_err(|e| anyhow!("the node's certificate: {e}"))?;
    let name = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .ok_or_else(|| anyhow!("the node's certificate names no node"))?
        .to_owned();
    anyhow::ensure!(
        !name.is_empty()
            && name.len() <= 63
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
        "the node's certificate names {name:?}, not a node name"
    );
    Ok(name)
}

/// This machine's id (`/etc/machine-id`, or D-Bus's copy), which heartbeats carry so that nodes
/// sharing a machine get subnets that do not overlap; `None` when there is none.
pub fn machine_id() -> Option<String> {
    ["/etc/machine-id", "/var/lib/dbus/machine-id"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|t| t.trim().to_owned())
        .find(|t| agent_proto::valid_host(t))
}
