//! A Debian system for the packages' tests (`packages.rs`, `install_doc.rs`): the packages
//! built by `scripts/package` from this build's binaries, and fresh Debian roots (copies of the
//! one `scripts/test` made with debootstrap) to install them in, with what systemd would
//! otherwise do for a unit played from its command lines.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

pub const TOOLS: &str = "/opt/pushleft-tools";

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn ok(o: &Output, what: &str) -> String {
    assert!(
        o.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A fresh Debian root from the tarball `scripts/test` made, with /proc mounted; removed when
/// dropped (only once what was mounted in it is unmounted).
pub struct Root {
    base: PathBuf,
    pub dir: PathBuf,
    mounts: Vec<PathBuf>,
    /// The network namespace its commands run in (none: the caller's).
    netns: Option<String>,
}

impl Root {
    /// A root named `name` (unique in the process), its commands run in `netns` if given.
    pub fn new(name: &str, netns: Option<&str>) -> Root {
        // scripts/lib.sh names it too (a new name when what goes into it changes).
        let tarball = Path::new(TOOLS).join("debian-root-3.tar");
        assert!(
            tarball.exists(),
            "{} is missing: scripts/test makes it (ensure_packaging)",
            tarball.display()
        );
        let base = PathBuf::from(format!("/var/tmp/pl-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let dir = base.join("root");
        std::fs::create_dir_all(&dir).expect("mkdir");
        let o = Command::new("tar")
            .arg("-C")
            .arg(&dir)
            .arg("-xf")
            .arg(&tarball)
            .output()
            .expect("tar");
        ok(&o, "unpack the Debian root");
        // A root folder as a system has it (the tarball's may say mktemp's 0700).
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
        // debootstrap writes no hosts file; an installed system has one that names localhost.
        std::fs::write(
            dir.join("etc/hosts"),
            "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n",
        )
        .expect("hosts");
        let o = Command::new("mount")
            .args(["-t", "proc", "proc"])
            .arg(dir.join("proc"))
            .output()
            .expect("mount");
        ok(&o, "mount /proc");
        let proc = dir.join("proc");
        Root {
            base,
            dir,
            mounts: vec![proc],
            netns: netns.map(str::to_owned),
        }
    }

    /// `socket` of the machine at `inside` in the root (a bind mount).
    pub fn bind(&mut self, socket: &Path, inside: &str) {
        let target = self.path(inside);
        std::fs::write(&target, "").expect("mount point");
        let o = Command::new("mount")
            .arg("--bind")
            .arg(socket)
            .arg(&target)
            .output()
            .expect("mount");
        ok(&o, "bind the host's docker socket");
        self.mounts.push(target);
    }

    /// `chroot` (inside the namespace, if any), as it starts.
    fn chroot(&self) -> Command {
        match &self.netns {
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/run/netns/{ns}")).arg("chroot");
                c
            }
            None => Command::new("chroot"),
        }
    }

    /// `chroot ROOT args…` as root, with a plain environment.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = self.chroot();
        c.arg(&self.dir)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .env("HOME", "/root")
            .env("LANG", "C.UTF-8");
        c
    }

    pub fn run(&self, args: &[&str]) -> String {
        ok(&self.command(args).output().expect("chroot"), &args.join(" "))
    }

    /// A command line of a unit, run as the unit's user.
    pub fn as_user(&self, user: &str, line: &[String]) -> Command {
        let mut c = self.chroot();
        if user != "root" {
            c.arg(format!("--userspec={user}:{user}"));
        }
        c.arg(&self.dir)
            .args(line)
            .env_clear()
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .env("PL_LOG", "info");
        c
    }

    pub fn path(&self, inside: &str) -> PathBuf {
        self.dir.join(inside.trim_start_matches('/'))
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        // Nothing is removed while anything is still mounted in it.
        let unmounted = self
            .mounts
            .iter()
            .rev()
            .all(|m| Command::new("umount").arg(m).status().is_ok_and(|s| s.success()));
        if unmounted {
            let _ = std::fs::remove_dir_all(&self.base);
        }
    }
}

/// A daemon from a unit's command line: stopped (SIGTERM, as systemd stops it) when dropped.
pub struct Running(pub Child);
impl Drop for Running {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline && !matches!(self.0.try_wait(), Ok(Some(_))) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `scripts/package` of this build's debug binaries, at `version`, into `out`.
pub fn package(out: &Path, version: &str) -> Vec<PathBuf> {
    let bins = workspace().join("target/debug");
    for b in ["pl", "pl-reconciler", "pl-agent"] {
        assert!(
            bins.join(b).exists(),
            "target/debug/{b} is missing: `cargo test --workspace` builds it (or `cargo build --bins`)"
        );
    }
    let path = format!("{TOOLS}/bin:{}", std::env::var("PATH").unwrap_or_default());
    let o = Command::new(workspace().join("scripts/package"))
        .args(["--profile", "dev", "--no-build", "--version", version])
        .arg(out)
        .env("PATH", path)
        .output()
        .expect("scripts/package");
    ok(&o, "scripts/package");
    let mut debs: Vec<PathBuf> = std::fs::read_dir(out)
        .expect("packages")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "deb"))
        .collect();
    debs.sort();
    assert_eq!(debs.len(), 3, "{debs:?}");
    debs
}

/// The `Key=` lines of a systemd unit (the first of each), without `ExecStart`'s prefixes.
pub fn unit_value(unit: &str, key: &str) -> String {
    unit.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in the unit"))
        .trim_start_matches(['+', '-', '@', '!', ':'])
        .to_owned()
}

pub fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_owned).collect()
}

