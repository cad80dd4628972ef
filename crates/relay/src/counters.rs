//! Counters of one forward, shared between the relay tasks and the daemon's
//! status and metrics.

use std::sync::atomic::{AtomicU64, Ordering};

/// Monotonic counters and gauges of one forward. Relaxed atomics: readers
/// want recent values, not a consistent snapshot.
#[derive(Debug, Default)]
pub struct Counters {
    /// TCP connections being relayed now (gauge).
    pub active: AtomicU64,
    /// TCP connections accepted and relayed (or attempted) since start.
    pub total: AtomicU64,
    /// Bytes from clients towards the target.
    pub bytes_to_target: AtomicU64,
    /// Bytes from the target back to clients.
    pub bytes_to_client: AtomicU64,
    /// Connects to the target that failed or timed out.
    pub connect_errors: AtomicU64,
    /// Connections that ended with an error other than a connect failure;
    /// for UDP, the errors the target's side reported on a session's
    /// socket (ICMP: port or host unreachable, prohibited, ...), after
    /// which the session goes on.
    pub errors: AtomicU64,
    /// TCP connections reset after their idle timeout (no byte moved
    /// either way for that long).
    pub idle_timeouts: AtomicU64,
    /// Times splice was refused and a plain copy was used instead.
    pub splice_fallbacks: AtomicU64,
    /// Connections or datagrams refused (private side, not allowed).
    pub refused: AtomicU64,
    /// UDP sessions open now (gauge).
    pub udp_sessions: AtomicU64,
    /// UDP sessions created since start.
    pub udp_sessions_total: AtomicU64,
    /// UDP sessions evicted because the table was full.
    pub udp_evictions: AtomicU64,
    /// UDP datagrams client → target and target → client.
    pub udp_datagrams_to_target: AtomicU64,
    pub udp_datagrams_to_client: AtomicU64,
    /// UDP datagrams dropped (send errors, full buffers).
    pub udp_drops: AtomicU64,
}

impl Counters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn dec(c: &AtomicU64) {
        c.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}
