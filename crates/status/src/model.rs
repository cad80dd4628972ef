//! What the daemon knows, as it is reported: the JSON of `/status`, the
//! source of `/metrics`, of the webhook and of `edgelinkd status`. Plain
//! data: what fills it is edgelink-forward's (a forward's report) and
//! edgelink-node's (the attachments, the node's counters).

use serde::{Deserialize, Serialize};
use std::time::{SystemTime, UNIX_EPOCH};

pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Whether the last attempt to reach a forward's target worked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reachability {
    /// `reachable`, `unreachable` or `unknown`.
    pub state: String,
    pub checked_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What `/status` and `/metrics` show of a [`Latency`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LatencySnapshot {
    pub count: u64,
    pub sum_seconds: f64,
    /// (upper bound in seconds, connects in that bucket alone); the last
    /// bound is +Inf, written as `null` in JSON.
    pub buckets: Vec<(Option<f64>, u64)>,
}

fn relay() -> String {
    "relay".into()
}

/// A reverse target that is a name: how it resolves now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedStatus {
    /// The address new connections go to (none yet, or a loop refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The name that answered, after the search list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered_as: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_at: Option<u64>,
    /// Why the last lookup failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default)]
    pub lookups: u64,
    /// Where the resolver configuration came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolver: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ForwardStatus {
    pub name: String,
    pub protocol: String,
    pub port: u16,
    /// A forward's device, or a reverse forward's cluster target as
    /// configured (`IP:port` or `name:port`).
    pub target: String,
    /// `reverse` for a reverse forward (devices calling the cluster);
    /// absent for a forward.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direction: Option<String>,
    /// Reverse: the interface addresses it listens on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<Vec<String>>,
    /// Reverse: who may connect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_sources: Option<Vec<String>>,
    /// Reverse, with a name as target: its resolution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved: Option<ResolvedStatus>,
    pub listener: String,
    /// TCP connections being relayed now; for a UDP forward, its open
    /// sessions (also in `udp_sessions`).
    pub active_connections: u64,
    /// TCP connections accepted (kernel path: flows); for a UDP forward,
    /// the sessions it created (also in `udp_sessions_total`).
    pub total_connections: u64,
    pub bytes_to_target: u64,
    pub bytes_to_client: u64,
    pub connect_errors: u64,
    pub errors: u64,
    pub splice_fallbacks: u64,
    pub refused: u64,
    pub udp_sessions: u64,
    pub udp_sessions_total: u64,
    pub udp_evictions: u64,
    pub udp_datagrams_to_target: u64,
    pub udp_datagrams_to_client: u64,
    pub udp_drops: u64,
    /// TCP: the idle timeout in force, in milliseconds (0: never).
    #[serde(default)]
    pub idle_timeout_ms: u64,
    /// `relay` or `kernel`.
    #[serde(default = "relay")]
    pub path: String,
    /// TCP: the bound on connections to the target in force (the forward's
    /// `maxConnections`, else `--forward-max-connections`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
    /// TCP: how long a client may wait for a place, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_timeout_ms: Option<u64>,
    /// TCP: connects retried after a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_retries: Option<u32>,
    /// TCP: the PROXY protocol header sent to the target, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_protocol: Option<String>,
    /// The kernel path: packets from clients to the target (nft counters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packets_to_target: Option<u64>,
    /// The kernel path: packets from the target back to clients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packets_to_client: Option<u64>,
    /// TCP: connections to the target now, when `maxConnections` bounds
    /// them (`activeConnections` also counts the clients waiting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_connections: Option<u64>,
    /// TCP clients waiting for a place now.
    #[serde(default)]
    pub queued: u64,
    /// TCP clients that had to wait.
    #[serde(default)]
    pub queued_total: u64,
    /// TCP clients closed after waiting longer than the queue timeout.
    #[serde(default)]
    pub queue_timeouts_total: u64,
    /// TCP clients reset at once because the queue was full.
    #[serde(default)]
    pub queue_full_total: u64,
    /// TCP clients that reset while waiting (a half-close stays queued).
    #[serde(default)]
    pub queue_abandoned_total: u64,
    /// Connects to the target tried again.
    #[serde(default)]
    pub connect_retries_total: u64,
    /// TCP: how long successful connects to the target took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_latency: Option<LatencySnapshot>,
    /// TCP connections reset at once because the daemon's
    /// `--max-connections` was reached.
    #[serde(default)]
    pub connections_rejected_total: u64,
    /// Clients refused because the Device's `allowedClients` does not
    /// select them (TCP connections; UDP datagrams are in `refused`).
    #[serde(default)]
    pub refused_by_policy_total: u64,
    /// TCP clients refused because the device is leased to another.
    #[serde(default)]
    pub refused_by_lease_total: u64,
    /// TCP clients the access rules refused that came from the node itself
    /// (the kubelet's readiness probe, a hostNetwork process): not in the
    /// two above, not audited.
    #[serde(default)]
    pub refused_from_node_total: u64,
    /// Relayed TCP connections reset because the access rules changed
    /// (a lease taken, a client no longer allowed).
    #[serde(default)]
    pub access_resets_total: u64,
    /// TCP clients that waited for their lease, and those that waited
    /// longer than the queue timeout.
    #[serde(default)]
    pub lease_waits_total: u64,
    #[serde(default)]
    pub lease_wait_timeouts_total: u64,
    /// A multiplexed Modbus/TCP forward's counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modbus: Option<ModbusStatus>,
    /// TCP connections reset because nothing moved for the idle timeout.
    #[serde(default)]
    pub idle_timeouts_total: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error_at: Option<u64>,
    pub reachability: Reachability,
}

