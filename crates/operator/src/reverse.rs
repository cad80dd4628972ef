//! `Device.spec.reverse`, devices on the segment calling cluster Services
//! through the proxy pod: each entry's target resolved against the
//! Services it names (`resolve`), the plugin's `reverse` entries made of
//! it (`plugin_entries`), the checks the plugin would make at ADD
//! (`check_spec`, `check_placement`), and each entry's status from
//! edgelinkd's report (`status`). Pure functions: the controller fetches
//! the Services and applies what comes out; nothing here talks to the API.
//! Reverse ports never go into the Device's Service (they are for devices
//! on the segment only).

use crate::crd::{Device, DeviceReverse, EdgeNetwork, Protocol, ReverseStatus, ServiceRef};
use crate::crd::{MAX_CONNECTIONS, MAX_CONNECT_RETRIES, MAX_IDLE_TIMEOUT_MS, MAX_QUEUE_TIMEOUT_MS};
use crate::reported::ReportAttachment;
use crate::target::target;
use crate::verdict::Verdict;
use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// The Services a Device's reverse entries name, by (namespace, name), as
/// the controller found them (absent: no such Service).
pub type Services = BTreeMap<(String, String), Service>;

/// Why an entry has no target: its reason (a condition's) and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unresolved {
    /// `ServiceNotFound` or `ServicePortNotFound`.
    pub reason: &'static str,
    pub message: String,
}

/// One reverse entry's target as rendered, or why it is left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub name: String,
    /// `namespace/name`, when the entry names a Service.
    pub service: Option<String>,
    pub target: Result<String, Unresolved>,
}

/// `(namespace, name)` of the Service `s` names, for Device `d`.
pub fn service_key(d: &Device, s: &ServiceRef) -> (String, String) {
    let ns = s
        .namespace
        .clone()
        .or_else(|| d.metadata.namespace.clone())
        .unwrap_or_default();
    (ns, s.name.clone())
}

/// The Services `d`'s reverse entries name.
pub fn service_keys(d: &Device) -> Vec<(String, String)> {
    let mut keys: Vec<_> = d
        .spec
        .reverse
        .iter()
        .filter_map(|r| r.service.as_ref().map(|s| service_key(d, s)))
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// Each entry of `d.spec.reverse`, in order: a `target` as given; a
/// Service as `ClusterIP:port`, which needs no cluster DNS in the proxy
/// pod (a headless Service as `<name>.<namespace>.svc.<cluster_domain>`
/// and its target port, an ExternalName one as its name and port).
pub fn resolve(d: &Device, services: &Services, cluster_domain: &str) -> Vec<Resolved> {
    d.spec
        .reverse
        .iter()
        .map(|r| match (&r.service, &r.target) {
            (Some(s), _) => {
                let key = service_key(d, s);
                Resolved {
                    name: r.name.clone(),
                    service: Some(format!("{}/{}", key.0, key.1)),
                    target: service_target(r, s, &key, services.get(&key), cluster_domain),
                }
            }
            (None, t) => Resolved {
                name: r.name.clone(),
                service: None,
                target: t.clone().ok_or_else(|| Unresolved {
                    reason: "InvalidSpec",
                    message: format!("reverse {}: neither service nor target", r.name),
                }),
            },
        })
        .collect()
}

fn service_target(
    r: &DeviceReverse,
    s: &ServiceRef,
    (ns, name): &(String, String),
    svc: Option<&Service>,
    cluster_domain: &str,
) -> Result<String, Unresolved> {
    let what = format!("reverse {}: Service {ns}/{name}", r.name);
    let no_port = |why: String| Unresolved {
        reason: "ServicePortNotFound",
        message: format!("{what} {why}"),
    };
    let Some(spec) = svc.and_then(|s| s.spec.as_ref()) else {
        return Err(Unresolved {
            reason: "ServiceNotFound",
            message: format!("{what} does not exist"),
        });
    };
    let proto = r.protocol.service();
    let ports: Vec<&ServicePort> = spec
        .ports
        .iter()
        .flatten()
        .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == proto)
        .collect();
    if spec.type_.as_deref() == Some("ExternalName") {
        let host = spec.external_name.clone().unwrap_or_default();
        let port = match &s.port {
            Some(IntOrString::Int(n)) => Some(*n),
            Some(IntOrString::String(pn)) => ports
                .iter()
                .find(|p| p.name.as_deref() == Some(pn))
                .map(|p| p.port),
            None => match ports.as_slice() {
                [one] => Some(one.port),
                _ => None,
            },
        };
        return match port {
            Some(p) if !host.is_empty() => Ok(format!("{host}:{p}")),
            _ => Err(no_port(
                "is an ExternalName Service whose port is not known: give service.port as a number (or target)"
                    .into(),
            )),
        };
    }
    let port = match &s.port {
        Some(IntOrString::Int(n)) => ports
            .iter()
            .find(|p| p.port == *n)
            .ok_or_else(|| no_port(format!("has no {proto} port {n}")))?,
        Some(IntOrString::String(pn)) => ports
            .iter()
            .find(|p| p.name.as_deref() == Some(pn))
            .ok_or_else(|| no_port(format!("has no {proto} port named {pn:?}")))?,
        None => match ports.as_slice() {
            [one] => one,
            [] => return Err(no_port(format!("has no {proto} port"))),
            many => {
                return Err(no_port(format!(
                    "has {} {proto} ports: give service.port",
                    many.len()
                )))
            }
        },
    };
    match spec.cluster_ip.as_deref() {
        Some(ip) if !ip.is_empty() && ip != "None" => Ok(target(ip, port.port as u32)),
        _ => {
            // Headless: the name resolves to the pods, which listen on
            // the target port.
            let pod_port = match &port.target_port {
                None => port.port,
                Some(IntOrString::Int(n)) => *n,
                Some(IntOrString::String(tp)) => {
                    return Err(no_port(format!(
                    "is headless and its port names its targetPort ({tp:?}): give target instead"
                )))
                }
            };
            Ok(format!("{name}.{ns}.svc.{cluster_domain}:{pod_port}"))
        }
    }
}

