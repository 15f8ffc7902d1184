//! Health: each web replica probed on its health path (a bounded HTTP/1.1 request inside its
//! network), and which replicas fail it now, for the heartbeat.

use super::*;

/// Largest header block a health probe reads; its body is never read.
pub const PROBE_MAX_HEADER_BYTES: usize = 8 * 1024;

/// How long one health probe may take, connection included.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// One HTTP GET of `path` on the instance's own `ip:port` (ureq): the status code, or why not.
///
/// The agent runs as root on the host, so a probe must never become a request to anywhere
/// else: it follows no redirect (a 3xx fails the probe, saying where it pointed; the hardening
/// review had a container redirect the probe to a loopback service and from there to the
/// metadata address, and the replica was judged healthy), uses no proxy from the environment,
/// takes `ip` only as an address (never a name to resolve), and reads at most
/// [`PROBE_MAX_HEADER_BYTES`] of headers and no body, within [`PROBE_TIMEOUT`].
pub(super) async fn probe(ip: &str, port: u16, path: &str) -> String {
    let Ok(ip) = ip.parse::<std::net::IpAddr>() else {
        return format!("address {ip:?} is not an IP address");
    };
    if !path.starts_with('/') || path.len() > 1024 || !path.bytes().all(|b| b.is_ascii_graphic()) {
        return "the health path is not an absolute URL path".to_owned();
    }
    let url = format!("http://{}{path}", std::net::SocketAddr::new(ip, port));
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .proxy(None)
            .max_response_header_size(PROBE_MAX_HEADER_BYTES)
            .timeout_global(Some(PROBE_TIMEOUT))
            .build()
            .into();
        match agent.get(&url).call() {
            Ok(r) if r.status().is_redirection() => {
                let to = r
                    .headers()
                    .get("location")
                    .map(|l| String::from_utf8_lossy(l.as_bytes()).into_owned())
                    .unwrap_or_default();
                format!(
                    "{} redirect to {to:.120} not followed (a probe goes only to the instance itself)",
                    r.status().as_u16()
                )
            }
            Ok(r) => r.status().as_u16().to_string(),
            Err(e) => e.to_string(),
        }
    })
    .await
    .unwrap_or_else(|e| e.to_string())
}

impl Engine {
    /// Which running containers of ours fail their health check now (their `HEALTH` label's
    /// path probed at their address, every one at once, each within [`PROBE_TIMEOUT`]): what
    /// the heartbeat reports as not healthy. Bounded by the heartbeat's own limit.
    pub async fn failing_health(&self) -> Result<std::collections::HashSet<String>, Failure> {
        let mut filters = self.our_filter(&[]);
        // Paused ones (a backup) are not probed: they count as not running already.
        filters.insert("status".to_owned(), vec!["running".to_owned()]);
        let list = self
            .docker
            .list_containers(Some(ListContainersOptionsBuilder::default().filters(&filters).build()))
            .await
            .map_err(|e| docker("docker-unavailable", e))?;
        let mut probes = tokio::task::JoinSet::new();
        for c in list.into_iter().take(agent_proto::MAX_HEARTBEAT_INSTANCES) {
            let name = c.names.and_then(|n| n.into_iter().next()).unwrap_or_default();
            let name = name.trim_start_matches('/').to_owned();
            let Some((port, path)) = c
                .labels
                .as_ref()
                .and_then(|l| l.get(HEALTH))
                .and_then(|h| h.split_once(' '))
                .and_then(|(p, path)| Some((p.parse::<u16>().ok()?, path.to_owned())))
            else {
                continue;
            };
            let ip = c
                .network_settings
                .and_then(|n| n.networks)
                .and_then(|n| n.into_values().find_map(|e| e.ip_address.filter(|a| !a.is_empty())));
            probes.spawn(async move {
                let ok = match ip {
                    Some(ip) => probe(&ip, port, &path).await.starts_with('2'),
                    None => false,
                };
                (name, ok)
            });
        }
        let mut failing = std::collections::HashSet::new();
        while let Some(r) = probes.join_next().await {
            if let Ok((name, false)) = r {
                failing.insert(name);
            }
        }
        Ok(failing)
    }
}
