//! edgelink's own configuration keys, parsed and validated completely before
//! anything on the node is touched. Every error names the key and the value
//! (code 7 unless noted). docs/configuration.md is the user-facing contract.

use crate::error::PluginError;
use edgelink_attachment::{Dns, Forward, Health, Reverse};
use edgelink_cni_spec::env::is_valid_ifname;
use edgelink_cni_spec::{codes, CniError, Env, NetConf};
use edgelink_ipam::IpamConfig;
use edgelink_netlink::MacvlanMode;
use forwards::parse_forwards;
use health::parse_health;
use ipnetwork::IpNetwork;
use reverse::{check_reverse, parse_dns, parse_reverse};
use serde_json::{Map, Value};
use std::net::IpAddr;
use std::path::PathBuf;
use virtual_addresses::parse_virtual;

mod forwards;
pub mod health;
pub mod keys;
mod reverse;
mod virtual_addresses;

pub use crate::node::DEFAULT_STATE_DIR;
pub const DEFAULT_BRIDGE: &str = "edge0";
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 5000;
/// `forwards[].idleTimeoutMs` at most: a week.
pub const MAX_IDLE_TIMEOUT_MS: u64 = 7 * 24 * 3600 * 1000;
/// `forwards[].maxConnections` at most.
pub const MAX_CONNECTIONS: u64 = 1_000_000;
/// `forwards[].queueTimeoutMs` at most: ten minutes.
pub const MAX_QUEUE_TIMEOUT_MS: u64 = 600_000;
/// `forwards[].connectRetries` at most.
pub const MAX_CONNECT_RETRIES: u64 = 10;

#[derive(Debug, Clone)]
pub struct BridgeConf {
    pub name: String,
    pub uplink: Option<String>,
    pub move_uplink_addresses: bool,
    pub is_gateway: bool,
    pub hairpin: bool,
    pub vlan: Option<u16>,
}

#[derive(Debug, Clone)]
pub struct MacvlanConf {
    pub uplink: String,
    pub mode: MacvlanMode,
}

#[derive(Debug, Clone)]
pub enum Mode {
    Bridge(BridgeConf),
    Macvlan(MacvlanConf),
}

impl Mode {
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Bridge(_) => "bridge",
            Mode::Macvlan(_) => "macvlan",
        }
    }
}

#[derive(Debug, Clone)]
pub enum Ipam {
    /// The built-in IPAM (no `ipam.type`, or `"edgelink"`).
    Builtin(Box<IpamConfig>),
    /// An IPAM plugin executed from CNI_PATH.
    Delegated { plugin: String },
    /// No `ipam` at all: an interface without addresses.
    None,
}

/// The validated configuration of one invocation.
#[derive(Debug, Clone)]
pub struct Config {
    pub net: NetConf,
    pub mode: Mode,
    pub mtu: Option<u32>,
    pub mac: Option<[u8; 6]>,
    pub state_dir: PathBuf,
    pub ipam: Ipam,
    pub requested_ips: Vec<IpAddr>,
    pub forwards: Vec<Forward>,
    /// Explicit `allowedTargets`; `None` means the attachment's own subnets.
    pub allowed_targets: Option<Vec<IpNetwork>>,
    /// `reverse[]`, an empty `allowed_sources` meaning the interface's
    /// subnets ([`Config::reverse_for`]).
    pub reverse: Vec<Reverse>,
    /// `allowForeignSources`: reverse sources may lie outside the segment.
    pub allow_foreign_sources: bool,
    /// `runtimeConfig.dns`, else `dns`: the resolver for reverse targets.
    pub dns: Option<Dns>,
    /// `health`: the device health probe, defaults filled in.
    pub health: Option<Health>,
    /// `virtualAddresses`: at most one IPv4 and one IPv6 address inside
    /// the interface's subnets that devices dial for the reverse forwards;
    /// edgelinkd holds them on one attachment at a time.
    pub virtual_addresses: Vec<IpAddr>,
}

