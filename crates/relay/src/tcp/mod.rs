//! One TCP connection relayed both ways with splice(2): socket → pipe →
//! socket, so the bytes never enter user space.
//!
//! Both directions run in the caller's task (no thread, no extra task per
//! connection). Each direction waits on tokio's readiness of its sockets and
//! splices until the kernel says EAGAIN before waiting again. They live in
//! a box while bytes move; when neither holds anything the connection
//! waits without them, and starts them again when a side speaks (see
//! `doze`).
//!
//! Pipe lifecycle, per direction: no pipe while the source has nothing to
//! read; a pipe from the pool as soon as it has; back to the pool once the
//! pipe is drained and the source would block. Never more than one pipe's
//! worth of bytes in flight per direction: while the destination would block,
//! the source is not read (backpressure goes back to the sender through TCP
//! flow control).
//!
//! Half-close: end of file from one side is passed on, after the pipe is
//! drained, as shutdown(SHUT_WR) of the other; the other direction carries
//! on until it ends too. An error on either side (a reset, EPIPE, ...) ends
//! both: what the relay already took in is passed on as far as the other
//! peer takes it at once, then the two sockets are closed with SO_LINGER
//! 0, so each peer sees a reset rather than a clean end of file; a
//! direction waiting for its destination watches its source for a reset
//! meanwhile (see `failure`).
//!
//! Where the kernel refuses splice (EINVAL, ENOSYS), the bytes already in
//! the pipe are first read out and delivered, then that direction goes on
//! with a plain read/write copy through a bounded buffer.
//!
//! Urgent data (a sender's MSG_OOB byte): splice(2) never reads across the
//! urgent mark; it returns what lies before it, then EAGAIN (or 0 once the
//! sender's FIN is in), for as long as the bytes after the mark wait. Both
//! sockets get SO_OOBINLINE, so the urgent byte stays in the stream, and a
//! direction whose splice stops short checks SIOCATMARK: at the mark, it
//! read(2)s past it into the pipe (a few KiB at most, once per urgent byte)
//! and splices on. The relay delivers the urgent byte in line, in order; it
//! does not pass the urgency on (no MSG_OOB towards the other peer).
//!
//! SPLICE_F_MORE: a splice out of a pipe that the source filled to its
//! limit carries SPLICE_F_MORE (MSG_MORE), so the kernel may hold a partial
//! segment back for the bytes that follow. When the source then turns out
//! to have nothing more, the direction flushes that tail (TCP_CORK off,
//! which pushes pending frames) before it waits: otherwise it would sit
//! until an ACK or the ~200 ms probe timer sent it.
//!
//! Per connection state is bounded in time when asked to: TCP keepalive on
//! both legs ([`TcpRelayConfig::keepalive`]) finds peers that went away
//! without a word, and an idle timeout ([`TcpRelayConfig::idle_timeout`])
//! resets both legs of a connection on which no byte moved either way.
//! The idle timeout costs a clock read per splice out of a pipe and one
//! timer per connection, which is moved on lazily when it fires early.

mod bounds;
mod direction;
mod doze;
mod failure;
mod period;

pub use bounds::{keepalive_params, KEEPALIVE_PROBES};

use crate::counters::Counters;
use crate::pipe::{ParkedPipe, Pipe, PipePool};
use bounds::Activity;
use futures_util::future::Either;
use period::{Legs, Period};
use socket2::SockRef;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// The pipe size used when nothing else is configured: 1 MiB pipes moved
/// ~10–20% more and cost less CPU per byte than the kernel's 64 KiB here.
pub const DEFAULT_PIPE_SIZE: usize = 1 << 20;

/// Size of the buffer of a direction that fell back to a plain copy.
pub const COPY_BUFFER_SIZE: usize = 64 * 1024;

/// The buffer of one burst copied when no pipe could be had, and the reads
/// a burst takes at most before the direction tries for a pipe again.
const BURST_BUFFER_SIZE: usize = 16 * 1024;
const BURST_READS: usize = 16;

/// Splice calls a direction makes in a row before it lets other tasks of
/// its worker run.
const YIELD_EVERY: u32 = 32;

