//! The mesh's WireGuard device and the node's key, behind one small API over both
//! WireGuards (`wireguard-uapi`): the kernel's through generic netlink, a userspace one
//! (`wireguard-go`) through its UAPI socket, `/var/run/wireguard/<interface>.sock`.
//!
//! Which one: the one that already serves the interface; else the kernel's, if it takes a
//! link of kind `wireguard` (its module is loaded, or loads on that request); else
//! `wireguard-go` when it is on `PATH`. The kernel's is preferred because it copies no packet
//! into a process and has nothing to keep running. `wireguard-go` daemonizes and serves the
//! interface until the interface is deleted, so the mesh outlives an agent restart either
//! way (and the drift round applies the last spec again if it did not).

use crate::outcome::{Failure, permanent, retryable};
use agent_proto::mesh::MeshSpec;
use base64::Engine as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use wireguard_uapi::{DeviceInterface, RouteSocket, WgSocket, get, xplatform};
use zeroize::Zeroizing;

/// Where userspace WireGuards put their sockets (the cross-platform protocol's place).
pub const SOCKET_DIR: &str = "/var/run/wireguard";
/// How long wireguard-go may take to serve its socket.
const USERSPACE_START: Duration = Duration::from_secs(5);

/// Which WireGuard serves the interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Kernel,
    Userspace,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Kernel => "kernel",
            Backend::Userspace => "wireguard-go",
        }
    }
}

/// A WireGuard key as `wg` writes it.
pub fn encode(key: &[u8; 32]) -> String {
    base64::engine::general_purpose::STANDARD.encode(key)
}

/// A key as `wg` writes it, or `None`.
pub fn decode(text: &str) -> Option<[u8; 32]> {
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .ok()?
        .try_into()
        .ok()
}

/// The node's private key: read from `path`, or made from the OS's randomness and written
/// there (0600, by rename) on first use.
pub fn private_key(path: &Path) -> Result<Zeroizing<[u8; 32]>, Failure> {
    if let Ok(text) = std::fs::read_to_string(path) {
        let text = Zeroizing::new(text);
        return decode(&text)
            .map(Zeroizing::new)
            .ok_or_else(|| permanent("mesh-key-invalid", format!("{} is not a WireGuard key", path.display())));
    }
    new_key(path)
}

/// Makes a new private key at `path` (0600, replacing the old one at once: a reader sees the
/// old key or the new one, never half of either).
pub fn new_key(path: &Path) -> Result<Zeroizing<[u8; 32]>, Failure> {
    let mut key = Zeroizing::new([0u8; 32]);
    getrandom::fill(key.as_mut()).map_err(|e| retryable("mesh-key-failed", e.to_string()))?;
    // Clamped as Curve25519 wants it (as `wg genkey` writes it).
    key[0] &= 248;
    key[31] = (key[31] & 127) | 64;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| retryable("state-write-failed", e.to_string()))?;
    }
    let tmp = path.with_extension("new");
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| retryable("state-write-failed", e.to_string()))?;
        f.write_all(Zeroizing::new(encode(&key)).as_bytes())
            .map_err(|e| retryable("state-write-failed", e.to_string()))?;
    }
    std::fs::rename(&tmp, path).map_err(|e| retryable("state-write-failed", e.to_string()))?;
    Ok(key)
}

/// The public half of `key`.
pub fn public_key(key: &[u8; 32]) -> [u8; 32] {
    x25519_dalek::x25519(*key, x25519_dalek::X25519_BASEPOINT_BYTES)
}

fn socket(iface: &str) -> PathBuf {
    Path::new(SOCKET_DIR).join(format!("{iface}.sock"))
}

/// The device as its WireGuard reports it, from whichever serves it.
pub fn get(iface: &str) -> Option<(Backend, get::Device)> {
    if let Ok(mut s) = WgSocket::connect()
        && let Ok(d) = s.get_device(DeviceInterface::from_name(iface))
    {
        return Some((Backend::Kernel, d));
    }
    xplatform::Client::create(socket(iface))
        .get()
        .ok()
        .map(|d| (Backend::Userspace, d))
}

