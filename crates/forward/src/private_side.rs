//! Which side of the pod a forward's connection or datagram came from. A
//! forward's listeners bind the wildcard address, so they are reachable
//! through every interface of the pod: the edgelink interface of their own
//! attachment, and any other attachment's (a second segment). A forward
//! serves the cluster side only: what arrives on the pod's cluster
//! interface ([`CLUSTER_IFNAME`]) or its loopback. Anything that arrives
//! elsewhere, is addressed to the attachment's interface, or comes from
//! its segment is refused, so that no segment reaches the cluster or
//! another segment through the relay.

use edgelink_attachment::Record;
use ipnetwork::IpNetwork;
use std::net::{IpAddr, SocketAddr};

/// The pod's cluster interface: the one Kubernetes runtimes give the pod
/// network (CNI_IFNAME of the cluster network) in every pod.
pub const CLUSTER_IFNAME: &str = "eth0";

/// The loopback's index, the same in every network namespace.
const LOOPBACK_IFINDEX: u32 = 1;

/// Tells connections that come from the private side (an edgelink or any
/// other interface but the cluster's) from those of the cluster.
#[derive(Clone, Debug)]
pub struct PrivateSide {
    /// Index of the edgelink interface in the pod.
    pub(crate) ifindex: Option<u32>,
    /// Index of the pod's cluster interface; None when it has none (then
    /// only the pod's own loopback is served).
    cluster: Option<u32>,
    /// Its addresses and subnets.
    nets: Vec<IpNetwork>,
}

impl PrivateSide {
    pub fn new(rec: &Record, ifindex: Option<u32>, cluster: Option<u32>) -> PrivateSide {
        PrivateSide {
            ifindex,
            cluster,
            nets: rec.interface.ips.clone(),
        }
    }

    /// A device must not use the relay to reach into the cluster or another
    /// segment: refuse what arrived on any interface but the cluster's and
    /// the loopback, what was addressed to the edgelink interface, and what
    /// comes from its segment.
    pub fn refuses(
        &self,
        peer: SocketAddr,
        local: Option<SocketAddr>,
        ingress: Option<u32>,
    ) -> bool {
        if let Some(i) = ingress {
            if Some(i) == self.ifindex || (i != LOOPBACK_IFINDEX && Some(i) != self.cluster) {
                return true;
            }
        }
        let peer_ip = canonical(peer.ip());
        self.nets
            .iter()
            .any(|n| n.contains(peer_ip) || local.is_some_and(|l| canonical(l.ip()) == n.ip()))
    }
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(cluster: Option<u32>) -> PrivateSide {
        PrivateSide {
            ifindex: Some(3),
            cluster,
            nets: vec!["172.31.250.100/24".parse().unwrap()],
        }
    }

    #[test]
    fn only_the_cluster_interface_and_the_loopback_are_served() {
        let client: SocketAddr = "10.244.1.20:40000".parse().unwrap();
        let s = side(Some(2));
        assert!(!s.refuses(client, None, Some(2)));
        assert!(!s.refuses(client, None, Some(LOOPBACK_IFINDEX)));
        // net1 itself, and a second attachment's interface.
        assert!(s.refuses(client, None, Some(3)));
        assert!(s.refuses(client, None, Some(4)));
        // Without a cluster interface, the loopback only.
        let s = side(None);
        assert!(s.refuses(client, None, Some(2)));
        assert!(!s.refuses(client, None, Some(LOOPBACK_IFINDEX)));
        // Unknown ingress: the address rules alone.
        assert!(!s.refuses(client, None, None));
        let device: SocketAddr = "172.31.250.10:40000".parse().unwrap();
        assert!(s.refuses(device, None, None));
    }
}
