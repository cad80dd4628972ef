//! edgelink's own configuration keys, parsed and validated completely before
//! anything on the node is touched. Every error names the key and the value
//! (code 7 unless noted). docs/configuration.md is the user-facing contract.

use crate::error::PluginError;
use edgelink_attachment::{Forward, Protocol};
use edgelink_cni_spec::env::is_valid_ifname;
use edgelink_cni_spec::{codes, CniError, Env, NetConf};
use edgelink_ipam::IpamConfig;
use edgelink_netlink::MacvlanMode;
use ipnetwork::IpNetwork;
use serde_json::{Map, Value};
use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

pub const DEFAULT_STATE_DIR: &str = "/var/lib/edgelink";
pub const DEFAULT_BRIDGE: &str = "edge0";
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 5000;
/// `forwards[].idleTimeoutMs` at most: a week.
pub const MAX_IDLE_TIMEOUT_MS: u64 = 7 * 24 * 3600 * 1000;
/// `forwards[].maxConnections` at most.
pub const MAX_CONNECTIONS: u64 = 1_000_000;

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
}

/// Settings that must be read even from a config that is otherwise bad
/// (DEL with a stripped config, logging set-up).
#[derive(Debug, Clone)]
pub struct Basics {
    pub state_dir: PathBuf,
    pub log_file: Option<String>,
    pub log_level: Option<String>,
}

pub fn basics(raw: &Value) -> Basics {
    let s = |k: &str| raw.get(k).and_then(Value::as_str).map(str::to_string);
    Basics {
        state_dir: s("stateDir")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR)),
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

fn parse_forwards(o: &Map<String, Value>) -> Result<Vec<Forward>, PluginError> {
    let list = match o.get("forwards") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(v) => return Err(bad("forwards", v, "is not an array")),
    };
    let mut out: Vec<Forward> = Vec::new();
    let mut names = HashSet::new();
    let mut ports = HashSet::new();
    for (i, f) in list.iter().enumerate() {
        let at = |k: &str| format!("forwards[{i}].{k}");
        let Value::Object(fo) = f else {
            return Err(bad(&format!("forwards[{i}]"), f, "is not an object"));
        };
        let name = match fo.get("name") {
            Some(Value::String(s)) => s.clone(),
            Some(v) => return Err(bad(&at("name"), v, "is not a string")),
            None => return Err(bad(&at("name"), &Value::Null, "is required")),
        };
        let valid_name = !name.is_empty()
            && name.len() <= 15
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !name.starts_with('-')
            && !name.ends_with('-');
        if !valid_name {
            return Err(bad(
                &at("name"),
                &Value::String(name),
                "is not a valid port name ([a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 15 characters)",
            ));
        }
        if !names.insert(name.clone()) {
            return Err(bad(
                &at("name"),
                &Value::String(name),
                "is used by another forward",
            ));
        }
        let protocol = match fo.get("protocol") {
            None | Some(Value::Null) => Protocol::Tcp,
            Some(Value::String(s)) if s.eq_ignore_ascii_case("tcp") => Protocol::Tcp,
            Some(Value::String(s)) if s.eq_ignore_ascii_case("udp") => Protocol::Udp,
            Some(v) => return Err(bad(&at("protocol"), v, "is not tcp or udp")),
        };
        let port = match get_uint(fo, "port", 1, 65535).map_err(|_| {
            bad(
                &at("port"),
                fo.get("port").unwrap_or(&Value::Null),
                "is not a port (1..=65535)",
            )
        })? {
            Some(p) => p as u16,
            None => return Err(bad(&at("port"), &Value::Null, "is required")),
        };
        if !ports.insert((protocol, port)) {
            return Err(bad(
                &at("port"),
                &Value::from(port),
                &format!("is used by another {protocol} forward"),
            ));
        }
        let target = match fo.get("target") {
            Some(Value::String(s)) => s.parse::<SocketAddr>().map_err(|_| {
                bad(
                    &at("target"),
                    &Value::String(s.clone()),
                    "is not IP:port or [IPv6]:port",
                )
            })?,
            Some(v) => return Err(bad(&at("target"), v, "is not a string")),
            None => return Err(bad(&at("target"), &Value::Null, "is required")),
        };
        if target.port() == 0 || target.ip().is_unspecified() || target.ip().is_multicast() {
            return Err(bad(
                &at("target"),
                &Value::String(target.to_string()),
                "is not a unicast address with a non-zero port",
            ));
        }
        let connect_timeout_ms = get_uint(fo, "connectTimeoutMs", 1, 600_000)
            .map_err(|_| {
                bad(
                    &at("connectTimeoutMs"),
                    fo.get("connectTimeoutMs").unwrap_or(&Value::Null),
                    "is not an integer in 1..=600000",
                )
            })?
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT_MS);
        // The relay's bounds (TCP only): 0 means never; below a second a
        // quiet but healthy session would be cut between two requests.
        let tcp_only = |k: &str| -> Result<(), PluginError> {
            match fo.get(k) {
                Some(v) if !v.is_null() && protocol != Protocol::Tcp => Err(bad(
                    &at(k),
                    v,
                    &format!("(forward {name:?}) is only valid with protocol tcp"),
                )),
                _ => Ok(()),
            }
        };
        tcp_only("idleTimeoutMs")?;
        tcp_only("maxConnections")?;
        let idle_timeout_ms = match get_uint(fo, "idleTimeoutMs", 0, MAX_IDLE_TIMEOUT_MS) {
            Ok(Some(ms)) if ms > 0 && ms < 1000 => Err(()),
            Ok(v) => Ok(v),
            Err(_) => Err(()),
        }
        .map_err(|_| {
            bad(
                &at("idleTimeoutMs"),
                fo.get("idleTimeoutMs").unwrap_or(&Value::Null),
                &format!(
                    "(forward {name:?}) is not 0 (never) or an integer in 1000..={MAX_IDLE_TIMEOUT_MS}"
                ),
            )
        })?;
        let max_connections = get_uint(fo, "maxConnections", 1, MAX_CONNECTIONS)
            .map_err(|_| {
                bad(
                    &at("maxConnections"),
                    fo.get("maxConnections").unwrap_or(&Value::Null),
                    &format!("(forward {name:?}) is not an integer in 1..={MAX_CONNECTIONS}"),
                )
            })?
            .map(|n| n as u32);
        out.push(Forward {
            name,
            protocol,
            port,
            target,
            connect_timeout_ms,
            idle_timeout_ms,
            max_connections,
        });
    }
    Ok(out)
}