/// Settings that must be read even from a config that is otherwise bad
/// (DEL with a stripped config, logging set-up).
#[derive(Debug, Clone)]
pub struct Basics {
    /// The node's state directory ([`crate::node::state_dir`]): a config's
    /// `stateDir` never moves it. DEL works there whatever the config says
    /// (a `stateDir` that ADD refused named nothing that ADD made).
    pub state_dir: PathBuf,
    pub log_file: Option<String>,
    pub log_level: Option<String>,
}

pub fn basics(raw: &Value) -> Basics {
    let s = |k: &str| raw.get(k).and_then(Value::as_str).map(str::to_string);
    let state_dir = crate::node::state_dir();
    if let Some(v) = s("stateDir").filter(|v| !crate::node::same_dir(v, &state_dir)) {
        tracing::warn!(stateDir = %v, node = %state_dir.display(), "the config's stateDir is not this node's state directory: ignored");
    }
    Basics {
        state_dir,
        log_file: s("logFile").filter(|p| !p.is_empty()),
        log_level: s("logLevel"),
    }
}

fn bad(field: &str, value: &Value, reason: &str) -> PluginError {
    PluginError::Cni(CniError::new(
        codes::INVALID_CONFIG,
        format!("{field}: {value} {reason}"),
    ))
}

/// A required key that is not there: `forwards[0].port: is missing`.
fn missing(field: &str, why: &str) -> PluginError {
    PluginError::Cni(CniError::new(
        codes::INVALID_CONFIG,
        format!("{field}: is missing{why}"),
    ))
}

fn get_str<'a>(o: &'a Map<String, Value>, field: &str) -> Result<Option<&'a str>, PluginError> {
    match o.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(bad(field, v, "is not a string")),
    }
}

fn get_bool(o: &Map<String, Value>, field: &str) -> Result<bool, PluginError> {
    match o.get(field) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(bad(field, v, "is not a boolean")),
    }
}

fn get_uint(
    o: &Map<String, Value>,
    field: &str,
    min: u64,
    max: u64,
) -> Result<Option<u64>, PluginError> {
    match o.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(bad(
                field,
                v,
                &format!("is not an integer in {min}..={max}"),
            )),
        },
    }
}

fn ifname_field(o: &Map<String, Value>, field: &str) -> Result<Option<String>, PluginError> {
    match get_str(o, field)? {
        None => Ok(None),
        Some(s) if is_valid_ifname(s) => Ok(Some(s.to_string())),
        Some(s) => Err(bad(
            field,
            &Value::String(s.into()),
            "is not a valid interface name (1 to 15 characters, no '/', ':' or spaces)",
        )),
    }
}

pub fn parse_mac(field: &str, s: &str) -> Result<[u8; 6], PluginError> {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    let mut mac = [0u8; 6];
    let ok = parts.len() == 6
        && parts
            .iter()
            .enumerate()
            .all(|(i, p)| p.len() == 2 && u8::from_str_radix(p, 16).map(|b| mac[i] = b).is_ok());
    if !ok {
        return Err(bad(field, &Value::String(s.into()), "is not a MAC address"));
    }
    if mac[0] & 1 == 1 {
        return Err(bad(
            field,
            &Value::String(s.into()),
            "is a multicast MAC address",
        ));
    }
    Ok(mac)
}

/// `"1.2.3.4"` or `"1.2.3.4/24"` → the address.
/// A requested address: an IP, or an IP with its prefix length
/// (`10.1.2.3/24`, as runtimeConfig.ips usually carries it).
fn parse_requested_ip(field: &str, s: &str) -> Result<IpAddr, PluginError> {
    let parsed = if s.contains('/') {
        s.parse::<ipnetwork::IpNetwork>().map(|n| n.ip()).ok()
    } else {
        s.parse::<IpAddr>().ok()
    };
    parsed.ok_or_else(|| bad(field, &Value::String(s.into()), "is not an IP address"))
}

/// This node's name for per-node ranges.
pub fn node_name(ipam: &Value, state_dir: &std::path::Path) -> String {
    if let Some(n) = edgelink_ipam::config::node_name_override(ipam) {
        return n;
    }
    if let Ok(n) = std::fs::read_to_string(state_dir.join("node-name")) {
        let n = n.trim();
        if !n.is_empty() {
            return n.to_string();
        }
    }
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default()
}

