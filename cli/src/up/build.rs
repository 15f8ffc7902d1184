//! `pl up --build PROJECT=DIR`: DIR's Dockerfile is built through the Docker engine API (by
//! `pl-agent build`: the agent owns the engine, `pl` links no Docker client), pushed to the
//! local control plane's own image store (the path `pl image push` takes; no registry), and
//! the local revision runs that image pinned by its digest. Only the mirror's copy of the state
//! says so: the user's Git files are never written.

use super::processes::tool;
use anyhow::{Context, Result, anyhow, bail};
use state_schema::model::{Kind, Spec};
use state_schema::state::State;
use state_schema::values::ImageRef;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// One `--build PROJECT=DIR`.
#[derive(Clone, Debug)]
pub struct Build {
    pub project: String,
    pub dir: PathBuf,
}

impl std::str::FromStr for Build {
    type Err = String;
    fn from_str(s: &str) -> Result<Build, String> {
        let (project, dir) = s.split_once('=').ok_or_else(|| format!("`{s}` is not PROJECT=DIR"))?;
        if project.is_empty() || dir.is_empty() {
            return Err(format!("`{s}` is not PROJECT=DIR"));
        }
        Ok(Build {
            project: project.to_owned(),
            dir: PathBuf::from(dir),
        })
    }
}

/// The builds this state folder remembers (`builds.json`, project → absolute folder), from the
/// last `pl up --build` that built them: a later `pl up` builds them again unless told
/// `--no-build`, rather than roll out the placeholder image the files name.
pub fn remembered(state: &Path) -> Vec<Build> {
    let Ok(bytes) = std::fs::read(state.join("builds.json")) else {
        return Vec::new();
    };
    serde_json::from_slice::<std::collections::BTreeMap<String, PathBuf>>(&bytes)
        .unwrap_or_default()
        .into_iter()
        .map(|(project, dir)| Build { project, dir })
        .collect()
}

/// Records `builds` as the state folder's (none: forgets every build).
pub fn remember(state: &Path, builds: &[Build]) -> Result<()> {
    let path = state.join("builds.json");
    if builds.is_empty() {
        return match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        };
    }
    let map: std::collections::BTreeMap<&str, &Path> =
        builds.iter().map(|b| (b.project.as_str(), b.dir.as_path())).collect();
    std::fs::write(&path, serde_json::to_vec_pretty(&map)?)?;
    Ok(())
}

/// What this run builds: `--build`s given now (folders made absolute), and, unless
/// `no_build`, the remembered ones for projects the state still declares and not given now.
pub fn to_build(state_dir: &Path, given: &[Build], no_build: bool, state: &State) -> Result<Vec<Build>> {
    let mut out: Vec<Build> = Vec::new();
    for b in given {
        let dir = std::fs::canonicalize(&b.dir).unwrap_or_else(|_| b.dir.clone());
        out.push(Build {
            project: b.project.clone(),
            dir,
        });
    }
    if no_build {
        return Ok(out);
    }
    for b in remembered(state_dir) {
        if out.iter().any(|g| g.project == b.project) || state.project(&b.project).is_none() {
            continue;
        }
        println!(
            "pl up: building {} from {} again, as an earlier `pl up --build` asked (`pl up --no-build` forgets it)",
            b.project,
            b.dir.display()
        );
        out.push(b);
    }
    Ok(out)
}

/// Refuses, before anything starts, an image no node could ever pull: a registry under
/// `.invalid` (the examples' placeholders, a name that never resolves) that no `--build`
/// replaces. Nothing would be asked of a resolver. `signed`: the state is a signed commit's,
/// applied as it is (`--allowed-signers`), where `--build` does not apply: the fix named is one
/// that works there (a pinned image a node can pull, in a signed commit), never `--build`.
pub fn check_pullable(builds: &[Build], state: &State, signed: bool) -> Result<()> {
    // The control plane's own store is under `.invalid` too, and its agents pull from it.
    let placeholder = |image: &str| {
        agent_proto::images::in_store(image).is_none()
            && image
                .split_once('/')
                .map(|(host, _)| host.split(':').next().unwrap_or(host))
                .is_some_and(|h| h == "invalid" || h.ends_with(".invalid"))
    };
    for l in state.of_kind(Kind::Project).chain(state.of_kind(Kind::Environment)) {
        let (project, image) = match &l.object.spec {
            Spec::Project(p) => (l.object.name().to_string(), p.image.as_str().to_owned()),
            Spec::Environment(e) => match &e.image {
                Some(i) => (e.project.to_string(), i.as_str().to_owned()),
                None => continue,
            },
            _ => continue,
        };
        if placeholder(&image) && signed {
            bail!(
                "{}: {} runs {image}, a placeholder whose registry never resolves. A signed commit is applied as it is (`--build` does not rewrite it): pin an image a node can pull, from a registry it resolves, in that file, and sign the commit; or, to try a local Dockerfile, apply the working tree without `--allowed-signers` (`pl up --build {project}=DIR`, after `pl down`)",
                l.file,
                l.object.name()
            );
        }
        if placeholder(&image) && !builds.iter().any(|b| b.project == project) {
            bail!(
                "{}: {} runs {image}, a placeholder whose registry never resolves: build it here with `pl up --build {project}=DIR` (a folder with its Dockerfile), or name an image a node can pull",
                l.file,
                l.object.name()
            );
        }
    }
    Ok(())
}