/// How a relay moves its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpRelayConfig {
    /// Bytes in flight per direction at most: the size of the pipes of the
    /// [`PipePool`] the relay is given (make the pool with this size). A
    /// direction never puts more than `min(pipe_size, pipe capacity)` in
    /// its pipe; 0 means the pipe's capacity.
    pub pipe_size: usize,
    /// Act as if the kernel refused the first splice out of each pipe, once
    /// bytes are in it: every direction then takes the plain-copy fallback,
    /// with bytes to rescue from its pipe. For tests and for measuring the
    /// copy path; never set in production.
    pub force_copy: bool,
    /// Bulk mode: once a wakeup found at least this many bytes waiting, the
    /// source's SO_RCVLOWAT is raised to it, so that the next wakeup comes
    /// with this much to move rather than with every segment that lands
    /// (fewer wakeups and splices per byte). A wait that sees no wakeup
    /// within [`BULK_TAIL`] drops back to 1, so the tail of a transfer and
    /// small messages are never held back longer than that. 0 turns bulk
    /// mode off.
    pub bulk_lowat: usize,
    /// Set TCP_NODELAY on both sockets (the relay passes on each burst as
    /// it comes and marks bulk transfers with SPLICE_F_MORE itself). A
    /// caller whose sockets have it already (accepted from a listener that
    /// has it, made with it) saves two syscalls per connection with false.
    pub set_nodelay: bool,
    /// Close (with RST on both legs) a connection with no bytes moving either way for this long. None: never.
    /// Counted in `idle_timeouts`; [`splice_duplex`] then returns an error
    /// of kind `TimedOut`. Checked to the millisecond, with one timer per
    /// connection.
    pub idle_timeout: Option<std::time::Duration>,
    /// TCP keepalive (idle time before the first probe) set on both sockets. None: leave the sockets as they are.
    /// The interval and probe count follow from it: see [`keepalive_params`].
    pub keepalive: Option<std::time::Duration>,
    /// Both sockets carry SO_OOBINLINE and the keepalive already
    /// ([`prepare_socket`] on the listener the client was accepted from,
    /// whose options an accepted socket inherits, and on the upstream
    /// socket when it was made): [`relay_tcp`] sets nothing, ten syscalls
    /// less per connection on the accepting thread.
    pub prepared: bool,
}

/// How long a direction in bulk mode waits for `bulk_lowat` bytes before it
/// takes whatever arrived.
pub const BULK_TAIL: std::time::Duration = std::time::Duration::from_millis(1);

/// The default [`TcpRelayConfig::bulk_lowat`]: 64 KiB. 256 KiB held a
/// stream back where the source's receive side grows its window slowly
/// (the reverse direction, device to cluster: 13 Gbit/s against 21 at
/// 64 KiB; docs/architecture.md has the figures).
pub const DEFAULT_BULK_LOWAT: usize = 64 * 1024;

impl Default for TcpRelayConfig {
    fn default() -> Self {
        TcpRelayConfig {
            pipe_size: DEFAULT_PIPE_SIZE,
            force_copy: false,
            bulk_lowat: DEFAULT_BULK_LOWAT,
            set_nodelay: true,
            idle_timeout: None,
            keepalive: None,
            prepared: false,
        }
    }
}

/// Relay `client` and `upstream` to each other until both directions have
/// ended, then close both.
///
/// Counts the bytes delivered each way (`bytes_to_target`, client →
/// upstream; `bytes_to_client`) and the directions that fell back to a
/// plain copy (`splice_fallbacks`); the connection gauges and error counts
/// are the caller's. Returns the first error of either direction, after
/// both sockets were reset.
///
/// Sets TCP_NODELAY on both sockets unless told not to
/// ([`TcpRelayConfig::set_nodelay`]), SO_OOBINLINE on both (urgent bytes
/// are relayed in line), and the keepalive options when
/// [`TcpRelayConfig::keepalive`] is set (see [`keepalive_params`]).
///
/// With [`TcpRelayConfig::idle_timeout`], a connection on which no byte
/// moved either way for that long is ended: both sockets are reset,
/// `idle_timeouts` is counted, and an error of kind
/// [`io::ErrorKind::TimedOut`] is returned.
///
/// Dropping the future closes both sockets (without a reset) and returns
/// its pipes to the pool.
pub async fn splice_duplex(
    client: TcpStream,
    upstream: TcpStream,
    pool: &PipePool,
    counters: &Counters,
    cfg: &TcpRelayConfig,
) -> io::Result<()> {
    let never = CancellationToken::new();
    match relay_tcp(client, upstream, pool, counters, cfg, &never, None).await {
        Relayed::Ended(r) => r,
        Relayed::Parked(_) => unreachable!("a token nobody holds was cancelled"),
    }
}

