//! The plugin's `health` key, made from `Device.spec.health` and its
//! defaults: what edgelinkd on each node probes, from inside the proxy
//! pod's network namespace, and how often.

use crate::crd::{
    Device, DeviceHealth, ProbeType, Protocol, DEFAULT_FAILURE_THRESHOLD, DEFAULT_INTERVAL_SECONDS,
    DEFAULT_SUCCESS_THRESHOLD, DEFAULT_TIMEOUT_SECONDS,
};
use serde_json::{json, Value};

/// The probe type: the given one, else tcp, or icmp for a Device without
/// a TCP port.
pub fn probe_type(d: &Device) -> ProbeType {
    match d.spec.health.as_ref().and_then(|h| h.type_) {
        Some(t) => t,
        None if d.spec.ports.iter().any(|p| p.protocol == Protocol::Tcp) => ProbeType::Tcp,
        None => ProbeType::Icmp,
    }
}

/// The device port probed: the given one, else the first port of the
/// probe's protocol (its targetPort). `None` for icmp, or when there is
/// none (`validate::device` refuses that Device).
fn port(d: &Device, h: &DeviceHealth, t: ProbeType) -> Option<u32> {
    let protocol = match t {
        ProbeType::Icmp => return None,
        ProbeType::Udp => Protocol::Udp,
        _ => Protocol::Tcp,
    };
    h.port.or_else(|| {
        d.spec
            .ports
            .iter()
            .find(|p| p.protocol == protocol)
            .map(|p| p.target_port())
    })
}

/// The plugin's `health` object (every number given, so the plugin's own
/// defaults never matter).
pub fn config(d: &Device) -> Value {
    let h = d.spec.health.clone().unwrap_or_default();
    let t = probe_type(d);
    let target = match port(d, &h, t) {
        Some(p) => crate::target::target(&d.spec.address, p),
        None => d.spec.address.clone(),
    };
    let mut c = json!({"type": t.as_str(), "target": target});
    let o = c.as_object_mut().expect("an object");
    if let Some(p) = &h.path {
        o.insert("path".into(), json!(p));
    }
    if let Some(s) = h.expect_status {
        o.insert("expectStatus".into(), json!(s));
    }
    if let Some(p) = &h.payload {
        o.insert("payload".into(), json!(p));
    }
    if t == ProbeType::Modbus {
        o.insert("unitId".into(), json!(h.unit_id.unwrap_or(1)));
        o.insert("register".into(), json!(h.register.unwrap_or(0)));
    }
    let interval = h.interval_seconds.unwrap_or(DEFAULT_INTERVAL_SECONDS);
    let timeout = h.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS);
    o.insert("intervalMs".into(), json!(interval * 1000));
    o.insert("timeoutMs".into(), json!(timeout * 1000));
    o.insert(
        "failureThreshold".into(),
        json!(h.failure_threshold.unwrap_or(DEFAULT_FAILURE_THRESHOLD)),
    );
    o.insert(
        "successThreshold".into(),
        json!(h.success_threshold.unwrap_or(DEFAULT_SUCCESS_THRESHOLD)),
    );
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::device;

    #[test]
    fn without_health_the_first_tcp_port_is_probed_with_the_defaults() {
        assert_eq!(
            config(&device()),
            json!({"type": "tcp", "target": "172.17.16.120:8080", "intervalMs": 2000,
                   "timeoutMs": 1000, "failureThreshold": 2, "successThreshold": 2})
        );
    }

    #[test]
    fn a_udp_only_device_is_pinged_and_each_type_takes_its_keys() {
        let mut d = device();
        d.spec.ports.retain(|p| p.protocol == Protocol::Udp);
        assert_eq!(config(&d)["type"], "icmp");
        assert_eq!(config(&d)["target"], "172.17.16.120");
        d.spec.health = Some(DeviceHealth {
            type_: Some(ProbeType::Udp),
            payload: Some("ping\n".into()),
            interval_seconds: Some(1),
            failure_threshold: Some(1),
            ..Default::default()
        });
        let c = config(&d);
        assert_eq!(
            (&c["type"], &c["target"], &c["payload"], &c["intervalMs"]),
            (
                &json!("udp"),
                &json!("172.17.16.120:5000"),
                &json!("ping\n"),
                &json!(1000)
            )
        );
        let mut d = device();
        d.spec.address = "fd00:17::120".into();
        d.spec.health = Some(DeviceHealth {
            type_: Some(ProbeType::Modbus),
            port: Some(502),
            unit_id: Some(7),
            ..Default::default()
        });
        let c = config(&d);
        assert_eq!(
            (&c["target"], &c["unitId"], &c["register"]),
            (&json!("[fd00:17::120]:502"), &json!(7), &json!(0))
        );
        d.spec.health = Some(DeviceHealth {
            type_: Some(ProbeType::Http),
            path: Some("/healthz".into()),
            expect_status: Some(204),
            ..Default::default()
        });
        let c = config(&d);
        assert_eq!(
            (&c["target"], &c["path"], &c["expectStatus"]),
            (
                &json!("[fd00:17::120]:8080"),
                &json!("/healthz"),
                &json!(204)
            )
        );
    }
}