/// The plugin's `reverse` entries: those of `d.spec.reverse` whose target
/// is resolved, as the plugin spells them.
pub fn plugin_entries(d: &Device, resolved: &[Resolved]) -> Vec<Value> {
    d.spec
        .reverse
        .iter()
        .filter_map(|r| {
            let t = resolved
                .iter()
                .find(|x| x.name == r.name)?
                .target
                .as_ref()
                .ok()?;
            let mut e = json!({
                "name": r.name,
                "protocol": r.protocol.as_str(),
                "port": r.port,
                "target": t,
            });
            let o = e.as_object_mut().expect("an object");
            if !r.allowed_sources.is_empty() {
                o.insert("allowedSources".into(), json!(r.allowed_sources));
            }
            for (k, v) in [
                ("connectTimeoutMs", r.connect_timeout_ms),
                ("idleTimeoutMs", r.idle_timeout_ms),
                ("maxConnections", r.max_connections),
                ("queueTimeoutMs", r.queue_timeout_ms),
                ("connectRetries", r.connect_retries),
            ] {
                if let Some(v) = v {
                    o.insert(k.into(), json!(v));
                }
            }
            if let Some(pp) = r.proxy_protocol {
                o.insert("proxyProtocol".into(), json!(pp.as_str()));
            }
            Some(e)
        })
        .collect()
}

/// `host:port` split, as the plugin reads a target (the plugin's own
/// parser, edgelink-attachment's `Target`): `[IPv6]:port`, `IPv4:port`
/// (unicast) or `dns-name:port`, port 1..65535.
pub fn parse_target(t: &str) -> Option<(String, u16)> {
    match t.parse::<edgelink_attachment::Target>().ok()? {
        edgelink_attachment::Target::Addr(a) => Some((a.ip().to_string(), a.port())),
        edgelink_attachment::Target::Name { host, port } => Some((host, port)),
    }
}

