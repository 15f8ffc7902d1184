//! `pl-agent build`, for `pl up --build PROJECT=DIR`: builds DIR's Dockerfile through the
//! Docker engine API, exports it as `docker save` would, and pushes it to the local control
//! plane's image store (`registry::archive`, only the blobs it lacks), so the run pins it by
//! digest like any pushed image and the agent pulls it through its loopback endpoint (the
//! engine has every layer already). The agent owns the engine: `pl` links no Docker client
//! and runs this instead.
//!
//! The context is DIR as a tar stream, less what its `.dockerignore` excludes (patterns
//! relative to DIR, `**` for any folders, `!` for an exception, the last match deciding, a
//! matched folder taking its contents), bounded by [`MAX_CONTEXT_BYTES`].

use bollard::Docker;
use futures_util::StreamExt;
use std::path::{Path, PathBuf};

/// The largest build context sent to the engine.
pub const MAX_CONTEXT_BYTES: u64 = 512 * 1024 * 1024;
/// How many lines of the build's output a failure carries (the failing step's).
const TAIL_LINES: usize = 30;

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("[build-context-unreadable] {path}: {source}")]
    Context { path: PathBuf, source: std::io::Error },
    #[error("[build-no-dockerfile] {0} has no Dockerfile")]
    NoDockerfile(PathBuf),
    #[error(
        "[build-context-too-large] the build context {0} is over {MAX_CONTEXT_BYTES} bytes: exclude what the image does not need in its .dockerignore"
    )]
    TooLarge(PathBuf),
    #[error("[build-dockerignore-invalid] {0}")]
    Ignore(String),
    #[error("[docker-unavailable] {0}")]
    Docker(bollard::errors::Error),
    #[error("[node-disk-full] the node's disk is full (free space where the engine keeps images): {0}")]
    DiskFull(bollard::errors::Error),
    #[error("[build-failed] {message}\n{output}")]
    Failed { message: String, output: String },
    #[error("[build-push-failed] pushing {reference}: {message}")]
    Push { reference: String, message: String },
    #[error("[build-store-invalid] {0}")]
    Store(String),
    #[error("[build-export-failed] exporting {reference}: {source}")]
    Export { reference: String, source: std::io::Error },
}

impl From<bollard::errors::Error> for BuildError {
    fn from(e: bollard::errors::Error) -> Self {
        if crate::docker::disk_full(&e) {
            BuildError::DiskFull(e)
        } else {
            BuildError::Docker(e)
        }
    }
}

/// `.dockerignore`'s rules: `(pattern, exception)` in file order.
struct Ignore(Vec<(globset::GlobMatcher, bool)>);

impl Ignore {
    fn read(dir: &Path) -> Result<Ignore, BuildError> {
        let text = match std::fs::read_to_string(dir.join(".dockerignore")) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(source) => {
                return Err(BuildError::Context {
                    path: dir.join(".dockerignore"),
                    source,
                });
            }
        };
        let mut rules = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (exception, pattern) = match line.strip_prefix('!') {
                Some(p) => (true, p.trim()),
                None => (false, line),
            };
            let pattern = pattern.trim_start_matches('/').trim_end_matches('/');
            let glob = globset::GlobBuilder::new(pattern)
                .literal_separator(true)
                .build()
                .map_err(|e| BuildError::Ignore(format!(".dockerignore:{}: {e}", n + 1)))?;
            rules.push((glob.compile_matcher(), exception));
        }
        Ok(Ignore(rules))
    }

    /// Whether `rel` (a `/`-separated path in the context) is left out: the last rule that
    /// matches it or one of its folders decides.
    fn excludes(&self, rel: &str) -> bool {
        let mut excluded = false;
        for (glob, exception) in &self.0 {
            let mut prefix = String::new();
            let mut hit = false;
            for part in rel.split('/') {
                if !prefix.is_empty() {
                    prefix.push('/');
                }
                prefix.push_str(part);
                if glob.is_match(&prefix) {
                    hit = true;
                    break;
                }
            }
            if hit {
                excluded = !exception;
            }
        }
        excluded
    }
}

