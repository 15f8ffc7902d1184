//! `pl image push IMAGE`: the engine pushes a local image to the control plane's store itself,
//! so only the layers the store lacks are read and sent, compressed as the engine keeps them
//! (no `docker save` of every layer first). Through the `docker` CLI the user already runs, so
//! its context (`DOCKER_HOST`, `docker context`) names the engine; with a configuration folder
//! of its own for the push (0700, removed after), whose only credential is the token for the
//! store's host: nothing is added to the user's credentials and the token is in no argument.

use crate::client::Client;
use anyhow::{Context, Result, anyhow, bail};
use base64::Engine as _;
use registry::oci::Digest;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The user's docker configuration folder, whose contexts the push keeps.
fn docker_config_dir() -> Option<PathBuf> {
    std::env::var_os("DOCKER_CONFIG")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".docker")))
}

/// The store's name for IMAGE: its path without registry host, tag or digest
/// (`registry.invalid/shop/web:1.4` is `shop/web`).
pub(crate) fn default_name(image: &str) -> String {
    let no_digest = image.split('@').next().unwrap_or(image);
    let no_tag = match no_digest.rsplit_once(':') {
        Some((head, tag)) if !tag.contains('/') => head,
        _ => no_digest,
    };
    match no_tag.split_once('/') {
        Some((host, rest)) if host.contains('.') || host.contains(':') || host == "localhost" => rest.to_owned(),
        _ => no_tag.to_owned(),
    }
}

/// The store's registry host as the engine names it (`host:port` of the API's address).
fn registry_host(base: &str) -> Result<String> {
    let host = base
        .strip_prefix("https://")
        .ok_or_else(|| anyhow!("the API's address is not https://"))?;
    Ok(host.split('/').next().unwrap_or(host).to_owned())
}

/// The docker CLI's `config.json`, as far as the push needs it.
#[derive(serde::Serialize)]
struct EngineConfig {
    auths: std::collections::BTreeMap<String, EngineAuth>,
    #[serde(rename = "currentContext", skip_serializing_if = "Option::is_none")]
    current_context: Option<String>,
}

/// `auth`: base64 of `user:password`, the one form every CLI version reads.
#[derive(serde::Serialize)]
struct EngineAuth {
    auth: String,
}

/// What the push keeps of the user's `config.json`: the context that names the engine.
#[derive(serde::Deserialize)]
struct UserConfig {
    #[serde(rename = "currentContext")]
    current_context: Option<String>,
}