/// The checks of `d.spec.reverse` that need nothing but the Device, into
/// `p`: one of service and target, names unique across ports and
/// reverse, no port a forward or another reverse entry of the same
/// protocol listens on, the TCP-only keys on TCP entries, in range.
pub fn check_spec(d: &Device, p: &mut Vec<String>) {
    for (i, r) in d.spec.reverse.iter().enumerate() {
        let f = format!("spec.reverse[{i}]");
        match (&r.service, &r.target) {
            (Some(_), Some(_)) => p.push(format!(
                "{f} ({}): give service or target, not both",
                r.name
            )),
            (None, None) => p.push(format!("{f} ({}): service or target is required", r.name)),
            (None, Some(t)) if parse_target(t).is_none() => p.push(format!(
                "{f}.target: {t:?} is not IP:port (unicast), [IPv6]:port or dns-name:port with a port in 1..65535"
            )),
            (Some(s), None)
                if service_key(d, s)
                    == (
                        d.metadata.namespace.clone().unwrap_or_default(),
                        d.metadata.name.clone().unwrap_or_default(),
                    ) =>
            {
                p.push(format!(
                    "{f}.service ({}): names the Device's own Service: the device would call itself through its proxy",
                    r.name
                ))
            }
            _ => {}
        }
        if !(1..=65535).contains(&r.port) {
            p.push(format!("{f}.port: {} is not in 1..65535", r.port));
        }
        if let Some(j) = d.spec.ports.iter().position(|x| x.name == r.name) {
            p.push(format!("{f}.name: {:?} is used by spec.ports[{j}]", r.name));
        }
        if let Some(j) = d.spec.reverse[..i].iter().position(|x| x.name == r.name) {
            p.push(format!(
                "{f}.name: {:?} is used by spec.reverse[{j}]",
                r.name
            ));
        }
        let pp = format!("{}/{}", r.port, r.protocol.as_str());
        if let Some((j, x)) = d
            .spec
            .ports
            .iter()
            .enumerate()
            .find(|(_, x)| x.protocol == r.protocol && x.port == r.port)
        {
            p.push(format!(
                "{f} ({}): {pp} is used by spec.ports[{j}] ({})",
                r.name, x.name
            ));
        }
        if let Some((j, x)) = d.spec.reverse[..i]
            .iter()
            .enumerate()
            .find(|(_, x)| x.protocol == r.protocol && x.port == r.port)
        {
            p.push(format!(
                "{f} ({}): {pp} is used by spec.reverse[{j}] ({})",
                r.name, x.name
            ));
        }
        if r.protocol != Protocol::Tcp {
            for (key, set) in [
                ("idleTimeoutMs", r.idle_timeout_ms.is_some()),
                ("maxConnections", r.max_connections.is_some()),
                ("queueTimeoutMs", r.queue_timeout_ms.is_some()),
                ("connectRetries", r.connect_retries.is_some()),
                ("proxyProtocol", r.proxy_protocol.is_some()),
            ] {
                if set {
                    p.push(format!(
                        "{f}.{key}: is only valid with protocol tcp ({} is {})",
                        r.name,
                        r.protocol.as_str()
                    ));
                }
            }
        }
        for (key, v, min, max) in [
            ("connectTimeoutMs", r.connect_timeout_ms, 1, 600_000),
            ("maxConnections", r.max_connections, 1, MAX_CONNECTIONS),
            (
                "queueTimeoutMs",
                r.queue_timeout_ms,
                1,
                MAX_QUEUE_TIMEOUT_MS,
            ),
            ("connectRetries", r.connect_retries, 0, MAX_CONNECT_RETRIES),
        ] {
            if let Some(v) = v.filter(|v| !(min..=max).contains(v)) {
                p.push(format!("{f}.{key}: {v} is not in {min}..{max}"));
            }
        }
        if let Some(v) = r
            .idle_timeout_ms
            .filter(|v| *v != 0 && !(1000..=MAX_IDLE_TIMEOUT_MS).contains(v))
        {
            p.push(format!(
                "{f}.idleTimeoutMs: {v} is not 0 (never) or in 1000..{MAX_IDLE_TIMEOUT_MS}"
            ));
        }
        for (k, c) in r.allowed_sources.iter().enumerate() {
            if c.parse::<IpNetwork>().is_err() {
                p.push(format!("{f}.allowedSources[{k}]: {c:?} is not a CIDR"));
            }
        }
    }
}

/// The segment's subnets on `node`: net1's in the proxy pod.
fn segment(n: &EdgeNetwork, node: &str) -> Vec<IpNetwork> {
    n.spec
        .ipam
        .ranges
        .iter()
        .filter(|r| r.node == node)
        .filter_map(|r| r.subnet.parse().ok())
        .collect()
}

fn within(outer: &IpNetwork, inner: &IpNetwork) -> bool {
    outer.is_ipv4() == inner.is_ipv4()
        && outer.prefix() <= inner.prefix()
        && outer.contains(inner.network())
}

