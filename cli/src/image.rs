//! `pl image sign`: an image's signature, made in process and kept in the state tree beside the
//! YAML (`image-signatures/sha256-<hex>.sig`), for nodes to check before they pull or run it.

use anyhow::{Context, Result, anyhow};
use state_repo::source::StateRepo;
use state_schema::image_signatures::{self, MAX_SIGNATURES};
use std::path::Path;

/// Signs `image`'s digest with the signing key and adds the signature to its file (once: a
/// signature already there is not added again). Prints the file's path.
pub fn sign(dir: &Path, image: &str, key: Option<&Path>) -> Result<u8> {
    let digest = match image_trust::digest_of(image) {
        Some(d) => d,
        None if image_trust::is_digest(image) => image,
        None => {
            eprintln!(
                "pl image sign: error[image-not-pinned]: `{image}` is not pinned to a digest\n  hint: sign `name@sha256:<64 hex>` (from `docker buildx imagetools inspect`, or `pl up --build`'s output)"
            );
            return Ok(1);
        }
    };
    let repo = StateRepo::open(dir)?;
    let key = crate::rollback_commit::signing_key(&repo, key)?;
    let signature = image_trust::sign(&key, digest)?;
    let relative = image_signatures::path_of(digest).ok_or_else(|| anyhow!("{digest} is not a sha256 digest"))?;
    let path = dir.join(&relative);
    let mut text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let blocks = image_signatures::blocks(&text)
        .map_err(|(line, why)| anyhow!("{}:{line}: {why}; fix or remove the file first", relative))?;
    if blocks.iter().any(|(_, b)| *b == signature) {
        println!("{relative}: already signed by this key");
        return Ok(0);
    }
    if blocks.len() >= MAX_SIGNATURES {
        eprintln!(
            "pl image sign: error[image-signature-invalid]: {relative} holds {MAX_SIGNATURES} signatures already, the most one image may carry\n  hint: remove the signatures of keys no longer trusted"
        );
        return Ok(1);
    }
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&signature);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    println!("{relative}");
    Ok(0)
}

/// One object whose image may move: a Project's, or an Environment's own.
struct Updatable {
    /// `project/api` or `environment/api-production`: unambiguous across kinds.
    label: String,
    file: String,
    at: state_schema::diag::Pos,
    image: String,
    policy: state_schema::image_updates::ImageUpdates,
}

fn updatable(state: &state_schema::state::State) -> Vec<Updatable> {
    use state_schema::model::Spec;
    let mut out = Vec::new();
    for loc in state.iter() {
        let (label, image, policy) = match &loc.object.spec {
            Spec::Project(p) => (
                format!("project/{}", loc.object.name()),
                p.image.as_str(),
                &p.image_updates,
            ),
            Spec::Environment(e) => match &e.image {
                Some(i) => (
                    format!("environment/{}", loc.object.name()),
                    i.as_str(),
                    &e.image_updates,
                ),
                None => continue,
            },
            _ => continue,
        };
        if let Some(policy) = policy {
            out.push(Updatable {
                label,
                file: loc.file.clone(),
                at: loc.pos_of("spec.image"),
                image: image.to_owned(),
                policy: policy.clone(),
            });
        }
    }
    out
}