/// `systemctl`, played by the tests: no systemd runs in their roots. `enable --now UNIT` does
/// what systemd does for Pushleft's units: makes the unit's `StateDirectory` and
/// `RuntimeDirectory`, runs its `ExecStartPre` lines (as root with `+`, else as its `User`),
/// and starts its `ExecStart` as its `User` with its `Environment`, in a session of its own,
/// its pid in `/run/<unit>.test-pid` (which [`Root::stop_units`] reads). Anything else is
/// refused, so a page that needs more from systemd fails its test.
const SYSTEMCTL: &str = r#"#!/bin/sh
# systemctl, played by Pushleft's tests (reconciler/tests/support/debian.rs): no systemd here.
set -eu
if [ "$#" -ne 3 ] || [ "$1" != enable ] || [ "$2" != --now ]; then
	echo "systemctl (played by the test): only 'enable --now UNIT', not: $*" >&2
	exit 2
fi
name=${3%.service}
unit=/usr/lib/systemd/system/$name.service
[ -f "$unit" ] || { echo "systemctl (played by the test): no $unit" >&2; exit 1; }
value() { sed -n "s/^$1=//p" "$unit" | head -n 1; }
user=$(value User)
user=${user:-root}
for d in $(value StateDirectory); do
	install -d -m "$(value StateDirectoryMode | grep . || echo 0755)" -o "$user" -g "$user" "/var/lib/$d"
done
for d in $(value RuntimeDirectory); do
	install -d -m "$(value RuntimeDirectoryMode | grep . || echo 0755)" -o "$user" -g "$user" "/run/$d"
done
drop=""
[ "$user" = root ] || drop="setpriv --reuid=$user --regid=$user --init-groups"
sed -n 's/^ExecStartPre=//p' "$unit" | while read -r line; do
	case $line in
	+*) sh -c "${line#+}" ;;
	*) $drop sh -c "$line" ;;
	esac
done
envs=$(sed -n 's/^Environment=//p' "$unit" | tr '\n' ' ')
setsid $drop env $envs $(value ExecStart) >"/var/log/$name.log" 2>&1 </dev/null &
echo $! >"/run/$name.test-pid"
"#;

impl Root {
    /// Puts the test's `systemctl` first on the root's `PATH` (`/usr/local/sbin`).
    pub fn play_systemd(&self) {
        use std::os::unix::fs::PermissionsExt;
        let path = self.path("/usr/local/sbin/systemctl");
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, SYSTEMCTL).expect("systemctl");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }

    /// Stops what the played `systemctl` started (SIGTERM, then SIGKILL after 20 s).
    pub fn stop_units(&self) {
        let Ok(entries) = std::fs::read_dir(self.path("/run")) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "test-pid")
                && let Ok(pid) = std::fs::read_to_string(&p)
            {
                let pid = pid.trim().to_owned();
                let _ = Command::new("kill").args(["-TERM", &pid]).status();
                let deadline = Instant::now() + Duration::from_secs(20);
                while Instant::now() < deadline && alive(&pid) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
                let _ = std::fs::remove_file(&p);
            }
        }
    }
}

/// Whether process `pid` runs (a zombie, which whoever inherited it may never reap, does not).
fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().chars().next()))
        .is_some_and(|state| state.is_some_and(|c| c != 'Z'))
}

/// Processes the test started (registries), killed when dropped.
pub struct Kill(pub Vec<std::process::Child>);
impl Drop for Kill {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