/// Refuses, before anything starts, a build of a project the state does not declare or a
/// folder with no Dockerfile.
pub fn check(builds: &[Build], state: &State) -> Result<()> {
    for b in builds {
        if state.project(&b.project).is_none() {
            bail!(
                "--build {}: the state declares no Project `{}`",
                b.dir.display(),
                b.project
            );
        }
        if !b.dir.join("Dockerfile").is_file() {
            bail!(
                "--build {}={}: no Dockerfile in {}",
                b.project,
                b.dir.display(),
                b.dir.display()
            );
        }
    }
    Ok(())
}

/// Builds each project's image and pushes it to the local control plane's store (`server`);
/// `(project, reference by digest)`. The build's output is shown as it comes (`PROJECT |
/// line`); a failed build ends with its failing step's output.
pub fn build_all(
    builds: &[Build],
    server: &crate::client::ServerArgs,
    socket: &Path,
) -> Result<Vec<(String, ImageRef)>> {
    let (Some(store), Some(ca), Some(token)) = (&server.server, &server.ca_cert, &server.token_file) else {
        bail!("the local control plane's address, CA and token are not known");
    };
    let mut built = Vec::new();
    for b in builds {
        println!("pl up: building {} from {}", b.project, b.dir.display());
        let mut child = Command::new(tool("pl-agent")?)
            .arg("build")
            .arg("--docker-socket")
            .arg(socket)
            .arg("--context")
            .arg(&b.dir)
            .args(["--store", store.as_str()])
            .arg("--ca-cert")
            .arg(ca)
            .arg("--token-file")
            .arg(token)
            .args(["--name", &format!("pl-build/{}", b.project)])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting pl-agent build")?;
        let stderr = child.stderr.take().context("the build's output")?;
        let mut said = Vec::new();
        for line in std::io::BufReader::new(stderr).lines() {
            let line = line.unwrap_or_default();
            println!("{} | {line}", b.project);
            said.push(line);
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            let last = said.iter().rev().find(|l| l.starts_with("pl-agent: ")).cloned();
            bail!(
                "building {} from {} failed: {}",
                b.project,
                b.dir.display(),
                last.as_deref()
                    .map(|l| l.trim_start_matches("pl-agent: "))
                    .unwrap_or("see the output above")
            );
        }
        let reference = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let image = ImageRef::new(&reference).map_err(|e| anyhow!("pl-agent build printed `{reference}`: {e:?}"))?;
        println!("pl up: built {} as {reference}", b.project);
        built.push((b.project.clone(), image));
    }
    Ok(built)
}

