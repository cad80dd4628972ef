//! What this process sent to edgelink-operator: the status webhook's
//! reports and the heartbeats, their count and body bytes (the
//! `edgelink_webhook_*` series of /metrics): the webhook's traffic from a
//! node, as `make bench-scale` reports it.

use std::sync::atomic::{AtomicU64, Ordering};

/// Posts and body bytes of one kind.
#[derive(Debug, Default)]
pub struct Sent {
    posts: AtomicU64,
    bytes: AtomicU64,
}

impl Sent {
    const fn new() -> Sent {
        Sent {
            posts: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
    }

    /// One post of `bytes` of body (answered or not).
    pub fn add(&self, bytes: usize) {
        self.posts.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// (posts, bytes) so far.
    pub fn get(&self) -> (u64, u64) {
        (
            self.posts.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }
}

/// The status reports (`/v1/status`).
pub static REPORTS: Sent = Sent::new();
/// The heartbeats (`/v1/heartbeat`).
pub static HEARTBEATS: Sent = Sent::new();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn posts_and_bytes_add_up() {
        let s = Sent::new();
        s.add(100);
        s.add(20);
        assert_eq!(s.get(), (2, 120));
    }
}
