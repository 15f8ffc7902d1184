//! `pl image push NAME`: an image as `docker save` writes it (from standard input, or
//! `--input FILE`) sent to the control plane's image store, each blob asked for first so only
//! what the store lacks travels; printed as `pushleft.invalid/NAME@sha256:…`, the reference
//! Git names it by. `pl image gc`: the store's unreferenced blobs, listed or removed.
//!
//! Both layouts of `docker save` are read: the OCI layout (Docker 25 and later: blobs named by
//! digest, so a blob the store holds is skipped without hashing it) and the older one (a
//! `layer.tar` per layer, hashed on the way through into a spool file before the store is
//! asked). Layers stay uncompressed, so their digests are the diff ids the engines know.

use crate::client::{Client, OutFormat, ServerArgs, print_json};
use anyhow::{Context, Result, anyhow, bail};
use registry::oci::{self, Digest};
use sha2::Digest as _;
use std::collections::HashMap;
use std::io::{Read, Seek, Write};
use std::path::Path;

/// What one push sent and skipped.
#[derive(Default)]
struct Tally {
    sent: u64,
    sent_bytes: u64,
    skipped: u64,
    skipped_bytes: u64,
}

/// The small files of a save kept to read after the stream (manifests, configs, indexes).
const SMALL: u64 = oci::MAX_MANIFEST_BYTES as u64;

pub fn push(args: &ServerArgs, name: &str, input: Option<&Path>) -> Result<u8> {
    let name = name
        .strip_prefix(agent_proto::images::STORE_HOST)
        .map(|n| n.trim_start_matches('/'))
        .unwrap_or(name);
    if !oci::valid_name(name) {
        eprintln!(
            "pl image push: error[image-name-invalid]: `{name}` is not a repository name\n  hint: lowercase letters, digits and `._-`, in `/`-separated parts (`web`, `shop/web`)"
        );
        return Ok(2);
    }
    let client = Client::new(args)?;
    let pusher = client.pusher();
    let reader: Box<dyn Read> = match input {
        Some(p) => Box::new(std::fs::File::open(p).with_context(|| format!("reading {}", p.display()))?),
        None => Box::new(std::io::stdin().lock()),
    };
    let mut tally = Tally::default();
    let mut small: HashMap<String, Vec<u8>> = HashMap::new();
    // Older layout: a layer's path in the archive → its digest and size.
    let mut layers: HashMap<String, (Digest, u64)> = HashMap::new();
    let mut archive = tar::Archive::new(reader);
    for entry in archive.entries().context("reading the image archive")? {
        let mut entry = entry.context("reading the image archive")?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let path = entry.path()?.to_string_lossy().into_owned();
        let size = entry.size();
        if let Some(d) = path
            .strip_prefix("blobs/sha256/")
            .and_then(|h| Digest::parse(&format!("sha256:{h}")))
        {
            let kept = (size <= SMALL).then(|| read_all(&mut entry)).transpose()?;
            if pusher.has_blob(name, &d).map_err(refused)? {
                tally.skipped += 1;
                tally.skipped_bytes += size;
            } else {
                match &kept {
                    Some(bytes) => pusher.upload(name, &d, size, bytes.as_slice()),
                    None => pusher.upload(name, &d, size, &mut entry),
                }
                .map_err(refused)?;
                tally.sent += 1;
                tally.sent_bytes += size;
            }
            if let Some(bytes) = kept {
                small.insert(path, bytes);
            }
        } else if path.ends_with("/layer.tar") {
            let (digest, spool) = spool(&mut entry)?;
            send_spooled(&pusher, name, &digest, size, spool, &mut tally)?;
            layers.insert(path, (digest, size));
        } else if size <= SMALL && (path.ends_with(".json") || path == "repositories") {
            small.insert(path.clone(), read_all(&mut entry)?);
        }
    }
    let (manifest, media_type) = match small.get("index.json") {
        Some(index) => oci_manifest(index, &small)?,
        None => {
            let (m, config) = legacy_manifest(&small, &layers)?;
            // The config is a small file of the save, named by its own digest's hex.
            if !pusher.has_blob(name, &config.0).map_err(refused)? {
                let bytes = &small[&config.2];
                pusher
                    .upload(name, &config.0, config.1, bytes.as_slice())
                    .map_err(refused)?;
                tally.sent += 1;
                tally.sent_bytes += config.1;
            }
            (m, oci::OCI_MANIFEST.to_owned())
        }
    };
    let digest = Digest::of(&manifest);
    pusher
        .put_manifest(name, digest.as_str(), &media_type, &manifest)
        .map_err(refused)?;
    let reference = format!("{}/{name}@{digest}", agent_proto::images::STORE_HOST);
    eprintln!(
        "pushed {reference}: {} blobs sent ({} bytes), {} already held ({} bytes)",
        tally.sent, tally.sent_bytes, tally.skipped, tally.skipped_bytes
    );
    println!("{reference}");
    Ok(0)
}

