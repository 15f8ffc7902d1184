//! The environment's network on the node: made with its subnet and our labels, adopted only
//! when it is ours, removed at teardown; the subnets others' networks take on this machine.

use super::*;

impl Engine {
    /// The environment's bridge network with the subnet from the lease, labelled as ours.
    /// One that exists with our labels and that subnet is adopted; another subnet is
    /// `network-subnet-mismatch`; a network with that name that is not ours, `foreign-network`.
    pub async fn ensure_network(&self, net: &NetworkSpec) -> Result<String, Failure> {
        match self.docker.inspect_network(&net.network, None).await {
            Ok(n) => {
                if !mine(n.labels.as_ref(), &self.control_plane, &self.node) {
                    return Err(permanent(
                        "foreign-network",
                        format!(
                            "a network named {} exists and is not this node's of control plane {}: left untouched",
                            net.network, self.control_plane
                        ),
                    ));
                }
                let subnets: Vec<String> = n
                    .ipam
                    .and_then(|i| i.config)
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|c| c.subnet)
                    .collect();
                if subnets != [net.subnet.clone()] {
                    return Err(permanent(
                        "network-subnet-mismatch",
                        format!("{} has subnet {subnets:?}, the lease says {}", net.network, net.subnet),
                    ));
                }
                Ok(format!("{} adopted", net.network))
            }
            Err(e) if not_found(&e) => {
                let labels = HashMap::from([
                    (OWNED.to_owned(), "true".to_owned()),
                    (CONTROL_PLANE.to_owned(), self.control_plane.clone()),
                    (ENVIRONMENT.to_owned(), net.environment.clone()),
                    (NODE.to_owned(), self.node.clone()),
                ]);
                let request = NetworkCreateRequest {
                    name: net.network.clone(),
                    driver: Some("bridge".into()),
                    ipam: Some(Ipam {
                        driver: Some("default".into()),
                        config: Some(vec![IpamConfig {
                            subnet: Some(net.subnet.clone()),
                            // Docker's default, said outright: the agent's name server for
                            // the environment listens there (`names/mod.rs`).
                            gateway: crate::names::gateway(&net.subnet).map(|g| g.to_string()),
                            ..IpamConfig::default()
                        }]),
                        options: None,
                    }),
                    labels: Some(labels),
                    // The bridge gets a name of ours, so the routes executor can name it.
                    options: Some(HashMap::from([(
                        "com.docker.network.bridge.name".to_owned(),
                        crate::routes::bridge_name(&net.network),
                    )])),
                    ..NetworkCreateRequest::default()
                };
                self.docker
                    .create_network(request)
                    .await
                    .map_err(|e| docker("network-create-failed", e))?;
                Ok(format!("{} created with {}", net.network, net.subnet))
            }
            Err(e) => Err(docker("docker-unavailable", e)),
        }
    }

    /// The pool's /24s (`10.208.0.0/12`) that networks on this engine use and this control plane
    /// did not make (another control plane's, or anyone's network): the heartbeat reports them,
    /// so the control plane gives its environments other ones. A larger network counts every
    /// /24 of the pool it covers.
    pub async fn taken_subnets(&self) -> Result<Vec<String>, Failure> {
        Ok(self.networks_seen().await?.0)
    }

    /// What the heartbeat reports of the engine's networks: the pool's /24s others take
    /// ([`Self::taken_subnets`]), and each environment network of this node's (at most
    /// [`agent_proto::MAX_HEARTBEAT_NETWORKS`]) with its subnet.
    pub async fn networks_seen(&self) -> Result<(Vec<String>, Vec<agent_proto::OwnNetwork>), Failure> {
        let networks = self
            .docker
            .list_networks(None::<bollard::query_parameters::ListNetworksOptions>)
            .await
            .map_err(|e| docker("docker-unavailable", e))?;
        let mut out = std::collections::BTreeSet::new();
        let mut own = Vec::new();
        for n in networks {
            let labels = n.labels.as_ref();
            let ours = owned(labels) && labels.and_then(|l| l.get(CONTROL_PLANE)) == Some(&self.control_plane);
            if ours {
                let environment = labels.and_then(|l| l.get(ENVIRONMENT));
                let subnet = n
                    .ipam
                    .and_then(|i| i.config)
                    .and_then(|c| c.into_iter().find_map(|c| c.subnet));
                if let (true, Some(environment), Some(subnet)) =
                    (mine(labels, &self.control_plane, &self.node), environment, subnet)
                    && own.len() < agent_proto::MAX_HEARTBEAT_NETWORKS
                {
                    own.push(agent_proto::OwnNetwork {
                        environment: environment.clone(),
                        subnet,
                    });
                }
                continue;
            }
            for cidr in n
                .ipam
                .and_then(|i| i.config)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|c| c.subnet)
            {
                out.extend(pool_slots(&cidr));
            }
        }
        Ok((out.into_iter().take(agent_proto::MAX_TAKEN_SUBNETS).collect(), own))
    }

    /// Removes the environment's network if it is ours; gone already is done.
    pub async fn remove_network(&self, network: &str) -> Result<String, Failure> {
        match self.docker.inspect_network(network, None).await {
            Ok(n) if !mine(n.labels.as_ref(), &self.control_plane, &self.node) => Err(permanent(
                "foreign-network",
                format!(
                    "a network named {network} is not this node's of control plane {}: left untouched",
                    self.control_plane
                ),
            )),
            Ok(_) => match self.docker.remove_network(network).await {
                Ok(()) => Ok(format!("{network} removed")),
                Err(e) if not_found(&e) => Ok(format!("{network} already gone")),
                Err(e) => Err(docker("network-remove-failed", e)),
            },
            Err(e) if not_found(&e) => Ok(format!("{network} already gone")),
            Err(e) => Err(docker("docker-unavailable", e)),
        }
    }
}

/// The /24s of the subnet pool (`10.208.0.0/12`) that `cidr` overlaps, as `10.x.y.0/24`.
pub fn pool_slots(cidr: &str) -> Vec<String> {
    let Some((addr, len)) = cidr.split_once('/') else {
        return Vec::new();
    };
    let (Ok(addr), Ok(len)) = (addr.parse::<std::net::Ipv4Addr>(), len.parse::<u32>()) else {
        return Vec::new();
    };
    if len > 32 {
        return Vec::new();
    }
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    let start = u32::from(addr) & mask;
    let end = start | !mask;
    let (pool_start, pool_end) = (
        u32::from(std::net::Ipv4Addr::new(10, 208, 0, 0)),
        u32::from(std::net::Ipv4Addr::new(10, 223, 255, 255)),
    );
    let (from, to) = (start.max(pool_start) >> 8, end.min(pool_end) >> 8);
    if from > to {
        return Vec::new();
    }
    (from..=to)
        .map(|slot| format!("{}/24", std::net::Ipv4Addr::from(slot << 8)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::pool_slots;

    #[test]
    fn a_network_takes_the_pool_slots_it_overlaps() {
        assert_eq!(pool_slots("10.208.3.0/24"), ["10.208.3.0/24"]);
        assert_eq!(pool_slots("10.208.3.128/25"), ["10.208.3.0/24"]);
        assert_eq!(pool_slots("10.209.0.0/23"), ["10.209.0.0/24", "10.209.1.0/24"]);
        assert_eq!(pool_slots("10.0.0.0/8").len(), 4096, "the whole pool");
        assert!(pool_slots("172.17.0.0/16").is_empty());
        assert!(pool_slots("10.224.0.0/24").is_empty());
        assert!(pool_slots("not a subnet").is_empty());
        assert!(pool_slots("fd00::/64").is_empty());
    }
}
