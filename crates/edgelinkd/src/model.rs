//! What the daemon knows, as it is reported: the JSON of `/status`, the
//! source of `/metrics`, of the control socket's `check` and of
//! `edgelinkd status`.

use crate::protect::{LatencySnapshot, Limits, Protection};
use edgelink_relay::Counters;
use serde::{Deserialize, Serialize};
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::Duration;
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

/// Mutable state of one forward (counters live in [`Counters`]).
#[derive(Debug, Default)]
pub struct ForwardState {
    /// `starting`, `listening`, `failed`, `refused`, `stopped`.
    pub listener: String,
    pub last_error: Option<String>,
    pub last_error_at: u64,
    pub reachability: Reachability,
}

/// One forward of one attachment, shared by its tasks and the reporters.
#[derive(Debug)]
pub struct ForwardRuntime {
    pub spec: edgelink_attachment::Forward,
    pub counters: std::sync::Arc<Counters>,
    pub state: Mutex<ForwardState>,
    /// TCP: the idle timeout in force (the forward's `idleTimeoutMs`, else
    /// the daemon's `--tcp-idle-timeout`); `None`: never.
    pub idle_timeout: Option<Duration>,
    /// TCP connections reset at once because the daemon's
    /// `--max-connections` was reached.
    pub rejected: AtomicU64,
    /// TCP: the device's protection (queue, retries, connect latency).
    pub protection: Protection,
    /// The kernel path: packets each way, from the table's counters.
    pub packets_to_target: AtomicU64,
    pub packets_to_client: AtomicU64,
    /// A reverse forward's own side (listen on the interface, sources,
    /// the followed target); `None` for a forward.
    pub reverse: Option<std::sync::Arc<crate::reverse::ReverseSide>>,
}

/// The daemon's defaults for what a forward does not set itself.
#[derive(Debug, Clone)]
pub struct ForwardDefaults {
    /// `--tcp-idle-timeout` (zero: never).
    pub idle_timeout: Duration,
    /// `--forward-max-connections` (0: no bound).
    pub max_connections: u32,
    /// `--queue-timeout`.
    pub queue_timeout: Duration,
    /// `--max-queue`.
    pub max_queue: u32,
    /// `--connect-retries`.
    pub connect_retries: u32,
    /// `--connect-retry-backoff`.
    pub retry_backoff: Duration,
}

impl ForwardRuntime {
    pub fn new(spec: edgelink_attachment::Forward, d: &ForwardDefaults) -> ForwardRuntime {
        let idle = spec
            .idle_timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(d.idle_timeout);
        let limits = Limits {
            max_connections: spec
                .max_connections
                .or((d.max_connections > 0).then_some(d.max_connections)),
            queue_timeout: spec
                .queue_timeout_ms
                .map(Duration::from_millis)
                .unwrap_or(d.queue_timeout),
            max_queue: d.max_queue,
            connect_retries: spec.connect_retries.unwrap_or(d.connect_retries),
            retry_backoff: d.retry_backoff,
        };
        ForwardRuntime {
            idle_timeout: (!idle.is_zero()).then_some(idle),
            rejected: AtomicU64::new(0),
            protection: Protection::new(limits),
            packets_to_target: AtomicU64::new(0),
            packets_to_client: AtomicU64::new(0),
            reverse: None,
            spec,
            counters: Default::default(),
            state: Mutex::new(ForwardState {
                listener: "starting".into(),
                reachability: Reachability {
                    state: "unknown".into(),
                    ..Default::default()
                },
                ..Default::default()
            }),
        }
    }

