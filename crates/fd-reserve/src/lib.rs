//! File descriptors kept back for the daemon's own doors.
//!
//! Cluster clients decide how many connections the forwards hold, and each
//! holds two sockets (and pipes while bytes are in flight). At the open-file
//! limit every accept(2) fails with EMFILE, the control socket's too: the
//! plugin's CHECK and DEL could no longer reach the daemon, nor a probe its
//! status server. So a few descriptors (open on /dev/null) are held from the
//! start. When the control socket or the status server cannot accept for
//! want of a descriptor, it takes the reserve ([`FdReserve::lease`]), which
//! closes them, accepts, and hands them back once the request is served.
//! While the reserve is lent out, or could take back fewer than
//! [`FD_RESERVE_MIN`] descriptors, the forwards accept nothing
//! ([`FdReserve::paused`]), so what is freed goes to the daemon's doors
//! and not to one more relayed connection. A reserve that is not whole is
//! topped up before each accept of a forward. UDP sessions open their
//! upstream sockets through [`Guarded`], which makes none while the forwards
//! are paused: a client that keeps sending from new ports would otherwise
//! take every descriptor the reserve frees before the request it was
//! freed for (a `reap`'s netns) could.

use edgelink_relay::SocketSource;
use futures_util::future::BoxFuture;
use std::fs::File;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Descriptors kept back: an accepted control connection, and what a
/// `reap` needs (the pod's netns, a netlink socket), with room to spare.
pub const FD_RESERVE: usize = 16;

/// Below this many descriptors kept back the forwards pause: enough for a
/// `reap` (an accepted connection, a netns, a netlink socket). Between the
/// two, what other descriptors (UDP sessions, pipes) took after a lease is
/// not waited for.
pub const FD_RESERVE_MIN: usize = 4;

pub struct FdReserve {
    size: usize,
    held: Mutex<Vec<File>>,
    /// Requests being served with the reserve's descriptors.
    leases: AtomicUsize,
    /// All `size` descriptors are held.
    whole: AtomicBool,
    /// Lent out, or fewer than [`FD_RESERVE_MIN`] held: forwards accept
    /// nothing.
    paused: AtomicBool,
}

/// The reserve lent out; taken back when dropped.
pub struct Lease(Arc<FdReserve>);

impl Drop for Lease {
    fn drop(&mut self) {
        self.0.leases.fetch_sub(1, Ordering::AcqRel);
        self.0.refill();
    }
}

