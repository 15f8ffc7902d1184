//! A registry on loopback for tests (Debian's `docker-registry`, plain HTTP on 127.0.0.1,
//! storing under a temporary folder, stopped when dropped), and images pushed to it over the
//! distribution API (no dockerd needed): real tags and real manifest digests. Included by path
//! by the tests that need it.

use sha2::Digest;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Registry {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[allow(dead_code)]
pub fn registry() -> Registry {
    registry_with_auth(None)
}

/// A registry that wants one of the `htpasswd` lines' users (bcrypt), when given.
pub fn registry_with_auth(htpasswd: Option<&str>) -> Registry {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = test_ports::free_port();
    let config = dir.path().join("config.yml");
    let auth = match htpasswd {
        Some(lines) => {
            let file = dir.path().join("htpasswd");
            std::fs::write(&file, lines).expect("htpasswd");
            format!("auth:\n  htpasswd:\n    realm: test\n    path: {}\n", file.display())
        }
        None => String::new(),
    };
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n{auth}",
            dir.path().join("data").display()
        ),
    )
    .expect("config");
    let child = Command::new("docker-registry")
        .arg("serve")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("docker-registry (Debian package docker-registry)");
    // Ready when the registry itself answers its API's root (not when anything accepts on the
    // port).
    let deadline = Instant::now() + Duration::from_secs(10);
    // (401 when it wants credentials: it is the registry that answers.)
    let root = format!("http://127.0.0.1:{port}/v2/");
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    while !agent
        .get(&root)
        .call()
        .is_ok_and(|r| matches!(r.status().as_u16(), 200 | 401))
    {
        assert!(Instant::now() < deadline, "the registry did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Registry { child, port, _dir: dir }
}

impl Registry {
    /// Its temporary folder (its data and configuration are inside).
    #[allow(dead_code)]
    pub fn dir(&self) -> &std::path::Path {
        self._dir.path()
    }

    fn blob(&self, agent: &ureq::Agent, name: &str, bytes: &[u8]) -> String {
        let digest = format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)));
        let start = agent
            .post(format!("http://127.0.0.1:{}/v2/{name}/blobs/uploads/", self.port))
            .send_empty()
            .expect("start an upload");
        assert_eq!(start.status().as_u16(), 202);
        let location = start
            .headers()
            .get("location")
            .expect("location")
            .to_str()
            .expect("text")
            .to_owned();
        let url = match location.starts_with("http") {
            true => location,
            false => format!("http://127.0.0.1:{}{location}", self.port),
        };
        let sep = if url.contains('?') { '&' } else { '?' };
        let done = agent
            .put(format!("{url}{sep}digest={digest}"))
            .header("content-type", "application/octet-stream")
            .send(bytes)
            .expect("upload");
        assert_eq!(done.status().as_u16(), 201, "blob upload");
        digest
    }

    /// Pushes an image whose one layer says `content` as `name:tag`; its manifest digest.
    #[allow(dead_code)]
    pub fn push(&self, name: &str, tag: &str, content: &str) -> String {
        let agent = ureq::agent();
        let config = format!(
            "{{\"architecture\":\"amd64\",\"os\":\"linux\",\"rootfs\":{{\"type\":\"layers\",\"diff_ids\":[]}},\"config\":{{\"Labels\":{{\"v\":\"{content}\"}}}}}}"
        );
        let config_digest = self.blob(&agent, name, config.as_bytes());
        let layer = content.as_bytes();
        let layer_digest = self.blob(&agent, name, layer);
        let manifest = format!(
            "{{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"config\":{{\"mediaType\":\"application/vnd.oci.image.config.v1+json\",\"digest\":\"{config_digest}\",\"size\":{}}},\"layers\":[{{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar\",\"digest\":\"{layer_digest}\",\"size\":{}}}]}}",
            config.len(),
            layer.len()
        );
        let put = agent
            .put(format!("http://127.0.0.1:{}/v2/{name}/manifests/{tag}", self.port))
            .header("content-type", "application/vnd.oci.image.manifest.v1+json")
            .send(manifest.as_bytes())
            .expect("manifest");
        assert_eq!(put.status().as_u16(), 201, "manifest push");
        format!("sha256:{}", hex::encode(sha2::Sha256::digest(manifest.as_bytes())))
    }
}
