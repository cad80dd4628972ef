use super::*;
use crate::fixtures::device;
use crate::report::NodeReport;

const STALE: Duration = Duration::from_secs(35);

/// A report of `node` serving device01-01's proxy `pod` with `health`
/// (None: an edgelinkd without health probes).
fn report(node: &str, pod: &str, health: Option<serde_json::Value>) -> NodeReport {
    let mut a = serde_json::json!({
        "containerId": "c1", "ifname": "net1", "podNamespace": "hil", "podName": pod,
        "state": "serving", "interface": {"name": "net1", "ips": ["172.17.16.200/24"]},
        "forwards": [
            {"name": "api", "protocol": "tcp", "port": 8080, "listener": "listening",
             "reachability": {"state": "reachable", "checkedAt": 1}},
            {"name": "telemetry", "protocol": "udp", "port": 5000, "listener": "listening",
             "reachability": {"state": "unknown", "checkedAt": 0}},
            {"name": "http", "protocol": "tcp", "port": 80, "listener": "listening",
             "reachability": {"state": "unknown", "checkedAt": 0}}
        ]
    });
    if let Some(h) = health {
        a["health"] = h;
    }
    serde_json::from_value(serde_json::json!({"node": node, "attachments": [a]})).unwrap()
}

fn probe(state: &str, error: Option<&str>) -> serde_json::Value {
    serde_json::json!({"type": "tcp", "target": "172.17.16.120:8080", "state": state,
        "since": 1_764_140_000u64, "lastSeen": 1_764_139_990u64, "checkedAt": 1_764_140_001u64,
        "latencyMs": 0.423, "error": error, "probesTotal": 10, "failuresTotal": 2, "skippedTotal": 0})
}

fn received(r: NodeReport) -> Received {
    Received {
        report: r,
        at: SystemTime::now(),
    }
}

fn decide_for(
    pod: Option<&PodFacts>,
    r: Option<&Received>,
    heard: Heard,
    fresh: bool,
    old: Option<&NodeStatus>,
) -> NodeDecision {
    let f = NodeFacts {
        node: "kedge1",
        pod_name: "device01-01-kedge1-0",
        pod,
        received: r,
        heard,
        fresh,
        others_serve: true,
    };
    decide(&device(), &[], &f, old, SystemTime::now(), STALE)
}

fn ready_pod() -> PodFacts {
    PodFacts {
        ready: true,
        gate: Some("True".into()),
        segment_address: Some("172.17.16.201".into()),
    }
}

#[test]
fn the_gate_follows_the_nodes_probe_with_its_error_and_latency() {
    let pod = ready_pod();
    let up = received(report(
        "kedge1",
        "device01-01-kedge1-0",
        Some(probe("reachable", None)),
    ));
    let d = decide_for(Some(&pod), Some(&up), Heard::Alive, false, None);
    let g = d.gate.unwrap();
    assert_eq!((g.status, g.reason), ("True", "Reachable"));
    assert_eq!(d.status.reachable, "True");
    assert_eq!(d.status.latency.as_deref(), Some("0.42ms"));
    assert_eq!(d.status.last_seen.as_deref(), Some("2025-11-26T06:53:10Z"));
    assert_eq!(d.status.segment_address.as_deref(), Some("172.17.16.200"));
    assert!(d.status.last_error.is_none() && !d.mark_not_ready);

    let down = received(report(
        "kedge1",
        "device01-01-kedge1-0",
        Some(probe(
            "unreachable",
            Some("connect 172.17.16.120:8080: No route to host"),
        )),
    ));
    let d2 = decide_for(
        Some(&pod),
        Some(&down),
        Heard::Alive,
        false,
        Some(&d.status),
    );
    assert!(
        d2.mark_not_ready,
        "Ready False at once, while another node serves"
    );
    let g = d2.gate.unwrap();
    assert_eq!((g.status, g.reason), ("False", "Unreachable"));
    assert!(g.message.contains("No route to host"), "{}", g.message);
    assert_eq!(d2.status.last_error.as_deref(), Some(g.message.as_str()));
    // A transition takes the probe's time; the last success stays known.
    assert_eq!(
        d2.status.last_transition_time.as_deref(),
        Some("2025-11-26T06:53:20Z")
    );
    assert_eq!(d2.status.last_seen, d.status.last_seen);

    let unknown = received(report(
        "kedge1",
        "device01-01-kedge1-0",
        Some(probe("unknown", None)),
    ));
    let new_pod = PodFacts {
        gate: None,
        ..ready_pod()
    };
    let g = decide_for(Some(&new_pod), Some(&unknown), Heard::Alive, false, None)
        .gate
        .unwrap();
    assert_eq!(
        (g.status, g.reason),
        ("False", "NotProbedYet"),
        "a new proxy is not Ready before its node reached the device"
    );
    // edgelinkd restarted or handed over (its health starts over): the
    // gate stays as it was, and the node is Unknown, not False.
    let d = decide_for(Some(&pod), Some(&unknown), Heard::Alive, false, None);
    assert!(d.gate.is_none());
    assert_eq!(d.status.reachable, "Unknown");
    // Not probed at all, and why: False.
    let mut never = probe(
        "unknown",
        Some("the pod's network namespace cannot be entered"),
    );
    never["probesTotal"] = 0.into();
    let cannot = received(report("kedge1", "device01-01-kedge1-0", Some(never)));
    let g = decide_for(Some(&pod), Some(&cannot), Heard::Alive, false, None)
        .gate
        .unwrap();
    assert_eq!((g.status, g.reason), ("False", "CannotProbe"));
    assert!(g.message.contains("cannot be entered"), "{}", g.message);
}