/// How [`relay_tcp`] and [`resume_tcp`] end.
#[derive(Debug)]
pub enum Relayed {
    /// Both directions ended (or one failed): as [`splice_duplex`].
    Ended(io::Result<()>),
    /// `park` was cancelled: the relay stopped where it stood and gives
    /// back everything it had, to be resumed by [`resume_tcp`] here or in
    /// another process. Nothing was read that is not in the pipes.
    Parked(ParkedTcp),
}

/// What one connection moved, from the kernel's count of its client
/// socket (TCP_INFO) as the relay ends: the bytes the client sent
/// (`to_target`) and those it acknowledged (`to_client`), across a
/// hand-over too. Filled when the relay ends by itself (not when it
/// parks), for a caller that asks (the audit trail): one getsockopt(2)
/// per connection.
#[derive(Debug, Default)]
pub struct Tally {
    pub to_target: AtomicU64,
    pub to_client: AtomicU64,
}

impl Tally {
    /// Read the client socket's counts (a failure leaves them as they are).
    pub fn take_from(&self, client: impl std::os::fd::AsFd) {
        if let Ok((received, acked)) = crate::sockopt::tcp_bytes(client) {
            self.to_target
                .store(received, std::sync::atomic::Ordering::Relaxed);
            self.to_client
                .store(acked, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// (to the target, to the client).
    pub fn get(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.to_target.load(Relaxed), self.to_client.load(Relaxed))
    }
}

/// A relayed connection stopped between two syscalls: its two sockets, the
/// pipe of each direction with the bytes in flight, and where each
/// direction stands. Plain descriptors (no runtime), so that they can be
/// sent to another process.
#[derive(Debug)]
pub struct ParkedTcp {
    pub client: std::net::TcpStream,
    pub upstream: std::net::TcpStream,
    /// Client to upstream.
    pub to_target: ParkedDirection,
    /// Upstream to client.
    pub to_client: ParkedDirection,
}

/// Where one direction of a parked connection stands.
#[derive(Debug, Default)]
pub struct ParkedDirection {
    /// Bytes read from the source and not yet written to the destination.
    pub pipe: Option<ParkedPipe>,
    /// The source's end of file was read (and is passed on once the pipe
    /// is drained).
    pub eof: bool,
    /// The direction is over: its end of file was passed on (a shutdown
    /// of the destination's write side, or left to close(2) when the other
    /// direction had passed its own on first).
    pub done: bool,
}

/// [`splice_duplex`] that can be parked: when `park` is cancelled, each
/// direction stops at its next wait (or yield) and the relay returns
/// [`Relayed::Parked`] instead of closing anything. A direction that ended
/// meanwhile is reported as done.
///
/// The sockets' options are set when this is called, not at the first
/// poll: the future holds only the relay ([`run`]), not this function's
/// arguments beside it.
pub fn relay_tcp<'a>(
    client: TcpStream,
    upstream: TcpStream,
    pool: &'a PipePool,
    counters: &'a Counters,
    cfg: &'a TcpRelayConfig,
    park: &'a CancellationToken,
    tally: Option<&'a Tally>,
) -> impl std::future::Future<Output = Relayed> + 'a {
    if cfg.set_nodelay {
        // Best effort: a socket that is already reset fails at the first
        // splice.
        let _ = client.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
    }
    if !cfg.prepared {
        if let Err(e) = prepare(&client, &upstream, cfg) {
            return Either::Left(std::future::ready(Relayed::Ended(Err(e))));
        }
    }
    Either::Right(run(
        client, upstream, None, pool, counters, cfg, park, tally,
    ))
}

/// Go on with a connection parked by [`relay_tcp`] (here or in another
/// process): register its sockets with this runtime, take its pipes into
/// `pool` and relay as before. The bytes in the pipes are delivered first,
/// in order. A pipe that does not hold what it claims, or a socket that
/// cannot be registered, ends the connection with both legs reset.
///
/// Called in the runtime that is to serve it (its sockets are registered
/// with it then, as in [`relay_tcp`]).
pub fn resume_tcp<'a>(
    parked: ParkedTcp,
    pool: &'a PipePool,
    counters: &'a Counters,
    cfg: &'a TcpRelayConfig,
    park: &'a CancellationToken,
    tally: Option<&'a Tally>,
) -> impl std::future::Future<Output = Relayed> + 'a {
    match resume_legs(parked, pool, cfg) {
        Ok((client, upstream, starts)) => {
            let starts = Some(Box::new(starts));
            Either::Right(run(
                client, upstream, starts, pool, counters, cfg, park, tally,
            ))
        }
        Err(ended) => Either::Left(std::future::ready(ended)),
    }
}

