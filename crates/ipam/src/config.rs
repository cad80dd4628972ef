//! The `ipam` object of a network configuration, parsed and validated.
//!
//! Parsing works on the raw `serde_json::Value` (not on derived wire types)
//! so that every error can name the exact field path (`ipam.ranges[0][1].subnet`)
//! and the offending value. Unknown keys (including `type`) are ignored, as
//! the CNI spec requires. Nothing here touches the disk or the network.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use ipnetwork::IpNetwork;
use serde_json::{Map, Value};

use crate::addr;

/// Default ARP probe timeout per candidate.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_millis(200);
/// Upper bound for `probe.timeoutMs`.
pub const MAX_PROBE_TIMEOUT_MS: u64 = 5000;

/// Validated built-in IPAM configuration, already filtered for this node.
#[derive(Debug, Clone, PartialEq)]
pub struct IpamConfig {
    /// One address is allocated per range set.
    pub range_sets: Vec<RangeSet>,
    /// Never allocated (canonical networks).
    pub exclude: Vec<IpNetwork>,
    /// Routes to add in the pod via the interface.
    pub routes: Vec<RouteConfig>,
    /// `{nameservers, domain, search, options}`, copied to the Result.
    pub dns: Option<Value>,
    /// ARP probing of IPv4 candidates.
    pub probe: ProbeConfig,
}

/// A set of ranges of one address family; one address is allocated per set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeSet {
    pub ranges: Vec<Range>,
}

/// One allocatable span `start..=end` inside `subnet`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    /// The subnet, host bits cleared.
    pub subnet: IpNetwork,
    /// First allocatable address (default: network+1).
    pub start: IpAddr,
    /// Last allocatable address (default: broadcast-1 for IPv4, last address for IPv6).
    pub end: IpAddr,
    /// Reported in the Result; never allocated.
    pub gateway: Option<IpAddr>,
    /// The node this range applies to; `None` = every node.
    pub node: Option<String>,
}

/// A route added in the pod via the interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteConfig {
    pub dst: IpNetwork,
    pub gw: Option<IpAddr>,
}

/// RFC 5227 probing of IPv4 candidates before they are handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeConfig {
    pub enabled: bool,
    pub timeout: Duration,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig {
            enabled: false,
            timeout: DEFAULT_PROBE_TIMEOUT,
        }
    }
}

/// A configuration error naming the field path, the offending value and why.
///
/// Display: `<field>: <value> <reason>`, or `<field>: <reason>` when there is
/// no single offending value (`value` is empty), e.g.
/// `ipam.ranges[0][1].subnet: "10.0.0.0/33" is not a CIDR` or
/// `ipam.ranges: no range applies to node "kedge2"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Path of the field, e.g. `ipam.ranges[0][1].subnet`.
    pub field: String,
    /// The offending value as JSON text (strings quoted), or empty.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

impl ConfigError {
    pub fn new(
        field: impl Into<String>,
        value: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        ConfigError {
            field: field.into(),
            value: value.into(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}: {}", self.field, self.reason)
        } else {
            write!(f, "{}: {} {}", self.field, self.value, self.reason)
        }
    }
}

impl std::error::Error for ConfigError {}

/// `ipam.nodeName` when it is a non-empty string (the plugin then uses it
/// instead of `<stateDir>/node-name` and the hostname).
pub fn node_name_override(ipam: &Value) -> Option<String> {
    match ipam.get("nodeName") {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

/// JSON text of a value for error messages, bounded in length.
fn render(v: &Value) -> String {
    const MAX: usize = 120;
    let s = v.to_string();
    if s.len() <= MAX {
        return s;
    }
    let mut cut = MAX;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &s[..cut])
}

fn as_str<'a>(v: &'a Value, field: &str, what: &str) -> Result<&'a str, ConfigError> {
    v.as_str()
        .ok_or_else(|| ConfigError::new(field, render(v), format!("is not a string ({what})")))
}

