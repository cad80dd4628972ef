//! `health`: the device health probe edgelinkd runs from inside the pod,
//! validated into the record's [`Health`] with every default filled in.

use super::{bad, get_str, get_uint, missing};
use crate::error::PluginError;
use edgelink_attachment::{Forward, Health, HealthKind, HealthTarget, Protocol};
use serde_json::{Map, Value};

pub const DEFAULT_INTERVAL_MS: u64 = 2000;
pub const DEFAULT_TIMEOUT_MS: u64 = 1000;
pub const DEFAULT_THRESHOLD: u32 = 2;
pub const INTERVAL_MS: (u64, u64) = (200, 3_600_000);
pub const TIMEOUT_MS: (u64, u64) = (50, 60_000);
pub const THRESHOLD: (u64, u64) = (1, 100);

/// The keys only one type takes.
const TYPED: [(&str, HealthKind); 5] = [
    ("path", HealthKind::Http),
    ("expectStatus", HealthKind::Http),
    ("payload", HealthKind::Udp),
    ("unitId", HealthKind::Modbus),
    ("register", HealthKind::Modbus),
];

fn at(k: &str) -> String {
    format!("health.{k}")
}

/// `o[k]` as an integer in `min..=max`, the error naming `health.k`.
fn uint(
    o: &Map<String, Value>,
    k: &str,
    (min, max): (u64, u64),
) -> Result<Option<u64>, PluginError> {
    get_uint(o, k, min, max).map_err(|_| {
        bad(
            &at(k),
            o.get(k).unwrap_or(&Value::Null),
            &format!("is not an integer in {min}..={max}"),
        )
    })
}

pub(super) fn parse_health(
    o: &Map<String, Value>,
    forwards: &[Forward],
) -> Result<Option<Health>, PluginError> {
    let ho = match o.get("health") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(ho)) => ho,
        Some(v) => return Err(bad("health", v, "is not an object")),
    };
    let kind =
        match get_str(ho, "type").map_err(|_| bad(&at("type"), &ho["type"], "is not a string"))? {
            None | Some("tcp") => HealthKind::Tcp,
            Some("icmp") => HealthKind::Icmp,
            Some("http") => HealthKind::Http,
            Some("udp") => HealthKind::Udp,
            Some("modbus") => HealthKind::Modbus,
            Some(other) => {
                return Err(bad(
                    &at("type"),
                    &Value::String(other.into()),
                    "is not one of tcp, icmp, http, udp, modbus",
                ))
            }
        };
    for (k, only) in TYPED {
        if let Some(v) = ho.get(k).filter(|v| !v.is_null()) {
            if kind != only {
                return Err(bad(
                    &at(k),
                    v,
                    &format!("is only valid with type {only} (this probe is {kind})"),
                ));
            }
        }
    }
    let target = target(ho, kind, forwards)?;
    let interval_ms = uint(ho, "intervalMs", INTERVAL_MS)?.unwrap_or(DEFAULT_INTERVAL_MS);
    let timeout_ms =
        uint(ho, "timeoutMs", TIMEOUT_MS)?.unwrap_or(DEFAULT_TIMEOUT_MS.min(interval_ms / 2));
    if timeout_ms > interval_ms {
        return Err(bad(
            &at("timeoutMs"),
            &Value::from(timeout_ms),
            &format!("is longer than intervalMs ({interval_ms}): at most one probe is in flight"),
        ));
    }
    let threshold = |k| -> Result<u32, PluginError> {
        Ok(uint(ho, k, THRESHOLD)?.map_or(DEFAULT_THRESHOLD, |n| n as u32))
    };
    Ok(Some(Health {
        kind,
        target,
        path: http_path(ho, kind)?,
        expect_status: uint(ho, "expectStatus", (100, 599))?.map(|n| n as u16),
        payload: payload(ho, kind)?,
        unit_id: (kind == HealthKind::Modbus)
            .then(|| uint(ho, "unitId", (0, 255)))
            .transpose()?
            .map(|n| n.unwrap_or(1) as u8),
        register: (kind == HealthKind::Modbus)
            .then(|| uint(ho, "register", (0, 65535)))
            .transpose()?
            .map(|n| n.unwrap_or(0) as u16),
        interval_ms,
        timeout_ms,
        failure_threshold: threshold("failureThreshold")?,
        success_threshold: threshold("successThreshold")?,
    }))
}

