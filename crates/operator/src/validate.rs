//! What the CRD schema of Kubernetes 1.20 cannot check and the controller
//! does before it makes anything: cross-field rules, the Device's name as
//! a Service name, the network's ranges on the device's node, the device's
//! address against them, the relay-only port keys against the port's
//! protocol and path, the reverse entries (`crate::reverse`'s checks).
//! A failed check is reported in the Device's status
//! (`Reconciled` False, reason `InvalidSpec` or `InvalidNetwork`) and
//! nothing is applied.
//!
//! The checks that need nothing but the object are CEL rules of the CRDs
//! too (`crd::cel`, in crds.yaml for Kubernetes 1.31 and later), in the
//! same words: there the apiserver refuses what would fail here. All stay
//! here (1.20 to 1.30 take crds-1.20.yaml, without the rules).

use crate::crd::{
    Device, DeviceHealth, DevicePort, EdgeNetwork, ForwardPath, Mode, ProbeType, Protocol,
    DEFAULT_INTERVAL_SECONDS, DEFAULT_TIMEOUT_SECONDS, MAX_CONNECTIONS, MAX_CONNECT_RETRIES,
    MAX_NODES, MAX_QUEUE_TIMEOUT_MS,
};
use ipnetwork::IpNetwork;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// What is wrong, one finding per line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.join("; "))]
pub struct Invalid(pub Vec<String>);

fn finish(problems: Vec<String>) -> Result<(), Invalid> {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Invalid(problems))
    }
}

/// A DNS-1035 label: what a Service's name must be.
fn is_dns1035(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[b.len() - 1] != b'-'
}

/// `spec.access.allowedClients`: each peer has a selector, and each
/// selector is one the API server takes (the NetworkPolicy's).
fn access(d: &Device, p: &mut Vec<String>) {
    for (i, peer) in d
        .spec
        .access
        .iter()
        .flat_map(|a| &a.allowed_clients)
        .enumerate()
    {
        let at = format!("spec.access.allowedClients[{i}]");
        if peer.namespace_selector.is_none() && peer.pod_selector.is_none() {
            p.push(format!("{at}: give namespaceSelector, podSelector or both"));
        }
        for (sel, f) in [
            (&peer.namespace_selector, "namespaceSelector"),
            (&peer.pod_selector, "podSelector"),
        ] {
            p.extend(
                sel.iter()
                    .flat_map(|s| crate::selector::problems(s, &format!("{at}.{f}"))),
            );
        }
    }
}

/// The checks of the Device alone (its network aside).
pub fn device(d: &Device) -> Result<(), Invalid> {
    let mut p = Vec::new();
    let name = d.metadata.name.as_deref().unwrap_or("");
    // The Service is named after the Device and the proxy pod `<name>-0`
    // carries it as a label value (63 characters at most).
    if !is_dns1035(name) || name.len() > 61 {
        p.push(format!(
            "metadata.name: {name:?} cannot name a Service and its proxy pod: it must be a DNS-1035 label \
             (a-z first, then a-z, 0-9 and -, not ending in -) of at most 61 characters"
        ));
    }
    nodes(d, &mut p);
    access(d, &mut p);
    if let Some(h) = &d.spec.health {
        health(d, h, &mut p);
    }
    match d.spec.address.parse::<IpAddr>() {
        Err(_) => p.push(format!("spec.address: {:?} is not an IP address", d.spec.address)),
        Ok(a) if !is_unicast(a) => p.push(format!(
            "spec.address: {a} is not a unicast address (unspecified, loopback, multicast or broadcast)"
        )),
        Ok(_) => {}
    }
    let mut names = BTreeMap::new();
    let mut ports = BTreeMap::new();
    for (i, port) in d.spec.ports.iter().enumerate() {
        if let Some(j) = names.insert(port.name.as_str(), i) {
            p.push(format!(
                "spec.ports[{i}].name: {:?} is used by spec.ports[{j}]",
                port.name
            ));
        }
        if let Some(j) = ports.insert((port.protocol, port.port), i) {
            p.push(format!(
                "spec.ports[{i}]: {}/{} is used by spec.ports[{j}] ({})",
                port.port,
                port.protocol.as_str(),
                d.spec.ports[j].name
            ));
        }
        if !(1..=65535).contains(&port.port) {
            p.push(format!(
                "spec.ports[{i}].port: {} is not in 1..65535",
                port.port
            ));
        }
        if let Some(t) = port.target_port {
            if !(1..=65535).contains(&t) {
                p.push(format!(
                    "spec.ports[{i}].targetPort: {t} is not in 1..65535"
                ));
            }
        }
        relay_keys(i, port, &mut p);
    }
    if d.spec.ports.is_empty() {
        p.push("spec.ports: at least one port is required".into());
    }
    crate::reverse::check_spec(d, &mut p);
    finish(p)
}

