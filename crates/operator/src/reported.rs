//! What edgelinkd reports through `--status-webhook`: the JSON of its
//! /status (edgelink-status's model), as far as the operator reads it.
//! Unknown fields are ignored and missing ones take defaults, so either
//! side may be upgraded first.

use serde::Deserialize;
use std::time::SystemTime;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct NodeReport {
    pub node: String,
    pub version: String,
    pub attachments: Vec<ReportAttachment>,
    /// edgelinkd's audit lines since its last report (issue 26): written
    /// to the operator's log as they came, with the node's name.
    pub audit: Vec<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ReportAttachment {
    pub container_id: String,
    pub ifname: String,
    pub pod_namespace: Option<String>,
    pub pod_name: Option<String>,
    /// `serving` or `failed`.
    pub state: String,
    pub error: Option<String>,
    pub interface: ReportInterface,
    pub forwards: Vec<ReportForward>,
    /// The device health probe's state (edgelinkd with health probes, and
    /// a NAD with `health`); absent from older edgelinkd.
    pub health: Option<ReportHealth>,
}

/// The attachment's device health, as edgelinkd probes it from the pod's
/// network namespace.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct ReportHealth {
    #[serde(rename = "type")]
    pub type_: String,
    pub target: String,
    /// `reachable`, `unreachable` or `unknown` (not probed enough yet).
    pub state: String,
    /// Unix seconds of the last transition.
    pub since: u64,
    /// Unix seconds of the last successful probe.
    pub last_seen: Option<u64>,
    pub checked_at: u64,
    pub latency_ms: Option<f64>,
    /// The last failed probe's error.
    pub error: Option<String>,
    pub probes_total: u64,
    pub failures_total: u64,
    pub skipped_total: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ReportInterface {
    pub name: String,
    pub ips: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ReportForward {
    pub name: String,
    /// `reverse` for a reverse forward (devices calling the cluster);
    /// empty or `forward` otherwise.
    pub direction: String,
    pub protocol: String,
    pub port: u32,
    pub listener: String,
    pub active_connections: u64,
    pub total_connections: u64,
    pub bytes_to_target: u64,
    pub bytes_to_client: u64,
    pub udp_sessions_total: u64,
    pub last_error: Option<String>,
    pub reachability: ReportReachability,
    /// A reverse forward whose target is a name: how it resolves now.
    pub resolved: Option<ReportResolved>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ReportResolved {
    /// The address new connections go to.
    pub address: Option<String>,
    /// Why the last lookup failed.
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ReportReachability {
    /// `reachable`, `unreachable` or `unknown`.
    pub state: String,
    pub error: Option<String>,
}

/// A report as received.
#[derive(Debug, Clone)]
pub struct Received {
    pub report: NodeReport,
    pub at: SystemTime,
}