fn refused(e: registry::push::PushError) -> anyhow::Error {
    anyhow!("{e} [{}]", e.code())
}

fn read_all(r: &mut impl Read) -> Result<Vec<u8>> {
    let mut v = Vec::new();
    r.read_to_end(&mut v).context("reading the image archive")?;
    Ok(v)
}

/// A layer copied to a spool file while it is hashed: the store is asked for its digest
/// before anything is sent, and the digest is known only at its end.
fn spool(entry: &mut impl Read) -> Result<(Digest, std::fs::File)> {
    let mut file = tempfile::tempfile().context("a spool file for a layer")?;
    let mut hash = sha2::Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = entry.read(&mut buf).context("reading the image archive")?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        file.write_all(&buf[..n]).context("writing a spool file")?;
    }
    file.rewind()?;
    Ok((Digest::from_hasher(hash), file))
}

fn send_spooled(
    pusher: &registry::push::Pusher,
    name: &str,
    digest: &Digest,
    size: u64,
    spool: std::fs::File,
    tally: &mut Tally,
) -> Result<()> {
    if pusher.has_blob(name, digest).map_err(refused)? {
        tally.skipped += 1;
        tally.skipped_bytes += size;
        return Ok(());
    }
    pusher.upload(name, digest, size, spool).map_err(refused)?;
    tally.sent += 1;
    tally.sent_bytes += size;
    Ok(())
}

/// The OCI layout's image: `index.json`'s one entry, a manifest (or index) among the blobs.
fn oci_manifest(index: &[u8], small: &HashMap<String, Vec<u8>>) -> Result<(Vec<u8>, String)> {
    let parsed = oci::parse_manifest(index, Some(oci::OCI_INDEX)).map_err(|e| anyhow!("index.json: {e}"))?;
    let [(d, _)] = parsed.references.as_slice() else {
        bail!(
            "the archive holds {} images; save one image per push [image-push-several]",
            parsed.references.len()
        );
    };
    let bytes = small
        .get(&format!("blobs/sha256/{}", d.hex()))
        .ok_or_else(|| anyhow!("index.json names {d}, which the archive does not hold"))?;
    let m = oci::parse_manifest(bytes, None).map_err(|e| anyhow!("{d}: {e}"))?;
    Ok((bytes.clone(), m.media_type))
}

/// The older layout's image (`manifest.json`: a config file and layer files) as an OCI
/// manifest, with the config's digest, size and path.
#[allow(clippy::type_complexity)]
fn legacy_manifest(
    small: &HashMap<String, Vec<u8>>,
    layers: &HashMap<String, (Digest, u64)>,
) -> Result<(Vec<u8>, (Digest, u64, String))> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Entry {
        config: String,
        layers: Vec<String>,
    }
    let text = small.get("manifest.json").ok_or_else(|| {
        anyhow!("not an archive `docker save` writes: no index.json or manifest.json [image-archive-invalid]")
    })?;
    let entries: Vec<Entry> = serde_json::from_slice(text).context("manifest.json")?;
    let [entry] = entries.as_slice() else {
        bail!(
            "the archive holds {} images; save one image per push [image-push-several]",
            entries.len()
        );
    };
    let config = small
        .get(&entry.config)
        .ok_or_else(|| anyhow!("manifest.json names {}, which the archive does not hold", entry.config))?;
    let config_digest = Digest::of(config);
    let mut listed = Vec::new();
    for l in &entry.layers {
        let found = layers
            .get(l)
            .ok_or_else(|| anyhow!("manifest.json names {l}, which the archive does not hold"))?;
        listed.push(found.clone());
    }
    let manifest = oci::image_manifest((&config_digest, config.len() as u64), &listed);
    Ok((manifest, (config_digest, config.len() as u64, entry.config.clone())))
}

/// `pl image gc [--delete]`.
pub fn gc(args: &ServerArgs, delete: bool) -> Result<u8> {
    let v = Client::new(args)?.collect_images(&operator_proto::images::CollectImages { delete })?;
    if args.format == OutFormat::Json {
        return print_json(&v);
    }
    for b in &v.blobs {
        outln!("{}  {} bytes  {} h old", b.digest, b.bytes, b.age_seconds / 3600);
    }
    let verb = if v.deleted {
        "removed"
    } else {
        "would remove (dry run; --delete removes)"
    };
    outln!(
        "{verb} {} blobs, {} bytes; {} unreferenced blobs kept for being younger than the grace; the store holds {} of {} bytes",
        v.blobs.len(),
        v.bytes,
        v.young,
        v.held_bytes,
        v.quota_bytes
    );
    Ok(0)
}
