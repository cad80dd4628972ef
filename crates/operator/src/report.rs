//! What edgelinkd reports through `--status-webhook` (the JSON of its
//! /status, as far as the operator reads it) and the device health made of
//! it: per port listening, reachable, connections, bytes; the
//! `DeviceReachable` condition. The wire types are reported.rs's.

use crate::crd::{Device, PortStatus, Protocol, ReverseStatus};
pub use crate::reported::*;
use crate::reverse::Resolved;
pub use crate::verdict::Verdict;
use std::time::{Duration, SystemTime};

/// The device's health as its node's edgelinkd last told it.
#[derive(Debug, Clone, PartialEq)]
pub struct Health {
    pub ports: Vec<PortStatus>,
    /// Per reverse entry (`crate::reverse::status`).
    pub reverse: Vec<ReverseStatus>,
    /// net1's address (without its prefix length).
    pub segment_address: Option<String>,
    pub reachable: Verdict,
    /// `None`: nothing known; else whether every port's listener is up.
    pub listening: Option<Result<(), String>>,
    pub reported_at: Option<SystemTime>,
}

/// Just after an operator takes the lead no report has come in yet: keep
/// the previous leader's last word on reachability (reason
/// `PreviousReport`) instead of `NoReport`, while `fresh` (younger than a
/// report interval or two). Idempotent: applied to its own output it gives
/// the same verdict, so the status does not change at each reconcile.
pub fn carry_previous(
    v: Verdict,
    old: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    fresh: bool,
) -> Verdict {
    if v.reason != "NoReport" || !fresh {
        return v;
    }
    let Some(c) = old.iter().find(|c| c.type_ == "DeviceReachable") else {
        return v;
    };
    let status = match c.status.as_str() {
        "True" => "True",
        "False" => "False",
        _ => "Unknown",
    };
    let message = if c.reason == "PreviousReport" {
        c.message.clone()
    } else {
        format!(
            "no report since the operator started; before: {}",
            c.message
        )
    };
    Verdict {
        status,
        reason: "PreviousReport",
        message,
    }
}

/// The attachment of `pod` (namespace, name) on net1 in `report`: the
/// serving one if an old and a new sandbox of the pod are both there.
pub fn attachment<'a>(report: &'a NodeReport, ns: &str, pod: &str) -> Option<&'a ReportAttachment> {
    let mut found = report.attachments.iter().filter(|a| {
        a.pod_namespace.as_deref() == Some(ns)
            && a.pod_name.as_deref() == Some(pod)
            && a.ifname == crate::render::SEGMENT_IFNAME
    });
    let first = found.next()?;
    if first.state == "serving" {
        return Some(first);
    }
    found.find(|a| a.state == "serving").or(Some(first))
}