fn parse_ip(v: &Value, field: &str) -> Result<IpAddr, ConfigError> {
    let s = as_str(v, field, "an IP address is expected")?;
    IpAddr::from_str(s.trim())
        .map_err(|_| ConfigError::new(field, render(v), "is not an IP address"))
}

/// A CIDR; with `require_prefix`, a bare address is refused.
fn parse_cidr(v: &Value, field: &str, require_prefix: bool) -> Result<IpNetwork, ConfigError> {
    let s = as_str(v, field, "a CIDR is expected")?.trim();
    if require_prefix && !s.contains('/') {
        return Err(ConfigError::new(
            field,
            render(v),
            "is not a CIDR (a prefix length such as /24 is required)",
        ));
    }
    IpNetwork::from_str(s)
        .map(addr::canonical)
        .map_err(|_| ConfigError::new(field, render(v), "is not a CIDR"))
}

fn as_array<'a>(v: &'a Value, field: &str, what: &str) -> Result<&'a Vec<Value>, ConfigError> {
    v.as_array()
        .ok_or_else(|| ConfigError::new(field, render(v), format!("is not an array ({what})")))
}

fn as_object<'a>(v: &'a Value, field: &str) -> Result<&'a Map<String, Value>, ConfigError> {
    v.as_object()
        .ok_or_else(|| ConfigError::new(field, render(v), "is not an object"))
}

fn ip_in(subnet: &IpNetwork, ip: IpAddr) -> bool {
    subnet.is_ipv4() == ip.is_ipv4() && subnet.contains(ip)
}

impl Range {
    /// The allocatable span as integers.
    pub(crate) fn span(&self) -> (u128, u128) {
        (addr::to_u128(self.start), addr::to_u128(self.end))
    }

    /// Whether `ip` lies in `start..=end`.
    pub fn contains(&self, ip: IpAddr) -> bool {
        if ip.is_ipv4() != self.start.is_ipv4() {
            return false;
        }
        let (lo, hi) = self.span();
        let v = addr::to_u128(ip);
        lo <= v && v <= hi
    }

    /// `subnet`, or `start-end (subnet)` when the span is not the default one.
    pub fn describe(&self) -> String {
        let (first, last) = default_span(&self.subnet);
        if (self.start, self.end) == (first, last) {
            self.subnet.to_string()
        } else {
            format!("{}-{} ({})", self.start, self.end, self.subnet)
        }
    }

    fn parse(v: &Value, path: &str) -> Result<Range, ConfigError> {
        let obj = v.as_object().ok_or_else(|| {
            ConfigError::new(
                path,
                render(v),
                "is not a range object ({\"subnet\": ..., \"rangeStart\": ..., ...})",
            )
        })?;
        let subnet_field = format!("{path}.subnet");
        let subnet = match obj.get("subnet") {
            None | Some(Value::Null) => {
                return Err(ConfigError::new(
                    subnet_field,
                    "",
                    "is missing (a CIDR such as \"172.17.16.0/24\" is required)",
                ))
            }
            Some(s) => parse_cidr(s, &subnet_field, true)?,
        };
        let (default_start, default_end) = default_span(&subnet);
        let inside = |key: &str, default: Option<IpAddr>| -> Result<Option<IpAddr>, ConfigError> {
            let field = format!("{path}.{key}");
            match obj.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => {
                    let ip = parse_ip(v, &field)?;
                    if !ip_in(&subnet, ip) {
                        return Err(ConfigError::new(
                            field,
                            render(v),
                            format!("is outside the subnet {subnet}"),
                        ));
                    }
                    Ok(Some(ip))
                }
            }
        };
        let start = inside("rangeStart", Some(default_start))?.unwrap_or(default_start);
        let end = inside("rangeEnd", Some(default_end))?.unwrap_or(default_end);
        let gateway = inside("gateway", None)?;
        if addr::to_u128(start) > addr::to_u128(end) {
            return Err(ConfigError::new(
                format!("{path}.rangeEnd"),
                format!("\"{end}\""),
                format!("is before rangeStart \"{start}\""),
            ));
        }
        let node = match obj.get("node") {
            None | Some(Value::Null) => None,
            Some(v) => {
                let field = format!("{path}.node");
                let s = as_str(v, &field, "a node name is expected")?;
                if s.is_empty() {
                    return Err(ConfigError::new(
                        field,
                        render(v),
                        "is empty (a node name is expected)",
                    ));
                }
                Some(s.to_string())
            }
        };
        Ok(Range {
            subnet,
            start,
            end,
            gateway,
            node,
        })
    }
}

