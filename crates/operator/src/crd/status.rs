//! A Device's status: what the operator made, and per node and port what
//! edgelinkd on each of the Device's nodes last reported.

use super::ReverseStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the operator made and what edgelinkd on the node reports.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceStatus {
    /// `Reconciled`, `Ready`, `DeviceReachable`.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The node the proxy pod is on (or is meant for, before it runs); with
    /// several nodes, the first (`nodes` has each).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The proxy pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The proxy pod's address on the segment (net1): what the device sees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment_address: Option<String>,
    /// `8080/tcp,5000/udp`: the ports column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_list: Option<String>,
    /// Per port, from edgelinkd's last report (with several nodes, the
    /// first node's that reported).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortStatus>,
    /// Per reverse entry: the target rendered into the NAD and, from
    /// edgelinkd's last report, its listener and counters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reverse: Vec<ReverseStatus>,
    /// When edgelinkd on the node last reported (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported_at: Option<String>,
    /// Per node of the Device: its proxy pod and whether that node
    /// reaches the device (edgelinkd's health probe, from the pod's
    /// network namespace).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["node"]))]
    pub nodes: Vec<NodeStatus>,
    /// `kedge1,kedge2`: the NODES column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_list: Option<String>,
    /// `1/2`: nodes that reach the device, of the Device's nodes (the
    /// REACHABLE column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reachable_nodes: Option<String>,
    /// The latest successful probe of the device from any node (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<String>,
    /// With `spec.virtualAddresses`: the node whose proxy holds them now
    /// (absent while they move or no proxy may hold them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_address_holder: Option<String>,
    /// Since when it has held them (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_address_since: Option<String>,
}

/// One node of a Device, as its edgelinkd last reported.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    pub node: String,
    /// The proxy pod on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Its address on the segment (net1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment_address: Option<String>,
    /// The pod is Ready: in the Service's endpoints.
    #[serde(default)]
    pub ready: bool,
    /// `True`, `False` or `Unknown`: the health probe from this node.
    pub reachable: String,
    /// Why: `Reachable`, `Unreachable`, `NotProbed`, `NoReport`, `NodeLost`, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The last successful probe (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<String>,
    /// When `reachable` last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    /// The last successful probe's round trip, e.g. `0.42ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<String>,
    /// The last failed probe's error, or why the node is not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When edgelinkd on this node last reported (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported_at: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortStatus {
    pub name: String,
    pub protocol: String,
    pub port: u32,
    /// edgelinkd's listener in the proxy pod: listening, starting, failed, refused, stopped.
    pub listener: String,
    pub listening: bool,
    /// `True`, `False` or `Unknown`: the last connect (TCP) or reply (UDP).
    pub reachable: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reachability_error: Option<String>,
    pub active_connections: u64,
    pub total_connections: u64,
    pub bytes_to_device: u64,
    pub bytes_from_device: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

impl DeviceStatus {
    /// Whether `self` and `other` say the same but for the live fields:
    /// when the probes last succeeded and took how long, when a node last
    /// reported, and the connection and byte counters. A status that
    /// differs only there is written at most every `--status-refresh`.
    pub fn same_state(&self, other: &DeviceStatus) -> bool {
        self.without_live() == other.without_live()
    }

    fn without_live(&self) -> DeviceStatus {
        let mut s = self.clone();
        s.last_seen = None;
        s.reported_at = None;
        for p in &mut s.ports {
            p.active_connections = 0;
            p.total_connections = 0;
            p.bytes_to_device = 0;
            p.bytes_from_device = 0;
        }
        for r in &mut s.reverse {
            r.active_connections = 0;
            r.total_connections = 0;
            r.bytes_to_target = 0;
            r.bytes_from_target = 0;
        }
        for n in &mut s.nodes {
            n.last_seen = None;
            n.latency = None;
            n.reported_at = None;
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status() -> DeviceStatus {
        DeviceStatus {
            last_seen: Some("2026-11-26T10:00:00Z".into()),
            ports: vec![PortStatus {
                name: "api".into(),
                protocol: "tcp".into(),
                port: 8080,
                listener: "listening".into(),
                listening: true,
                reachable: "True".into(),
                total_connections: 3,
                ..Default::default()
            }],
            nodes: vec![NodeStatus {
                node: "kedge1".into(),
                reachable: "True".into(),
                latency: Some("0.41ms".into()),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn counters_and_times_are_live_and_a_state_is_not() {
        let a = status();
        let mut b = status();
        b.last_seen = Some("2026-11-26T10:00:30Z".into());
        b.ports[0].total_connections = 9;
        b.nodes[0].latency = Some("0.52ms".into());
        assert!(a.same_state(&b), "only live fields moved");
        let mut c = b.clone();
        c.nodes[0].reachable = "False".into();
        assert!(!a.same_state(&c), "a node's reachability is a state");
        let mut c = b.clone();
        c.ports[0].listener = "failed".into();
        assert!(!a.same_state(&c), "a listener's state is a state");
    }
}
