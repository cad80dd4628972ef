//! What a multiplexer counts: requests, responses, the exceptions it
//! answered itself (by code), the queue and how long requests waited in
//! it, the device's connections made again, and frames it could not read.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds (milliseconds) of the queue-wait histogram's buckets; the
/// last bucket takes the rest.
pub const WAIT_BUCKETS_MS: [u64; 8] = [1, 5, 10, 50, 100, 500, 1000, 5000];

#[derive(Debug, Default)]
pub struct Stats {
    /// Requests taken from clients.
    pub requests: AtomicU64,
    /// Responses of the device passed to their clients.
    pub responses: AtomicU64,
    /// Exceptions the multiplexer answered itself, by code (0x0A: no way
    /// to the device or the queue full; 0x0B: no answer in time, or the
    /// device's connection lost).
    pub exceptions: [AtomicU64; 16],
    /// Requests waiting in the queue now.
    pub queued: AtomicU64,
    /// Connections to the device made again after one was lost.
    pub reconnects: AtomicU64,
    /// Responses that came after their request was answered (a timeout) or
    /// its client had gone: dropped, never passed to another client.
    pub late_responses: AtomicU64,
    /// Clients reset for a frame that is not Modbus/TCP.
    pub malformed_from_clients: AtomicU64,
    /// Device connections dropped for a frame that is not Modbus/TCP or
    /// answers no request.
    pub malformed_from_device: AtomicU64,
    /// How long requests waited in the queue: counts per bucket of
    /// [`WAIT_BUCKETS_MS`] (and one more), and the sum in microseconds.
    pub wait_buckets: [AtomicU64; WAIT_BUCKETS_MS.len() + 1],
    pub wait_sum_us: AtomicU64,
}

impl Stats {
    pub(crate) fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn exception(&self, code: u8) {
        Stats::inc(&self.exceptions[usize::from(code & 0x0F)]);
    }

    pub(crate) fn waited(&self, d: Duration) {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let i = WAIT_BUCKETS_MS
            .iter()
            .position(|&b| ms < b)
            .unwrap_or(WAIT_BUCKETS_MS.len());
        Stats::inc(&self.wait_buckets[i]);
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.wait_sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// A counter's value.
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}
