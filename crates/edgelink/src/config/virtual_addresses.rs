//! `virtualAddresses`: the addresses devices on the segment dial for the
//! reverse forwards, held on the interface by one attachment at a time.
//! The plugin only validates and records them; edgelinkd adds, removes and
//! announces them.
//!
//! What the config alone tells is checked by [`parse_virtual`] (addresses,
//! families, duplicates, a reverse forward to serve); what needs the
//! interface's subnets is [`check_virtual`], run where
//! [`super::Config::check_reverse`] runs: at parse time with the built-in
//! IPAM, after the IPAM ADD with a delegated one.

use super::{bad, Config, Ipam};
use crate::error::PluginError;
use edgelink_attachment::Reverse;
use edgelink_ipam::{IpamConfig, Range};
use ipnetwork::IpNetwork;
use serde_json::{Map, Value};
use std::net::IpAddr;

const KEY: &str = "virtualAddresses";

/// At most one address of each family.
pub const MAX_VIRTUAL_ADDRESSES: usize = 2;

fn family(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() {
        "IPv4"
    } else {
        "IPv6"
    }
}

fn at(i: usize) -> String {
    format!("{KEY}[{i}]")
}

fn text(ip: IpAddr) -> Value {
    Value::String(ip.to_string())
}

/// Why `ip` cannot be a unicast address a device dials, if it cannot.
fn not_unicast(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) if v4.is_unspecified() => Some("the unspecified address"),
        IpAddr::V4(v4) if v4.is_loopback() => Some("a loopback address"),
        IpAddr::V4(v4) if v4.is_multicast() => Some("a multicast address"),
        IpAddr::V4(v4) if v4.is_link_local() => Some("a link-local address (169.254.0.0/16)"),
        IpAddr::V4(v4) if v4.is_broadcast() => Some("the broadcast address"),
        IpAddr::V6(v6) if v6.is_unspecified() => Some("the unspecified address"),
        IpAddr::V6(v6) if v6.is_loopback() => Some("the loopback address"),
        IpAddr::V6(v6) if v6.is_multicast() => Some("a multicast address"),
        IpAddr::V6(v6) if v6.is_unicast_link_local() => Some("a link-local address (fe80::/10)"),
        _ => None,
    }
}

/// `virtualAddresses` as written: at most one IPv4 and one IPv6 unicast
/// address, no prefix length, and only with a reverse forward to serve.
pub(super) fn parse_virtual(
    o: &Map<String, Value>,
    reverse: &[Reverse],
) -> Result<Vec<IpAddr>, PluginError> {
    let list = match o.get(KEY) {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(v) => return Err(bad(KEY, v, "is not an array of IP addresses")),
    };
    if list.len() > MAX_VIRTUAL_ADDRESSES {
        return Err(bad(
            KEY,
            &o[KEY],
            &format!(
                "has {} entries: at most {MAX_VIRTUAL_ADDRESSES} (one IPv4 and one IPv6 address)",
                list.len()
            ),
        ));
    }
    let mut out: Vec<IpAddr> = Vec::new();
    for (i, v) in list.iter().enumerate() {
        let Value::String(s) = v else {
            return Err(bad(
                &at(i),
                v,
                "is not a string (an IP address is expected)",
            ));
        };
        if s.contains('/') {
            return Err(bad(
                &at(i),
                v,
                "has a prefix length: a virtual address is a bare IP address (it takes the prefix of the interface's subnet)",
            ));
        }
        let ip: IpAddr = s
            .parse()
            .map_err(|_| bad(&at(i), v, "is not an IP address"))?;
        if let Some(what) = not_unicast(ip) {
            return Err(bad(
                &at(i),
                v,
                &format!("is {what}, not a unicast address devices can dial"),
            ));
        }
        if let Some(j) = out.iter().position(|x| *x == ip) {
            return Err(bad(
                &at(i),
                v,
                &format!("is listed twice ({KEY}[{j}] is the same address)"),
            ));
        }
        if let Some(j) = out.iter().position(|x| x.is_ipv4() == ip.is_ipv4()) {
            return Err(bad(
                &at(i),
                v,
                &format!(
                    "is a second {} address ({KEY}[{j}] is one): at most one IPv4 and one IPv6 address",
                    family(ip)
                ),
            ));
        }
        out.push(ip);
    }
    if !out.is_empty() && reverse.is_empty() {
        return Err(bad(
            KEY,
            &o[KEY],
            "is set but there is no reverse entry: nothing would listen on them (devices dial a virtual address to reach the reverse forwards; add reverse or leave virtualAddresses out)",
        ));
    }
    Ok(out)
}

impl Config {
    /// Every virtual address must lie inside one of the interface's
    /// subnets (`own`: its addresses, or with the built-in IPAM its
    /// subnets), and be none of: the subnet's network or broadcast address,
    /// one of `own`'s addresses, a gateway (`result_gateways`, those of a
    /// delegated IPAM's result; the built-in IPAM's own from its config),
    /// and with the built-in IPAM an address a range of any node hands out.
    pub fn check_virtual(
        &self,
        own: &[IpNetwork],
        result_gateways: &[IpAddr],
    ) -> Result<(), PluginError> {
        if self.virtual_addresses.is_empty() {
            return Ok(());
        }
        match &self.ipam {
            Ipam::Builtin(ic) => {
                let pools = Pools::of(&self.net.raw["ipam"], ic);
                let gateways: Vec<IpAddr> = pools
                    .gateways()
                    .chain(ic.routes.iter().filter_map(|r| r.gw))
                    .chain(result_gateways.iter().copied())
                    .collect();
                check_virtual(
                    &self.virtual_addresses,
                    own,
                    &gateways,
                    "the IPAM configuration (ipam.ranges[][].gateway or ipam.routes[].gw)",
                    Some(&pools),
                )
            }
            _ => check_virtual(
                &self.virtual_addresses,
                own,
                result_gateways,
                "the IPAM result",
                None,
            ),
        }
    }
}

