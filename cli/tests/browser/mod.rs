//! A network namespace of the browser's own, for the Chromium test.
//!
//! Chromium aborts every request in flight with `ERR_NETWORK_CHANGED` when an address or link
//! of its namespace changes, and a simulated host's namespace changes whenever the agent makes
//! a Docker network or starts a container: pages failed to load, a live stream closed, a
//! one-time link was opened twice (each a flake of `ui.rs` in CI). In a namespace of its own,
//! whose only link is its loopback, nothing changes under the browser. ChromeDriver stays in
//! the host's namespace and talks to Chromium over pipes (`--remote-debugging-pipe`, which
//! `nsenter` passes on); the web view reaches the browser through a forwarder this test runs:
//! a listener on the browser's loopback whose connections it makes again on the host's.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// At most this many connections are forwarded, for at most this long.
const MOST_CONNECTIONS: usize = 512;
const LIFETIME: Duration = Duration::from_secs(600);

pub struct BrowserNet {
    name: String,
    stop: Arc<AtomicBool>,
}

impl BrowserNet {
    /// A fresh namespace `name` with only its loopback up.
    pub fn new(name: &str) -> BrowserNet {
        let _ = Command::new("ip")
            .args(["netns", "del", name])
            .stderr(Stdio::null())
            .status();
        for args in [vec!["netns", "add", name], vec!["-n", name, "link", "set", "lo", "up"]] {
            assert!(
                Command::new("ip").args(&args).status().expect("ip").success(),
                "ip {args:?}"
            );
        }
        BrowserNet {
            name: name.to_owned(),
            stop: Arc::new(AtomicBool::new(false)),
        }
    }

    /// A script that starts Chromium inside the namespace (ChromeDriver's `binary`).
    pub fn chromium(&self, dir: &Path) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let script = dir.join("chromium-in-netns");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nexec nsenter --net=/run/netns/{} /usr/bin/chromium \"$@\"\n",
                self.name
            ),
        )
        .expect("write");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        script
    }

    /// Forwards 127.0.0.1:`port` of the namespace to 127.0.0.1:`port` of the calling thread's
    /// namespace (the host's), until the namespace is dropped.
    pub fn forward(&self, port: u16) {
        let here = std::fs::File::open("/proc/thread-self/ns/net").expect("this thread's namespace");
        let there = std::fs::File::open(format!("/run/netns/{}", self.name)).expect("the browser's namespace");
        // A socket stays in the namespace it was made in: the listener is made there, each
        // connection to the view here.
        let listener = std::thread::spawn(move || {
            nix::sched::setns(&there, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            TcpListener::bind(("127.0.0.1", port)).expect("bind in the browser's namespace")
        })
        .join()
        .expect("listener");
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = self.stop.clone();
        std::thread::spawn(move || {
            nix::sched::setns(&here, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            let start = Instant::now();
            let mut served = 0;
            while !stop.load(Ordering::Relaxed) && served < MOST_CONNECTIONS && start.elapsed() < LIFETIME {
                match listener.accept() {
                    Ok((browser, _)) => {
                        served += 1;
                        let _ = browser.set_nonblocking(false);
                        if let Ok(view) = TcpStream::connect(("127.0.0.1", port)) {
                            splice(browser, view);
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
    }
}

/// Copies both ways between two connections until each side ends.
fn splice(a: TcpStream, b: TcpStream) {
    for (mut from, mut to) in [(a.try_clone().expect("clone"), b.try_clone().expect("clone")), (b, a)] {
        std::thread::spawn(move || {
            let mut buf = [0u8; 16 * 1024];
            while let Ok(n) = from.read(&mut buf) {
                if n == 0 || to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        });
    }
}

impl BrowserNet {
    /// How many processes run in the namespace (the browser's, once it started).
    pub fn processes(&self) -> usize {
        let o = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
            .expect("ip");
        String::from_utf8_lossy(&o.stdout).lines().count()
    }
}

impl Drop for BrowserNet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}
