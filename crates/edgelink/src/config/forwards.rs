//! `forwards[]`: the ports in the pod relayed to devices, validated into
//! the records' [`Forward`]s.

use super::{
    bad, get_uint, missing, DEFAULT_CONNECT_TIMEOUT_MS, MAX_CONNECTIONS, MAX_CONNECT_RETRIES,
    MAX_IDLE_TIMEOUT_MS, MAX_QUEUE_TIMEOUT_MS,
};
use crate::error::PluginError;
use edgelink_attachment::{Forward, ForwardPath, ModbusMux, Protocol, ProxyProtocol};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::net::SocketAddr;

/// The keys every entry of `forwards[]` and `reverse[]` has: `name`,
/// `protocol`, `port`. `list` names the array in errors.
pub(super) struct Head {
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
}

pub(super) fn head(list: &str, i: usize, fo: &Map<String, Value>) -> Result<Head, PluginError> {
    let at = |k: &str| format!("{list}[{i}].{k}");
    let name = match fo.get("name") {
        Some(Value::String(s)) => s.clone(),
        Some(v) => return Err(bad(&at("name"), v, "is not a string")),
        None => return Err(missing(&at("name"), "")),
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
        None => return Err(missing(&at("port"), "")),
    };
    Ok(Head {
        name,
        protocol,
        port,
    })
}

/// The relay's settings of one entry: the connect timeout, and the TCP
/// bounds (idle timeout, connection cap, queue, retries, PROXY header).
pub(super) struct RelayKeys {
    pub connect_timeout_ms: u64,
    pub idle_timeout_ms: Option<u64>,
    pub max_connections: Option<u32>,
    pub queue_timeout_ms: Option<u64>,
    pub connect_retries: Option<u32>,
    pub proxy_protocol: Option<ProxyProtocol>,
}

/// The TCP-only keys: refused with UDP, and with the kernel path.
pub(super) const TCP_KEYS: [&str; 5] = [
    "idleTimeoutMs",
    "maxConnections",
    "queueTimeoutMs",
    "connectRetries",
    "proxyProtocol",
];

/// `what` names the entry in errors: `forward "api"`, `reverse "mqtt"`.
pub(super) fn relay_keys(
    at: &dyn Fn(&str) -> String,
    what: &str,
    protocol: Protocol,
    fo: &Map<String, Value>,
) -> Result<RelayKeys, PluginError> {
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
    for k in TCP_KEYS {
        match fo.get(k) {
            Some(v) if !v.is_null() && protocol != Protocol::Tcp => {
                return Err(bad(
                    &at(k),
                    v,
                    &format!("({what}) is only valid with protocol tcp"),
                ))
            }
            _ => {}
        }
    }
    let queue_timeout_ms =
        get_uint(fo, "queueTimeoutMs", 1, MAX_QUEUE_TIMEOUT_MS).map_err(|_| {
            bad(
                &at("queueTimeoutMs"),
                fo.get("queueTimeoutMs").unwrap_or(&Value::Null),
                &format!("({what}) is not an integer in 1..={MAX_QUEUE_TIMEOUT_MS}"),
            )
        })?;
    let connect_retries = get_uint(fo, "connectRetries", 0, MAX_CONNECT_RETRIES)
        .map_err(|_| {
            bad(
                &at("connectRetries"),
                fo.get("connectRetries").unwrap_or(&Value::Null),
                &format!("({what}) is not an integer in 0..={MAX_CONNECT_RETRIES}"),
            )
        })?
        .map(|n| n as u32);
    let proxy_protocol = match fo.get("proxyProtocol") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s == "v1" => Some(ProxyProtocol::V1),
        Some(Value::String(s)) if s == "v2" => Some(ProxyProtocol::V2),
        Some(v) => {
            return Err(bad(
                &at("proxyProtocol"),
                v,
                &format!("({what}) is not \"v1\" or \"v2\""),
            ))
        }
    };
    let idle_timeout_ms = match get_uint(fo, "idleTimeoutMs", 0, MAX_IDLE_TIMEOUT_MS) {
        Ok(Some(ms)) if ms > 0 && ms < 1000 => Err(()),
        Ok(v) => Ok(v),
        Err(_) => Err(()),
    }
    .map_err(|_| {
        bad(
            &at("idleTimeoutMs"),
            fo.get("idleTimeoutMs").unwrap_or(&Value::Null),
            &format!("({what}) is not 0 (never) or an integer in 1000..={MAX_IDLE_TIMEOUT_MS}"),
        )
    })?;
    let max_connections = get_uint(fo, "maxConnections", 1, MAX_CONNECTIONS)
        .map_err(|_| {
            bad(
                &at("maxConnections"),
                fo.get("maxConnections").unwrap_or(&Value::Null),
                &format!("({what}) is not an integer in 1..={MAX_CONNECTIONS}"),
            )
        })?
        .map(|n| n as u32);
    Ok(RelayKeys {
        connect_timeout_ms,
        idle_timeout_ms,
        max_connections,
        queue_timeout_ms,
        connect_retries,
        proxy_protocol,
    })
}