/// Exactly one of nodeName, nodes and nodeSelector; nodes unique, 16 at most.
fn nodes(d: &Device, p: &mut Vec<String>) {
    let s = &d.spec;
    let given = [
        s.node_name.is_some(),
        !s.nodes.is_empty(),
        s.node_selector.is_some(),
    ];
    match given.iter().filter(|g| **g).count() {
        0 => p.push("spec: one of nodeName, nodes and nodeSelector is required".into()),
        1 => {}
        _ => p.push("spec: give only one of nodeName, nodes and nodeSelector".into()),
    }
    if s.node_selector.as_ref().is_some_and(|sel| sel.is_empty()) {
        p.push("spec.nodeSelector: is empty: it would select every node".into())
    }
    if s.nodes.len() > MAX_NODES as usize {
        p.push(format!(
            "spec.nodes: {} nodes, at most {MAX_NODES}",
            s.nodes.len()
        ));
    }
    for (i, n) in s.nodes.iter().enumerate() {
        if n.is_empty() {
            p.push(format!("spec.nodes[{i}]: is empty"));
        } else if let Some(j) = s.nodes[..i].iter().position(|m| m == n) {
            p.push(format!("spec.nodes[{i}]: {n:?} is also spec.nodes[{j}]"));
        }
    }
}

/// The health probe: each key on a probe type that takes it, a port to
/// probe (given, or a port of the probe's protocol), udp's payload, a
/// timeout within the interval.
fn health(d: &Device, h: &DeviceHealth, p: &mut Vec<String>) {
    let t = h.type_.unwrap_or_default();
    for k in h.foreign_keys(t) {
        p.push(format!(
            "spec.health.{k}: is not a key of probe type {}",
            t.as_str()
        ));
    }
    if t == ProbeType::Udp && h.payload.is_none() {
        p.push("spec.health.payload: is required with probe type udp (the datagram sent)".into());
    }
    if t == ProbeType::Udp
        && h.port.is_none()
        && !d.spec.ports.iter().any(|x| x.protocol == Protocol::Udp)
    {
        p.push(
            "spec.health.port: is required: probe type udp and the Device has no UDP port".into(),
        );
    }
    if matches!(t, ProbeType::Tcp | ProbeType::Http)
        && h.port.is_none()
        && !d.spec.ports.iter().any(|x| x.protocol == Protocol::Tcp)
    {
        p.push(format!(
            "spec.health.port: is required: probe type {} and the Device has no TCP port",
            t.as_str()
        ));
    }
    let interval = h.interval_seconds.unwrap_or(DEFAULT_INTERVAL_SECONDS);
    let timeout = h.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS);
    if timeout > interval {
        p.push(format!(
            "spec.health.timeoutSeconds: {timeout} is longer than intervalSeconds ({interval})"
        ));
    }
}

/// The relay's TCP keys of one port: in range, on a TCP port, and not on
/// the kernel path (which has no connection of its own to bound, queue,
/// retry or prefix), as the plugin refuses them at ADD.
fn relay_keys(i: usize, port: &DevicePort, p: &mut Vec<String>) {
    let set = [
        ("maxConnections", port.max_connections.is_some()),
        ("queueTimeoutMs", port.queue_timeout_ms.is_some()),
        ("connectRetries", port.connect_retries.is_some()),
        ("proxyProtocol", port.proxy_protocol.is_some()),
    ];
    for (key, is_set) in set {
        if !is_set {
            continue;
        }
        if port.protocol != Protocol::Tcp {
            p.push(format!(
                "spec.ports[{i}].{key}: is only valid with protocol tcp ({} is {})",
                port.name,
                port.protocol.as_str()
            ));
        }
        if port.path == Some(ForwardPath::Kernel) {
            p.push(format!(
                "spec.ports[{i}].{key}: needs the relay: it cannot be set with path kernel ({})",
                port.name
            ));
        }
    }
    let ranges = [
        ("maxConnections", port.max_connections, 1, MAX_CONNECTIONS),
        (
            "queueTimeoutMs",
            port.queue_timeout_ms,
            1,
            MAX_QUEUE_TIMEOUT_MS,
        ),
        (
            "connectRetries",
            port.connect_retries,
            0,
            MAX_CONNECT_RETRIES,
        ),
    ];
    for (key, v, min, max) in ranges {
        if let Some(v) = v.filter(|v| !(min..=max).contains(v)) {
            p.push(format!("spec.ports[{i}].{key}: {v} is not in {min}..{max}"));
        }
    }
}