/// The built-in IPAM's view of the segment: what it hands out, and the
/// gateways it names.
struct Pools {
    /// Every range of every node: the virtual address moves between the
    /// nodes' proxy pods, so no node's pod may be given it.
    ranges: Vec<Range>,
    exclude: Vec<IpNetwork>,
}

impl Pools {
    /// The ranges of `ic` (this node's) and of every node `ipam` (the raw
    /// `ipam` object `ic` was parsed from) names in `ranges[][].node`.
    fn of(ipam: &Value, ic: &IpamConfig) -> Pools {
        let mut ranges: Vec<Range> = Vec::new();
        let mut add = |c: &IpamConfig| {
            for r in c.range_sets.iter().flat_map(|s| s.ranges.iter()) {
                if !ranges.contains(r) {
                    ranges.push(r.clone());
                }
            }
        };
        add(ic);
        let nodes = ipam
            .pointer("/ranges")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_array)
            .flatten()
            .filter_map(|r| r.get("node").and_then(Value::as_str));
        for n in nodes {
            // Validated with the config already: it parses for every node.
            if let Ok(c) = IpamConfig::from_json(ipam, n) {
                add(&c);
            }
        }
        Pools {
            ranges,
            exclude: ic.exclude.clone(),
        }
    }

    /// The range that could hand `ip` out to a pod: it lies in the range's
    /// span and `ipam.exclude` does not take it out.
    fn handing_out(&self, ip: IpAddr) -> Option<&Range> {
        if self
            .exclude
            .iter()
            .any(|n| n.is_ipv4() == ip.is_ipv4() && n.contains(ip))
        {
            return None;
        }
        self.ranges.iter().find(|r| r.contains(ip))
    }

    /// The gateways of every range.
    fn gateways(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.ranges.iter().filter_map(|r| r.gateway)
    }
}

/// Why `ip` cannot be a virtual address of an interface with `own` (its
/// addresses, or with the built-in IPAM its subnets), the `gateways` of
/// its IPAM (`gateways_of` names where they come from) and, with the
/// built-in IPAM, its `pools`.
fn check_virtual(
    vips: &[IpAddr],
    own: &[IpNetwork],
    gateways: &[IpAddr],
    gateways_of: &str,
    pools: Option<&Pools>,
) -> Result<(), PluginError> {
    for (i, &ip) in vips.iter().enumerate() {
        let fail = |why: String| Err(bad(&at(i), &text(ip), &why));
        let same_family: Vec<&IpNetwork> =
            own.iter().filter(|n| n.is_ipv4() == ip.is_ipv4()).collect();
        if same_family.is_empty() {
            return fail(format!(
                "is an {} address and the interface has no {} subnet ({}): it needs one to be held on",
                family(ip),
                family(ip),
                if own.is_empty() {
                    "it has no address at all (ipam)".to_string()
                } else {
                    format!("it has only {}", list(own))
                }
            ));
        }
        let Some(n) = same_family.iter().find(|n| n.contains(ip)) else {
            return fail(format!(
                "is outside the interface's subnets [{}]: devices on the segment could not reach it",
                list(own)
            ));
        };
        let subnet = IpNetwork::new(n.network(), n.prefix()).unwrap_or(**n);
        match subnet {
            IpNetwork::V4(s) if s.prefix() <= 30 => {
                if IpAddr::V4(s.network()) == ip {
                    return fail(format!("is the network address of the subnet {subnet}"));
                }
                if IpAddr::V4(s.broadcast()) == ip {
                    return fail(format!("is the broadcast address of the subnet {subnet}"));
                }
            }
            IpNetwork::V6(s) if s.prefix() <= 126 && IpAddr::V6(s.network()) == ip => {
                return fail(format!(
                    "is the network (subnet-router anycast) address of the subnet {subnet}"
                ));
            }
            _ => {}
        }
        if let Some(a) = own.iter().find(|a| a.ip() == ip) {
            return fail(format!(
                "is the interface's own address ({a}): a virtual address must be one no attachment is given"
            ));
        }
        if gateways.contains(&ip) {
            return fail(format!(
                "is a gateway of {gateways_of}: the segment's router already answers for it"
            ));
        }
        if let Some(r) = pools.and_then(|p| p.handing_out(ip)) {
            let node = r
                .node
                .as_deref()
                .map(|n| format!(" of node {n:?}"))
                .unwrap_or_default();
            return fail(format!(
                "is inside the built-in IPAM's range {}{node}: a pod could be given it; choose an address outside every range (rangeStart..rangeEnd) or add it to ipam.exclude",
                r.describe()
            ));
        }
    }
    Ok(())
}

fn list(nets: &[IpNetwork]) -> String {
    nets.iter()
        .map(|n| {
            IpNetwork::new(n.network(), n.prefix())
                .unwrap_or(*n)
                .to_string()
        })
        .collect::<Vec<_>>()
        .join(", ")
}