/// DIR as the tar the engine builds from. The Dockerfile and `.dockerignore` always go.
pub fn context(dir: &Path) -> Result<Vec<u8>, BuildError> {
    if !dir.join("Dockerfile").is_file() {
        return Err(BuildError::NoDockerfile(dir.to_owned()));
    }
    let ignore = Ignore::read(dir)?;
    let mut tar = tar::Builder::new(Vec::new());
    tar.follow_symlinks(false);
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| BuildError::Context { path, source }
    };
    let mut pending = vec![PathBuf::new()];
    let mut total: u64 = 0;
    while let Some(rel) = pending.pop() {
        let here = dir.join(&rel);
        let mut entries: Vec<_> = std::fs::read_dir(&here)
            .map_err(io(&here))?
            .collect::<Result<_, _>>()
            .map_err(io(&here))?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let name = rel.join(entry.file_name());
            let text = name.to_string_lossy().into_owned();
            let always = text == "Dockerfile" || text == ".dockerignore";
            if !always && ignore.excludes(&text) {
                continue;
            }
            let path = entry.path();
            let kind = entry.file_type().map_err(io(&path))?;
            if kind.is_file() {
                total += entry.metadata().map_err(io(&path))?.len();
                if total > MAX_CONTEXT_BYTES {
                    return Err(BuildError::TooLarge(dir.to_owned()));
                }
            }
            tar.append_path_with_name(&path, &name).map_err(io(&path))?;
            if kind.is_dir() {
                pending.push(name);
            }
        }
    }
    tar.into_inner().map_err(io(dir))
}

/// A client of the image store at `store` (a control plane's operator API on loopback: an
/// image built here never leaves the machine), trusting `ca_cert`, with the operator token in
/// `token_file`.
pub fn store_pusher(store: &str, ca_cert: &Path, token_file: &Path) -> Result<registry::push::Pusher, BuildError> {
    let host = store.strip_prefix("https://").unwrap_or_default();
    let host = host.split('/').next().unwrap_or_default();
    if !(host.starts_with("127.") || host.starts_with("localhost:") || host.starts_with("[::1]:")) {
        return Err(BuildError::Store(format!(
            "--store {store} is not https:// on loopback"
        )));
    }
    let read = |p: &Path| std::fs::read(p).map_err(|e| BuildError::Store(format!("{}: {e}", p.display())));
    pushleft_secrets::check_private_file(token_file)
        .map_err(|m| BuildError::Store(format!("{}: {m}", token_file.display())))?;
    let token = zeroize::Zeroizing::new(read(token_file)?);
    let token = std::str::from_utf8(&token)
        .map_err(|_| BuildError::Store(format!("{}: not text", token_file.display())))?
        .trim();
    let pem = read(ca_cert)?;
    let ca = ureq::tls::Certificate::from_pem(&pem)
        .map_err(|e| BuildError::Store(format!("{}: {e}", ca_cert.display())))?
        .to_owned();
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::Specific(std::sync::Arc::new(vec![ca])))
        .build();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .tls_config(tls)
        .http_status_as_error(false)
        .build()
        .into();
    Ok(registry::push::Pusher::new(agent, store, token))
}

/// Builds `dir` as `pl-build/NAME:latest` on the engine at `socket`, pushes it to the store
/// `pusher` speaks to as NAME, and returns its reference there
/// (`pushleft.invalid/NAME@sha256:…`). The build's output goes to `progress` as it comes.
pub async fn build_and_push(
    socket: &Path,
    dir: &Path,
    name: &str,
    pusher: registry::push::Pusher,
    progress: impl FnMut(&str),
) -> Result<String, BuildError> {
    let docker = Docker::connect_with_unix(&socket.to_string_lossy(), 600, bollard::API_DEFAULT_VERSION)?;
    let tag = format!("pl-build/{name}:latest");
    build(&docker, dir, &tag, progress).await?;
    let export = |source| BuildError::Export {
        reference: tag.clone(),
        source,
    };
    // The engine's export, spooled: the push reads it as a file (the store is asked for each
    // blob before it is sent, so an unchanged layer costs a hash, not a transfer).
    let mut file = tempfile::tempfile().map_err(export)?;
    let mut stream = docker.export_image(&tag);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        std::io::Write::write_all(&mut file, &chunk).map_err(export)?;
    }
    std::io::Seek::rewind(&mut file).map_err(export)?;
    let name = name.to_owned();
    let pushed =
        tokio::task::spawn_blocking(move || registry::archive::push_archive(&pusher, &name, file).map(|p| (name, p)))
            .await
            .map_err(|e| BuildError::Push {
                reference: tag.clone(),
                message: e.to_string(),
            })?;
    let (name, pushed) = pushed.map_err(|e| BuildError::Push {
        reference: tag.clone(),
        message: format!("{e} [{}]", e.code()),
    })?;
    let digest = pushed.digest.ok_or_else(|| BuildError::Push {
        reference: tag.clone(),
        message: "the push named no manifest".into(),
    })?;
    Ok(format!("{}/{name}@{digest}", agent_proto::images::STORE_HOST))
}