/// `health.target`, else the default of its type: the first TCP
/// forward's target (ICMP: its address; UDP: the first UDP forward's).
fn target(
    ho: &Map<String, Value>,
    kind: HealthKind,
    forwards: &[Forward],
) -> Result<HealthTarget, PluginError> {
    let s = match ho.get("target") {
        None | Some(Value::Null) => return default_target(kind, forwards),
        Some(Value::String(s)) => s,
        Some(v) => return Err(bad(&at("target"), v, "is not a string")),
    };
    let v = Value::String(s.clone());
    let t: HealthTarget = s.parse().map_err(|_| {
        let want = match kind {
            HealthKind::Icmp => "an IP address",
            _ => "IP:port or [IPv6]:port",
        };
        bad(&at("target"), &v, &format!("is not {want}"))
    })?;
    let ip = match (kind, t) {
        (HealthKind::Icmp, HealthTarget::Addr(_)) => {
            return Err(bad(
                &at("target"),
                &v,
                "has a port: type icmp takes an address alone",
            ))
        }
        (HealthKind::Icmp, HealthTarget::Host(ip)) => ip,
        (_, HealthTarget::Host(_)) => {
            return Err(bad(
                &at("target"),
                &v,
                &format!("has no port: type {kind} takes IP:port"),
            ))
        }
        (_, HealthTarget::Addr(a)) if a.port() == 0 => {
            return Err(bad(&at("target"), &v, "has port 0"))
        }
        (_, HealthTarget::Addr(a)) => a.ip(),
    };
    if ip.is_unspecified() || ip.is_multicast() {
        return Err(bad(&at("target"), &v, "is not a unicast address"));
    }
    Ok(t)
}

fn default_target(kind: HealthKind, forwards: &[Forward]) -> Result<HealthTarget, PluginError> {
    let first = |p: Protocol| forwards.iter().find(|f| f.protocol == p);
    let (found, what) = match kind {
        HealthKind::Udp => (first(Protocol::Udp), "UDP forward"),
        _ => (first(Protocol::Tcp), "TCP forward"),
    };
    match (kind, found) {
        (HealthKind::Icmp, Some(f)) => Ok(HealthTarget::Host(f.target.ip())),
        (_, Some(f)) => Ok(HealthTarget::Addr(f.target)),
        (_, None) => Err(missing(
            &at("target"),
            &format!(" (type {kind} probes the first {what}'s target by default, and there is none: add health.target or a {what})"),
        )),
    }
}

fn http_path(ho: &Map<String, Value>, kind: HealthKind) -> Result<Option<String>, PluginError> {
    if kind != HealthKind::Http {
        return Ok(None);
    }
    let p = get_str(ho, "path").map_err(|_| bad(&at("path"), &ho["path"], "is not a string"))?;
    let Some(p) = p else {
        return Ok(Some("/".into()));
    };
    let ok = p.starts_with('/') && p.len() <= 2048 && p.chars().all(|c| c.is_ascii_graphic());
    if !ok {
        return Err(bad(
            &at("path"),
            &Value::String(p.into()),
            "is not a request path (starts with '/', printable ASCII without spaces, at most 2048 bytes)",
        ));
    }
    Ok(Some(p.to_string()))
}

fn payload(ho: &Map<String, Value>, kind: HealthKind) -> Result<Option<String>, PluginError> {
    if kind != HealthKind::Udp {
        return Ok(None);
    }
    match ho.get("payload") {
        Some(Value::String(s)) if !s.is_empty() && s.len() <= 1400 => Ok(Some(s.clone())),
        Some(Value::String(s)) => Err(bad(
            &at("payload"),
            &Value::String(s.clone()),
            "is not 1 to 1400 bytes",
        )),
        None | Some(Value::Null) => Err(missing(
            &at("payload"),
            " (type udp sends it and waits for any reply)",
        )),
        Some(v) => Err(bad(&at("payload"), v, "is not a string")),
    }
}