/// The files to commit in place of the user's so that each built project (and any of its
/// Environments that names an image of its own) runs the built image: `(file, new text)`.
/// `text_of` reads a file of the state being applied.
pub fn overrides(
    state: &State,
    built: &[(String, ImageRef)],
    text_of: impl Fn(&str) -> Result<String>,
) -> Result<Vec<(String, String)>> {
    // Every image to point at the built one, by file: the `image` scalar alone is replaced,
    // the rest of the file stays as written, so what the daemon judges is the user's file
    // (its lines, its defaults left unwritten, every field it has: a rewrite through the
    // canonical form once dropped `rollout.strategy` and wrote `watchSeconds: 0`, and the
    // daemon rejected what `pl validate` accepted, at lines the user's file did not have).
    let mut edits: std::collections::BTreeMap<String, Vec<(state_schema::diag::Pos, String)>> = Default::default();
    for (project, image) in built {
        let hits = state
            .of_kind(Kind::Project)
            .chain(state.of_kind(Kind::Environment))
            .filter(|l| match &l.object.spec {
                Spec::Project(_) => l.object.metadata.name.as_str() == project,
                Spec::Environment(e) => e.project.as_str() == project && e.image.is_some(),
                _ => false,
            });
        for located in hits {
            let pos = located
                .positions
                .iter()
                .find(|(p, _)| p == "spec.image")
                .map(|(_, pos)| *pos)
                .ok_or_else(|| {
                    anyhow!(
                        "{}:{}: no `image` to point at the built image",
                        located.file,
                        located.pos.line
                    )
                })?;
            edits
                .entry(located.file.clone())
                .or_default()
                .push((pos, image.as_str().to_owned()));
        }
    }
    let mut files = Vec::new();
    for (file, mut images) in edits {
        // Last first: an earlier scalar's place stays put.
        images.sort_by_key(|(pos, _)| std::cmp::Reverse((pos.line, pos.column)));
        let mut text = text_of(&file)?;
        for (pos, image) in images {
            text = state_schema::edit::replace_scalar(&text, pos, &image).ok_or_else(|| {
                anyhow!(
                    "{file}:{}:{}: the image to point at the built one moved",
                    pos.line,
                    pos.column
                )
            })?;
        }
        files.push((file, text));
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use state_schema::parse::parse_file;

    /// An image of the control plane's own store is pulled by the agents: not a placeholder,
    /// though its name is under `.invalid` too.
    #[test]
    fn an_image_of_the_store_is_not_a_placeholder() {
        let project = format!(
            "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {{name: api}}\nspec:\n  image: pushleft.invalid/api@sha256:{}\n  roles:\n    web: {{kind: web, port: 8080}}\n---\napiVersion: pushleft.dev/v1alpha1\nkind: Environment\nmetadata: {{name: api-production}}\nspec: {{project: api, stage: production, pool: main}}\n",
            "1".repeat(64)
        );
        let state = state_with(&project);
        super::check_pullable(&[], &state, true).expect("pulled from the store");
        super::check_pullable(&[], &state, false).expect("pulled from the store");
    }

    /// With `--allowed-signers` the fix named is never `--build` (which that mode refuses).
    #[test]
    fn a_signed_placeholder_names_a_fix_that_works_with_signatures() {
        let project = "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata: {name: api}\nspec:\n  image: registry.example.invalid/api@sha256:0000000000000000000000000000000000000000000000000000000000000000\n  roles:\n    web: {kind: web, port: 8080}\n---\napiVersion: pushleft.dev/v1alpha1\nkind: Environment\nmetadata: {name: api-production}\nspec: {project: api, stage: production, pool: main}\n";
        let state = state_with(project);
        let signed = super::check_pullable(&[], &state, true)
            .expect_err("placeholder")
            .to_string();
        assert!(
            signed.contains("sign the commit") && signed.contains("without `--allowed-signers`"),
            "{signed}"
        );
        let local = super::check_pullable(&[], &state, false)
            .expect_err("placeholder")
            .to_string();
        assert!(local.contains("pl up --build api=DIR"), "{local}");
    }
    use state_schema::state::assemble;
    use state_schema::values::ImageRef;

    /// The state of the root and `project`'s text, which must be valid.
    fn state_with(project: &str) -> state_schema::state::State {
        let loaded = assemble(
            vec![
                parse_file("pushleft.yaml", ROOT.as_bytes()),
                parse_file("projects/api.yaml", project.as_bytes()),
            ],
            Vec::new(),
        );
        assert!(loaded.is_valid(), "{:?}", loaded.diagnostics);
        loaded.state
    }

    const ROOT: &str = "apiVersion: pushleft.dev/v1alpha1\nkind: Repository\nmetadata: {name: t}\nspec: {baseDomain: example.com}\n---\napiVersion: pushleft.dev/v1alpha1\nkind: NodePool\nmetadata: {name: main}\nspec:\n  region: eu\n  nodes:\n    - {name: n1, capacity: {cpu: \"8\", memory: 16Gi}}\n";

    /// A canary project rewritten for a built image is the user's file with its image alone
    /// changed, and is as valid as it was (the canonical form once lost `strategy`).
    #[test]
    fn a_built_image_changes_the_image_and_nothing_else() {
        let project = "apiVersion: pushleft.dev/v1alpha1\nkind: Project\nmetadata:\n  name: api\nspec:\n  # the image pl up --build replaces\n  image: registry.example.invalid/api@sha256:0000000000000000000000000000000000000000000000000000000000000000\n  roles:\n    web:\n      kind: web\n      port: 8080\n      replicas: 2\n      rollout:\n        strategy: canary\n        steps: [{weight: 10, pause: 60s}, {weight: 50}]\n---\napiVersion: pushleft.dev/v1alpha1\nkind: Environment\nmetadata: {name: api-production}\nspec: {project: api, stage: production, pool: main}\n";
        let state = state_with(project);
        let built = ImageRef::new(&format!("127.0.0.1:5000/pl-build/api@sha256:{}", "1".repeat(64))).expect("image");
        let files = super::overrides(&state, &[("api".to_owned(), built.clone())], |_| Ok(project.to_owned()))
            .expect("overrides");
        assert_eq!(files.len(), 1);
        let (file, text) = &files[0];
        assert_eq!(file, "projects/api.yaml");
        assert_eq!(
            text,
            &project.replace(
                "registry.example.invalid/api@sha256:0000000000000000000000000000000000000000000000000000000000000000",
                &format!("\"{}\"", built.as_str())
            )
        );
        assert_eq!(file, "projects/api.yaml");
        state_with(text);
    }
}
