//! One forward of one attachment as its tasks share it: the spec, the
//! counters, the listener's state and last error, the device's protection,
//! and the report of all that for /status and /metrics.

use crate::protect::{Limits, Protection};
use edgelink_relay::Counters;
use edgelink_status::{now, ForwardStatus, Reachability, ResolvedStatus};
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::Duration;

/// A forward's counts of the access rules at work.
#[derive(Debug, Default)]
pub struct AccessCounters {
    /// Clients refused because `allowedClients` does not select them.
    pub refused_policy: AtomicU64,
    /// Clients refused because the device is leased to someone else.
    pub refused_lease: AtomicU64,
    /// Clients refused that came from the node itself (the kubelet's
    /// readiness probe of the proxy pod, a hostNetwork process): not in
    /// the two above, not audited.
    pub refused_node: AtomicU64,
    /// Relayed connections reset because the rules changed (a lease
    /// taken, a client no longer allowed).
    pub reset: AtomicU64,
    /// Clients that waited for their lease; and those that waited longer
    /// than the queue timeout.
    pub waited: AtomicU64,
    pub wait_timeouts: AtomicU64,
    /// The second of the last refusal logged at info (one a second).
    pub(crate) logged: AtomicU64,
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
    /// The access rules at work: refusals, resets, waits.
    pub access: AccessCounters,
    /// A multiplexed Modbus/TCP forward's counts (kept across restarts of
    /// its multiplexer).
    pub modbus: Option<std::sync::Arc<edgelink_modbus::Stats>>,
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
            access: Default::default(),
            modbus: spec.modbus.map(|_| Default::default()),
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
        let reverse = self.reverse_report();
        ForwardStatus {
            name: self.spec.name.clone(),
            protocol: self.spec.protocol.to_string(),
            port: self.spec.port,
            target: match &self.reverse {
                Some(r) => r.spec.target.to_string(),
                None => self.spec.target.to_string(),
            },
            direction: reverse.as_ref().map(|_| "reverse".to_string()),
            listen: reverse.as_ref().map(|r| r.listen.clone()),
            allowed_sources: reverse.as_ref().map(|r| r.allowed_sources.clone()),
            resolved: reverse.and_then(|r| r.resolved),
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
            refused_by_policy_total: Counters::get(&self.access.refused_policy),
            refused_by_lease_total: Counters::get(&self.access.refused_lease),
            refused_from_node_total: Counters::get(&self.access.refused_node),
            access_resets_total: Counters::get(&self.access.reset),
            lease_waits_total: Counters::get(&self.access.waited),
            lease_wait_timeouts_total: Counters::get(&self.access.wait_timeouts),
            modbus: self.modbus.as_deref().map(modbus_report),
            idle_timeouts_total: Counters::get(&c.idle_timeouts),
            last_error: s.last_error.clone(),
            last_error_at: (s.last_error_at > 0).then_some(s.last_error_at),
            reachability: self.reachability(&s),
        }
    }

    /// What a reverse forward adds to the report (`None`: a forward).
    fn reverse_report(&self) -> Option<ReverseReport> {
        let r = self.reverse.as_ref()?;
        let res = r.lock().clone();
        Some(ReverseReport {
            listen: r
                .listen_addrs()
                .iter()
                .chain(&r.virtual_listen_addrs())
                .map(|a| a.to_string())
                .collect(),
            allowed_sources: r
                .spec
                .allowed_sources
                .iter()
                .map(|n| n.to_string())
                .collect(),
            resolved: r.spec.target.addr().is_none().then(|| ResolvedStatus {
                address: res.addr.map(|a| a.to_string()),
                answered_as: res.answered_as.clone(),
                resolved_at: (res.resolved_at > 0).then_some(res.resolved_at),
                error: res.error.clone(),
                lookups: res.lookups,
                resolver: res.resolver.clone(),
            }),
        })
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

/// A reverse forward's part of its report.
struct ReverseReport {
    listen: Vec<String>,
    allowed_sources: Vec<String>,
    resolved: Option<ResolvedStatus>,
}

/// A multiplexer's counts as /status shows them.
fn modbus_report(s: &edgelink_modbus::Stats) -> edgelink_status::ModbusStatus {
    use edgelink_modbus::stats::WAIT_BUCKETS_MS;
    let get = edgelink_modbus::Stats::get;
    let exceptions_total = (0u8..16)
        .map(|code| (code, get(&s.exceptions[usize::from(code)])))
        .filter(|(_, n)| *n > 0)
        .map(|(code, n)| (format!("0x{code:02X}"), n))
        .collect();
    let bounds = WAIT_BUCKETS_MS
        .iter()
        .map(|b| b.to_string())
        .chain(std::iter::once("+Inf".to_string()));
    edgelink_status::ModbusStatus {
        requests_total: get(&s.requests),
        responses_total: get(&s.responses),
        exceptions_total,
        queued: get(&s.queued),
        queue_wait_ms_buckets: bounds.zip(s.wait_buckets.iter().map(get)).collect(),
        queue_wait_sum_us: get(&s.wait_sum_us),
        reconnects_total: get(&s.reconnects),
        late_responses_total: get(&s.late_responses),
        malformed_from_clients_total: get(&s.malformed_from_clients),
        malformed_from_device_total: get(&s.malformed_from_device),
    }
}