/// Whether a link named `iface` is in this thread's network namespace.
fn link_here(iface: &str) -> bool {
    use rustix::net::{AddressFamily, SocketType, netdevice::name_to_index, socket};
    socket(AddressFamily::INET, SocketType::DGRAM, None).is_ok_and(|fd| name_to_index(&fd, iface).is_ok())
}

/// Makes the interface if nothing serves it yet (see the module's comment): its backend.
pub fn ensure(iface: &str) -> Result<Backend, Failure> {
    if let Some((b, _)) = get(iface) {
        if b == Backend::Kernel || link_here(iface) {
            return Ok(b);
        }
        // A wireguard-go whose interface was deleted (it ends on its own soon): a new one.
        forget(iface);
    }
    if let Ok(mut r) = RouteSocket::connect()
        && r.add_device(iface).is_ok()
    {
        return Ok(Backend::Kernel);
    }
    let found =
        std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("wireguard-go").is_file()));
    if !found {
        return Err(permanent(
            "mesh-unavailable",
            "this kernel takes no WireGuard link and wireguard-go is not on PATH",
        ));
    }
    std::fs::create_dir_all(SOCKET_DIR).map_err(|e| retryable("state-write-failed", e.to_string()))?;
    // It forks itself into the background and returns; its banner goes nowhere.
    let status = std::process::Command::new("wireguard-go")
        .arg(iface)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| retryable("mesh-start-failed", e.to_string()))?;
    if !status.success() {
        return Err(retryable(
            "mesh-start-failed",
            format!("wireguard-go {iface} ended with {status}"),
        ));
    }
    let deadline = Instant::now() + USERSPACE_START;
    while xplatform::Client::create(socket(iface)).get().is_err() {
        if Instant::now() > deadline {
            return Err(retryable(
                "mesh-start-failed",
                format!(
                    "wireguard-go did not serve {} within {USERSPACE_START:?}",
                    socket(iface).display()
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Backend::Userspace)
}

/// A peer as the spec says it, parsed: (public key, endpoint, keepalive, allowed IPs).
type Peer = ([u8; 32], Option<SocketAddr>, Option<u16>, Vec<(IpAddr, u8)>);

fn peers(spec: &MeshSpec) -> Result<Vec<Peer>, Failure> {
    let invalid = |what: String| permanent("mesh-spec-invalid", what);
    spec.peers
        .iter()
        .map(|p| {
            let key = decode(&p.public_key)
                .ok_or_else(|| invalid(format!("{}'s public key is not a WireGuard key", p.node)))?;
            let endpoint = match &p.endpoint {
                Some(e) => Some(
                    e.parse::<SocketAddr>()
                        .map_err(|_| invalid(format!("{}'s endpoint {e} is not address:port", p.node)))?,
                ),
                None => None,
            };
            let ips = p
                .subnets
                .iter()
                .map(|s| {
                    let bad = || invalid(format!("{s} is not an IPv4 CIDR"));
                    let (a, l) = s.split_once('/').ok_or_else(bad)?;
                    let a: std::net::Ipv4Addr = a.parse().map_err(|_| bad())?;
                    let l: u8 = l.parse().ok().filter(|l| *l <= 32).ok_or_else(bad)?;
                    Ok((IpAddr::V4(a), l))
                })
                .collect::<Result<Vec<_>, Failure>>()?;
            Ok((key, endpoint, p.keepalive, ips))
        })
        .collect()
}

/// Sets the device to `spec` whole: key, port, its peers (each one's allowed IPs replaced),
/// and every other peer removed. Peers are changed in place, not replaced wholesale, so a
/// spec that changes nothing of a peer keeps its session (no new handshake, no pause).
pub fn set(iface: &str, backend: Backend, key: &[u8; 32], spec: &MeshSpec) -> Result<(), Failure> {
    let peers = peers(spec)?;
    let failed = |e: String| retryable("mesh-apply-failed", e);
    let stale: Vec<[u8; 32]> = get(iface)
        .map(|(_, d)| d.peers.into_iter().map(|p| p.public_key).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter(|k| !peers.iter().any(|(p, ..)| p == k))
        .collect();
    match backend {
        Backend::Kernel => {
            use wireguard_uapi::linux::set;
            let ips: Vec<Vec<set::AllowedIp<'_>>> = peers
                .iter()
                .map(|(_, _, _, ips)| {
                    ips.iter()
                        .map(|(a, l)| set::AllowedIp {
                            ipaddr: a,
                            cidr_mask: Some(*l),
                        })
                        .collect()
                })
                .collect();
            let device = set::Device::from_ifname(iface)
                .private_key(key)
                .listen_port(spec.port)
                .peers(
                    peers
                        .iter()
                        .zip(ips)
                        .map(|((k, endpoint, keepalive, _), ips)| {
                            let mut p = set::Peer::from_public_key(k)
                                .flags(vec![set::WgPeerF::ReplaceAllowedIps])
                                .allowed_ips(ips);
                            if let Some(e) = endpoint {
                                p = p.endpoint(e);
                            }
                            p.persistent_keepalive_interval(keepalive.unwrap_or(0))
                        })
                        .chain(
                            stale
                                .iter()
                                .map(|k| set::Peer::from_public_key(k).flags(vec![set::WgPeerF::RemoveMe])),
                        )
                        .collect(),
                );
            WgSocket::connect()
                .map_err(|e| failed(e.to_string()))?
                .set_device(device)
                .map_err(|e| failed(e.to_string()))
        }
        Backend::Userspace => {
            use xplatform::set;
            let device = set::Device {
                private_key: Some(*key),
                listen_port: Some(spec.port),
                fwmark: None,
                replace_peers: None,
                peers: peers
                    .into_iter()
                    .map(|(k, endpoint, keepalive, ips)| {
                        let mut p = set::Peer::from_public_key(k)
                            .replace_allowed_ips(true)
                            .persistent_keepalive_interval(keepalive.unwrap_or(0))
                            .allowed_ips(
                                ips.into_iter()
                                    .map(|(ipaddr, cidr_mask)| set::AllowedIp { ipaddr, cidr_mask })
                                    .collect(),
                            );
                        if let Some(e) = endpoint {
                            p = p.endpoint(e);
                        }
                        p
                    })
                    .chain(stale.iter().map(|k| set::Peer::from_public_key(*k).remove(true)))
                    .collect(),
            };
            xplatform::Client::create(socket(iface))
                .set(device)
                .map_err(|e| failed(e.to_string()))
        }
    }
}

/// Forgets a userspace WireGuard's socket once its interface is gone (it ends on its own).
pub fn forget(iface: &str) {
    let _ = std::fs::remove_file(socket(iface));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_keys_are_x25519_of_the_base_point_and_keys_round_trip() {
        // RFC 7748, section 6.1: Alice's key pair.
        let private: [u8; 32] = hex::decode("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
            .expect("hex")
            .try_into()
            .expect("32");
        assert_eq!(
            hex::encode(public_key(&private)),
            "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
        );
        assert_eq!(decode(&encode(&private)), Some(private));
        assert_eq!(decode("not a key"), None);
        assert_eq!(decode(&encode(&[1; 32])[..20]), None);

        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("mesh/private.key");
        let made = private_key(&path).expect("made");
        assert_eq!(made[0] & 7, 0, "clamped");
        assert_eq!(*private_key(&path).expect("read"), *made, "made once");
        std::fs::write(&path, "garbage").expect("write");
        assert_eq!(private_key(&path).expect_err("invalid").code, "mesh-key-invalid");
    }
}