/// A multiplexed Modbus/TCP forward (`"multiplex": true`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModbusStatus {
    /// Requests taken from clients; responses of the device passed back.
    pub requests_total: u64,
    pub responses_total: u64,
    /// Exceptions edgelinkd answered itself, by code (`"0x0B"`: no answer
    /// in time or the device's connection lost; `"0x0A"`: no way to the
    /// device, or the queue full).
    pub exceptions_total: std::collections::BTreeMap<String, u64>,
    /// Requests waiting now for a connection to the device.
    pub queued: u64,
    /// How long requests waited: counts of waits under each bound (ms),
    /// the last one for the rest, and their sum (µs).
    pub queue_wait_ms_buckets: Vec<(String, u64)>,
    pub queue_wait_sum_us: u64,
    pub reconnects_total: u64,
    /// Responses that came after their request was answered or its client
    /// went: dropped.
    pub late_responses_total: u64,
    pub malformed_from_clients_total: u64,
    pub malformed_from_device_total: u64,
}

/// An attachment's device health (its `health` probe), as the operator
/// An attachment's virtual addresses: whether it holds them, as the
/// operator's grants (or, without an operator, the attachment alone) say.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VirtualStatus {
    pub addresses: Vec<String>,
    /// On the interface now.
    pub held: bool,
    /// Since when held, or released (seconds since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<u64>,
    /// `operator`, `unmanaged` (no operator grants: held while the
    /// daemon runs) or `unknown` (no answer from the operator yet).
    pub granted_by: String,
    /// Why the last add, removal or announcement failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub taken_total: u64,
    pub released_total: u64,
    /// Gratuitous ARPs / unsolicited NAs sent (each address, each time).
    pub announcements_total: u64,
}

/// reads it (docs/status.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthStatus {
    /// `tcp`, `icmp`, `http`, `udp` or `modbus`.
    #[serde(rename = "type")]
    pub kind: String,
    pub target: String,
    /// `reachable`, `unreachable` or `unknown`.
    pub state: String,
    /// Unix seconds of the last transition (or of the start).
    pub since: u64,
    pub since_ms: u64,
    /// Unix seconds of the last successful probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<u64>,
    /// Unix seconds of the last probe (absent before the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked_at: Option<u64>,
    /// Of the last successful probe, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<f64>,
    /// Of the last failed probe; absent after a success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub probes_total: u64,
    pub failures_total: u64,
    /// Probes not sent: the device had no free place under the target
    /// forward's `maxConnections`.
    pub skipped_total: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentStatus {
    pub container_id: String,
    pub ifname: String,
    pub network: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    pub netns: String,
    pub mode: String,
    pub interface: edgelink_attachment::RecordInterface,
    /// `serving` or `failed`.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub forwards: Vec<ForwardStatus>,
    /// The device health probe; absent when none is configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthStatus>,
    /// Its virtual addresses (`virtualAddresses`); absent without.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_addresses: Option<VirtualStatus>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MalformedRecord {
    pub path: String,
    pub error: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub node: String,
    pub version: String,
    pub started_at: u64,
    pub last_reconcile_at: u64,
    pub draining: bool,
    pub attachments: Vec<AttachmentStatus>,
    pub malformed_records: Vec<MalformedRecord>,
    /// Attachments cleaned up because their netns was gone.
    pub reclaimed_total: u64,
    /// Pod interfaces the plugin's DEL retired (down, renamed) and this
    /// daemon deleted.
    #[serde(default)]
    pub retired_links_deleted_total: u64,
    /// Worker threads serving connections (`--workers`).
    #[serde(default)]
    pub workers: usize,
    /// Worker threads that died and were replaced.
    #[serde(default)]
    pub worker_replacements_total: u64,
    /// What needs an operator's eye (the node's conntrack table too small
    /// for the kernel path).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}
