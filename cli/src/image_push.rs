//! `pl image push IMAGE`: the engine's local image pushed by the engine (`image_engine.rs`), or
//! with `--input FILE|-` an archive as `docker save` writes it sent through `registry::archive`
//! (each blob asked for first, so only what the store lacks travels); printed as
//! `pushleft.invalid/NAME@sha256:…`, the reference Git names it by. `pl image gc`: the store's
//! unreferenced blobs, listed or removed.

use crate::client::{Client, OutFormat, ServerArgs, print_json};
use anyhow::{Context, Result, anyhow};
use registry::oci;
use std::io::Read;
use std::path::Path;

pub fn push(args: &ServerArgs, image: &str, name: Option<&str>, input: Option<&Path>) -> Result<u8> {
    // With an archive, IMAGE is the name; from the engine, the name defaults to IMAGE's path.
    let name = match (name, input) {
        (Some(n), _) => n.to_owned(),
        (None, Some(_)) => image.to_owned(),
        (None, None) => crate::image_engine::default_name(image),
    };
    let name = name
        .strip_prefix(agent_proto::images::STORE_HOST)
        .map(|n| n.trim_start_matches('/').to_owned())
        .unwrap_or(name);
    if !oci::valid_name(&name) {
        eprintln!(
            "pl image push: error[image-name-invalid]: `{name}` is not a repository name\n  hint: lowercase letters, digits and `._-`, in `/`-separated parts (`web`, `shop/web`); --name NAME sets it"
        );
        return Ok(2);
    }
    let client = Client::new(args)?;
    let digest = match input {
        None => crate::image_engine::push(&client, image, &name)?,
        Some(p) => {
            let reader: Box<dyn Read> = if p == Path::new("-") {
                Box::new(std::io::stdin().lock())
            } else {
                Box::new(std::fs::File::open(p).with_context(|| format!("reading {}", p.display()))?)
            };
            let pushed = registry::archive::push_archive(&client.pusher(), &name, reader)
                .map_err(|e| anyhow!("{e} [{}]", e.code()))?;
            eprintln!(
                "{} blobs sent ({} bytes), {} already held ({} bytes)",
                pushed.sent, pushed.sent_bytes, pushed.held, pushed.held_bytes
            );
            pushed.digest.ok_or_else(|| anyhow!("the push named no manifest"))?
        }
    };
    let reference = format!("{}/{name}@{digest}", agent_proto::images::STORE_HOST);
    eprintln!("pushed {reference}");
    println!("{reference}");
    Ok(0)
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
