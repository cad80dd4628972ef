//! A Device's virtual address (`spec.virtualAddresses`): the one address
//! devices dial for its reverse entries, whichever node serves them. It is
//! held by one proxy pod at a time; this module says where it may be
//! (`check`) and who holds it (`choose`), and keeps the grants edgelinkd
//! takes with each heartbeat ([`book`]). Pure: the controller gathers the
//! facts, the heartbeat endpoint answers from the book.
//!
//! How the address moves: the operator picks the holder among the
//! Device's proxies (the current one while it reaches the device; else the
//! first that does), and grants it the address in the answers to its
//! node's heartbeats, each grant for `hold` (the node-lost bound). A node
//! that stops being heard loses the address when its last grant runs out,
//! and only then is it granted to another: the address is never granted
//! to two pods at once. edgelinkd adds the address to net1 with a kernel
//! lifetime of the grant (gone with the grant even if edgelinkd dies) and
//! announces it (gratuitous ARP, unsolicited NA) on taking it.

pub mod book;

use crate::crd::{Device, EdgeNetwork};
use crate::validate::handed_out;
use ipnetwork::IpNetwork;
use std::net::IpAddr;

/// The virtual addresses of `d`, as addresses (the schema and `check`
/// have refused anything else).
pub fn addresses(d: &Device) -> Vec<IpAddr> {
    d.spec
        .virtual_addresses
        .iter()
        .filter_map(|a| a.parse().ok())
        .collect()
}

/// What is wrong with `d`'s virtual addresses on network `n` with proxies
/// on `nodes`: each must lie in a subnet of every node's ranges (any of
/// them may hold it), outside every range (no proxy may be given it), and
/// be neither a gateway nor the device's own address; at most one per
/// family; only with reverse entries (nothing else listens on them).
pub fn check(d: &Device, n: &EdgeNetwork, nodes: &[String]) -> Vec<String> {
    let mut p = Vec::new();
    let vips = &d.spec.virtual_addresses;
    if vips.is_empty() {
        return p;
    }
    if d.spec.reverse.is_empty() {
        p.push("spec.virtualAddresses: the Device has no reverse entries, so nothing would listen on them: add spec.reverse or remove spec.virtualAddresses".into());
        return p;
    }
    let net_name = n.metadata.name.as_deref().unwrap_or("");
    let mut families = (0, 0);
    for (i, s) in vips.iter().enumerate() {
        let field = format!("spec.virtualAddresses[{i}]");
        let Ok(ip) = s.parse::<IpAddr>() else {
            p.push(format!("{field}: {s:?} is not an IP address"));
            continue;
        };
        if ip.is_ipv4() {
            families.0 += 1;
        } else {
            families.1 += 1;
        }
        if s == &d.spec.address || d.spec.address.parse::<IpAddr>().ok() == Some(ip) {
            p.push(format!("{field}: {ip} is the device's own address"));
        }
        for node in nodes {
            let ranges: Vec<_> = n
                .spec
                .ipam
                .ranges
                .iter()
                .filter(|r| r.node == *node)
                .collect();
            let mut inside = false;
            for r in &ranges {
                let Ok(net) = r.subnet.parse::<IpNetwork>() else {
                    continue;
                };
                if !net.contains(ip) {
                    continue;
                }
                inside = true;
                if ip == net.network() || (net.is_ipv4() && Some(ip) == broadcast(net)) {
                    p.push(format!(
                        "{field}: {ip} is the network or broadcast address of {net}"
                    ));
                }
                let (start, end) = handed_out(r, net);
                if start <= ip && ip <= end {
                    p.push(format!("{field}: {ip} is inside the range {start}-{end} that proxy pods on node {node} get their addresses from"));
                }
                if r.gateway.as_deref().and_then(|g| g.parse::<IpAddr>().ok()) == Some(ip) {
                    p.push(format!(
                        "{field}: {ip} is the gateway of node {node}'s range"
                    ));
                }
            }
            if !inside {
                p.push(format!("{field}: {ip} is in no subnet EdgeNetwork {net_name} gives proxies on node {node}: a proxy there could not hold it"));
            }
        }
    }
    if families.0 > 1 || families.1 > 1 {
        p.push("spec.virtualAddresses: at most one IPv4 and one IPv6 address".into());
    }
    p.sort();
    p.dedup();
    p
}

/// What `d`'s virtual addresses clash with among the other Devices of its
/// EdgeNetwork (`others`, any namespace, `d` itself skipped): a device's
/// own address (taking it would take the device's traffic), or another
/// Device's virtual address that was there first (the older Device keeps
/// it; the same age: the first by namespace and name).
pub fn clashes<'a>(d: &Device, others: impl IntoIterator<Item = &'a Device>) -> Vec<String> {
    let mine = addresses(d);
    if mine.is_empty() {
        return Vec::new();
    }
    let key = |x: &Device| {
        (
            x.metadata.creation_timestamp.clone().map(|t| t.0),
            x.metadata.namespace.clone().unwrap_or_default(),
            x.metadata.name.clone().unwrap_or_default(),
        )
    };
    let me = key(d);
    let mut p = Vec::new();
    for o in others {
        let (_, ns, name) = key(o);
        if o.spec.network != d.spec.network
            || (ns.as_str(), name.as_str()) == (me.1.as_str(), me.2.as_str())
        {
            continue;
        }
        for (i, ip) in mine.iter().enumerate() {
            if o.spec.address.parse::<IpAddr>().ok() == Some(*ip) {
                p.push(format!("spec.virtualAddresses[{i}]: {ip} is the address of Device {ns}/{name}'s device"));
            }
            if addresses(o).contains(ip) && key(o) < me {
                p.push(format!("spec.virtualAddresses[{i}]: {ip} is already Device {ns}/{name}'s virtual address on EdgeNetwork {}", d.spec.network));
            }
        }
    }
    p.sort();
    p
}

fn broadcast(n: IpNetwork) -> Option<IpAddr> {
    match n {
        IpNetwork::V4(v4) if v4.prefix() < 31 => Some(IpAddr::V4(v4.broadcast())),
        _ => None,
    }
}

/// One proxy of a Device as the holder choice sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub node: String,
    /// `namespace/pod`: what edgelinkd names its attachment by.
    pub pod: String,
    /// Its pod exists and its node's edgelinkd is heard.
    pub alive: bool,
    /// And it reaches the device.
    pub serving: bool,
}

/// Whether a node serves the device, for the holder's choice: it reaches
/// it, or its probe starts over (edgelinkd restarted or handed over: the
/// verdict is Unknown) while its proxy is still Ready, as its gate keeps
/// it. A take-over must not move the address.
pub fn serves(s: &crate::crd::NodeStatus) -> bool {
    s.reachable == "True" || (s.reachable != "False" && s.ready)
}

/// Who should hold the address (`namespace/pod`): the current holder while
/// it serves; else the first that serves (in the Device's node order);
/// else, when none does, the current holder while it is alive (moving
/// gains nothing), else the first alive; else nobody.
pub fn choose(current: Option<&str>, candidates: &[Candidate]) -> Option<String> {
    let cur = current.and_then(|c| candidates.iter().find(|x| x.pod == c));
    if let Some(c) = cur.filter(|c| c.serving) {
        return Some(c.pod.clone());
    }
    if let Some(c) = candidates.iter().find(|c| c.serving) {
        return Some(c.pod.clone());
    }
    if let Some(c) = cur.filter(|c| c.alive) {
        return Some(c.pod.clone());
    }
    candidates.iter().find(|c| c.alive).map(|c| c.pod.clone())
}

#[cfg(test)]
mod tests;