/// `stale_after`: a report older than this says nothing any more (the
/// node's edgelinkd posts at least every `--status-webhook-interval`).
/// `resolved`: the targets of `d`'s reverse entries, as rendered.
pub fn health(
    d: &Device,
    resolved: &[Resolved],
    node: &str,
    pod: &str,
    received: Option<&Received>,
    now: SystemTime,
    stale_after: Duration,
) -> Health {
    let unknown = |reason: &'static str, message: String| Health {
        ports: Vec::new(),
        reverse: crate::reverse::status(d, resolved, None).0,
        segment_address: None,
        reachable: Verdict::new("Unknown", reason, message),
        listening: None,
        reported_at: received.map(|r| r.at),
    };
    let Some(r) = received else {
        return unknown(
            "NoReport",
            format!(
                "edgelinkd on node {node} has not reported to the operator (its --status-webhook)"
            ),
        );
    };
    let age = now.duration_since(r.at).unwrap_or_default();
    if age > stale_after {
        return unknown(
            "ReportStale",
            format!(
                "edgelinkd on node {node} last reported {}s ago",
                age.as_secs()
            ),
        );
    }
    let ns = d.metadata.namespace.as_deref().unwrap_or("");
    let Some(a) = attachment(&r.report, ns, pod) else {
        return unknown(
            "ProxyNotServed",
            format!("edgelinkd on node {node} serves no attachment of pod {ns}/{pod}"),
        );
    };
    let segment_address = a
        .interface
        .ips
        .first()
        .map(|ip| ip.split('/').next().unwrap_or(ip).to_string());
    let mut ports = Vec::new();
    let mut not_listening = Vec::new();
    let (mut reachable, mut unreachable) = (Vec::new(), Vec::new());
    for p in &d.spec.ports {
        let Some(f) = a.forwards.iter().find(|f| {
            f.direction != "reverse"
                && f.name == p.name
                && f.protocol.eq_ignore_ascii_case(p.protocol.as_str())
        }) else {
            // The pod's forwards come from the NAD at ADD: a port added
            // since is there once the replaced pod is.
            not_listening.push(format!("{} (not in the proxy pod's forwards yet)", p.name));
            ports.push(PortStatus {
                name: p.name.clone(),
                protocol: p.protocol.as_str().into(),
                port: p.port,
                listener: "absent".into(),
                reachable: "Unknown".into(),
                ..Default::default()
            });
            continue;
        };
        let listening = f.listener == "listening";
        if !listening {
            not_listening.push(format!("{} ({})", p.name, f.listener));
        }
        let state = match f.reachability.state.as_str() {
            "reachable" => {
                reachable.push(p.name.clone());
                "True"
            }
            "unreachable" => {
                unreachable.push(format!(
                    "{} ({}/{}): {}",
                    p.name,
                    p.target_port(),
                    p.protocol.as_str(),
                    f.reachability.error.as_deref().unwrap_or("no answer")
                ));
                "False"
            }
            _ => "Unknown",
        };
        ports.push(PortStatus {
            name: p.name.clone(),
            protocol: p.protocol.as_str().into(),
            port: p.port,
            listener: f.listener.clone(),
            listening,
            reachable: state.into(),
            reachability_error: f.reachability.error.clone(),
            active_connections: f.active_connections,
            total_connections: if p.protocol == Protocol::Udp {
                f.udp_sessions_total
            } else {
                f.total_connections
            },
            bytes_to_device: f.bytes_to_target,
            bytes_from_device: f.bytes_to_client,
            last_error: f.last_error.clone(),
        });
    }
    let (reverse, reverse_not_listening) = crate::reverse::status(d, resolved, Some(a));
    not_listening.extend(reverse_not_listening);
    let reachable_verdict = if !unreachable.is_empty() {
        Verdict::new("False", "Unreachable", unreachable.join("; "))
    } else if !reachable.is_empty() {
        Verdict::new(
            "True",
            "Reachable",
            format!(
                "edgelinkd on node {node} reached the device on {}",
                reachable.join(", ")
            ),
        )
    } else if a.state != "serving" {
        Verdict::new(
            "Unknown",
            "ProxyFailed",
            format!(
                "edgelinkd on node {node}: {}",
                a.error.as_deref().unwrap_or("the attachment failed")
            ),
        )
    } else {
        Verdict::new(
            "Unknown",
            "NotChecked",
            "no connect to the device yet (a UDP-only device is reachable once it answered)",
        )
    };
    Health {
        ports,
        reverse,
        segment_address,
        reachable: reachable_verdict,
        listening: Some(if not_listening.is_empty() {
            Ok(())
        } else {
            Err(not_listening.join(", "))
        }),
        reported_at: Some(r.at),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::device;

    /// A report as edgelinkd writes it (edgelink-status's model, a trimmed /status).
    fn report(api: &str, api_err: Option<&str>) -> NodeReport {
        serde_json::from_value(serde_json::json!({
            "node": "kedge1", "version": "0.1.0", "startedAt": 1, "lastReconcileAt": 2, "draining": false,
            "attachments": [
                {"containerId": "old", "ifname": "net1", "network": "plant-floor", "podNamespace": "hil",
                 "podName": "device01-01-0", "netns": "/run/netns/x", "mode": "bridge", "state": "failed",
                 "interface": {"name": "net1", "mac": "m", "ips": ["172.17.16.201/24"]}, "forwards": []},
                {"containerId": "c1", "ifname": "net1", "network": "plant-floor", "podNamespace": "hil",
                 "podName": "device01-01-0", "netns": "/run/netns/y", "mode": "bridge", "state": "serving",
                 "interface": {"name": "net1", "mac": "m", "ips": ["172.17.16.200/24"]},
                 "forwards": [
                    {"name": "api", "protocol": "tcp", "port": 8080, "target": "172.17.16.120:8080", "listener": "listening",
                     "activeConnections": 1, "totalConnections": 7, "bytesToTarget": 100, "bytesToClient": 200,
                     "reachability": {"state": api, "checkedAt": 3, "error": api_err}},
                    {"name": "telemetry", "protocol": "udp", "port": 5000, "target": "172.17.16.120:5000", "listener": "listening",
                     "udpSessionsTotal": 2, "reachability": {"state": "unknown", "checkedAt": 0}},
                    {"name": "http", "protocol": "tcp", "port": 80, "target": "172.17.16.120:80", "listener": "failed",
                     "reachability": {"state": "unknown", "checkedAt": 0}}
                 ]}
            ],
            "malformedRecords": [], "reclaimedTotal": 0
        }))
        .unwrap()
    }

    fn got(r: NodeReport, at: SystemTime) -> Received {
        Received { report: r, at }
    }

    #[test]
    fn per_port_state_and_counters_come_from_the_serving_attachment() {
        let now = SystemTime::now();
        let h = health(
            &device(),
            &[],
            "kedge1",
            "device01-01-0",
            Some(&got(report("reachable", None), now)),
            now,
            Duration::from_secs(35),
        );
        assert_eq!(h.segment_address.as_deref(), Some("172.17.16.200"));
        assert_eq!(h.reachable.status, "True");
        let api = &h.ports[0];
        assert_eq!(
            (
                api.listening,
                api.reachable.as_str(),
                api.total_connections,
                api.bytes_to_device,
                api.bytes_from_device
            ),
            (true, "True", 7, 100, 200)
        );
        assert_eq!(h.ports[1].total_connections, 2, "UDP counts sessions");
        assert_eq!(h.listening, Some(Err("http (failed)".into())));
    }

    #[test]
    fn an_unreachable_port_makes_the_device_unreachable_with_the_error() {
        let now = SystemTime::now();
        let h = health(
            &device(),
            &[],
            "kedge1",
            "device01-01-0",
            Some(&got(report("unreachable", Some("No route to host")), now)),
            now,
            Duration::from_secs(35),
        );
        assert_eq!(
            (h.reachable.status, h.reachable.reason),
            ("False", "Unreachable")
        );
        assert!(
            h.reachable
                .message
                .contains("api (8080/tcp): No route to host"),
            "{}",
            h.reachable.message
        );
    }

    #[test]
    fn no_report_a_stale_one_or_no_attachment_is_unknown() {
        let now = SystemTime::now();
        let d = device();
        let stale = Duration::from_secs(35);
        assert_eq!(
            health(&d, &[], "kedge1", "device01-01-0", None, now, stale)
                .reachable
                .reason,
            "NoReport"
        );
        let old = got(report("reachable", None), now - Duration::from_secs(60));
        assert_eq!(
            health(&d, &[], "kedge1", "device01-01-0", Some(&old), now, stale)
                .reachable
                .reason,
            "ReportStale"
        );
        let fresh = got(report("reachable", None), now);
        let h = health(&d, &[], "kedge1", "other-0", Some(&fresh), now, stale);
        assert_eq!(
            (h.reachable.status, h.reachable.reason),
            ("Unknown", "ProxyNotServed")
        );
        assert!(h.listening.is_none());
    }

    #[test]
    fn the_previous_leaders_word_is_carried_once_and_stays_the_same() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
        let c = |status: &str, reason: &str, message: &str| Condition {
            type_: "DeviceReachable".into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            observed_generation: None,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        };
        let none = Verdict::new(
            "Unknown",
            "NoReport",
            "edgelinkd on node kedge1 has not reported",
        );
        let old = [c("True", "Reachable", "reached the device on api")];
        let v = carry_previous(none.clone(), &old, true);
        assert_eq!((v.status, v.reason), ("True", "PreviousReport"));
        assert!(
            v.message.ends_with("before: reached the device on api"),
            "{}",
            v.message
        );
        // The next reconcile sees its own output: nothing changes.
        let again = carry_previous(none.clone(), &[c(v.status, v.reason, &v.message)], true);
        assert_eq!(again, v);
        // Once stale, or with a real report, the verdict is the new one.
        assert_eq!(carry_previous(none.clone(), &old, false), none);
        let real = Verdict::new("False", "Unreachable", "api: refused");
        assert_eq!(carry_previous(real.clone(), &old, true), real);
    }

    #[test]
    fn a_port_the_pod_does_not_serve_yet_is_not_listening() {
        let now = SystemTime::now();
        let mut d = device();
        d.spec.ports[0].name = "api2".into();
        let h = health(
            &d,
            &[],
            "kedge1",
            "device01-01-0",
            Some(&got(report("reachable", None), now)),
            now,
            Duration::from_secs(35),
        );
        assert_eq!(h.ports[0].listener, "absent");
        assert!(
            matches!(&h.listening, Some(Err(m)) if m.contains("api2 (not in the proxy pod's forwards yet)"))
        );
    }
}
