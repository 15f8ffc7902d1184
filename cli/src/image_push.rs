//! `pl image push NAME`: an image as `docker save` writes it (from standard input, or
//! `--input FILE`) sent to the control plane's image store through `registry::archive` (each
//! blob asked for first, so only what the store lacks travels); printed as
//! `pushleft.invalid/NAME@sha256:…`, the reference Git names it by. `pl image gc`: the store's
//! unreferenced blobs, listed or removed.

use crate::client::{Client, OutFormat, ServerArgs, print_json};
use anyhow::{Context, Result, anyhow};
use registry::oci;
use std::io::Read;
use std::path::Path;

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
    let reader: Box<dyn Read> = match input {
        Some(p) => Box::new(std::fs::File::open(p).with_context(|| format!("reading {}", p.display()))?),
        None => Box::new(std::io::stdin().lock()),
    };
    let pushed =
        registry::archive::push_archive(&client.pusher(), name, reader).map_err(|e| anyhow!("{e} [{}]", e.code()))?;
    let digest = pushed.digest.ok_or_else(|| anyhow!("the push named no manifest"))?;
    let reference = format!("{}/{name}@{digest}", agent_proto::images::STORE_HOST);
    eprintln!(
        "pushed {reference}: {} blobs sent ({} bytes), {} already held ({} bytes)",
        pushed.sent, pushed.sent_bytes, pushed.held, pushed.held_bytes
    );
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
