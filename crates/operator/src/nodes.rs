//! Each node of a Device: whether it reaches the device, what its proxy
//! pod's readiness gate must say, and the Device's summary of them all.
//! Pure: the controller gathers the facts (the node's report, whether its
//! edgelinkd is still heard, the proxy pod) and applies the decisions.
//!
//! Who decides: edgelinkd on the node probes the device from inside the
//! proxy pod's network namespace and reports the state; the operator only
//! turns it into the gate, and decides alone that a node is lost when its
//! edgelinkd stops being heard (no heartbeat for `--node-lost-after`), and
//! takes a lost node's proxy out only while another node's serves.

use crate::crd::{Device, NodeStatus};
use crate::report::{self, Health, Received, ReportAttachment};
use crate::reverse::Resolved;
use crate::verdict::Verdict;
use std::time::{Duration, SystemTime};

/// Whether the node's edgelinkd is heard (reports or heartbeats).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard {
    /// Within its bound.
    Alive,
    /// Heard before, silent for this long (past its bound): the node, or
    /// edgelinkd on it, is gone.
    Lost(Duration),
    /// Not since the operator started.
    Never,
}

/// The proxy pod as the API has it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodFacts {
    pub ready: bool,
    /// The readiness gate's condition: `True`, `False`, absent.
    pub gate: Option<String>,
    /// The address Multus recorded for net1.
    pub segment_address: Option<String>,
}

/// What the controller must do for one node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeDecision {
    pub status: NodeStatus,
    /// The node's health as the report says it (ports, reverse, listening).
    pub health: Health,
    /// The readiness gate's value; `None`: leave it as it is.
    pub gate: Option<Verdict>,
    /// The node is lost and its pod still Ready: mark it not Ready, as the
    /// node lifecycle controller would, only sooner.
    pub mark_not_ready: bool,
}

/// The facts of one node.
pub struct NodeFacts<'a> {
    pub node: &'a str,
    pub pod_name: &'a str,
    pub pod: Option<&'a PodFacts>,
    pub received: Option<&'a Received>,
    pub heard: Heard,
    /// The operator started within a report interval or two: a node not
    /// heard yet is not known to be gone. After it, a node never heard is
    /// taken as lost.
    pub fresh: bool,
    /// Another node of the Device is heard and its proxy is Ready: silence
    /// alone never takes a Device's last serving proxy out of its Service
    /// (the operator cut off from every node must not empty it); and a
    /// proxy's Ready is set False with its gate only while another serves.
    pub others_serve: bool,
}

fn rfc3339(secs: u64) -> Option<String> {
    k8s_openapi::jiff::Timestamp::from_second(secs as i64)
        .ok()
        .map(|t| t.to_string())
}

fn system_rfc3339(t: SystemTime) -> Option<String> {
    rfc3339(t.duration_since(SystemTime::UNIX_EPOCH).ok()?.as_secs())
}

/// The serving attachment of the proxy pod in the node's fresh report.
fn served<'a>(d: &Device, f: &NodeFacts<'a>) -> Option<&'a ReportAttachment> {
    let ns = d.metadata.namespace.as_deref().unwrap_or("");
    report::attachment(&f.received?.report, ns, f.pod_name)
}

/// The node's reachability and the gate from it.
fn verdicts(d: &Device, f: &NodeFacts, h: &Health) -> (Verdict, Option<Verdict>) {
    let node = f.node;
    if let Heard::Lost(for_) = f.heard {
        let v = Verdict::new(
            "False",
            "NodeLost",
            format!("edgelinkd on node {node} not heard for {}s", for_.as_secs()),
        );
        let gate = f.others_serve.then(|| v.clone());
        return (v, gate);
    }
    if h.listening.is_none() {
        // No fresh report of the pod: keep the gate unless the node is
        // known to serve nothing of it.
        if f.heard == Heard::Never && !f.fresh {
            // Not heard since the operator started (the node died with
            // the last leader, or its edgelinkd never reports): as lost.
            let v = Verdict::new(
                "False",
                "NoReport",
                format!("edgelinkd on node {node} has not been heard since the operator started"),
            );
            let gate = f.others_serve.then(|| v.clone());
            return (v, gate);
        }
        let gate = match (f.heard, h.reachable.reason) {
            (Heard::Never, _) => None,
            (_, "ProxyNotServed") => Some(Verdict::new(
                "False",
                "ProxyNotServed",
                h.reachable.message.clone(),
            )),
            _ => None,
        };
        return (h.reachable.clone(), gate);
    }
    let Some(probe) = served(d, f).and_then(|a| a.health.as_ref()) else {
        // edgelinkd without health probes: gated on serving only.
        let gate = Verdict::new(
            "True",
            "NotProbed",
            format!("edgelinkd on node {node} serves the pod but does not probe the device"),
        );
        return (h.reachable.clone(), Some(gate));
    };
    let v = match probe.state.as_str() {
        "reachable" => Verdict::new(
            "True",
            "Reachable",
            format!(
                "edgelinkd on node {node} reaches the device ({} {})",
                probe.type_, probe.target
            ),
        ),
        "unreachable" => Verdict::new(
            "False",
            "Unreachable",
            format!(
                "edgelinkd on node {node} does not reach the device ({} {}): {}",
                probe.type_,
                probe.target,
                probe.error.as_deref().unwrap_or("no answer")
            ),
        ),
        _ if probe.probes_total == 0 && probe.error.is_some() => Verdict::new(
            "False",
            "CannotProbe",
            format!(
                "edgelinkd on node {node} cannot probe the device: {}",
                probe.error.as_deref().unwrap_or_default()
            ),
        ),
        _ => {
            // Not probed enough yet: a new proxy waits for the first
            // verdict (gate False); one that had a gate keeps it, as after
            // edgelinkd's restart or hand-over, whose health starts over.
            let v = Verdict::new(
                "Unknown",
                "NotProbedYet",
                format!("edgelinkd on node {node} has not probed the device enough yet"),
            );
            let gate = match f.pod.and_then(|p| p.gate.as_deref()) {
                Some(_) => None,
                None => Some(Verdict::new("False", v.reason, v.message.clone())),
            };
            return (v, gate);
        }
    };
    (v.clone(), Some(v))
}