/// A folder for the `docker` CLI with the store's credential, the user's contexts, and
/// nothing else.
fn config_folder(host: &str, token: &str) -> Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("pl-image-push-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()?;
    let mut config = EngineConfig {
        auths: std::collections::BTreeMap::from([(
            host.to_owned(),
            EngineAuth {
                auth: base64::engine::general_purpose::STANDARD.encode(format!("pushleft:{token}")),
            },
        )]),
        current_context: None,
    };
    if let Some(user) = docker_config_dir() {
        if user.join("contexts").is_dir() {
            std::os::unix::fs::symlink(user.join("contexts"), dir.path().join("contexts"))?;
        }
        config.current_context = std::fs::read(user.join("config.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<UserConfig>(&b).ok())
            .and_then(|u| u.current_context);
    }
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dir.path().join("config.json"))?;
    f.write_all(serde_json::to_string(&config)?.as_bytes())?;
    Ok(dir)
}

fn docker(config: &Path, args: &[&str]) -> Result<Output> {
    Command::new("docker")
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .map_err(|e| {
            anyhow!(
                "error[image-engine-unavailable]: running `docker`: {e}\n  hint: install the docker CLI, or send an archive: docker save IMAGE | pl image push NAME --input -"
            )
        })
}

fn said(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
    .trim()
    .to_owned()
}

/// Pushes IMAGE from the engine as `name`; the manifest's digest, once the store holds it.
pub(crate) fn push(client: &Client, image: &str, name: &str) -> Result<Digest> {
    let host = registry_host(client.base())?;
    let folder = config_folder(&host, client.token()).context("a configuration folder for the push")?;
    let config = folder.path();
    let inspect = docker(config, &["image", "inspect", "--format", "{{len .RepoTags}}", image])?;
    if !inspect.status.success() {
        bail!(
            "error[image-not-local]: the engine holds no image `{image}`: {}\n  hint: build or pull it first, or name an archive with --input",
            said(&inspect)
        );
    }
    let named = String::from_utf8_lossy(&inspect.stdout).trim() != "0";
    let mut nonce = [0u8; 6];
    getrandom::fill(&mut nonce).map_err(|e| anyhow!("random: {e}"))?;
    let hex: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
    let target = format!("{host}/{name}:pl-push-{hex}");
    let tagged = docker(config, &["tag", image, &target])?;
    if !tagged.status.success() {
        bail!("error[image-engine-push-failed]: docker tag: {}", said(&tagged));
    }
    let pushed = docker(config, &["push", &target]);
    // The push's tag goes again, unless it is the image's only name (removing it would remove
    // the image).
    if named {
        let _ = docker(config, &["image", "rm", &target]);
    }
    let pushed = pushed?;
    let out = said(&pushed);
    if !pushed.status.success() {
        let hint = if out.contains("x509") || out.contains("certificate") {
            format!(
                "the engine does not trust the control plane's certificate: put its CA in /etc/docker/certs.d/{host}/ca.crt, or send an archive: docker save {image} | pl image push {name} --input -"
            )
        } else {
            format!("the engine pushes to {host} itself: it must reach it (or send an archive with --input)")
        };
        bail!("error[image-engine-push-failed]: docker push: {out}\n  hint: {hint}");
    }
    let digest = out
        .split("digest: ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(Digest::parse)
        .ok_or_else(|| anyhow!("error[image-engine-push-failed]: docker push named no digest: {out}"))?;
    // Said only once the store holds it.
    match client.pusher().has_manifest(name, &digest) {
        Ok(true) => Ok(digest),
        Ok(false) => {
            bail!("error[image-engine-push-failed]: the engine pushed {digest}, but the store does not hold it")
        }
        Err(e) => bail!("{e} [{}]", e.code()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_image_path() {
        assert_eq!(default_name("web"), "web");
        assert_eq!(default_name("web:1.4"), "web");
        assert_eq!(default_name("shop/web:1.4"), "shop/web");
        assert_eq!(default_name("registry.invalid/shop/web:1.4"), "shop/web");
        assert_eq!(default_name("localhost:5000/web@sha256:abc"), "web");
        assert_eq!(default_name("127.0.0.1:5000/shop/web"), "shop/web");
        assert!(registry::oci::valid_name(&default_name("registry.invalid:443/a/b:c")));
    }

    #[test]
    fn the_engine_pushes_to_the_apis_host() {
        assert_eq!(
            registry_host("https://cp.invalid:8443").expect("host"),
            "cp.invalid:8443"
        );
        assert!(registry_host("http://cp.invalid").is_err());
    }

    #[test]
    fn the_push_folder_holds_only_the_stores_credential() {
        let dir = config_folder("cp.invalid:8443", "secret-token").expect("folder");
        let text = std::fs::read_to_string(dir.path().join("config.json")).expect("config");
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        let auths = v["auths"].as_object().expect("auths");
        assert_eq!(auths.len(), 1);
        let auth = auths["cp.invalid:8443"]["auth"].as_str().expect("auth");
        let decoded = base64::engine::general_purpose::STANDARD.decode(auth).expect("base64");
        assert_eq!(decoded, b"pushleft:secret-token");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("config.json"))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let dmode = std::fs::metadata(dir.path()).expect("meta").permissions().mode();
        assert_eq!(dmode & 0o077, 0, "only its owner reads the folder");
    }
}