fn is_unicast(a: IpAddr) -> bool {
    !(a.is_unspecified() || a.is_loopback() || a.is_multicast())
        && a != IpAddr::V4(std::net::Ipv4Addr::BROADCAST)
}

fn parse_ip(field: &str, v: &str, p: &mut Vec<String>) -> Option<IpAddr> {
    match v.parse() {
        Ok(a) => Some(a),
        Err(_) => {
            p.push(format!("{field}: {v:?} is not an IP address"));
            None
        }
    }
}

/// The network's own rules, as the plugin would refuse them at ADD.
pub fn network(n: &EdgeNetwork) -> Result<(), Invalid> {
    let mut p = Vec::new();
    let s = &n.spec;
    match s.mode {
        Mode::Macvlan => {
            if s.uplink.is_none() {
                p.push("spec.uplink: is required with mode macvlan (the macvlan master)".into());
            }
            for (f, set) in [
                ("bridge", s.bridge.is_some()),
                ("moveUplinkAddresses", s.move_uplink_addresses.is_some()),
                ("vlan", s.vlan.is_some()),
            ] {
                if set {
                    p.push(format!("spec.{f}: is only valid with mode bridge"));
                }
            }
        }
        Mode::Bridge => {
            if s.macvlan_mode.is_some() {
                p.push("spec.macvlanMode: is only valid with mode macvlan".into());
            }
        }
    }
    // (node, start, end) of each range, for the overlap check.
    let mut spans: Vec<(usize, &str, IpAddr, IpAddr)> = Vec::new();
    for (i, r) in s.ipam.ranges.iter().enumerate() {
        let f = format!("spec.ipam.ranges[{i}]");
        let net: IpNetwork = match r.subnet.parse() {
            Ok(n) => n,
            Err(_) => {
                p.push(format!("{f}.subnet: {:?} is not a CIDR", r.subnet));
                continue;
            }
        };
        let mut inside = |k: &str, v: &Option<String>| -> Option<IpAddr> {
            let a = parse_ip(&format!("{f}.{k}"), v.as_deref()?, &mut p)?;
            if !net.contains(a) {
                p.push(format!("{f}.{k}: {a} is outside the subnet {net}"));
                return None;
            }
            Some(a)
        };
        let start = inside("rangeStart", &r.range_start);
        let end = inside("rangeEnd", &r.range_end);
        inside("gateway", &r.gateway);
        let start = start.unwrap_or_else(|| first_host(net));
        let end = end.unwrap_or_else(|| last_host(net));
        if start > end {
            p.push(format!("{f}: rangeEnd {end} is before rangeStart {start}"));
            continue;
        }
        for (j, node, s2, e2) in &spans {
            if *node == r.node && start <= *e2 && *s2 <= end {
                p.push(format!(
                    "{f}: overlaps spec.ipam.ranges[{j}] on node {node}"
                ));
            }
        }
        spans.push((i, r.node.as_str(), start, end));
    }
    for (i, c) in s.allowed_targets.iter().enumerate() {
        if c.parse::<IpNetwork>().is_err() {
            p.push(format!("spec.allowedTargets[{i}]: {c:?} is not a CIDR"));
        }
    }
    for (i, c) in s.ipam.exclude.iter().enumerate() {
        if c.parse::<IpNetwork>().is_err() {
            p.push(format!("spec.ipam.exclude[{i}]: {c:?} is not a CIDR"));
        }
    }
    finish(p)
}

/// The addresses range `r` (of subnet `net`) hands proxy pods: its
/// rangeStart..rangeEnd, the subnet's hosts where they are absent.
pub(crate) fn handed_out(r: &crate::crd::NodeRange, net: IpNetwork) -> (IpAddr, IpAddr) {
    let start = r
        .range_start
        .as_deref()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| first_host(net));
    let end = r
        .range_end
        .as_deref()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| last_host(net));
    (start, end)
}