/// Default `rangeStart`/`rangeEnd` of a subnet.
fn default_span(subnet: &IpNetwork) -> (IpAddr, IpAddr) {
    let (first, last) = addr::net_span(subnet);
    let v4 = subnet.is_ipv4();
    if !addr::has_reserved_edges(subnet) {
        return (addr::from_u128(first, v4), addr::from_u128(last, v4));
    }
    let end = if v4 { last - 1 } else { last };
    (addr::from_u128(first + 1, v4), addr::from_u128(end, v4))
}

impl IpamConfig {
    /// Parse and validate the `ipam` object (built-in IPAM). `node_name` is
    /// this node's name; ranges carrying `"node"` that name another node are
    /// dropped AFTER validation (overlap checks consider all ranges of the
    /// config, whatever their node). A range set left without ranges is
    /// dropped; when no set is left, that is an error naming the node.
    pub fn from_json(ipam: &Value, node_name: &str) -> Result<IpamConfig, ConfigError> {
        let obj = as_object(ipam, "ipam")?;

        // ranges: validate everything, for every node.
        let ranges_v = match obj.get("ranges") {
            None | Some(Value::Null) => {
                return Err(ConfigError::new(
                    "ipam.ranges",
                    "",
                    "is missing (an array of range sets such as [[{\"subnet\": \"172.17.16.0/24\"}]] is required)",
                ))
            }
            Some(v) => v,
        };
        let sets_v = as_array(
            ranges_v,
            "ipam.ranges",
            "an array of range sets is expected",
        )?;
        if sets_v.is_empty() {
            return Err(ConfigError::new(
                "ipam.ranges",
                "[]",
                "is empty (at least one range set is required)",
            ));
        }
        let mut all: Vec<Vec<Range>> = Vec::with_capacity(sets_v.len());
        for (i, set_v) in sets_v.iter().enumerate() {
            let path = format!("ipam.ranges[{i}]");
            let ranges_v = set_v.as_array().ok_or_else(|| {
                ConfigError::new(
                    path.as_str(),
                    render(set_v),
                    "is not an array of ranges (ranges is an array of range sets: [[{...}]])",
                )
            })?;
            if ranges_v.is_empty() {
                return Err(ConfigError::new(path, "[]", "is an empty range set"));
            }
            let mut set = Vec::with_capacity(ranges_v.len());
            for (j, r) in ranges_v.iter().enumerate() {
                let rpath = format!("ipam.ranges[{i}][{j}]");
                let range = Range::parse(r, &rpath)?;
                if let Some(first) = set.first() {
                    let first: &Range = first;
                    if first.subnet.is_ipv4() != range.subnet.is_ipv4() {
                        return Err(ConfigError::new(
                            format!("{rpath}.subnet"),
                            format!("\"{}\"", range.subnet),
                            format!(
                                "is {} but ipam.ranges[{i}][0] is {}: a range set may not mix IPv4 and IPv6",
                                family(&range.subnet),
                                family(&first.subnet)
                            ),
                        ));
                    }
                }
                set.push(range);
            }
            all.push(set);
        }
        check_overlaps(&all)?;
        check_families(&all)?;

        let exclude = match obj.get("exclude") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => as_array(v, "ipam.exclude", "an array of CIDRs is expected")?
                .iter()
                .enumerate()
                .map(|(k, e)| parse_cidr(e, &format!("ipam.exclude[{k}]"), false))
                .collect::<Result<Vec<_>, _>>()?,
        };
        let routes = match obj.get("routes") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => as_array(v, "ipam.routes", "an array of {dst, gw} is expected")?
                .iter()
                .enumerate()
                .map(|(k, r)| parse_route(r, &format!("ipam.routes[{k}]")))
                .collect::<Result<Vec<_>, _>>()?,
        };
        let dns = match obj.get("dns") {
            None | Some(Value::Null) => None,
            Some(v) => Some(validate_dns(v)?),
        };
        if let Some(v) = obj.get("nodeName") {
            match v {
                Value::Null => {}
                Value::String(s) if !s.is_empty() => {}
                _ => {
                    return Err(ConfigError::new(
                        "ipam.nodeName",
                        render(v),
                        "is not a non-empty string (a node name is expected)",
                    ))
                }
            }
        }
        let probe = match obj.get("probe") {
            None | Some(Value::Null) => ProbeConfig::default(),
            Some(v) => parse_probe(v)?,
        };

        // Filter by node, after validation.
        let range_sets: Vec<RangeSet> = all
            .into_iter()
            .map(|set| RangeSet {
                ranges: set
                    .into_iter()
                    .filter(|r| r.node.as_deref().is_none_or(|n| n == node_name))
                    .collect(),
            })
            .filter(|s| !s.ranges.is_empty())
            .collect();
        if range_sets.is_empty() {
            return Err(ConfigError::new(
                "ipam.ranges",
                "",
                format!("no range applies to node {}", Value::from(node_name)),
            ));
        }
        Ok(IpamConfig {
            range_sets,
            exclude,
            routes,
            dns,
            probe,
        })
    }

    /// Every subnet of every range that applies on this node, without
    /// duplicates, in config order (the default `allowedTargets`).
    pub fn subnets(&self) -> Vec<IpNetwork> {
        let mut out: Vec<IpNetwork> = Vec::new();
        for r in self.range_sets.iter().flat_map(|s| s.ranges.iter()) {
            if !out.contains(&r.subnet) {
                out.push(r.subnet);
            }
        }
        out
    }

    /// Which range set / range an address belongs to (its `start..=end`
    /// span), e.g. for requested IPs.
    pub fn range_for(&self, ip: IpAddr) -> Option<(usize, &Range)> {
        self.range_sets
            .iter()
            .enumerate()
            .find_map(|(i, set)| set.ranges.iter().find(|r| r.contains(ip)).map(|r| (i, r)))
    }

    /// Whether `ip` is excluded by `exclude`.
    pub fn is_excluded(&self, ip: IpAddr) -> bool {
        self.exclude.iter().any(|n| ip_in(n, ip))
    }
}