/// Whether an accept(2) failed for want of a file descriptor.
pub fn exhausted(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

/// The result of an accept that is ready at once (`None`: nothing waits).
pub async fn accept_now<T>(accept: impl std::future::Future<Output = T>) -> Option<T> {
    // A zero timeout polls `accept` once before it expires.
    tokio::time::timeout(std::time::Duration::ZERO, accept)
        .await
        .ok()
}

impl FdReserve {
    pub fn new(size: usize) -> Arc<FdReserve> {
        let r = Arc::new(FdReserve {
            size,
            held: Mutex::new(Vec::with_capacity(size)),
            leases: AtomicUsize::new(0),
            whole: AtomicBool::new(false),
            paused: AtomicBool::new(true),
        });
        r.refill();
        r
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Vec<File>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether all descriptors of the reserve are held.
    pub fn whole(&self) -> bool {
        self.whole.load(Ordering::Acquire)
    }

    /// Whether the forwards must accept nothing now: the reserve is lent
    /// out, or too little of it could be taken back yet.
    pub fn paused(&self) -> bool {
        self.paused.load(Ordering::Acquire)
    }

    /// Close the reserve's descriptors for one request of the control
    /// socket or the status server; `None` when they are lent out already.
    pub fn lease(self: &Arc<Self>) -> Option<Lease> {
        let mut held = self.held();
        if held.is_empty() {
            return None;
        }
        self.paused.store(true, Ordering::Release);
        self.whole.store(false, Ordering::Release);
        self.leases.fetch_add(1, Ordering::AcqRel);
        tracing::debug!(
            fds = held.len(),
            "at the open-file limit: lending the fd reserve"
        );
        held.clear();
        Some(Lease(self.clone()))
    }

    /// Take descriptors back until the reserve is whole, or none is free
    /// (never while it is lent out).
    pub fn refill(&self) {
        if self.leases.load(Ordering::Acquire) > 0 {
            return;
        }
        let mut held = self.held();
        while held.len() < self.size {
            match File::open("/dev/null") {
                Ok(f) => held.push(f),
                Err(_) => break,
            }
        }
        tracing::trace!(held = held.len(), "fd reserve refilled");
        // A lease taken meanwhile waits for the lock and clears `held`
        // after this: the flags it sets win.
        self.whole.store(held.len() == self.size, Ordering::Release);
        self.paused.store(
            held.len() < FD_RESERVE_MIN.min(self.size),
            Ordering::Release,
        );
    }
}

/// Make a descriptor (an upstream socket) for a connection accepted before
/// the forwards paused: not while the reserve is lent out, so that the
/// request it is lent for gets what it frees. Waits for the pause to end
/// (`wait` at most, then makes it all the same); one made while a lease
/// began is closed again and made once the lease is over.
pub async fn outside_a_lease<T, F>(
    fds: &FdReserve,
    wait: Duration,
    make: impl Fn() -> F,
) -> io::Result<T>
where
    F: std::future::Future<Output = io::Result<T>>,
{
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        while fds.paused() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(PAUSE_STEP).await;
        }
        let made = make().await?;
        if !fds.paused() || tokio::time::Instant::now() >= deadline {
            return Ok(made);
        }
    }
}

/// How often a paused maker looks whether the pause is over.
const PAUSE_STEP: Duration = Duration::from_millis(10);

/// A socket source that makes no UDP session socket while the forwards
/// are paused ([`FdReserve::paused`]): the session's datagrams are dropped
/// and counted as when the socket cannot be made (EMFILE), and the next
/// datagram of the client tries again. Upstream TCP sockets are not held
/// back: their connections were accepted before the pause.
pub struct Guarded {
    inner: Arc<dyn SocketSource>,
    fds: Arc<FdReserve>,
}

impl Guarded {
    pub fn wrap(inner: Arc<dyn SocketSource>, fds: &Arc<FdReserve>) -> Arc<dyn SocketSource> {
        Arc::new(Guarded {
            inner,
            fds: fds.clone(),
        })
    }
}

fn lent_out() -> io::Error {
    io::Error::from_raw_os_error(libc::EMFILE)
}

impl SocketSource for Guarded {
    fn udp_socket(
        &self,
        target: SocketAddr,
    ) -> BoxFuture<'static, io::Result<std::net::UdpSocket>> {
        if self.fds.paused() {
            return Box::pin(async { Err(lent_out()) });
        }
        let made = self.inner.udp_socket(target);
        let fds = self.fds.clone();
        Box::pin(async move {
            let s = made.await?;
            // Paused while it was being made: closed again at once, so the
            // request the reserve is lent for gets the descriptor.
            if fds.paused() {
                return Err(lent_out());
            }
            Ok(s)
        })
    }

    fn tcp_socket(&self, target: SocketAddr) -> BoxFuture<'static, io::Result<socket2::Socket>> {
        self.inner.tcp_socket(target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_empties_the_reserve_until_it_is_dropped() {
        let r = FdReserve::new(4);
        assert!(r.whole() && !r.paused());
        let lease = r.lease().expect("a whole reserve lends");
        assert!(r.paused() && !r.whole());
        assert!(r.lease().is_none(), "lent out already");
        r.refill();
        assert!(r.paused(), "no refill while lent out");
        assert!(r.held().is_empty());
        drop(lease);
        assert!(r.whole() && !r.paused());
        assert_eq!(r.held().len(), 4);
    }
}