/// The checks that need the segment on `node` and the resolved targets,
/// into `p`: no target inside the segment (the device's traffic would be
/// relayed back onto it), and `allowedSources` inside the segment unless
/// `spec.allowForeignSources`.
pub fn check_placement(
    d: &Device,
    n: &EdgeNetwork,
    node: &str,
    resolved: &[Resolved],
    p: &mut Vec<String>,
) {
    let seg = segment(n, node);
    let seg_list = seg
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let foreign_ok = d.spec.allow_foreign_sources == Some(true);
    for (i, r) in d.spec.reverse.iter().enumerate() {
        let f = format!("spec.reverse[{i}]");
        let rendered = resolved
            .iter()
            .find(|x| x.name == r.name)
            .and_then(|x| x.target.as_ref().ok().map(|t| (t, x.service.as_ref())));
        if let Some((t, svc)) = rendered {
            let ip = parse_target(t).and_then(|(h, _)| h.parse::<IpAddr>().ok());
            if let Some(s) = ip.and_then(|a| seg.iter().find(|s| s.contains(a))) {
                let via = svc.map(|s| format!(" (Service {s})")).unwrap_or_default();
                p.push(format!(
                    "{f} ({}): target {t}{via} is inside the segment {s}: a device's traffic would be relayed back onto its own segment (a loop)",
                    r.name
                ));
            }
        }
        if foreign_ok {
            continue;
        }
        for (k, c) in r.allowed_sources.iter().enumerate() {
            let Ok(c) = c.parse::<IpNetwork>() else {
                continue;
            };
            if !seg.iter().any(|s| within(s, &c)) {
                p.push(format!(
                    "{f}.allowedSources[{k}] ({}): {c} is outside the segment's subnets [{seg_list}] on node {node}: set spec.allowForeignSources to allow it",
                    r.name
                ));
            }
        }
    }
}

/// The `ReverseResolved` condition of a Device with reverse entries:
/// True when every entry's target is rendered; else False, naming each
/// entry left out and why (reason `ServiceNotFound` when a Service is
/// missing, the likelier fix, else `ServicePortNotFound`).
pub fn verdict(resolved: &[Resolved]) -> Verdict {
    let failed: Vec<&Unresolved> = resolved
        .iter()
        .filter_map(|r| r.target.as_ref().err())
        .collect();
    let Some(first) = failed.first() else {
        let rendered: Vec<String> = resolved
            .iter()
            .filter_map(|r| Some(format!("{} -> {}", r.name, r.target.as_ref().ok()?)))
            .collect();
        return Verdict {
            status: "True",
            reason: "Resolved",
            message: format!(
                "every reverse entry has its target: {}",
                rendered.join(", ")
            ),
        };
    };
    let reason = failed
        .iter()
        .find(|u| u.reason == "ServiceNotFound")
        .unwrap_or(first)
        .reason;
    Verdict {
        status: "False",
        reason,
        message: format!(
            "{}; left out of the proxy's config until resolved",
            failed
                .iter()
                .map(|u| u.message.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        ),
    }
}

/// Each reverse entry's status: the rendered target and, from the
/// attachment edgelinkd reports for the proxy pod (if any), its listener
/// and counters; with the entries that are rendered but do not listen
/// (`mqtt (failed)`).
pub fn status(
    d: &Device,
    resolved: &[Resolved],
    a: Option<&ReportAttachment>,
) -> (Vec<ReverseStatus>, Vec<String>) {
    let mut out = Vec::new();
    let mut not_listening = Vec::new();
    for r in &d.spec.reverse {
        let res = resolved.iter().find(|x| x.name == r.name);
        let mut s = ReverseStatus {
            name: r.name.clone(),
            protocol: r.protocol.as_str().into(),
            port: r.port,
            target: res.and_then(|x| x.target.clone().ok()),
            service: res.and_then(|x| x.service.clone()),
            listener: "unresolved".into(),
            ..Default::default()
        };
        if s.target.is_none() {
            out.push(s);
            continue;
        }
        let f = a.and_then(|a| {
            a.forwards.iter().find(|f| {
                f.direction == "reverse"
                    && f.name == r.name
                    && f.protocol.eq_ignore_ascii_case(r.protocol.as_str())
            })
        });
        match f {
            None => {
                s.listener = "absent".into();
                if a.is_some() {
                    not_listening.push(format!(
                        "{} (reverse, not in the proxy pod's forwards yet)",
                        r.name
                    ));
                }
            }
            Some(f) => {
                s.listener = f.listener.clone();
                s.listening = f.listener == "listening";
                if !s.listening {
                    not_listening.push(format!("{} (reverse, {})", r.name, f.listener));
                }
                s.active_connections = f.active_connections;
                s.total_connections = if r.protocol == Protocol::Udp {
                    f.udp_sessions_total
                } else {
                    f.total_connections
                };
                s.bytes_to_target = f.bytes_to_target;
                s.bytes_from_target = f.bytes_to_client;
                s.last_error = f.last_error.clone();
                if let Some(res) = &f.resolved {
                    s.resolved_address = res.address.clone();
                    s.resolve_error = res.error.clone();
                }
            }
        }
        out.push(s);
    }
    (out, not_listening)
}

#[cfg(test)]
mod tests;