/// A parked connection's sockets registered here and its pipes adopted,
/// from plain ground (no SO_RCVLOWAT raised, nothing corked); or how it
/// ended when that failed.
fn resume_legs<'p>(
    parked: ParkedTcp,
    pool: &'p PipePool,
    cfg: &TcpRelayConfig,
) -> Result<(TcpStream, TcpStream, [Start<'p>; 2]), Relayed> {
    let ParkedTcp {
        client,
        upstream,
        to_target,
        to_client,
    } = parked;
    let fail = |client: &std::net::TcpStream, upstream: &std::net::TcpStream, e| {
        for s in [client, upstream] {
            let _ = SockRef::from(s).set_linger(Some(std::time::Duration::ZERO));
        }
        Relayed::Ended(Err(e))
    };
    let mut starts = [Start::default(), Start::default()];
    for (start, dir) in starts.iter_mut().zip([to_target, to_client]) {
        start.eof = dir.eof;
        start.done = dir.done;
        if let Some(p) = dir.pipe {
            match pool.adopt(p) {
                Ok(p) => start.pipe = Some(p),
                Err(e) => return Err(fail(&client, &upstream, e)),
            }
        }
    }
    let set = client
        .set_nonblocking(true)
        .and_then(|()| upstream.set_nonblocking(true));
    if let Err(e) = set {
        return Err(fail(&client, &upstream, e));
    }
    let (client, upstream) = match failure::from_std(client, upstream) {
        Ok(both) => both,
        Err(e) => return Err(Relayed::Ended(Err(e))),
    };
    if let Err(e) = prepare(&client, &upstream, cfg) {
        return Err(Relayed::Ended(Err(e)));
    }
    for (start, (src, dst)) in starts
        .iter()
        .zip([(&client, &upstream), (&upstream, &client)])
    {
        if start.done {
            continue;
        }
        // The parking process may have left SO_RCVLOWAT raised (bulk mode)
        // and a tail held back by SPLICE_F_MORE: start from plain ground.
        let ground = crate::sockopt::set_rcvlowat(src, 1).and_then(|()| direction::uncork(dst));
        if let Err(e) = ground {
            reset(&client);
            reset(&upstream);
            return Err(Relayed::Ended(Err(e)));
        }
    }
    Ok((client, upstream, starts))
}

/// What the relay wants of a socket before it relays: SO_OOBINLINE (urgent
/// data stays in the stream), and TCP keepalive after `keepalive` idle when
/// given. Set on a listener, its accepted sockets inherit both; set on an
/// upstream socket before it connects, the connection has them from its
/// start ([`TcpRelayConfig::prepared`]).
pub fn prepare_socket(
    sock: &impl std::os::fd::AsFd,
    keepalive: Option<std::time::Duration>,
) -> io::Result<()> {
    let sock = SockRef::from(sock);
    sock.set_out_of_band_inline(true)?;
    match keepalive {
        Some(idle) => sock.set_tcp_keepalive(&keepalive_params(idle)),
        None => Ok(()),
    }
}

/// [`prepare_socket`] on both legs. Fails with both legs reset.
fn prepare(client: &TcpStream, upstream: &TcpStream, cfg: &TcpRelayConfig) -> io::Result<()> {
    for stream in [client, upstream] {
        let set = prepare_socket(stream, cfg.keepalive);
        if let Err(e) = set {
            reset(client);
            reset(upstream);
            return Err(e);
        }
    }
    Ok(())
}

/// Where a direction starts: fresh, or where a parked one stood.
#[derive(Default)]
struct Start<'p> {
    pipe: Option<Pipe<'p>>,
    eof: bool,
    done: bool,
}

/// How a direction stopped without an error of its own making.
enum DirEnd<'p> {
    Done,
    Parked {
        pipe: Option<Pipe<'p>>,
        eof: bool,
    },
    /// The source failed: the bytes in the pipe are still to be delivered
    /// (see `failure`).
    Failed {
        pipe: Option<Pipe<'p>>,
        error: io::Error,
    },
}

