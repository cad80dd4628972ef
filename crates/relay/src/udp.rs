//! UDP relayed per client: one connected upstream socket per client
//! address, in a bounded session table, with batched syscalls both ways.
//!
//! One task reads the listener with recvmmsg(2), drops what `refuse` says
//! (datagrams from the private side), groups the rest by session and sends
//! each group with one sendmmsg(2) on that session's connected socket. Each
//! session has a small task that reads its socket with recvmmsg and answers
//! its client with sendmmsg on the listener, from the address the client
//! wrote to. Runs of same-size datagrams go out as one UDP_SEGMENT (GSO)
//! message (see [`UdpConfig::gso`]). Nothing blocks a tokio worker: every syscall is non-blocking,
//! driven by tokio's readiness; a datagram that finds a full socket buffer
//! is dropped and counted, as the network would.
//!
//! Sessions end after `idle_timeout` without a datagram either way (a
//! periodic sweep), or when the table is full and a new client arrives (the
//! least recently used one is evicted), or when the relay shuts down.

#[allow(unsafe_code)]
mod mmsg;
mod session;

use crate::counters::Counters;
use crate::{RefuseFn, SocketSource};
use mmsg::{RecvBatch, MAX_BATCH};
use session::{Clock, Table};
use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::Interest;
use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

/// Largest datagram relayed: 64 KiB, more than a UDP datagram can carry
/// (65,507 bytes of payload over IPv4, 65,527 over IPv6), so none is
/// dropped for its size. Each datagram is received into a 2 KiB slot of
/// its batch, and what does not fit spills into pages that are only
/// touched then and given back once it was passed on (see `mmsg`).
pub const MAX_DATAGRAM: usize = mmsg::DATAGRAM_MAX;

/// Batches the listener reads in a row before the relay looks at its other
/// work (new sessions, the sweep, shutdown).
const ROUNDS: usize = 16;

/// Longest the listener is left unread while a new client's datagrams wait
/// for its upstream socket. Past that, what its queue cannot take is dropped.
const MAX_HOLD: Duration = Duration::from_millis(20);

thread_local! {
    /// Listener buffers, one set per worker thread: a listener task uses
    /// them only inside [`from_clients`], between two awaits. With a set per
    /// forward, each idle UDP forward held 64 datagram buffers (about
    /// 140 KiB), and a node whose pods came and went kept the freed sets
    /// resident: edgelinkd grew by 200 MiB over 2,000 attachments added and
    /// deleted (docs/reliability.md, item 31).
    static LISTEN_BATCH: RefCell<RecvBatch> = RefCell::new(RecvBatch::new(MAX_BATCH));
}

/// Tuning of a UDP forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpConfig {
    /// A session with no datagram either way for this long is closed.
    pub idle_timeout: Duration,
    /// Sessions (clients) at most; a new client beyond that evicts the least
    /// recently used session.
    pub max_sessions: usize,
    /// Datagrams per recvmmsg/sendmmsg (1 to 64).
    pub batch: usize,
    /// Send runs of same-size datagrams as one UDP_SEGMENT (GSO) message
    /// each. Turned off for the rest of a direction's life at the first
    /// refusal (a path without checksum offload, an MTU below the
    /// datagrams), and the datagrams are sent one by one instead.
    pub gso: bool,
    /// Called as each session ends (idle, evicted, failed, closed; not when
    /// parked for a hand-over), with what it moved: the audit trail.
    pub on_end: Option<SessionHook>,
}

/// How a UDP session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEnded {
    /// No datagram either way for the idle timeout.
    Idle,
    /// The table was full and it was the least recently used.
    Evicted,
    /// Its upstream socket could not be made, or failed.
    Failed,
    /// The forward stopped.
    Closed,
}

/// What one UDP session moved, as it ends.
#[derive(Debug, Clone)]
pub struct SessionEnd {
    pub peer: SocketAddr,
    pub duration: Duration,
    /// Payload bytes relayed to the target, and back to the client.
    pub bytes_to_target: u64,
    pub bytes_to_client: u64,
    pub how: SessionEnded,
}

/// [`UdpConfig::on_end`]: a function of the caller's.
#[derive(Clone)]
pub struct SessionHook(pub Arc<dyn Fn(SessionEnd) + Send + Sync>);

impl std::fmt::Debug for SessionHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionHook")
    }
}