/// Decide for one node. `old`: its status before, for the transition time.
pub fn decide(
    d: &Device,
    resolved: &[Resolved],
    f: &NodeFacts,
    old: Option<&NodeStatus>,
    now: SystemTime,
    stale_after: Duration,
) -> NodeDecision {
    let h = report::health(
        d,
        resolved,
        f.node,
        f.pod_name,
        f.received,
        now,
        stale_after,
    );
    let (reach, gate) = verdicts(d, f, &h);
    let probe = served(d, f).and_then(|a| a.health.clone());
    let since = probe
        .as_ref()
        .filter(|p| matches!(p.state.as_str(), "reachable" | "unreachable"))
        .and_then(|p| rfc3339(p.since));
    let last_transition_time = match old {
        Some(o) if o.reachable == reach.status => o.last_transition_time.clone(),
        _ => since.or_else(|| system_rfc3339(now)),
    };
    let pod_ready = f.pod.is_some_and(|p| p.ready);
    let status = NodeStatus {
        node: f.node.to_string(),
        pod: f.pod.map(|_| f.pod_name.to_string()),
        segment_address: h
            .segment_address
            .clone()
            .or_else(|| f.pod.and_then(|p| p.segment_address.clone())),
        ready: pod_ready,
        reachable: reach.status.to_string(),
        reason: Some(reach.reason.to_string()),
        last_seen: probe
            .as_ref()
            .and_then(|p| p.last_seen)
            .and_then(rfc3339)
            .or_else(|| old.and_then(|o| o.last_seen.clone())),
        last_transition_time,
        latency: probe
            .as_ref()
            .and_then(|p| p.latency_ms)
            .map(|ms| format!("{ms:.2}ms")),
        last_error: match reach.status {
            "True" => None,
            _ => Some(reach.message.clone()),
        },
        reported_at: f.received.and_then(|r| system_rfc3339(r.at)),
    };
    NodeDecision {
        // Ready False at once, not when the kubelet folds the gate in (a
        // lost node has none), while another node serves.
        mark_not_ready: gate.as_ref().is_some_and(|g| g.status == "False")
            && pod_ready
            && f.others_serve,
        status,
        health: h,
        gate,
    }
}

/// The Device's view of its nodes: `1/2` reaching it, the latest
/// successful probe, and `DeviceReachable` (True when some node reaches
/// the device, False when every node is known not to).
pub fn summary(nodes: &[NodeStatus]) -> (String, Option<String>, Verdict) {
    let reaching: Vec<&str> = nodes
        .iter()
        .filter(|n| n.reachable == "True")
        .map(|n| n.node.as_str())
        .collect();
    let count = format!("{}/{}", reaching.len(), nodes.len());
    let last_seen = nodes.iter().filter_map(|n| n.last_seen.clone()).max();
    let why = |n: &NodeStatus| {
        n.last_error
            .clone()
            .unwrap_or_else(|| format!("node {}: {}", n.node, n.reachable))
    };
    let v = if !reaching.is_empty() {
        Verdict::new(
            "True",
            "Reachable",
            format!(
                "reached from {} of {} nodes ({})",
                reaching.len(),
                nodes.len(),
                reaching.join(", ")
            ),
        )
    } else if !nodes.is_empty() && nodes.iter().all(|n| n.reachable == "False") {
        let reason = match nodes
            .iter()
            .all(|n| n.reason.as_deref() == Some("NodeLost"))
        {
            true => "NodesLost",
            false => "Unreachable",
        };
        Verdict::new(
            "False",
            reason,
            nodes.iter().map(why).collect::<Vec<_>>().join("; "),
        )
    } else {
        let reason = nodes
            .iter()
            .find_map(|n| n.reason.clone())
            .unwrap_or_else(|| "NoNode".into());
        Verdict::new(
            "Unknown",
            known_reason(&reason),
            nodes.iter().map(why).collect::<Vec<_>>().join("; "),
        )
    };
    (count, last_seen, v)
}

/// A node's reason, as a condition's: one of those a node's verdict has.
fn known_reason(r: &str) -> &'static str {
    const KNOWN: [&str; 8] = [
        "NotProbedYet",
        "NoReport",
        "ReportStale",
        "ProxyNotServed",
        "NotChecked",
        "ProxyFailed",
        "PreviousReport",
        "NoNode",
    ];
    KNOWN.into_iter().find(|k| *k == r).unwrap_or("Unknown")
}

#[cfg(test)]
mod tests;