fn family(n: &IpNetwork) -> &'static str {
    if n.is_ipv4() {
        "IPv4"
    } else {
        "IPv6"
    }
}

/// At most one range set per address family: each set gives every
/// attachment one address, so sets of one family would let one pod take as
/// many addresses of a segment as the config lists sets (issue 20, item 11).
fn check_families(all: &[Vec<Range>]) -> Result<(), ConfigError> {
    let mut seen: [Option<usize>; 2] = [None, None];
    for (i, set) in all.iter().enumerate() {
        let Some(first) = set.first() else { continue };
        let fam = usize::from(!first.subnet.is_ipv4());
        if let Some(j) = seen[fam] {
            return Err(ConfigError::new(
                format!("ipam.ranges[{i}]"),
                "",
                format!(
                    "is a second {} range set (ipam.ranges[{j}] is one): one range set per \
                     address family (a set is a list of ranges, and each set gives an \
                     attachment one address)",
                    family(&first.subnet)
                ),
            ));
        }
        seen[fam] = Some(i);
    }
    Ok(())
}

/// No two ranges of the config, in any set and for any node, may share an address.
fn check_overlaps(all: &[Vec<Range>]) -> Result<(), ConfigError> {
    let flat: Vec<(usize, usize, &Range)> = all
        .iter()
        .enumerate()
        .flat_map(|(i, set)| set.iter().enumerate().map(move |(j, r)| (i, j, r)))
        .collect();
    for (k, (i, j, r)) in flat.iter().enumerate() {
        let (lo, hi) = r.span();
        for (pi, pj, p) in &flat[..k] {
            if p.start.is_ipv4() != r.start.is_ipv4() {
                continue;
            }
            let (plo, phi) = p.span();
            if lo <= phi && plo <= hi {
                return Err(ConfigError::new(
                    format!("ipam.ranges[{i}][{j}]"),
                    r.describe(),
                    format!("overlaps ipam.ranges[{pi}][{pj}] ({})", p.describe()),
                ));
            }
        }
    }
    Ok(())
}

