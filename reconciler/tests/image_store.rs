//! The control plane's image store (`[images]`) through a real daemon's `/v2/` endpoint, with
//! the push client `pl image push` uses: a blob asked for, sent and then held; a blob whose
//! bytes do not match its digest refused (`image-digest-mismatch`) and not kept; a push past
//! the quota refused (`image-quota-exceeded`) with nothing left behind; a manifest naming a blob
//! the store lacks refused (`image-blob-missing`); a manifest put under a tag kept by its digest
//! and never read by the tag (Git names images by digest); `docker login`'s basic credentials
//! with a token as the password accepted, a wrong one not; a push renews the blobs its manifest
//! names (for the collection's grace); a viewer may read and not push, no token may do neither; and a folder
//! another control plane owns stops the daemon at start. Loopback only.

#[path = "support/daemon.rs"]
mod daemon_support;
#[path = "support/repo.rs"]
mod repo_support;

use daemon_support::{Daemon, config, free_port, setup};
use registry::oci::{self, Digest};
use registry::push::Pusher;
use repo_support::{Repo, project};
use std::time::Duration;

fn pusher(d: &Daemon, token: &str) -> Pusher {
    Pusher::new(d.agent().clone(), &format!("https://localhost:{}", d.port), token)
}

#[test]
fn the_store_keeps_only_whole_verified_blobs_within_its_quota() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repo::new(dir.path());
    std::fs::write(dir.path().join("allowed_signers"), &repo.signers).expect("signers");
    repo.write("projects/api.yaml", &project("api", 1));
    repo.commit("project", true);
    let s = setup(dir.path());
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let port = free_port();
    let store = dir.path().join("images");
    let cfg = config(
        &s,
        "d",
        &repo.dir,
        &url,
        port,
        &format!("[images]\ndir = {store:?}\nquota_bytes = 4194304\nmax_blob_bytes = 2097152\n"),
    );
    let mut d = Daemon::start(&s, &cfg, port);
    d.wait_ready(Duration::from_secs(20));
    let op = pusher(&d, &s.operator);

    // A blob: asked for, sent, then held, and readable as sent.
    let layer = vec![7u8; 1 << 20];
    let ld = Digest::of(&layer);
    assert!(!op.has_blob("web", &ld).expect("head"));
    op.upload("web", &ld, layer.len() as u64, layer.as_slice())
        .expect("upload");
    assert!(op.has_blob("web", &ld).expect("head"));
    assert!(
        op.has_blob("other/name", &ld).expect("content-addressed"),
        "any name serves a digest"
    );
    let (status, body) = d.get(&format!("/v2/web/blobs/{ld}"), Some(&s.viewer));
    assert_eq!((status, body.len()), (200, layer.len()));

    // Bytes that are not the digest's: refused, and nothing kept or counted.
    let liar = Digest::of(b"something else");
    let e = op.upload("web", &liar, 4, &b"evil"[..]).expect_err("a lie");
    assert_eq!(e.code(), "image-digest-mismatch", "{e}");
    assert!(!op.has_blob("web", &liar).expect("head"));
    assert!(!op.has_blob("web", &Digest::of(b"evil")).expect("head"));

    // Past the blob limit.
    let big = vec![1u8; (2 << 20) + 1];
    let e = op
        .upload("web", &Digest::of(&big), big.len() as u64, big.as_slice())
        .expect_err("too large");
    assert_eq!(e.code(), "image-blob-too-large", "{e}");
    let two = vec![2u8; 2 << 20];
    op.upload("web", &Digest::of(&two), two.len() as u64, two.as_slice())
        .expect("3 MiB in all fits");

    // Manifests: by digest, once their blobs are held.
    let config_blob = b"{}".to_vec();
    let cd = Digest::of(&config_blob);
    let missing = oci::image_manifest((&cd, 2), &[(ld.clone(), layer.len() as u64)]);
    let e = op
        .put_manifest("web", Digest::of(&missing).as_str(), oci::OCI_MANIFEST, &missing)
        .expect_err("config missing");
    assert_eq!(e.code(), "image-blob-missing", "{e}");
    op.upload("web", &cd, 2, config_blob.as_slice()).expect("config");
    let manifest = missing;
    let md = Digest::of(&manifest);
    op.put_manifest("web", md.as_str(), oci::OCI_MANIFEST, &manifest)
        .expect("a manifest whose blobs are held");
    let read = d
        .agent()
        .get(&d.url(&format!("/v2/web/manifests/{md}")))
        .header("authorization", &format!("Bearer {}", s.viewer))
        .call()
        .expect("manifest");
    assert_eq!(
        read.headers().get("content-type").and_then(|v| v.to_str().ok()),
        Some(oci::OCI_MANIFEST)
    );
    assert_eq!(
        read.headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok()),
        Some(md.as_str())
    );

    // A push renews what its manifest names: blobs it found held (and did not send) are as
    // young as the push, for the collection's grace.
    let old = std::time::SystemTime::now() - Duration::from_secs(48 * 3600);
    let blob = |d: &Digest| store.join("blobs/sha256").join(d.hex());
    for d in [&ld, &cd, &md] {
        let f = std::fs::File::options().write(true).open(blob(d)).expect("blob");
        f.set_modified(old).expect("mtime");
    }
    op.put_manifest("web", md.as_str(), oci::OCI_MANIFEST, &manifest)
        .expect("the same manifest again");
    for d in [&ld, &cd, &md] {
        let age = std::fs::metadata(blob(d))
            .and_then(|m| m.modified())
            .expect("mtime")
            .elapsed()
            .unwrap_or_default();
        assert!(age < Duration::from_secs(600), "{d} was not renewed: {age:?} old");
    }

    // Past the quota (a little over 3 MiB held of 4): refused, and nothing left behind.
    let more = vec![3u8; 1 << 20];
    let e = op
        .upload("web", &Digest::of(&more), more.len() as u64, more.as_slice())
        .expect_err("past the quota");
    assert_eq!(e.code(), "image-quota-exceeded", "{e}");
    let uploads: Vec<_> = std::fs::read_dir(store.join("uploads")).expect("uploads").collect();
    assert!(uploads.is_empty(), "a refused upload leaves nothing: {uploads:?}");
    // Under a tag (as `docker push` puts it): kept by digest; the tag is not kept.
    op.put_manifest("web", "v1", oci::OCI_MANIFEST, &manifest)
        .expect("a tag put");
    let (status, body) = d.get("/v2/web/manifests/v1", Some(&s.viewer));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("image-tag-unsupported"), "{body}");
    // Basic credentials whose password is a token (`docker login`'s) read and push too.
    use base64::Engine;
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("anyone:{}", s.viewer));
    let (status, _) = d.get_with_header("/v2/", &format!("Basic {basic}"));
    assert_eq!(status, 200);
    let wrong = base64::engine::general_purpose::STANDARD.encode("anyone:guess");
    let (status, _) = d.get_with_header("/v2/", &format!("Basic {wrong}"));
    assert_eq!(status, 401);
    let e = op
        .put_manifest("web", Digest::of(b"x").as_str(), oci::OCI_MANIFEST, &manifest)
        .expect_err("a digest the bytes are not");
    assert_eq!(e.code(), "image-digest-mismatch", "{e}");

    // Roles: a viewer reads and may not push; no token, neither.
    let viewer = pusher(&d, &s.viewer);
    assert!(viewer.has_blob("web", &ld).expect("a viewer reads"));
    let e = viewer
        .upload("web", &Digest::of(b"v"), 1, &b"v"[..])
        .expect_err("a viewer pushes nothing");
    assert_eq!(e.code(), "image-store-unauthorized");
    let anyone = pusher(&d, "not-a-token");
    assert_eq!(
        anyone.has_blob("web", &ld).expect_err("no token").code(),
        "image-store-unauthorized"
    );
    let (status, _) = d.get("/v2/", None);
    assert_eq!(status, 401);
    // A path that climbs out of the uploads is a name the store refuses.
    let (status, _) = d.post(
        "/v2/web/blobs/uploads/..%2F..%2Fowner",
        &[("authorization", &format!("Bearer {}", s.operator))],
        b"",
    );
    assert!(status == 404 || status == 405, "{status}");
    assert_eq!(
        std::fs::read_to_string(store.join("owner"))
            .expect("owner")
            .lines()
            .count(),
        1
    );
    d.kill9();

    // Another control plane's folder: the daemon does not start on it.
    std::fs::write(store.join("owner"), "another-control-plane\n").expect("owner");
    let port2 = free_port();
    let cfg2 = config(
        &s,
        "d2",
        &repo.dir,
        &url,
        port2,
        &format!("[images]\ndir = {store:?}\n"),
    );
    let mut d2 = Daemon::start(&s, &cfg2, port2);
    let exited = (0..100).find_map(|_| {
        std::thread::sleep(Duration::from_millis(100));
        d2.child.try_wait().expect("wait")
    });
    assert!(
        exited.is_some_and(|s| !s.success()),
        "a foreign store folder stops the start"
    );
    let log = std::fs::read_to_string(&d2.log).expect("log");
    assert!(log.contains("image-store-foreign"), "{log}");
}
