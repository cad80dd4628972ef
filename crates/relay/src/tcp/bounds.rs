//! What bounds a relayed connection in time: TCP keepalive on both legs
//! and the idle timeout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// Keepalive probes sent before a silent peer is given up
/// (TCP_KEEPCNT). With [`keepalive_params`], a dead peer is found about
/// twice the keepalive idle time after the last byte.
pub const KEEPALIVE_PROBES: u32 = 3;

/// The keepalive parameters set for a keepalive idle time of `idle`:
/// TCP_KEEPIDLE `idle` (at least 1 s, the kernel's unit), TCP_KEEPINTVL a
/// third of it between 1 s and 75 s (the interval Linux uses by default),
/// TCP_KEEPCNT [`KEEPALIVE_PROBES`]. So a peer that went away is given up
/// about `2 × idle` after the last byte, for idle times up to ~4 min.
pub fn keepalive_params(idle: Duration) -> socket2::TcpKeepalive {
    let idle = idle.max(Duration::from_secs(1));
    let interval = (idle / 3).clamp(Duration::from_secs(1), Duration::from_secs(75));
    socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval(interval)
        .with_retries(KEEPALIVE_PROBES)
}

/// When a connection last moved a byte, for the idle timeout.
pub(super) struct Activity {
    /// Whether anyone looks (an idle timeout is set): otherwise
    /// [`Activity::touch`] reads no clock.
    on: bool,
    start: Instant,
    /// Milliseconds from `start` to the last byte moved.
    last_ms: AtomicU64,
}

impl Activity {
    pub(super) fn new(on: bool) -> Activity {
        Activity {
            on,
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    /// Bytes moved now.
    pub(super) fn touch(&self) {
        if self.on {
            let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
            self.last_ms.store(ms, Ordering::Relaxed);
        }
    }

    /// When the connection is idle for `timeout` if no byte moves before.
    pub(super) fn due(&self, timeout: Duration) -> Instant {
        self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed)) + timeout
    }

    /// Resolves once no byte has moved for `timeout` (counted from the last
    /// byte, or the start: a relay that stops and starts its waits does not
    /// move it on). One timer, moved on to the last byte's time plus
    /// `timeout` each time it fires early.
    pub(super) async fn idle_for(&self, timeout: Duration) {
        let sleep = tokio::time::sleep_until(self.due(timeout));
        tokio::pin!(sleep);
        loop {
            sleep.as_mut().await;
            let due = self.due(timeout);
            if due <= Instant::now() {
                return;
            }
            sleep.as_mut().reset(due);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use socket2::SockRef;

    /// `TcpRelayConfig::prepared` rests on this: an accepted socket has
    /// the listener's SO_OOBINLINE and keepalive (Linux copies the
    /// listening socket into each child).
    #[test]
    fn an_accepted_socket_inherits_the_listeners_relay_options() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        crate::tcp::prepare_socket(&l, Some(Duration::from_secs(30))).unwrap();
        let _c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (a, _) = l.accept().unwrap();
        let s = SockRef::from(&a);
        assert!(s.out_of_band_inline().unwrap());
        assert!(s.keepalive().unwrap());
        assert_eq!(s.tcp_keepalive_time().unwrap(), Duration::from_secs(30));
        assert_eq!(s.tcp_keepalive_interval().unwrap(), Duration::from_secs(10));
        assert_eq!(s.tcp_keepalive_retries().unwrap(), KEEPALIVE_PROBES);
        // Without a keepalive: the inline urgent data alone.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        crate::tcp::prepare_socket(&l, None).unwrap();
        let _c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (a, _) = l.accept().unwrap();
        assert!(SockRef::from(&a).out_of_band_inline().unwrap());
        assert!(!SockRef::from(&a).keepalive().unwrap());
    }
}
