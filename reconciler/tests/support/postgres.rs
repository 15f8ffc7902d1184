//! A throwaway PostgreSQL cluster for tests and benchmarks: initdb and pg_ctl from Debian's
//! postgresql into a temporary directory, on a free loopback port. As root the server runs
//! as `postgres` (initdb refuses root).
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// A PostgreSQL cluster for one test, stopped and removed on drop.
pub struct Postgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    pub port: u16,
    as_postgres: bool,
}

fn pg_bin() -> PathBuf {
    let on_path = Command::new("sh")
        .args(["-c", "command -v initdb"])
        .output()
        .expect("sh");
    if on_path.status.success() {
        let p = PathBuf::from(String::from_utf8_lossy(&on_path.stdout).trim());
        return p.parent().expect("bin dir").to_owned();
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is installed (scripts/test installs it)")
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .collect();
    versions.sort();
    versions.pop().expect("a PostgreSQL version")
}

impl Postgres {
    pub fn start() -> Self {
        let bin = pg_bin();
        let dir = tempfile::Builder::new().prefix("pl-pg-").tempdir().expect("tempdir");
        let port = test_ports::free_port();
        // initdb refuses to run as root: run the server as `postgres` then.
        let root = String::from_utf8_lossy(&Command::new("id").arg("-u").output().expect("id").stdout).trim() == "0";
        if root {
            let s = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .expect("chown");
            assert!(s.success());
        }
        let pg = Postgres {
            dir,
            bin,
            port,
            as_postgres: root,
        };
        let data = pg.dir.path().join("data");
        pg.run(
            "initdb",
            &[
                "-D",
                data.to_str().expect("utf-8"),
                "-A",
                "trust",
                "-U",
                "pushleft",
                "--no-sync",
            ],
        );
        pg.start_server();
        pg
    }

    /// A PostgreSQL tool, run as `postgres` when we are root.
    fn command(&self, tool: &str) -> Command {
        let exe = self.bin.join(tool);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe);
            c
        } else {
            Command::new(exe)
        }
    }

    pub fn run(&self, tool: &str, args: &[&str]) {
        let o = self.command(tool).args(args).output().expect("PostgreSQL tool runs");
        assert!(
            o.status.success(),
            "{tool}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// Starts the server; its output goes to the log file (a pipe left open by the server
    /// would keep `output()` waiting for ever).
    fn start_server(&self) {
        let data = self.dir.path().join("data");
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=on",
            self.port,
            self.dir.path().display()
        );
        self.run(
            "pg_ctl",
            &[
                "-D",
                data.to_str().expect("utf-8"),
                "-o",
                &opts,
                "-l",
                self.dir.path().join("log").to_str().expect("utf-8"),
                "-w",
                "start",
            ],
        );
    }

    /// Stops the server (fast: open sessions are cut) and starts it again on the same port.
    pub fn restart(&self) {
        let data = self.dir.path().join("data");
        self.run(
            "pg_ctl",
            &["-D", data.to_str().expect("utf-8"), "-m", "fast", "-w", "stop"],
        );
        self.start_server();
    }

    pub fn url(&self) -> String {
        format!("postgres://pushleft@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let data = self.dir.path().join("data");
        let _ = self
            .command("pg_ctl")
            .args(["-D", data.to_str().unwrap_or_default(), "-m", "immediate", "stop"])
            .output();
    }
}