    /// A reverse forward: served as a forward, with its own side.
    pub fn reverse(side: crate::reverse::ReverseSide, d: &ForwardDefaults) -> ForwardRuntime {
        let mut f = ForwardRuntime::new(side.spec.as_forward(), d);
        f.reverse = Some(std::sync::Arc::new(side));
        f
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, ForwardState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_listener(&self, state: &str) {
        self.lock().listener = state.to_string();
    }

    pub fn error(&self, e: impl std::fmt::Display) {
        let mut s = self.lock();
        s.last_error = Some(e.to_string());
        s.last_error_at = now();
    }

    pub fn reach(&self, ok: bool, err: Option<String>) {
        let mut s = self.lock();
        s.reachability = Reachability {
            state: if ok { "reachable" } else { "unreachable" }.into(),
            checked_at: now(),
            error: err,
        };
    }

    pub fn report(&self) -> ForwardStatus {
        let c = &self.counters;
        let p = &self.protection;
        let l = &p.limits;
        let kernel = self.spec.path == edgelink_attachment::ForwardPath::Kernel;
        // The relay's bounds mean nothing to the kernel path.
        let tcp = self.spec.protocol == edgelink_attachment::Protocol::Tcp && !kernel;
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let s = self.lock();
        let reverse = self.reverse.as_ref().map(|r| (r, r.lock().clone()));
        ForwardStatus {
            name: self.spec.name.clone(),
            protocol: self.spec.protocol.to_string(),
            port: self.spec.port,
            target: match &reverse {
                Some((r, _)) => r.spec.target.to_string(),
                None => self.spec.target.to_string(),
            },
            direction: reverse.as_ref().map(|_| "reverse".to_string()),
            listen: reverse
                .as_ref()
                .map(|(r, _)| r.listen_addrs().iter().map(|a| a.to_string()).collect()),
            allowed_sources: reverse.as_ref().map(|(r, _)| {
                r.spec
                    .allowed_sources
                    .iter()
                    .map(|n| n.to_string())
                    .collect()
            }),
            resolved: reverse
                .as_ref()
                .filter(|(r, _)| r.spec.target.addr().is_none())
                .map(|(_, res)| ResolvedStatus {
                    address: res.addr.map(|a| a.to_string()),
                    answered_as: res.answered_as.clone(),
                    resolved_at: (res.resolved_at > 0).then_some(res.resolved_at),
                    error: res.error.clone(),
                    lookups: res.lookups,
                    resolver: res.resolver.clone(),
                }),
            listener: s.listener.clone(),
            // A UDP forward's sessions are its connections (the relay counts
            // them apart; the kernel path counts its conntrack flows in
            // `total`): one pair of numbers means the same in /status, in
            // /metrics and in the `edgelinkd status` table.
            active_connections: Counters::get(&c.active) + Counters::get(&c.udp_sessions),
            total_connections: Counters::get(&c.total) + Counters::get(&c.udp_sessions_total),
            bytes_to_target: Counters::get(&c.bytes_to_target),
            bytes_to_client: Counters::get(&c.bytes_to_client),
            connect_errors: Counters::get(&c.connect_errors),
            errors: Counters::get(&c.errors),
            splice_fallbacks: Counters::get(&c.splice_fallbacks),
            refused: Counters::get(&c.refused),
            udp_sessions: Counters::get(&c.udp_sessions),
            udp_sessions_total: Counters::get(&c.udp_sessions_total),
            udp_evictions: Counters::get(&c.udp_evictions),
            udp_datagrams_to_target: Counters::get(&c.udp_datagrams_to_target),
            udp_datagrams_to_client: Counters::get(&c.udp_datagrams_to_client),
            udp_drops: Counters::get(&c.udp_drops),
            idle_timeout_ms: self
                .idle_timeout
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            path: self.spec.path.to_string(),
            max_connections: tcp.then_some(l.max_connections).flatten(),
            queue_timeout_ms: tcp.then(|| millis(l.queue_timeout)),
            connect_retries: tcp.then_some(l.connect_retries),
            proxy_protocol: self.spec.proxy_protocol.map(|p| p.to_string()),
            packets_to_target: kernel.then(|| Counters::get(&self.packets_to_target)),
            packets_to_client: kernel.then(|| Counters::get(&self.packets_to_client)),
            target_connections: p.in_use(),
            queued: Counters::get(&p.queued),
            queued_total: Counters::get(&p.queued_total),
            queue_timeouts_total: Counters::get(&p.queue_timeouts),
            queue_full_total: Counters::get(&p.queue_full),
            queue_abandoned_total: Counters::get(&p.queue_abandoned),
            connect_retries_total: Counters::get(&p.retries),
            connect_latency: tcp.then(|| p.latency.snapshot()),
            connections_rejected_total: Counters::get(&self.rejected),
            idle_timeouts_total: Counters::get(&c.idle_timeouts),
            last_error: s.last_error.clone(),
            last_error_at: (s.last_error_at > 0).then_some(s.last_error_at),
            reachability: self.reachability(&s),
        }
    }

    /// UDP has no connect: a target that answered is reachable.
    fn reachability(&self, s: &ForwardState) -> Reachability {
        if self.spec.protocol == edgelink_attachment::Protocol::Udp
            && s.reachability.state == "unknown"
            && Counters::get(&self.counters.udp_datagrams_to_client) > 0
        {
            return Reachability {
                state: "reachable".into(),
                checked_at: now(),
                error: None,
            };
        }
        s.reachability.clone()
    }
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
    /// TCP connections reset because nothing moved for the idle timeout.
    #[serde(default)]
    pub idle_timeouts_total: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error_at: Option<u64>,
    pub reachability: Reachability,
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