fn parse_cidr_list(
    o: &Map<String, Value>,
    field: &str,
) -> Result<Option<Vec<IpNetwork>>, PluginError> {
    cidr_list(o, field, field)
}

/// `o[key]` as a list of CIDRs; `field` names it in errors.
fn cidr_list(
    o: &Map<String, Value>,
    field: &str,
    key: &str,
) -> Result<Option<Vec<IpNetwork>>, PluginError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str()
                    .and_then(|s| s.parse::<IpNetwork>().ok())
                    .ok_or_else(|| bad(&format!("{field}[{i}]"), v, "is not a CIDR"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(v) => Err(bad(field, v, "is not an array of CIDRs")),
    }
}

impl Config {
    /// Validate everything ADD, CHECK and STATUS need, on this node (its
    /// state directory: [`crate::node::state_dir`]).
    pub fn parse(net: NetConf, env: &Env) -> Result<Config, PluginError> {
        Self::parse_in(net, env, crate::node::state_dir())
    }

    /// As [`Config::parse`], for a node whose state directory is `node_dir`:
    /// a `stateDir` in the config must name it (code 7 naming both).
    pub fn parse_in(net: NetConf, env: &Env, node_dir: PathBuf) -> Result<Config, PluginError> {
        let Value::Object(o) = &net.raw else {
            unreachable!("NetConf::parse only accepts objects")
        };
        if net.plugin_type != "edgelink" {
            return Err(bad(
                "type",
                &Value::String(net.plugin_type.clone()),
                "is not \"edgelink\"",
            ));
        }
        // Ignored, as CNI wants, but never silently: a misspelt key gives
        // another network than the one meant.
        for u in keys::unknown_keys(&net.raw) {
            tracing::warn!("{u}");
        }
        let uplink = ifname_field(o, "uplink")?;
        let mode = match get_str(o, "mode")?.unwrap_or("bridge") {
            "bridge" => {
                if let Some(v) = o.get("macvlanMode") {
                    if !v.is_null() {
                        return Err(bad("macvlanMode", v, "is only valid with mode \"macvlan\""));
                    }
                }
                let vlan = get_uint(o, "vlan", 1, 4094)?.map(|v| v as u16);
                Mode::Bridge(BridgeConf {
                    name: ifname_field(o, "bridge")?.unwrap_or_else(|| DEFAULT_BRIDGE.to_string()),
                    uplink,
                    move_uplink_addresses: get_bool(o, "moveUplinkAddresses")?,
                    is_gateway: get_bool(o, "isGateway")?,
                    hairpin: get_bool(o, "hairpinMode")?,
                    vlan,
                })
            }
            "macvlan" => {
                for k in ["isGateway", "hairpinMode", "vlan", "moveUplinkAddresses"] {
                    if let Some(v) = o
                        .get(k)
                        .filter(|v| !v.is_null() && **v != Value::Bool(false))
                    {
                        return Err(bad(k, v, "is only valid with mode \"bridge\""));
                    }
                }
                let Some(uplink) = uplink else {
                    return Err(missing(
                        "uplink",
                        " (mode \"macvlan\" needs one: the macvlan master)",
                    ));
                };
                let mode = match get_str(o, "macvlanMode")?.unwrap_or("bridge") {
                    "bridge" => MacvlanMode::Bridge,
                    "private" => MacvlanMode::Private,
                    "vepa" => MacvlanMode::Vepa,
                    "passthru" => MacvlanMode::Passthru,
                    other => {
                        return Err(bad(
                            "macvlanMode",
                            &Value::String(other.into()),
                            "is not one of bridge, private, vepa, passthru",
                        ))
                    }
                };
                Mode::Macvlan(MacvlanConf { uplink, mode })
            }
            other => {
                return Err(bad(
                    "mode",
                    &Value::String(other.into()),
                    "is not \"bridge\" or \"macvlan\"",
                ))
            }
        };
        let mtu = get_uint(o, "mtu", 68, 65535)?.map(|m| m as u32);
        if let Some(level) = get_str(o, "logLevel")? {
            if !["error", "warn", "info", "debug", "trace"].contains(&level) {
                return Err(bad(
                    "logLevel",
                    &Value::String(level.into()),
                    "is not one of error, warn, info, debug, trace",
                ));
            }
        }
        if let Some(s) = get_str(o, "stateDir")? {
            crate::node::check_state_dir(s, &node_dir)?;
        }
        let state_dir = node_dir;

        // MAC: runtimeConfig.mac (capability), then CNI_ARGS MAC=, then `mac`.
        let mut mac = match get_str(o, "mac")? {
            Some(s) => Some(parse_mac("mac", s)?),
            None => None,
        };
        if let Some(s) = env.args.mac() {
            mac = Some(parse_mac("CNI_ARGS MAC", s)?);
        }
        if net.has_capability("mac") {
            if let Some(v) = net.runtime_config.get("mac") {
                match v.as_str() {
                    Some(s) => mac = Some(parse_mac("runtimeConfig.mac", s)?),
                    None => return Err(bad("runtimeConfig.mac", v, "is not a string")),
                }
            }
        }

        // Requested IPs: runtimeConfig.ips (capability), args.cni.ips, CNI_ARGS IP=.
        let mut requested_ips = Vec::new();
        if net.has_capability("ips") {
            if let Some(v) = net.runtime_config.get("ips") {
                let Some(a) = v.as_array() else {
                    return Err(bad("runtimeConfig.ips", v, "is not an array"));
                };
                for (i, x) in a.iter().enumerate() {
                    let f = format!("runtimeConfig.ips[{i}]");
                    let s = x.as_str().ok_or_else(|| bad(&f, x, "is not a string"))?;
                    requested_ips.push(parse_requested_ip(&f, s)?);
                }
            }
        }
        if requested_ips.is_empty() {
            if let Some(v) = net.args.get("cni").and_then(|c| c.get("ips")) {
                let Some(a) = v.as_array() else {
                    return Err(bad("args.cni.ips", v, "is not an array"));
                };
                for (i, x) in a.iter().enumerate() {
                    let f = format!("args.cni.ips[{i}]");
                    let s = x.as_str().ok_or_else(|| bad(&f, x, "is not a string"))?;
                    requested_ips.push(parse_requested_ip(&f, s)?);
                }
            }
        }
        if requested_ips.is_empty() {
            for s in env.args.ips() {
                requested_ips.push(parse_requested_ip("CNI_ARGS IP", s)?);
            }
        }

        let ipam = match o.get("ipam") {
            None | Some(Value::Null) => Ipam::None,
            Some(Value::Object(io)) => match io.get("type") {
                None | Some(Value::Null) => {
                    Ipam::Builtin(Box::new(builtin_ipam(&net.raw["ipam"], &state_dir)?))
                }
                Some(Value::String(t)) if t == "edgelink" || t.is_empty() => {
                    Ipam::Builtin(Box::new(builtin_ipam(&net.raw["ipam"], &state_dir)?))
                }
                Some(Value::String(t)) => {
                    crate::delegate::validate_plugin_name(t)?;
                    Ipam::Delegated { plugin: t.clone() }
                }
                Some(v) => return Err(bad("ipam.type", v, "is not a string")),
            },
            Some(v) => return Err(bad("ipam", v, "is not an object")),
        };
        if !requested_ips.is_empty() && matches!(ipam, Ipam::None) {
            return Err(bad(
                "runtimeConfig.ips",
                &Value::String(format!("{requested_ips:?}")),
                "cannot be honoured without ipam",
            ));
        }

        let forwards = parse_forwards(o)?;
        let allowed_targets = parse_cidr_list(o, "allowedTargets")?;
        let health = parse_health(o, &forwards)?;
        let reverse = parse_reverse(o, &forwards)?;
        let virtual_addresses = parse_virtual(o, &reverse)?;
        let allow_foreign_sources = get_bool(o, "allowForeignSources")?;
        let dns = parse_dns(
            o,
            net.has_capability("dns")
                .then(|| net.runtime_config.get("dns"))
                .flatten(),
        )?;
        let cfg = Config {
            net,
            mode,
            mtu,
            mac,
            state_dir,
            ipam,
            requested_ips,
            forwards,
            allowed_targets,
            reverse,
            allow_foreign_sources,
            dns,
            health,
            virtual_addresses,
        };
        // With the built-in IPAM the subnets are known now: check targets
        // before anything is touched. Delegated IPAM is checked after ADD.
        if let Ipam::Builtin(ic) = &cfg.ipam {
            cfg.check_targets(&ic.subnets())?;
            cfg.check_reverse(&ic.subnets())?;
            cfg.check_virtual(&ic.subnets(), &[])?;
        } else if let Some(explicit) = &cfg.allowed_targets {
            cfg.check_targets(explicit)?;
        }
        Ok(cfg)
    }