fn first_host(n: IpNetwork) -> IpAddr {
    match n {
        IpNetwork::V4(v) if v.prefix() < 31 => IpAddr::V4((u32::from(v.network()) + 1).into()),
        IpNetwork::V6(v) if v.prefix() < 127 => IpAddr::V6((u128::from(v.network()) + 1).into()),
        n => n.network(),
    }
}

fn last_host(n: IpNetwork) -> IpAddr {
    match n {
        IpNetwork::V4(v) if v.prefix() < 31 => IpAddr::V4((u32::from(v.broadcast()) - 1).into()),
        IpNetwork::V4(v) => IpAddr::V4(v.broadcast()),
        IpNetwork::V6(v) => IpAddr::V6(v.broadcast()),
    }
}

/// A port's `maxConnections` is the device's total over its `nodes`
/// proxies, split evenly: each needs at least one place.
pub fn connections_split(d: &Device, nodes: usize) -> Result<(), Invalid> {
    let mut p = Vec::new();
    for (i, port) in d.spec.ports.iter().enumerate() {
        if let Some(m) = port.max_connections.filter(|m| (*m as usize) < nodes) {
            p.push(format!(
                "spec.ports[{i}].maxConnections: {m} is below the Device's {nodes} nodes: the total is split \
                 between the nodes' proxies and each needs one place (a device that takes fewer connections \
                 than it has nodes cannot be shared between them yet)"
            ));
        }
    }
    finish(p)
}

/// The Device on its network on `node`: the node has ranges of the
/// device's family there, and the address is one a proxy may reach and
/// not one a proxy may get.
pub fn placement(d: &Device, n: &EdgeNetwork, node: &str) -> Result<(), Invalid> {
    let mut p = Vec::new();
    let Ok(addr) = d.spec.address.parse::<IpAddr>() else {
        return Err(Invalid(vec![format!(
            "spec.address: {:?} is not an IP address",
            d.spec.address
        )]));
    };
    let net_name = n.metadata.name.as_deref().unwrap_or("");
    let ranges: Vec<_> = n
        .spec
        .ipam
        .ranges
        .iter()
        .filter(|r| r.node == node)
        .collect();
    if ranges.is_empty() {
        p.push(format!(
            "EdgeNetwork {net_name} has no range for node {node}: add one to spec.ipam.ranges"
        ));
        return finish(p);
    }
    let subnets: Vec<IpNetwork> = ranges
        .iter()
        .filter_map(|r| r.subnet.parse().ok())
        .collect();
    if !subnets.iter().any(|s| s.is_ipv4() == addr.is_ipv4()) {
        p.push(format!(
            "EdgeNetwork {net_name} gives proxies on node {node} no {} address, so {addr} cannot be reached",
            if addr.is_ipv4() { "IPv4" } else { "IPv6" }
        ));
    }
    let allowed: Vec<IpNetwork> = if n.spec.allowed_targets.is_empty() {
        subnets.clone()
    } else {
        n.spec
            .allowed_targets
            .iter()
            .filter_map(|c| c.parse().ok())
            .collect()
    };
    if !allowed.iter().any(|c| c.contains(addr)) {
        p.push(format!(
            "spec.address: {addr} is outside EdgeNetwork {net_name}'s allowed targets [{}] on node {node}",
            allowed.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", ")
        ));
    }
    for r in &ranges {
        let Ok(net) = r.subnet.parse::<IpNetwork>() else {
            continue;
        };
        if !net.contains(addr) {
            continue;
        }
        let (start, end) = handed_out(r, net);
        if start <= addr && addr <= end {
            p.push(format!(
                "spec.address: {addr} is inside the range {start}-{end} that proxy pods on node {node} get their addresses from"
            ));
        }
        if r.gateway.as_deref().and_then(|g| g.parse::<IpAddr>().ok()) == Some(addr) {
            p.push(format!(
                "spec.address: {addr} is the range's gateway on node {node}"
            ));
        }
    }
    finish(p)
}

/// The reverse entries on `node`'s segment, their targets resolved: no
/// target inside the segment (a loop), no `allowedSources` outside it
/// unless `spec.allowForeignSources`.
pub fn reverse_placement(
    d: &Device,
    n: &EdgeNetwork,
    node: &str,
    resolved: &[crate::reverse::Resolved],
) -> Result<(), Invalid> {
    let mut p = Vec::new();
    crate::reverse::check_placement(d, n, node, resolved, &mut p);
    finish(p)
}

#[cfg(test)]
mod tests;