impl PartialEq for SessionHook {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SessionHook {}

impl Default for UdpConfig {
    fn default() -> Self {
        UdpConfig {
            idle_timeout: Duration::from_secs(60),
            max_sessions: 4096,
            batch: 64,
            gso: true,
            on_end: None,
        }
    }
}

/// Relay the datagrams that reach `listener` (already bound) to `target`,
/// each client through its own upstream socket made by `source`, and the
/// replies back to their client, until `shutdown` resolves. Returns once all
/// sessions are closed.
///
/// `refuse(peer, ifindex)` is asked for every datagram, with the interface
/// it arrived on (IPv4-mapped peers are given as IPv4); refused datagrams
/// are dropped and counted in `refused`.
///
/// Counts sessions (`udp_sessions`, `udp_sessions_total`,
/// `udp_evictions`), datagrams each way and drops (`udp_drops`: truncated,
/// full socket buffers, send errors, a new client's queue overflowing while
/// its socket is being made) and upstream sockets that could not be made or
/// connected (`connect_errors`).
///
/// The listener should have IP_PKTINFO (IPV6_RECVPKTINFO) on before it is
/// bound: serve_udp turns it on too, but a datagram queued before that
/// carries no interface (`refuse` is then asked with `None`).
///
/// Fails if the listener cannot be set up, or fails in a way that will not
/// pass (EBADF, ENOTSOCK, ...); transient errors are counted as drops.
pub async fn serve_udp(
    listener: std::net::UdpSocket,
    target: SocketAddr,
    source: Arc<dyn SocketSource>,
    cfg: UdpConfig,
    counters: Arc<Counters>,
    refuse: Arc<RefuseFn>,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()> {
    let never = CancellationToken::new();
    let forward = UdpForward {
        listener,
        sessions: Vec::new(),
    };
    relay_udp(
        forward, target, source, cfg, counters, refuse, shutdown, &never,
    )
    .await
    .map(|_| ())
}

/// Where a UDP forward's new sessions go: one address, or whatever a
/// function says when the session starts (a name followed by its
/// resolver): a session keeps the address it started with.
#[derive(Clone)]
pub enum UdpTarget {
    Fixed(SocketAddr),
    Dynamic(Arc<dyn Fn() -> io::Result<SocketAddr> + Send + Sync>),
}

impl UdpTarget {
    pub fn current(&self) -> io::Result<SocketAddr> {
        match self {
            UdpTarget::Fixed(a) => Ok(*a),
            UdpTarget::Dynamic(f) => f(),
        }
    }
}

impl From<SocketAddr> for UdpTarget {
    fn from(a: SocketAddr) -> UdpTarget {
        UdpTarget::Fixed(a)
    }
}

impl std::fmt::Debug for UdpTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UdpTarget::Fixed(a) => write!(f, "{a}"),
            UdpTarget::Dynamic(_) => f.write_str("(followed)"),
        }
    }
}

/// A UDP forward's listener and sessions, as [`relay_udp`] parked them (or
/// a listener alone, to start with). Plain descriptors: they can be sent
/// to another process.
#[derive(Debug)]
pub struct UdpForward {
    pub listener: std::net::UdpSocket,
    pub sessions: Vec<ParkedSession>,
}

/// A UDP session stopped by a park: its client, the address the client
/// wrote to, its connected upstream socket, and how long it was idle.
#[derive(Debug)]
pub struct ParkedSession {
    pub peer: SocketAddr,
    /// Where the client's datagrams were addressed (answers come from
    /// there), when the listener is on a wildcard address.
    pub local: Option<std::net::IpAddr>,
    pub socket: std::net::UdpSocket,
    pub idle_ms: u64,
}