#[test]
fn a_lost_node_is_unreachable_and_its_ready_pod_is_marked_not_ready() {
    let pod = ready_pod();
    let up = received(report(
        "kedge1",
        "device01-01-kedge1-0",
        Some(probe("reachable", None)),
    ));
    let d = decide_for(
        Some(&pod),
        Some(&up),
        Heard::Lost(Duration::from_secs(4)),
        false,
        None,
    );
    let g = d.gate.unwrap();
    assert_eq!((g.status, g.reason), ("False", "NodeLost"));
    assert!(g.message.contains("not heard for 4s"), "{}", g.message);
    assert!(d.mark_not_ready);
    // Not Ready already: nothing more to mark.
    let not_ready = PodFacts {
        ready: false,
        ..ready_pod()
    };
    assert!(
        !decide_for(
            Some(&not_ready),
            None,
            Heard::Lost(Duration::from_secs(9)),
            false,
            None
        )
        .mark_not_ready
    );
}

#[test]
fn silence_never_takes_the_last_serving_proxy_out() {
    let pod = ready_pod();
    let f = NodeFacts {
        node: "kedge1",
        pod_name: "device01-01-0",
        pod: Some(&pod),
        received: None,
        heard: Heard::Lost(Duration::from_secs(5)),
        fresh: false,
        others_serve: false,
    };
    let d = decide(&device(), &[], &f, None, SystemTime::now(), STALE);
    assert_eq!(
        (d.status.reachable.as_str(), d.status.reason.as_deref()),
        ("False", Some("NodeLost"))
    );
    assert!(d.gate.is_none() && !d.mark_not_ready);
}

#[test]
fn without_a_report_the_gate_is_left_alone_then_closed_and_without_probes_it_follows_serving() {
    let pod = ready_pod();
    // Just after the operator started: nobody knows yet.
    assert!(decide_for(Some(&pod), None, Heard::Never, true, None)
        .gate
        .is_none());
    // Not heard once the operator is past its first seconds (the node died
    // with the last leader, or its edgelinkd never reports): as lost,
    // while another node serves.
    let d = decide_for(Some(&pod), None, Heard::Never, false, None);
    let g = d.gate.unwrap();
    assert_eq!((g.status, g.reason), ("False", "NoReport"));
    assert!(d.mark_not_ready);
    // An edgelinkd without health probes: gated on serving the pod.
    let old = received(report("kedge1", "device01-01-kedge1-0", None));
    let d = decide_for(Some(&pod), Some(&old), Heard::Alive, false, None);
    assert_eq!(d.gate.unwrap().reason, "NotProbed");
    assert_eq!(
        d.status.reachable, "True",
        "from the forwards' reachability"
    );
    // A node that reports but does not serve the pod (its sandbox is gone).
    let other = received(report(
        "kedge1",
        "someone-else-0",
        Some(probe("reachable", None)),
    ));
    let g = decide_for(Some(&pod), Some(&other), Heard::Alive, false, None)
        .gate
        .unwrap();
    assert_eq!((g.status, g.reason), ("False", "ProxyNotServed"));
}

fn node(name: &str, reachable: &str, reason: &str, seen: Option<&str>) -> NodeStatus {
    NodeStatus {
        node: name.into(),
        reachable: reachable.into(),
        reason: Some(reason.into()),
        last_seen: seen.map(str::to_string),
        last_error: (reachable != "True").then(|| format!("node {name}: {reason}")),
        ..Default::default()
    }
}

#[test]
fn the_device_is_reachable_from_any_node_and_unreachable_when_every_node_says_so() {
    let a = node("kedge1", "True", "Reachable", Some("2026-11-26T06:00:00Z"));
    let b = node(
        "kedge2",
        "False",
        "Unreachable",
        Some("2026-11-26T06:00:05Z"),
    );
    let (count, seen, v) = summary(&[a.clone(), b.clone()]);
    assert_eq!(count, "1/2");
    assert_eq!(seen.as_deref(), Some("2026-11-26T06:00:05Z"));
    assert_eq!((v.status, v.reason), ("True", "Reachable"));
    assert!(v.message.contains("1 of 2 nodes (kedge1)"), "{}", v.message);

    let a_down = node("kedge1", "False", "NodeLost", None);
    let (count, _, v) = summary(&[a_down.clone(), b.clone()]);
    assert_eq!(
        (count.as_str(), v.status, v.reason),
        ("0/2", "False", "Unreachable")
    );
    assert!(v.message.contains("node kedge1: NodeLost") && v.message.contains("node kedge2"));
    let b_lost = node("kedge2", "False", "NodeLost", None);
    assert_eq!(summary(&[a_down, b_lost]).2.reason, "NodesLost");

    let unknown = node("kedge1", "Unknown", "NoReport", None);
    let (_, _, v) = summary(&[unknown, b]);
    assert_eq!((v.status, v.reason), ("Unknown", "NoReport"));
}
