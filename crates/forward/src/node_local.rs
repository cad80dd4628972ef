//! Whether an address is one of the node's own (the network namespace
//! edgelinkd runs in): the kubelet's readiness probe of a proxy pod comes
//! from there (the pod network's gateway on the node, or the node's
//! address), every 10 s. Read with getifaddrs(3) when asked, at most every
//! 10 s; only a refusal asks.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a read of the node's addresses is taken as current.
const FRESH: Duration = Duration::from_secs(10);

static NODE: Mutex<Option<(Instant, HashSet<IpAddr>)>> = Mutex::new(None);

/// Whether `a` is an address of the calling thread's network namespace
/// (a worker's home: the node's), as read within the last 10 s.
pub fn is_node_address(a: IpAddr) -> bool {
    let a = edgelink_access::rules::canonical(a);
    let mut node = NODE.lock().unwrap_or_else(|e| e.into_inner());
    let stale = node.as_ref().is_none_or(|(at, _)| at.elapsed() >= FRESH);
    if stale {
        *node = Some((Instant::now(), read()));
    }
    node.as_ref().is_some_and(|(_, set)| set.contains(&a))
}

fn read() -> HashSet<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return HashSet::new();
    };
    addrs
        .filter_map(|i| i.address)
        .filter_map(|s| {
            s.as_sockaddr_in()
                .map(|v4| IpAddr::V4(v4.ip()))
                .or_else(|| s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loopback_is_the_nodes_and_a_documentation_address_is_not() {
        assert!(is_node_address("127.0.0.1".parse().unwrap()));
        assert!(is_node_address("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!is_node_address("192.0.2.77".parse().unwrap()));
    }
}