/// [`serve_udp`] from a parked forward's state, and parkable: when `park`
/// is cancelled, the relay stops reading and returns the listener and the
/// sessions that have their socket (`Some`); datagrams that arrive
/// meanwhile wait in the kernel's socket buffers. `None`: `shutdown`
/// resolved and every session was closed.
#[allow(clippy::too_many_arguments)]
pub async fn relay_udp(
    forward: UdpForward,
    target: impl Into<UdpTarget>,
    source: Arc<dyn SocketSource>,
    cfg: UdpConfig,
    counters: Arc<Counters>,
    refuse: Arc<RefuseFn>,
    shutdown: impl Future<Output = ()> + Send,
    park: &CancellationToken,
) -> io::Result<Option<UdpForward>> {
    let UdpForward { listener, sessions } = forward;
    listener.set_nonblocking(true)?;
    let local = listener.local_addr()?;
    enable_pktinfo(&listener, local)?;
    let listener = Arc::new(tokio::net::UdpSocket::from_std(listener)?);
    let batch = cfg.batch.clamp(1, MAX_BATCH);

    let (created_tx, mut created_rx) = mpsc::unbounded_channel();
    let (ended_tx, mut ended_rx) = mpsc::unbounded_channel();
    let mut table = Table::new(session::Shared {
        listener: listener.clone(),
        target: target.into(),
        source,
        counters: counters.clone(),
        refuse,
        // Behind a wildcard address, answer from the address each client
        // wrote to (a multi-homed pod, a secondary address); otherwise the
        // kernel does that already.
        answer_from_dst: local.ip().is_unspecified(),
        batch,
        max_sessions: cfg.max_sessions.max(1),
        clock: Clock::new(),
        created: created_tx,
        ended: ended_tx,
        gso_to_target: AtomicBool::new(cfg.gso),
        gso_to_client: AtomicBool::new(cfg.gso),
        on_end: cfg.on_end.clone(),
    });
    let mut sweep = tokio::time::interval(sweep_period(cfg.idle_timeout));
    sweep.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let idle_ms = u64::try_from(cfg.idle_timeout.as_millis()).unwrap_or(u64::MAX);
    let mut shutdown = std::pin::pin!(shutdown);
    // While a new client's queue is full, the listener is left unread (for
    // MAX_HOLD at most) until the client's socket is there.
    let mut holding = false;
    let mut hold_timer = std::pin::pin!(tokio::time::sleep(MAX_HOLD));
    for s in sessions {
        table.adopt(s);
    }

    let result = loop {
        let crowded = table.crowded();
        if crowded && !holding {
            holding = true;
            hold_timer
                .as_mut()
                .reset(tokio::time::Instant::now() + MAX_HOLD);
        } else if !crowded {
            holding = false;
        }
        let hold = holding && !hold_timer.is_elapsed();
        tokio::select! {
            biased;
            () = &mut shutdown => break Ok(false),
            () = park.cancelled() => break Ok(true),
            Some(created) = created_rx.recv() => table.created(created),
            Some((slot, generation)) = ended_rx.recv() => table.ended(slot, generation),
            _ = sweep.tick() => table.sweep(idle_ms),
            () = &mut hold_timer, if hold => {}
            ready = listener.readable(), if !hold => {
                let read = ready.and_then(|()| {
                    LISTEN_BATCH.with(|rx| from_clients(&listener, &mut rx.borrow_mut(), &mut table, !holding))
                });
                if let Err(e) = read {
                    break Err(e);
                }
            }
        }
    };
    if let Ok(true) = result {
        // A new client's session still waiting for its upstream socket
        // would lose what it queued (a new flow's first datagram, lost in
        // a take-over: kube lab F6, CI 2026-11-26): its socket is let come
        // first, so it is handed over Ready.
        let settle = tokio::time::sleep(SETTLE_PENDING);
        let mut settle = std::pin::pin!(settle);
        while table.pending() {
            tokio::select! {
                Some(created) = created_rx.recv() => table.created(created),
                () = &mut settle => break,
            }
        }
        let sessions = table.park().await;
        // A second descriptor: this one goes with the table's Arc.
        let listener = std::net::UdpSocket::from(listener.as_fd().try_clone_to_owned()?);
        return Ok(Some(UdpForward { listener, sessions }));
    }
    table.close().await;
    result.map(|_| None)
}

/// How long a park waits for the upstream sockets of new sessions.
const SETTLE_PENDING: Duration = Duration::from_millis(250);

/// Read the listener until it would block (or for [`ROUNDS`] batches, or,
/// with `stop_when_crowded`, until a new client's queue is full) and pass
/// the datagrams on.
fn from_clients(
    listener: &tokio::net::UdpSocket,
    rx: &mut RecvBatch,
    table: &mut Table,
    stop_when_crowded: bool,
) -> io::Result<()> {
    let batch = table.batch();
    for _ in 0..ROUNDS {
        let got = listener.try_io(Interest::READABLE, || {
            mmsg::recv_batch(listener.as_fd(), rx, batch)
        });
        match got {
            Ok(n) => {
                table.dispatch(rx, n);
                rx.release();
                if stop_when_crowded && table.crowded() {
                    return Ok(());
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if fatal(&e) => {
                tracing::warn!(error = %e, "UDP listener failed");
                return Err(e);
            }
            Err(e) => {
                tracing::debug!(error = %e, "UDP listener receive error");
                table.count_drop(1);
            }
        }
    }
    Ok(())
}

/// Errors of a listener that will not go away by trying again.
fn fatal(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EBADF | libc::ENOTSOCK | libc::EINVAL | libc::EFAULT | libc::EOPNOTSUPP)
    )
}

fn enable_pktinfo(listener: &std::net::UdpSocket, local: SocketAddr) -> io::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt};
    match local {
        SocketAddr::V4(_) => setsockopt(listener, sockopt::Ipv4PacketInfo, &true)?,
        SocketAddr::V6(_) => setsockopt(listener, sockopt::Ipv6RecvPacketInfo, &true)?,
    }
    Ok(())
}

/// How often idle sessions are looked for: an eighth of the timeout, between
/// 5 ms and 1 s. A session lives at most that much longer than the timeout.
fn sweep_period(idle_timeout: Duration) -> Duration {
    (idle_timeout / 8).clamp(Duration::from_millis(5), Duration::from_secs(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_period_is_bounded() {
        assert_eq!(
            sweep_period(Duration::from_secs(60)),
            Duration::from_secs(1)
        );
        assert_eq!(
            sweep_period(Duration::from_millis(200)),
            Duration::from_millis(25)
        );
        assert_eq!(sweep_period(Duration::ZERO), Duration::from_millis(5));
    }

    #[test]
    fn defaults() {
        let d = UdpConfig::default();
        assert_eq!(d.idle_timeout, Duration::from_secs(60));
        assert_eq!((d.max_sessions, d.batch, d.gso), (4096, 64, true));
    }
}
