//! `reverse[]`: ports on the edgelink interface that devices dial,
//! relayed into the cluster, validated into the records' [`Reverse`]s.
//!
//! What can be checked from the config alone is checked here (names,
//! ports against the forwards' and each other's, targets); what needs the
//! interface's subnets (sources, loops) is [`check_reverse`], run as soon
//! as they are known.

use super::forwards::{head, relay_keys, Head};
use super::{bad, cidr_list, missing};
use crate::error::PluginError;
use edgelink_attachment::{Dns, Forward, Reverse, Target};
use ipnetwork::IpNetwork;
use serde_json::{Map, Value};

/// `reverse[]` as written: `allowed_sources` empty where the config gives
/// none (the interface's subnets, filled in by [`Config::reverse_for`]).
pub(super) fn parse_reverse(
    o: &Map<String, Value>,
    forwards: &[Forward],
) -> Result<Vec<Reverse>, PluginError> {
    let list = match o.get("reverse") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(v) => return Err(bad("reverse", v, "is not an array")),
    };
    let mut out: Vec<Reverse> = Vec::new();
    for (i, r) in list.iter().enumerate() {
        let at = |k: &str| format!("reverse[{i}].{k}");
        let Value::Object(ro) = r else {
            return Err(bad(&format!("reverse[{i}]"), r, "is not an object"));
        };
        let Head {
            name,
            protocol,
            port,
        } = head("reverse", i, ro)?;
        // Names key the status and the metrics of both directions.
        if let Some(j) = forwards.iter().position(|f| f.name == name) {
            return Err(bad(
                &at("name"),
                &Value::String(name),
                &format!("is used by forwards[{j}]"),
            ));
        }
        if let Some(j) = out.iter().position(|r| r.name == name) {
            return Err(bad(
                &at("name"),
                &Value::String(name),
                &format!("is used by reverse[{j}]"),
            ));
        }
        // A forward listens on every address of the pod, the interface's
        // too: the same port and protocol cannot be both.
        if let Some(j) = forwards
            .iter()
            .position(|f| f.port == port && f.protocol == protocol)
        {
            return Err(bad(
                &at("port"),
                &Value::from(port),
                &format!(
                    "(reverse {name:?}) collides with forwards[{j}] ({:?}, {protocol} {port})",
                    forwards[j].name
                ),
            ));
        }
        if let Some(j) = out
            .iter()
            .position(|r| r.port == port && r.protocol == protocol)
        {
            return Err(bad(
                &at("port"),
                &Value::from(port),
                &format!(
                    "(reverse {name:?}) collides with reverse[{j}] ({:?}, {protocol} {port})",
                    out[j].name
                ),
            ));
        }
        let target: Target = match ro.get("target") {
            Some(Value::String(s)) => s.parse().map_err(|e| {
                bad(
                    &at("target"),
                    &Value::String(s.clone()),
                    &format!("(reverse {name:?}) {e}"),
                )
            })?,
            Some(v) => return Err(bad(&at("target"), v, "is not a string")),
            None => return Err(missing(&at("target"), "")),
        };
        if let Some(v) = ro.get("path").filter(|v| !v.is_null()) {
            if v != "relay" {
                return Err(bad(
                    &at("path"),
                    v,
                    &format!("(reverse {name:?}) is not \"relay\": reverse forwards are relayed"),
                ));
            }
        }
        let sources = cidr_list(ro, &at("allowedSources"), "allowedSources")?;
        if sources.as_ref().is_some_and(|s| s.is_empty()) {
            return Err(bad(
                &at("allowedSources"),
                &Value::Array(Vec::new()),
                &format!("(reverse {name:?}) is empty: no device could connect; leave it out for the interface's subnets"),
            ));
        }
        let what = format!("reverse {name:?}");
        let keys = relay_keys(&at, &what, protocol, ro)?;
        out.push(Reverse {
            name,
            protocol,
            port,
            target,
            allowed_sources: sources.unwrap_or_default(),
            connect_timeout_ms: keys.connect_timeout_ms,
            idle_timeout_ms: keys.idle_timeout_ms,
            max_connections: keys.max_connections,
            queue_timeout_ms: keys.queue_timeout_ms,
            connect_retries: keys.connect_retries,
            proxy_protocol: keys.proxy_protocol,
        });
    }
    Ok(out)
}

/// The resolver settings for reverse targets that are names: the
/// runtime's `runtimeConfig.dns` (the `dns` capability), else the network
/// config's own `dns` (both the CNI `dns` dictionary).
pub(super) fn parse_dns(
    o: &Map<String, Value>,
    runtime: Option<&Value>,
) -> Result<Option<Dns>, PluginError> {
    let (field, v) = match (runtime, o.get("dns")) {
        (Some(v), _) if !v.is_null() => ("runtimeConfig.dns", v),
        (_, Some(v)) if !v.is_null() => ("dns", v),
        _ => return Ok(None),
    };
    let dns: Dns = serde_json::from_value(v.clone())
        .map_err(|e| bad(field, v, &format!("is not a CNI dns dictionary: {e}")))?;
    for (i, s) in dns.nameservers.iter().enumerate() {
        if s.parse::<std::net::IpAddr>().is_err() {
            return Err(bad(
                &format!("{field}.nameservers[{i}]"),
                &Value::String(s.clone()),
                "is not an IP address",
            ));
        }
    }
    Ok((dns != Dns::default()).then_some(dns))
}

/// Why a reverse forward cannot be served on an interface with `own`
/// addresses: no address to listen on, a source outside the segment
/// (unless `allow_foreign`), a target inside it (a loop).
pub(super) fn check_reverse(
    reverse: &[Reverse],
    own: &[IpNetwork],
    allow_foreign: bool,
) -> Result<(), PluginError> {
    let subnets: Vec<IpNetwork> = own
        .iter()
        .map(|n| IpNetwork::new(n.network(), n.prefix()).unwrap_or(*n))
        .collect();
    let list = || {
        subnets
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    for (i, r) in reverse.iter().enumerate() {
        if own.is_empty() {
            return Err(bad(
                &format!("reverse[{i}]"),
                &Value::String(r.name.clone()),
                "needs an address on the interface to listen on, and this attachment has none (ipam)",
            ));
        }
        if let Some(a) = r.target.addr() {
            if let Some(n) = subnets.iter().find(|n| n.contains(a.ip())) {
                return Err(bad(
                    &format!("reverse[{i}].target"),
                    &Value::String(a.to_string()),
                    &format!(
                        "(reverse {:?}) is inside the interface's own subnet {n}: devices would be relayed back onto their segment (a loop)",
                        r.name
                    ),
                ));
            }
        }
        if !allow_foreign {
            for (k, s) in r.allowed_sources.iter().enumerate() {
                let inside = subnets
                    .iter()
                    .any(|n| n.contains(s.network()) && n.prefix() <= s.prefix());
                if !inside {
                    return Err(bad(
                        &format!("reverse[{i}].allowedSources[{k}]"),
                        &Value::String(s.to_string()),
                        &format!(
                            "(reverse {:?}) is outside the interface's subnets [{}]; set allowForeignSources to allow it",
                            r.name,
                            list()
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}