    /// The networks forwards may reach: explicit `allowedTargets`, else `own`.
    pub fn allowed(&self, own: &[IpNetwork]) -> Vec<IpNetwork> {
        match &self.allowed_targets {
            Some(a) => a.clone(),
            None => own
                .iter()
                .map(|n| IpNetwork::new(n.network(), n.prefix()).unwrap_or(*n))
                .collect(),
        }
    }

    /// Every forward's target, and the health probe's, must lie inside the
    /// allowed networks.
    pub fn check_targets(&self, own: &[IpNetwork]) -> Result<(), PluginError> {
        let allowed = self.allowed(own);
        let targets = self
            .forwards
            .iter()
            .enumerate()
            .map(|(i, f)| {
                (
                    format!("forwards[{i}].target"),
                    f.target_allowed(&allowed),
                    f.target.to_string(),
                )
            })
            .chain(self.health.iter().map(|h| {
                (
                    "health.target".to_string(),
                    h.target.allowed(&allowed),
                    h.target.to_string(),
                )
            }));
        for (field, inside, target) in targets {
            if !inside {
                let list: Vec<String> = allowed.iter().map(|n| n.to_string()).collect();
                return Err(bad(
                    &field,
                    &Value::String(target),
                    &format!(
                        "is outside the allowed targets [{}] ({})",
                        list.join(", "),
                        if self.allowed_targets.is_some() {
                            "allowedTargets"
                        } else {
                            "the attachment's own subnets; set allowedTargets to widen"
                        }
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Every reverse forward must have an address to listen on, sources
    /// inside the segment (unless `allowForeignSources`) and a target
    /// outside it.
    pub fn check_reverse(&self, own: &[IpNetwork]) -> Result<(), PluginError> {
        check_reverse(&self.reverse_for(own), own, self.allow_foreign_sources)
    }

    /// The reverse forwards as the record keeps them: sources the config
    /// leaves out are the interface's subnets (`own`).
    pub fn reverse_for(&self, own: &[IpNetwork]) -> Vec<Reverse> {
        let subnets: Vec<IpNetwork> = own
            .iter()
            .map(|n| IpNetwork::new(n.network(), n.prefix()).unwrap_or(*n))
            .collect();
        self.reverse
            .iter()
            .map(|r| {
                let mut r = r.clone();
                if r.allowed_sources.is_empty() {
                    r.allowed_sources = subnets.clone();
                }
                r
            })
            .collect()
    }

    pub fn uplink(&self) -> Option<&str> {
        match &self.mode {
            Mode::Bridge(b) => b.uplink.as_deref(),
            Mode::Macvlan(m) => Some(&m.uplink),
        }
    }
}

fn builtin_ipam(ipam: &Value, state_dir: &std::path::Path) -> Result<IpamConfig, PluginError> {
    let node = node_name(ipam, state_dir);
    IpamConfig::from_json(ipam, &node)
        .map_err(|e| PluginError::Cni(CniError::new(codes::INVALID_CONFIG, e.to_string())))
}

#[cfg(test)]
mod tests;