/// Builds `dir` as `tag`, the output to `progress`; a failure carries its step's output.
async fn build(docker: &Docker, dir: &Path, tag: &str, mut progress: impl FnMut(&str)) -> Result<(), BuildError> {
    use bollard::query_parameters::BuildImageOptionsBuilder;
    let tar = context(dir)?;
    let options = BuildImageOptionsBuilder::default()
        .dockerfile("Dockerfile")
        .t(tag)
        .rm(true)
        .forcerm(true)
        .build();
    let mut output: std::collections::VecDeque<String> = std::collections::VecDeque::new();
    let keep = |line: &str, output: &mut std::collections::VecDeque<String>| {
        // A new step starts a new tail: a failure shows its own step's output.
        if line.starts_with("Step ") {
            output.clear();
        }
        output.push_back(line.to_owned());
        if output.len() > TAIL_LINES {
            output.pop_front();
        }
    };
    let mut stream = docker.build_image(options, None, Some(bollard::body_full(tar.into())));
    while let Some(item) = stream.next().await {
        let info = match item {
            Ok(info) => info,
            Err(bollard::errors::Error::DockerStreamError { error }) => {
                return Err(BuildError::Failed {
                    message: error,
                    output: Vec::from(output).join("\n"),
                });
            }
            Err(e) => return Err(e.into()),
        };
        if let Some(text) = &info.stream {
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                progress(line);
                keep(line, &mut output);
            }
        }
        if let Some(detail) = info.error_detail {
            return Err(BuildError::Failed {
                message: detail.message.unwrap_or_default(),
                output: Vec::from(output).join("\n"),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ignore(text: &str) -> Ignore {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(".dockerignore"), text).expect("write");
        Ignore::read(dir.path()).expect("valid")
    }

    /// The engine's answer when its disk is full, as the CI host's dockerd gave it.
    fn engine_error(message: &str) -> bollard::errors::Error {
        bollard::errors::Error::DockerResponseServerError {
            status_code: 500,
            message: message.to_owned(),
        }
    }

    #[test]
    fn a_full_disk_is_named_as_such_and_other_engine_errors_are_not() {
        let full = engine_error(
            "Error processing tar file(exit status 1): write /rootfs/lib/libkrb5.so.3: no space left on device",
        );
        let got = BuildError::from(full).to_string();
        assert!(got.starts_with("[node-disk-full] "), "{got}");
        let other = BuildError::from(engine_error("Error processing tar file: unexpected EOF"));
        assert!(other.to_string().starts_with("[docker-unavailable] "), "{other}");
        // The task path (a container, a pull, a network) names it the same way.
        let failure = crate::docker::failure_of(engine_error("mkdir /var/lib/docker/x: no space left on device"));
        assert_eq!(failure.code, "node-disk-full");
        let failure = crate::docker::failure_of(engine_error("conflict"));
        assert_eq!(failure.code, "docker-unavailable");
    }

    #[test]
    fn dockerignore_rules_decide_by_the_last_match_and_take_folders_whole() {
        let i = ignore("# comment\n*.log\nnode_modules\n/target/\n**/secret.txt\n!keep.log\n");
        assert!(i.excludes("debug.log"));
        assert!(!i.excludes("keep.log"), "an exception after the rule");
        assert!(!i.excludes("logs/debug.log"), "`*` stays within a folder");
        assert!(i.excludes("node_modules/x/y.js"), "a folder's contents");
        assert!(i.excludes("target/debug/pl"));
        assert!(i.excludes("a/b/secret.txt"));
        assert!(!i.excludes("src/main.rs"));
    }

    #[test]
    fn the_context_leaves_out_what_dockerignore_excludes_and_keeps_the_dockerfile() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("Dockerfile"), "FROM scratch\n").expect("write");
        std::fs::write(dir.path().join(".dockerignore"), "Dockerfile\n*.tmp\n").expect("write");
        std::fs::create_dir(dir.path().join("www")).expect("mkdir");
        std::fs::write(dir.path().join("www/index.html"), "hi").expect("write");
        std::fs::write(dir.path().join("scratch.tmp"), "x").expect("write");
        let tar = context(dir.path()).expect("context");
        let mut archive = tar::Archive::new(tar.as_slice());
        let mut names: Vec<String> = archive
            .entries()
            .expect("entries")
            .map(|e| e.expect("entry").path().expect("path").to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, [".dockerignore", "Dockerfile", "www", "www/index.html"]);
    }

    #[test]
    fn a_folder_without_a_dockerfile_is_refused_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = context(dir.path()).expect_err("no Dockerfile");
        assert!(e.to_string().starts_with("[build-no-dockerfile]"), "{e}");
    }
}