fn parse_route(v: &Value, path: &str) -> Result<RouteConfig, ConfigError> {
    let obj = as_object(v, path)?;
    let dst_field = format!("{path}.dst");
    let dst = match obj.get("dst") {
        None | Some(Value::Null) => {
            return Err(ConfigError::new(
                dst_field,
                "",
                "is missing (a CIDR is required)",
            ))
        }
        Some(d) => parse_cidr(d, &dst_field, false)?,
    };
    let gw = match obj.get("gw") {
        None | Some(Value::Null) => None,
        Some(g) => {
            let field = format!("{path}.gw");
            let ip = parse_ip(g, &field)?;
            if ip.is_ipv4() != dst.is_ipv4() {
                return Err(ConfigError::new(
                    field,
                    render(g),
                    format!("is not of the family of dst {dst}"),
                ));
            }
            Some(ip)
        }
    };
    Ok(RouteConfig { dst, gw })
}

fn validate_dns(v: &Value) -> Result<Value, ConfigError> {
    let obj = as_object(v, "ipam.dns")?;
    if let Some(ns) = obj.get("nameservers").filter(|n| !n.is_null()) {
        for (k, n) in as_array(ns, "ipam.dns.nameservers", "IP addresses are expected")?
            .iter()
            .enumerate()
        {
            parse_ip(n, &format!("ipam.dns.nameservers[{k}]"))?;
        }
    }
    if let Some(d) = obj.get("domain").filter(|d| !d.is_null()) {
        as_str(d, "ipam.dns.domain", "a domain name is expected")?;
    }
    for key in ["search", "options"] {
        if let Some(list) = obj.get(key).filter(|l| !l.is_null()) {
            let field = format!("ipam.dns.{key}");
            for (k, s) in as_array(list, &field, "strings are expected")?
                .iter()
                .enumerate()
            {
                as_str(s, &format!("{field}[{k}]"), "a string is expected")?;
            }
        }
    }
    Ok(v.clone())
}

fn parse_probe(v: &Value) -> Result<ProbeConfig, ConfigError> {
    let obj = as_object(v, "ipam.probe")?;
    let mut probe = ProbeConfig::default();
    if let Some(e) = obj.get("enabled").filter(|e| !e.is_null()) {
        probe.enabled = e
            .as_bool()
            .ok_or_else(|| ConfigError::new("ipam.probe.enabled", render(e), "is not a bool"))?;
    }
    if let Some(t) = obj.get("timeoutMs").filter(|t| !t.is_null()) {
        let ms = t
            .as_u64()
            .filter(|ms| (1..=MAX_PROBE_TIMEOUT_MS).contains(ms));
        let ms = ms.ok_or_else(|| {
            ConfigError::new(
                "ipam.probe.timeoutMs",
                render(t),
                format!("is not an integer in 1..{MAX_PROBE_TIMEOUT_MS}"),
            )
        })?;
        probe.timeout = Duration::from_millis(ms);
    }
    Ok(probe)
}

#[cfg(test)]
mod tests;
