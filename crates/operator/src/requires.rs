//! Pods that need devices: a pod annotated
//! `edgelink.io/requires-devices: device01-01,device01-02` (a Device of the
//! pod's namespace by name, of another as `namespace/name`) gets the
//! condition `edgelink.io/device-reachable`, True only while every one of
//! those Devices is reachable from some node (`DeviceReachable` True). With
//! the condition among the pod's readiness gates, the pod is not Ready —
//! a test job's pod does not start its test, a Service does not send it
//! clients — while a device it needs is gone. Pure: `run::consumers`
//! watches the pods and Devices and writes the condition.

use crate::crd::Device;
use crate::verdict::Verdict;

/// The Devices `annotation` names, as (namespace, name), for a pod in
/// `pod_ns`; or what is wrong with it.
pub fn parse(annotation: &str, pod_ns: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for item in annotation.split(',').map(str::trim) {
        if item.is_empty() {
            continue;
        }
        let (ns, name) = match item.split_once('/') {
            Some((ns, name)) => (ns, name),
            None => (pod_ns, item),
        };
        let ok = |s: &str| {
            !s.is_empty()
                && s.len() <= 253
                && s.bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.')
        };
        if !ok(ns) || !ok(name) {
            return Err(format!("{:?} is not a Device name or namespace/name", item));
        }
        out.push((ns.to_string(), name.to_string()));
    }
    if out.is_empty() {
        return Err("names no Device".into());
    }
    Ok(out)
}

/// The condition for a pod that requires `annotation`'s Devices;
/// `device(ns, name)`: the Device, if it exists.
pub fn gate<'a>(
    annotation: &str,
    pod_ns: &str,
    device: impl Fn(&str, &str) -> Option<&'a Device>,
) -> Verdict {
    let wanted = match parse(annotation, pod_ns) {
        Ok(w) => w,
        Err(e) => {
            return Verdict::new(
                "False",
                "InvalidAnnotation",
                format!("{}: {e}", crate::render::REQUIRES_DEVICES_ANNOTATION),
            )
        }
    };
    let mut missing = Vec::new();
    let mut reached = Vec::new();
    for (ns, name) in &wanted {
        let shown = if ns == pod_ns {
            name.clone()
        } else {
            format!("{ns}/{name}")
        };
        let Some(d) = device(ns, name) else {
            missing.push(format!("{shown}: no such Device"));
            continue;
        };
        let c = d
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "DeviceReachable"));
        match c {
            Some(c) if c.status == "True" => reached.push(format!(
                "{shown} ({})",
                d.status
                    .as_ref()
                    .and_then(|s| s.reachable_nodes.clone())
                    .map(|n| format!("{n} nodes"))
                    .unwrap_or_else(|| "reachable".into())
            )),
            Some(c) => missing.push(format!("{shown}: {} ({})", c.reason, c.message)),
            None => missing.push(format!("{shown}: not reported yet")),
        }
    }
    if missing.is_empty() {
        Verdict::new(
            "True",
            "DevicesReachable",
            format!("reachable: {}", reached.join(", ")),
        )
    } else {
        Verdict::new("False", "DeviceUnreachable", missing.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::device;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn with_reachable(status: &str, reason: &str) -> Device {
        let mut d = device();
        d.status = Some(crate::crd::DeviceStatus {
            conditions: vec![Condition {
                type_: "DeviceReachable".into(),
                status: status.into(),
                reason: reason.into(),
                message: "from kedge2".into(),
                observed_generation: None,
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            }],
            reachable_nodes: Some("1/2".into()),
            ..Default::default()
        });
        d
    }

    #[test]
    fn the_names_are_the_pods_namespace_or_qualified() {
        assert_eq!(
            parse(" device01-01, lab/device01-02 ,", "hil").unwrap(),
            [
                ("hil".to_string(), "device01-01".to_string()),
                ("lab".into(), "device01-02".into())
            ]
        );
        assert!(parse("", "hil").unwrap_err().contains("names no Device"));
        assert!(parse("Device_1", "hil")
            .unwrap_err()
            .contains("\"Device_1\""));
    }

    #[test]
    fn true_only_while_every_device_is_reachable() {
        let up = with_reachable("True", "Reachable");
        let down = with_reachable("False", "Unreachable");
        let g = gate("device01-01", "hil", |_, _| Some(&up));
        assert_eq!((g.status, g.reason), ("True", "DevicesReachable"));
        assert_eq!(g.message, "reachable: device01-01 (1/2 nodes)");
        let g = gate("device01-01,lab/device01-02", "hil", |ns, _| {
            Some(if ns == "hil" { &up } else { &down })
        });
        assert_eq!((g.status, g.reason), ("False", "DeviceUnreachable"));
        assert_eq!(g.message, "lab/device01-02: Unreachable (from kedge2)");
        let g = gate("device01-09", "hil", |_, _| None);
        assert_eq!(g.message, "device01-09: no such Device");
        let g = gate("a b", "hil", |_, _| Some(&up));
        assert_eq!((g.status, g.reason), ("False", "InvalidAnnotation"));
    }
}