pub(super) fn parse_forwards(o: &Map<String, Value>) -> Result<Vec<Forward>, PluginError> {
    let list = match o.get("forwards") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(v) => return Err(bad("forwards", v, "is not an array")),
    };
    let mut out: Vec<Forward> = Vec::new();
    // Each name and (protocol, port) taken, by the entry that took it.
    let mut names = HashMap::new();
    let mut ports = HashMap::new();
    for (i, f) in list.iter().enumerate() {
        let at = |k: &str| format!("forwards[{i}].{k}");
        let Value::Object(fo) = f else {
            return Err(bad(&format!("forwards[{i}]"), f, "is not an object"));
        };
        let Head {
            name,
            protocol,
            port,
        } = head("forwards", i, fo)?;
        if let Some(j) = names.insert(name.clone(), i) {
            return Err(bad(
                &at("name"),
                &Value::String(name),
                &format!("is used by forwards[{j}] too"),
            ));
        }
        if let Some((j, other)) = ports.insert((protocol, port), (i, name.clone())) {
            return Err(bad(
                &at("port"),
                &Value::from(port),
                &format!("({protocol}) is used by forwards[{j}] ({other:?}) too"),
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
            None => return Err(missing(&at("target"), "")),
        };
        if target.port() == 0 || target.ip().is_unspecified() || target.ip().is_multicast() {
            return Err(bad(
                &at("target"),
                &Value::String(target.to_string()),
                "is not a unicast address with a non-zero port",
            ));
        }
        let path = match fo.get("path") {
            None | Some(Value::Null) => ForwardPath::Relay,
            Some(Value::String(s)) if s == "relay" => ForwardPath::Relay,
            Some(Value::String(s)) if s == "kernel" => ForwardPath::Kernel,
            Some(v) => {
                return Err(bad(
                    &at("path"),
                    v,
                    &format!("(forward {name:?}) is not \"relay\" or \"kernel\""),
                ))
            }
        };
        if path == ForwardPath::Kernel {
            // The kernel's NAT has no connection of its own to bound,
            // queue, retry or prefix: those keys need the relay.
            for k in TCP_KEYS {
                if let Some(v) = fo.get(k).filter(|v| !v.is_null()) {
                    return Err(bad(
                        &at(k),
                        v,
                        &format!(
                            "(forward {name:?}) needs the relay: it cannot be set with \"path\": \"kernel\""
                        ),
                    ));
                }
            }
        }
        let what = format!("forward {name:?}");
        let keys = relay_keys(&at, &what, protocol, fo)?;
        let modbus = modbus_keys(&at, &what, protocol, path, keys.proxy_protocol, fo)?;
        out.push(Forward {
            name,
            protocol,
            port,
            target,
            connect_timeout_ms: keys.connect_timeout_ms,
            idle_timeout_ms: keys.idle_timeout_ms,
            max_connections: keys.max_connections,
            queue_timeout_ms: keys.queue_timeout_ms,
            connect_retries: keys.connect_retries,
            proxy_protocol: keys.proxy_protocol,
            path,
            modbus,
        });
    }
    Ok(out)
}

/// `appProtocol`, `multiplex`, `maxInFlight`, `responseTimeoutMs`: a
/// Modbus/TCP forward whose clients share the device's connections. The
/// multiplexing reads every frame, so it needs TCP, the relay, and no
/// PROXY header (the device would take it for a frame).
fn modbus_keys(
    at: &dyn Fn(&str) -> String,
    what: &str,
    protocol: Protocol,
    path: ForwardPath,
    proxy_protocol: Option<ProxyProtocol>,
    fo: &Map<String, Value>,
) -> Result<Option<ModbusMux>, PluginError> {
    let modbus = match fo.get("appProtocol") {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) if s == "modbus-tcp" => true,
        Some(v) => {
            return Err(bad(
                &at("appProtocol"),
                v,
                &format!(
                    "({what}) is not \"modbus-tcp\" (the one application protocol edgelink knows)"
                ),
            ))
        }
    };
    let multiplex = match fo.get("multiplex") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(v) => {
            return Err(bad(
                &at("multiplex"),
                v,
                &format!("({what}) is not true or false"),
            ))
        }
    };
    if !multiplex {
        for k in ["maxInFlight", "responseTimeoutMs"] {
            if let Some(v) = fo.get(k).filter(|v| !v.is_null()) {
                return Err(bad(
                    &at(k),
                    v,
                    &format!("({what}) needs \"multiplex\": true"),
                ));
            }
        }
        return Ok(None);
    }
    let needs = |why: &str| {
        bad(
            &at("multiplex"),
            &Value::Bool(true),
            &format!("({what}) {why}"),
        )
    };
    if !modbus {
        return Err(needs(
            "needs \"appProtocol\": \"modbus-tcp\": only Modbus/TCP is multiplexed",
        ));
    }
    if protocol != Protocol::Tcp || path != ForwardPath::Relay {
        return Err(needs(
            "needs protocol tcp and the relay (not \"path\": \"kernel\")",
        ));
    }
    if proxy_protocol.is_some() {
        return Err(needs(
            "cannot be set with proxyProtocol: the device would read the header as a frame",
        ));
    }
    let max_in_flight = get_uint(fo, "maxInFlight", 1, u64::from(ModbusMux::MAX_IN_FLIGHT))
        .map_err(|_| {
            bad(
                &at("maxInFlight"),
                fo.get("maxInFlight").unwrap_or(&Value::Null),
                &format!(
                    "({what}) is not an integer in 1..={}",
                    ModbusMux::MAX_IN_FLIGHT
                ),
            )
        })?
        .map_or(ModbusMux::DEFAULT_MAX_IN_FLIGHT, |n| n as u32);
    let max = ModbusMux::MAX_RESPONSE_TIMEOUT_MS;
    let response_timeout_ms = get_uint(fo, "responseTimeoutMs", 1, max)
        .map_err(|_| {
            bad(
                &at("responseTimeoutMs"),
                fo.get("responseTimeoutMs").unwrap_or(&Value::Null),
                &format!("({what}) is not an integer in 1..={max}"),
            )
        })?
        .unwrap_or(ModbusMux::DEFAULT_RESPONSE_TIMEOUT_MS);
    Ok(Some(ModbusMux {
        max_in_flight,
        response_timeout_ms,
    }))
}
