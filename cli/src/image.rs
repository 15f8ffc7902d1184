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

/// `pl image update`: for each image with an `imageUpdates` policy, the registry's newest
/// allowed tag and its digest, decided by `state_schema::image_updates::decide`, written as a
/// signed commit of the changed file on `pl-image-update/<kind>/<name>` (one branch per
/// object, moved when the update changes; a branch that holds it already is left alone), or
/// for `branch: applied` chained on `pl-image-update/applied/<branch>` for CI to push to the
/// applied branch. HEAD, its branch, the index and the work tree are left alone. Exit 0 when
/// every image was decided, 1 when a registry or the repository failed one.
pub fn update(dir: &Path, key: Option<&Path>, auth: &[String]) -> Result<u8> {
    use state_repo::commit::Expect;
    use state_repo::image_update::{Target, write};
    use state_schema::image_updates::{Branch, Decision, decide};
    use state_schema::state::images::updatable;
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
        let (repository, _) = state_schema::image_updates::repository_of(&o.image);
        let newest = match registry::pick(repository, &credentials, |tags| {
            state_schema::image_updates::newest(&o.policy.pick, tags)
        }) {
            Ok(n) => n,
            Err(e) => {
                eprintln!("{}: error[{}]: {e}", o.label, e.code());
                failed = true;
                continue;
            }
        };
        let found = newest.as_ref().map(|(t, d)| (t.as_str(), d.as_str()));
        let (tag, image) = match decide(&o.policy, &o.image, found) {
            Decision::Pinned => {
                println!("{}: pinned (`digests: pin`), left alone", o.label);
                continue;
            }
            Decision::NoTag => {
                println!("{}: no tag is allowed by its policy, left alone", o.label);
                continue;
            }
            Decision::Current => {
                println!("{}: up to date", o.label);
                continue;
            }
            Decision::Update { image, tag } => (tag, image),
        };
        let (branch, parent) = match o.policy.branch {
            Branch::Own => (format!("pl-image-update/{}", o.label), head.id),
            Branch::Applied => (format!("pl-image-update/applied/{checked_out}"), applied_tip),
        };
        let target = Target {
            branch: &branch,
            parent,
            expect: Expect::Any,
        };
        let (tip, written) = match write(&repo, o, (&image, &tag), &target, &key) {
            Ok(w) => w,
            Err(e) => {
                eprintln!("{}: error[image-update-failed]: {e}", o.label);
                failed = true;
                continue;
            }
        };
        if o.policy.branch == Branch::Applied {
            applied_tip = tip;
        }
        let how = if written { "" } else { ", already there" };
        println!(
            "{}: {} → {image} on {branch} ({}{how})",
            o.label,
            o.image,
            &tip.to_string()[..12]
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