impl DirEnd<'_> {
    fn park(self) -> ParkedDirection {
        match self {
            // A failed direction is never parked (see `run`).
            DirEnd::Done | DirEnd::Failed { .. } => ParkedDirection {
                pipe: None,
                eof: true,
                done: true,
            },
            DirEnd::Parked { pipe, eof } => ParkedDirection {
                pipe: pipe.filter(|p| !p.is_empty()).map(Pipe::park),
                eof,
                done: false,
            },
        }
    }
}

/// The relay of a connection: its directions run in a period boxed on its
/// own, and when neither holds anything they are given up and the
/// connection waits for its sockets without their state
/// ([`doze::doze`]): an idle connection keeps a few hundred bytes, not
/// the directions' 2.1 KiB.
///
/// `resumed`: where each direction stands (a parked connection), else
/// fresh. Boxed, and not an `async fn` (which would keep its arguments
/// twice, rust-lang/rust#62958): this future is every idle connection's.
// Each argument is a borrow the future holds (or a socket it owns): a
// struct of them would be one more layer in every idle connection's task.
#[allow(clippy::too_many_arguments)]
fn run<'a, 'p: 'a>(
    client: TcpStream,
    upstream: TcpStream,
    mut resumed: Option<Box<[Start<'p>; 2]>>,
    pool: &'p PipePool,
    counters: &'a Counters,
    cfg: &'a TcpRelayConfig,
    park: &'a CancellationToken,
    tally: Option<&'a Tally>,
) -> impl std::future::Future<Output = Relayed> + 'a {
    async move {
        let activity = Activity::new(cfg.idle_timeout.is_some());
        // The directions that ended (client → upstream first).
        let mut done = resumed
            .as_ref()
            .map_or([false; 2], |s| [s[0].done, s[1].done]);
        // Set by the direction that ends first: the second one leaves its end
        // of file to close(2), which follows at once, instead of a shutdown.
        let ended = AtomicBool::new(done.contains(&true));
        let legs = Legs {
            client: &client,
            upstream: &upstream,
            pool,
            counters,
            cfg,
            park,
            activity: &activity,
            ended: &ended,
            tally,
        };
        loop {
            let period = {
                let fresh = || {
                    done.map(|done| Start {
                        done,
                        ..Start::default()
                    })
                };
                Box::pin(legs.period(resumed.take().map_or_else(fresh, |s| *s)))
            };
            done = match period.await {
                Period::Dozed { done } => done,
                Period::Ended(r) => return legs.tallied(r),
                Period::Concluded(a, b) => {
                    legs.tallied(());
                    return conclude(a, b, client, upstream);
                }
            };
            match doze::doze(&legs, done).await {
                doze::Woke::Readable => {}
                doze::Woke::Parked => {
                    let [a, b] = done.map(|done| {
                        Ok(if done {
                            DirEnd::Done
                        } else {
                            DirEnd::Parked {
                                pipe: None,
                                eof: false,
                            }
                        })
                    });
                    return conclude(a, b, client, upstream);
                }
                doze::Woke::IdleTimeout => return legs.tallied(legs.idle_timeout()),
            }
        }
    }
}

/// How a relay whose directions both stopped without a failure ends:
/// closed, or parked.
fn conclude(
    a: io::Result<DirEnd<'_>>,
    b: io::Result<DirEnd<'_>>,
    client: TcpStream,
    upstream: TcpStream,
) -> Relayed {
    match (a, b) {
        (Ok(DirEnd::Done), Ok(DirEnd::Done)) => Relayed::Ended(Ok(())),
        (Ok(a), Ok(b)) => {
            let (to_target, to_client) = (a.park(), b.park());
            match failure::into_std(client, upstream) {
                Ok((client, upstream)) => Relayed::Parked(ParkedTcp {
                    client,
                    upstream,
                    to_target,
                    to_client,
                }),
                Err(e) => Relayed::Ended(Err(e)),
            }
        }
        // Failures are the caller's (`failure::end`).
        (Err(e), _) | (_, Err(e)) => Relayed::Ended(Err(e)),
    }
}

/// Close with RST when the socket is dropped.
fn reset(stream: &TcpStream) {
    // An error here means the socket is unusable anyway.
    let _ = SockRef::from(stream).set_linger(Some(std::time::Duration::ZERO));
}