/// `pl image update`: for each image with an `imageUpdates` policy, the registry's newest
/// allowed tag and its digest, decided by `state_schema::image_updates::decide`, written as a
/// signed commit of the changed file on `pl-image-update/<kind>/<name>` (moved on each update,
/// one branch per object), or for `branch: applied` chained on
/// `pl-image-update/applied/<branch>` for CI to push to the applied branch. HEAD, its branch,
/// the index and the work tree are left alone. Exit 0 when every image was decided, 1 when a
/// registry or the repository failed one.
pub fn update(dir: &Path, key: Option<&Path>, auth: &[String]) -> Result<u8> {
    use state_schema::image_updates::{Branch, Decision, decide, newest, repository_of};
    let repo = StateRepo::open(dir)?;
    let head = repo.resolve("HEAD")?;
    let loaded = state_repo::load::load(&repo, &state_repo::source::Rev::Commit(head.clone()))?;
    if !loaded.is_valid() {
        eprintln!("pl image update: error[invalid-state]: HEAD's state is invalid; run `pl validate --rev HEAD`");
        return Ok(1);
    }
    let objects = updatable(&loaded.state);
    if objects.is_empty() {
        println!("no image has an `imageUpdates` policy");
        return Ok(0);
    }
    let credentials = registry_credentials(auth)?;
    let key = crate::rollback_commit::signing_key(&repo, key)?;
    let checked_out = repo
        .thread_repo()
        .and_then(|r| r.head_name().ok().flatten())
        .map(|n| n.shorten().to_string())
        .unwrap_or_else(|| "HEAD".to_owned());
    let mut applied_tip = head.id;
    let mut failed = false;
    for o in &objects {
        let (repository, _) = repository_of(&o.image);
        let found = registry::split(repository).and_then(|(host, name)| {
            let client = registry::Registry::new(host, credentials.get(host).cloned());
            let tags = client.tags(name)?;
            match newest(&o.policy.pick, &tags) {
                Some(tag) => Ok(Some((tag.to_owned(), client.digest(name, tag)?))),
                None => Ok(None),
            }
        });
        let newest = match found {
            Ok(n) => n,
            Err(e) => {
                eprintln!("{}: error[{}]: {e}", o.label, e.code());
                failed = true;
                continue;
            }
        };
        let (tag, image) = match decide(
            &o.policy,
            &o.image,
            newest.as_ref().map(|(t, d)| (t.as_str(), d.as_str())),
        ) {
            Decision::Pinned => {
                println!("{}: pinned (`digests: pin`), left alone", o.label);
                continue;
            }
            Decision::NoTag => {
                println!(
                    "{}: no tag of {repository} is allowed by its policy, left alone",
                    o.label
                );
                continue;
            }
            Decision::Current => {
                println!("{}: up to date", o.label);
                continue;
            }
            Decision::Update { image, tag } => (tag, image),
        };
        let path = format!("{}{}", repo.prefix(), o.file);
        let at_head = repo
            .entry_at(&head, &o.file)?
            .map(|e| repo.read(repo.thread_repo().as_ref(), &e))
            .transpose()?
            .and_then(|b| String::from_utf8(b).ok());
        let Some(edited) = at_head.and_then(|t| state_schema::edit::replace_scalar(&t, o.at, &image)) else {
            eprintln!(
                "{}: error[edit-failed]: {}:{}:{}: no image scalar to replace",
                o.label, o.file, o.at.line, o.at.column
            );
            failed = true;
            continue;
        };
        let message = format!(
            "{}: image {tag}\n\n{} → {image}\n\nWritten by `pl image update` under the policy's `imageUpdates`.\n",
            o.label, o.image
        );
        let (branch, parent) = match o.policy.branch {
            Branch::Own => (format!("pl-image-update/{}", o.label), head.id),
            Branch::Applied => (format!("pl-image-update/applied/{checked_out}"), applied_tip),
        };
        let id = state_repo::commit::commit_files(repo.root(), parent, &[(path, edited.into_bytes())], &message, &key)?;
        state_repo::commit::point_branch(repo.root(), &branch, id, "pl image update")?;
        if o.policy.branch == Branch::Applied {
            applied_tip = id;
        }
        println!(
            "{}: {} → {image} on {branch} ({})",
            o.label,
            o.image,
            &id.to_string()[..12]
        );
    }
    Ok(u8::from(failed))
}

/// `--registry-auth HOST=FILE`: each file holds `user:password` and may be read by its owner
/// alone.
fn registry_credentials(auth: &[String]) -> Result<std::collections::HashMap<String, zeroize::Zeroizing<String>>> {
    let mut out = std::collections::HashMap::new();
    for a in auth {
        let (host, file) = a
            .split_once('=')
            .ok_or_else(|| anyhow!("--registry-auth {a}: write it HOST=FILE"))?;
        pushleft_secrets::check_private_file(Path::new(file))
            .map_err(|e| anyhow!("--registry-auth {host}: {file}: {e}"))?;
        let text = zeroize::Zeroizing::new(std::fs::read_to_string(file).with_context(|| format!("reading {file}"))?);
        out.insert(host.to_owned(), zeroize::Zeroizing::new(text.trim().to_owned()));
    }
    Ok(out)
}