fn parse_cidr_list(
    o: &Map<String, Value>,
    field: &str,
) -> Result<Option<Vec<IpNetwork>>, PluginError> {
    match o.get(field) {
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
    /// Validate everything ADD, CHECK and STATUS need.
    pub fn parse(net: NetConf, env: &Env) -> Result<Config, PluginError> {
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
                    return Err(bad(
                        "uplink",
                        &Value::Null,
                        "is required with mode \"macvlan\"",
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
        let state_dir = match get_str(o, "stateDir")? {
            Some(s) if s.starts_with('/') => PathBuf::from(s),
            Some(s) => {
                return Err(bad(
                    "stateDir",
                    &Value::String(s.into()),
                    "is not an absolute path",
                ))
            }
            None => PathBuf::from(DEFAULT_STATE_DIR),
        };

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
        };
        // With the built-in IPAM the subnets are known now: check targets
        // before anything is touched. Delegated IPAM is checked after ADD.
        if let Ipam::Builtin(ic) = &cfg.ipam {
            cfg.check_targets(&ic.subnets())?;
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

    /// Every forward's target must lie inside the allowed networks.
    pub fn check_targets(&self, own: &[IpNetwork]) -> Result<(), PluginError> {
        let allowed = self.allowed(own);
        for (i, f) in self.forwards.iter().enumerate() {
            if !f.target_allowed(&allowed) {
                let list: Vec<String> = allowed.iter().map(|n| n.to_string()).collect();
                return Err(bad(
                    &format!("forwards[{i}].target"),
                    &Value::String(f.target.to_string()),
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
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::HashMap;

    fn env(args: &str) -> Env {
        let m: HashMap<&str, String> = [
            ("CNI_COMMAND", "ADD".to_string()),
            ("CNI_CONTAINERID", "c1".into()),
            ("CNI_IFNAME", "net1".into()),
            ("CNI_NETNS", "/run/netns/x".into()),
            ("CNI_ARGS", args.into()),
        ]
        .into_iter()
        .collect();
        Env::from_lookup(|k| m.get(k).cloned()).unwrap()
    }

    fn base() -> Value {
        json!({
            "cniVersion": "1.0.0", "name": "plant-floor", "type": "edgelink",
            "mode": "bridge", "bridge": "edge0", "uplink": "eth1",
            "stateDir": "/tmp/elk-config-test",
            "ipam": {"ranges": [[{"subnet": "172.17.16.0/24", "rangeStart": "172.17.16.200",
                     "rangeEnd": "172.17.16.250", "gateway": "172.17.16.1"}]], "nodeName": "n1"},
            "forwards": [
                {"name": "api", "protocol": "tcp", "port": 8080, "target": "172.17.16.120:8080"},
                {"name": "telemetry", "protocol": "udp", "port": 5000, "target": "172.17.16.120:5000"}
            ]
        })
    }

    fn parse(v: &Value, args: &str) -> Result<Config, CniError> {
        let net = NetConf::parse(v.to_string().as_bytes())?;
        Config::parse(net, &env(args)).map_err(|e| e.into_cni())
    }

    fn err(v: &Value) -> CniError {
        parse(v, "").unwrap_err()
    }

    #[test]
    fn parses_the_design_example() {
        let c = parse(&base(), "").unwrap();
        assert!(
            matches!(&c.mode, Mode::Bridge(b) if b.name == "edge0" && b.uplink.as_deref() == Some("eth1"))
        );
        assert_eq!(c.forwards.len(), 2);
        assert_eq!(c.forwards[1].protocol, Protocol::Udp);
        assert_eq!(c.forwards[0].connect_timeout_ms, 5000);
        assert!(matches!(c.ipam, Ipam::Builtin(_)));
    }

    #[test]
    fn unknown_mode_names_the_value() {
        let mut v = base();
        v["mode"] = json!("ipvlan");
        let e = err(&v);
        assert_eq!(e.code, 7);
        assert!(e.msg.contains("mode") && e.msg.contains("ipvlan"), "{e}");
    }

    #[test]
    fn target_outside_subnets_is_refused_unless_allowed() {
        let mut v = base();
        v["forwards"][0]["target"] = json!("10.0.0.5:80");
        let e = err(&v);
        assert_eq!(e.code, 7);
        assert!(
            e.msg.contains("forwards[0].target") && e.msg.contains("10.0.0.5:80"),
            "{e}"
        );
        v["allowedTargets"] = json!(["10.0.0.0/8", "172.17.16.0/24"]);
        assert!(parse(&v, "").is_ok());
        v["allowedTargets"] = json!(["172.17.16.0/24"]);
        assert_eq!(err(&v).code, 7);
        v["allowedTargets"] = json!(["nope"]);
        assert!(err(&v).msg.contains("allowedTargets[0]"));
    }

    #[test]
    fn forward_validation() {
        for (k, val, needle) in [
            ("name", json!("API"), "forwards[0].name"),
            ("protocol", json!("sctp"), "sctp"),
            ("port", json!(0), "forwards[0].port"),
            ("port", json!(70000), "forwards[0].port"),
            ("target", json!("172.17.16.120"), "forwards[0].target"),
            ("target", json!("172.17.16.120:0"), "forwards[0].target"),
        ] {
            let mut v = base();
            v["forwards"][0][k] = val;
            let e = err(&v);
            assert_eq!(e.code, 7, "{k}");
            assert!(e.msg.contains(needle), "{k}: {e}");
        }
        let mut v = base();
        v["forwards"][1]["name"] = json!("api");
        assert!(err(&v).msg.contains("another forward"));
        let mut v = base();
        v["forwards"][1]["protocol"] = json!("tcp");
        v["forwards"][1]["port"] = json!(8080);
        assert!(err(&v).msg.contains("another tcp forward"));
    }

    #[test]
    fn macvlan_needs_uplink_and_valid_mode() {
        let mut v = base();
        v["mode"] = json!("macvlan");
        v.as_object_mut().unwrap().remove("uplink");
        assert!(err(&v).msg.contains("uplink"));
        v["uplink"] = json!("eth1");
        v["macvlanMode"] = json!("bogus");
        assert!(err(&v).msg.contains("bogus"));
        v["macvlanMode"] = json!("passthru");
        assert!(
            matches!(parse(&v, "").unwrap().mode, Mode::Macvlan(m) if m.mode == MacvlanMode::Passthru)
        );
        v["isGateway"] = json!(true);
        assert!(err(&v).msg.contains("isGateway"));
    }

    #[test]
    fn mac_and_ips_from_every_source() {
        let mut v = base();
        v["mac"] = json!("02:00:00:00:00:01");
        let c = parse(
            &v,
            "IgnoreUnknown=1;MAC=02:00:00:00:00:02;IP=172.17.16.210/24",
        )
        .unwrap();
        assert_eq!(c.mac, Some([2, 0, 0, 0, 0, 2]));
        assert_eq!(
            c.requested_ips,
            vec!["172.17.16.210".parse::<IpAddr>().unwrap()]
        );
        v["capabilities"] = json!({"mac": true, "ips": true});
        v["runtimeConfig"] = json!({"mac": "02:00:00:00:00:03", "ips": ["172.17.16.211/24"]});
        let c = parse(&v, "MAC=02:00:00:00:00:02;IP=172.17.16.210").unwrap();
        assert_eq!(c.mac, Some([2, 0, 0, 0, 0, 3]));
        assert_eq!(
            c.requested_ips,
            vec!["172.17.16.211".parse::<IpAddr>().unwrap()]
        );
        v["runtimeConfig"]["mac"] = json!("01:00:00:00:00:00");
        assert!(err(&v).msg.contains("multicast"));
        v["runtimeConfig"]["mac"] = json!("zz");
        assert!(err(&v).msg.contains("runtimeConfig.mac"));
    }

    #[test]
    fn delegated_ipam_and_scalar_checks() {
        let mut v = base();
        v["ipam"] = json!({"type": "host-local", "ranges": [[{"subnet": "172.17.16.0/24"}]]});
        assert!(
            matches!(parse(&v, "").unwrap().ipam, Ipam::Delegated { plugin } if plugin == "host-local")
        );
        v["ipam"]["type"] = json!("../../bin/sh");
        assert!(err(&v).msg.contains("ipam.type"));
        let mut v = base();
        v["mtu"] = json!(10);
        assert!(err(&v).msg.contains("mtu"));
        let mut v = base();
        v["vlan"] = json!(5000);
        assert!(err(&v).msg.contains("vlan"));
        let mut v = base();
        v["bridge"] = json!("this-name-is-too-long");
        assert!(err(&v).msg.contains("bridge"));
        let mut v = base();
        v["stateDir"] = json!("relative/dir");
        assert!(err(&v).msg.contains("stateDir"));
        let mut v = base();
        v["type"] = json!("bridge");
        assert!(err(&v).msg.contains("type"));
    }

    #[test]
    fn requested_ips_take_an_address_with_or_without_its_prefix() {
        assert_eq!(
            parse_requested_ip("ips", "172.17.16.5").unwrap(),
            "172.17.16.5".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            parse_requested_ip("ips", "172.17.16.5/24").unwrap(),
            "172.17.16.5".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            parse_requested_ip("ips", "fd00::5/64").unwrap(),
            "fd00::5".parse::<IpAddr>().unwrap()
        );
        for bad in ["172.17.16.5/garbage", "172.17.16.5/33", "nope", ""] {
            assert!(parse_requested_ip("ips", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn forward_bounds_are_validated_and_name_the_forward() {
        let mut v = base();
        v["forwards"][0]["idleTimeoutMs"] = json!(0);
        v["forwards"][0]["maxConnections"] = json!(3);
        let c = parse(&v, "").unwrap();
        assert_eq!(c.forwards[0].idle_timeout_ms, Some(0));
        assert_eq!(c.forwards[0].max_connections, Some(3));
        // Absent: the daemon's defaults.
        assert_eq!(c.forwards[1].idle_timeout_ms, None);
        assert_eq!(c.forwards[1].max_connections, None);
        let mut v = base();
        v["forwards"][0]["idleTimeoutMs"] = json!(MAX_IDLE_TIMEOUT_MS);
        v["forwards"][0]["maxConnections"] = json!(MAX_CONNECTIONS);
        assert!(parse(&v, "").is_ok());

        for (key, value) in [
            ("idleTimeoutMs", json!(999)),
            ("idleTimeoutMs", json!(-1)),
            ("idleTimeoutMs", json!(MAX_IDLE_TIMEOUT_MS + 1)),
            ("idleTimeoutMs", json!("60000")),
            ("idleTimeoutMs", json!(1.5)),
            ("maxConnections", json!(0)),
            ("maxConnections", json!(MAX_CONNECTIONS + 1)),
            ("maxConnections", json!(true)),
        ] {
            let mut v = base();
            v["forwards"][0][key] = value.clone();
            let e = err(&v);
            assert_eq!(e.code, 7, "{key}={value}: {e}");
            assert!(
                e.msg.contains(&format!("forwards[0].{key}")) && e.msg.contains("\"api\""),
                "{key}={value}: {e}"
            );
        }
        // UDP has sessions, not connections: the keys are refused there.
        for key in ["idleTimeoutMs", "maxConnections"] {
            let mut v = base();
            v["forwards"][1][key] = json!(5000);
            let e = err(&v);
            assert_eq!(e.code, 7);
            assert!(
                e.msg.contains(&format!("forwards[1].{key}")) && e.msg.contains("telemetry"),
                "{e}"
            );
        }
    }
}
