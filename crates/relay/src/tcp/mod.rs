//! One TCP connection relayed both ways with splice(2): socket → pipe →
//! socket, so the bytes never enter user space.
//!
//! Both directions run in the caller's task (no thread, no extra task per
//! connection). Each direction waits on tokio's readiness of its sockets and
//! splices until the kernel says EAGAIN before waiting again.
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
mod copy;
mod failure;

pub use bounds::{keepalive_params, KEEPALIVE_PROBES};

use crate::counters::Counters;
use crate::pipe::{ParkedPipe, Pipe, PipePool};
use bounds::Activity;
use copy::Burst;
use nix::fcntl::SpliceFFlags;
use socket2::SockRef;
use std::io;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::io::Interest;
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
    match relay_tcp(client, upstream, pool, counters, cfg, &never).await {
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
pub async fn relay_tcp(
    client: TcpStream,
    upstream: TcpStream,
    pool: &PipePool,
    counters: &Counters,
    cfg: &TcpRelayConfig,
    park: &CancellationToken,
) -> Relayed {
    if cfg.set_nodelay {
        // Best effort: a socket that is already reset fails at the first
        // splice.
        let _ = client.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
    }
    if let Err(e) = prepare(&client, &upstream, cfg) {
        return Relayed::Ended(Err(e));
    }
    let starts = [Start::default(), Start::default()];
    run(client, upstream, starts, pool, counters, cfg, park).await
}

/// Go on with a connection parked by [`relay_tcp`] (here or in another
/// process): register its sockets with this runtime, take its pipes into
/// `pool` and relay as before. The bytes in the pipes are delivered first,
/// in order. A pipe that does not hold what it claims, or a socket that
/// cannot be registered, ends the connection with both legs reset.
pub async fn resume_tcp(
    parked: ParkedTcp,
    pool: &PipePool,
    counters: &Counters,
    cfg: &TcpRelayConfig,
    park: &CancellationToken,
) -> Relayed {
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
                Err(e) => return fail(&client, &upstream, e),
            }
        }
    }
    let set = client
        .set_nonblocking(true)
        .and_then(|()| upstream.set_nonblocking(true));
    if let Err(e) = set {
        return fail(&client, &upstream, e);
    }
    let (client, upstream) = match failure::from_std(client, upstream) {
        Ok(both) => both,
        Err(e) => return Relayed::Ended(Err(e)),
    };
    if let Err(e) = prepare(&client, &upstream, cfg) {
        return Relayed::Ended(Err(e));
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
        let ground = crate::sockopt::set_rcvlowat(src, 1).and_then(|()| uncork(dst));
        if let Err(e) = ground {
            reset(&client);
            reset(&upstream);
            return Relayed::Ended(Err(e));
        }
    }
    run(client, upstream, starts, pool, counters, cfg, park).await
}

/// SO_OOBINLINE, and keepalive when asked, on both legs. Fails with both
/// legs reset.
fn prepare(client: &TcpStream, upstream: &TcpStream, cfg: &TcpRelayConfig) -> io::Result<()> {
    for stream in [client, upstream] {
        let sock = SockRef::from(stream);
        let set = sock
            .set_out_of_band_inline(true)
            .and_then(|()| match cfg.keepalive {
                Some(idle) => sock.set_tcp_keepalive(&keepalive_params(idle)),
                None => Ok(()),
            });
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

async fn run<'p>(
    client: TcpStream,
    upstream: TcpStream,
    starts: [Start<'p>; 2],
    pool: &'p PipePool,
    counters: &Counters,
    cfg: &TcpRelayConfig,
    park: &CancellationToken,
) -> Relayed {
    let activity = Activity::new(cfg.idle_timeout.is_some());
    // Set by the direction that ends first: the second one leaves its end
    // of file to close(2), which follows at once, instead of a shutdown.
    let ended = AtomicBool::new(starts.iter().any(|s| s.done));
    let [start_target, start_client] = starts;
    // The directions' park: cancelled by a park, or by the failure of
    // either direction, which makes the other give back what it holds.
    let stop = park.child_token();
    let park = &stop;

    let to_target = Direction {
        src: &client,
        dst: &upstream,
        pool,
        bytes: &counters.bytes_to_target,
        fallbacks: &counters.splice_fallbacks,
        ended: &ended,
        activity: &activity,
        cfg,
        park,
    };
    let to_client = Direction {
        src: &upstream,
        dst: &client,
        pool,
        bytes: &counters.bytes_to_client,
        fallbacks: &counters.splice_fallbacks,
        ended: &ended,
        activity: &activity,
        cfg,
        park,
    };
    let outcome = {
        // Pinned once: moved into either branch, it would take its room
        // twice in this future.
        let a = to_target.run(start_target);
        let b = to_client.run(start_client);
        tokio::pin!(a, b);
        let relay = failure::both(a, b, park);
        tokio::pin!(relay);
        match cfg.idle_timeout {
            None => Some(relay.await),
            Some(timeout) => tokio::select! {
                biased;
                r = &mut relay => Some(r),
                () = activity.idle_for(timeout) => {
                    Counters::inc(&counters.idle_timeouts);
                    tracing::debug!(?timeout, "connection idle: reset");
                    None
                }
            },
        }
    };
    let Some((a, b)) = outcome else {
        reset(&client);
        reset(&upstream);
        return Relayed::Ended(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "no byte moved either way for {:?}",
                cfg.idle_timeout.unwrap_or_default()
            ),
        )));
    };
    if failure::failed(&a) || failure::failed(&b) {
        let e = failure::end([(&to_target, a), (&to_client, b)], &client, &upstream);
        return Relayed::Ended(Err(e));
    }
    conclude(a, b, client, upstream)
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

/// One direction of a connection.
struct Direction<'a, 'p> {
    src: &'a TcpStream,
    dst: &'a TcpStream,
    pool: &'p PipePool,
    bytes: &'a AtomicU64,
    fallbacks: &'a AtomicU64,
    ended: &'a AtomicBool,
    activity: &'a Activity,
    cfg: &'a TcpRelayConfig,
    /// Cancelled: stop at the next wait and give the state back (a park,
    /// or the other direction failed).
    park: &'a CancellationToken,
}

/// How the splice phase of a direction ended.
enum Spliced<'p> {
    /// End of file passed on: the direction is done.
    Done,
    /// Asked to park.
    Parked { pipe: Option<Pipe<'p>>, eof: bool },
    /// Splice refused; go on with a copy. The pipe may hold bytes.
    Refused { pipe: Option<Pipe<'p>>, eof: bool },
    /// The source failed; the pipe may hold bytes.
    Failed {
        pipe: Option<Pipe<'p>>,
        error: io::Error,
    },
}

/// What one splice into the pipe did.
enum Fill {
    Moved(usize),
    /// EAGAIN while the pipe holds bytes: either the source is empty or the
    /// pipe's slots are all used. The source's readiness is kept, since it
    /// may still have bytes; draining the pipe tells which.
    Stalled,
}

/// Why filling the pipe stopped.
enum Filled {
    /// The source sent end of file.
    Eof,
    /// The pipe holds all it may: the source likely has more.
    Full,
    /// See [`Fill::Stalled`].
    Stalled,
    /// The source gave less than the room left: it is likely empty.
    Partial,
    /// The source has nothing now (its readiness is cleared).
    WouldBlock,
    /// Bytes moved, and the source has nothing more now (its readiness is
    /// cleared).
    Dry,
}

const FLAGS: SpliceFFlags = SpliceFFlags::SPLICE_F_NONBLOCK.union(SpliceFFlags::SPLICE_F_MOVE);

fn splice_refused(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS))
}

/// Send what MSG_MORE held back on `dst`: clearing TCP_CORK pushes the
/// pending frames (TCP_NODELAY is left as it is).
fn uncork(dst: &TcpStream) -> io::Result<()> {
    crate::sockopt::set_int(dst, libc::IPPROTO_TCP, libc::TCP_CORK, 0)
}

/// The size of a pipe slot's page.
fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .and_then(|v| usize::try_from(v).ok())
            .filter(|&v| v > 0)
            .unwrap_or(65536)
    })
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

/// pipe2(2) failed for want of a descriptor (the process's limit or the
/// system's) or of memory: a direction copies instead.
fn no_room_for_a_pipe(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM)
    )
}

/// Largest read past an urgent mark: one page, which an empty pipe always
/// takes whole.
const PAST_MARK: usize = 4096;

/// When `src` is at its urgent mark, which splice(2) cannot cross, read
/// past it into the empty `pipe` with read(2) (with SO_OOBINLINE the urgent
/// byte comes first, in line) and return the bytes moved: `Some(0)` is end
/// of file. `None` when the source is not at a mark.
fn past_mark(src: &TcpStream, pipe: &mut Pipe<'_>, want: usize) -> io::Result<Option<usize>> {
    if !crate::sockopt::at_mark(src)? {
        return Ok(None);
    }
    let mut buf = [0u8; PAST_MARK];
    let max = want.min(PAST_MARK);
    let n = nix::unistd::read(src, &mut buf[..max])?;
    // An empty pipe takes up to a page whole (PIPE_BUF writes are atomic).
    let written = pipe.write_from(&buf[..n])?;
    if written != n {
        return Err(io::Error::other(format!(
            "the pipe took {written} of the {n} bytes read past an urgent mark"
        )));
    }
    tracing::trace!(bytes = n, "read past an urgent mark");
    Ok(Some(n))
}

impl<'a, 'p> Direction<'a, 'p> {
    async fn run(&self, start: Start<'p>) -> io::Result<DirEnd<'p>> {
        if start.done {
            return Ok(DirEnd::Done);
        }
        match self.splice(start.pipe, start.eof).await? {
            Spliced::Done => Ok(DirEnd::Done),
            Spliced::Parked { pipe, eof } => Ok(DirEnd::Parked { pipe, eof }),
            Spliced::Failed { pipe, error } => Ok(DirEnd::Failed { pipe, error }),
            Spliced::Refused { pipe, eof } => {
                Counters::inc(self.fallbacks);
                tracing::debug!("splice refused, copying instead");
                self.copy(pipe, eof).await
            }
        }
    }

    /// `fut`, unless the relay is asked to park first (`None`).
    async fn unless_parked<T>(&self, fut: impl std::future::Future<Output = T>) -> Option<T> {
        tokio::select! {
            biased;
            () = self.park.cancelled() => None,
            r = fut => Some(r),
        }
    }

    /// Pass the source's end of file on to the destination. When the other
    /// direction has ended already, both sockets are closed as soon as this
    /// one returns, and close(2) sends the FIN: both receive queues were
    /// read to their end, so it cannot turn into a reset.
    fn pass_eof(&self) -> io::Result<()> {
        if self.ended.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        SockRef::from(self.dst).shutdown(Shutdown::Write)
    }

    /// Bytes the direction may put in `pipe` now.
    fn room(&self, pipe: &Pipe<'_>) -> usize {
        let limit = match self.cfg.pipe_size {
            0 => pipe.capacity(),
            n => n.min(pipe.capacity()),
        };
        limit.saturating_sub(pipe.len())
    }

    /// Splice from the source into `pipe` until the pipe is full or the
    /// source has given what it had.
    fn fill(&self, pipe: &mut Pipe<'_>) -> io::Result<Filled> {
        let src = self.src;
        loop {
            let want = self.room(pipe);
            if want == 0 {
                return Ok(Filled::Full);
            }
            let had = pipe.len();
            // A splice stops short because the source ran dry or because
            // the pipe ran out of slots (one per page or segment, each
            // holding at least a byte). Fewer bytes in the pipe than it has
            // slots rules out the second: the source was empty when read,
            // and its readiness can be cleared now rather than by an EAGAIN
            // from one more splice. Clearing it inside the same try_io
            // keeps any wakeup that came after the splice started.
            let slots = pipe.capacity() / page_size();
            let mut dry = 0usize;
            //
            // Urgent data breaks both inferences: splice stops short at
            // the urgent mark, then gives EAGAIN, or 0 once the FIN is in,
            // with bytes still queued. So a splice that looks dry, or would
            // block, or ends the stream, asks SIOCATMARK before it is
            // believed; at the mark the direction reads past it (see
            // `past_mark`), and the source's readiness is kept.
            let filled = src.try_io(Interest::READABLE, || {
                match pipe.splice_from(src, want, FLAGS) {
                    Err(e) if would_block(&e) && had > 0 => Ok(Fill::Stalled),
                    Err(e) if would_block(&e) => match past_mark(src, pipe, want)? {
                        Some(n) => Ok(Fill::Moved(n)),
                        None => Err(e),
                    },
                    // At the mark with bytes in the pipe: drain, then come
                    // back with an empty pipe to read past it.
                    Ok(0) if had > 0 && crate::sockopt::at_mark(src)? => Ok(Fill::Stalled),
                    Ok(0) if had == 0 => Ok(Fill::Moved(past_mark(src, pipe, want)?.unwrap_or(0))),
                    // Stopped at the mark: a short move, not a dry source;
                    // the next splice finds the mark.
                    Ok(n) if n > 0 && n < want && had + n < slots => {
                        if crate::sockopt::at_mark(src)? {
                            return Ok(Fill::Moved(n));
                        }
                        dry = n;
                        Err(io::ErrorKind::WouldBlock.into())
                    }
                    r => r.map(Fill::Moved),
                }
            });
            match filled {
                Err(e) if would_block(&e) && dry > 0 => return Ok(Filled::Dry),
                Ok(Fill::Moved(0)) => return Ok(Filled::Eof),
                // Less than asked: the source is (nearly) empty. Splicing
                // again would most likely cost an EAGAIN before the drain.
                Ok(Fill::Moved(n)) if n < want => return Ok(Filled::Partial),
                Ok(Fill::Moved(_)) => {}
                Ok(Fill::Stalled) => return Ok(Filled::Stalled),
                Err(e) if would_block(&e) => return Ok(Filled::WouldBlock),
                Err(e) => return Err(e),
            }
        }
    }

    async fn splice(&self, mut pipe: Option<Pipe<'p>>, mut eof: bool) -> io::Result<Spliced<'p>> {
        // The last fill took all the room: the source likely has more.
        let mut more = false;
        // The last splice into the destination carried SPLICE_F_MORE: the
        // kernel may hold its tail back until it is flushed.
        let mut corked = false;
        let mut budget = YIELD_EVERY;
        // Bytes taken from the source since it was last waited for, and the
        // source's SO_RCVLOWAT now.
        let mut taken = 0usize;
        let mut lowat = 1usize;
        loop {
            // Source → pipe.
            if !eof {
                if pipe.is_none() {
                    // Idle: hold no pipe until there is something to move.
                    let Some(ready) = self
                        .unless_parked(self.wait_readable(taken, &mut lowat))
                        .await
                    else {
                        return Ok(Spliced::Parked { pipe, eof });
                    };
                    ready?;
                    taken = 0;
                    match self.pool.acquire() {
                        Ok(p) => pipe = Some(p),
                        // No descriptor (or no memory) for a pipe: what the
                        // source has now is copied through a buffer that
                        // lives only for that, and the next bytes try for
                        // a pipe again (docs/reliability.md, item 34).
                        Err(e) if no_room_for_a_pipe(&e) => {
                            tracing::debug!(error = %e, "no pipe to splice through: copying a burst");
                            match self.copy_burst()? {
                                Burst::More => {}
                                Burst::Eof => eof = true,
                                Burst::Blocked => match self.writable().await {
                                    Some(r) => r?,
                                    None => return Ok(Spliced::Parked { pipe, eof }),
                                },
                            }
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                }
                if let Some(p) = pipe.as_mut() {
                    let before = p.len();
                    let filled = self.fill(p);
                    taken += p.len().saturating_sub(before);
                    match filled {
                        Ok(Filled::Eof) => eof = true,
                        Ok(Filled::Full) => more = true,
                        Ok(Filled::Stalled | Filled::Partial | Filled::Dry) => more = false,
                        Ok(Filled::WouldBlock) => {
                            more = false;
                            if p.is_empty() {
                                // Drained and the source would block.
                                pipe = None;
                                if corked {
                                    // Nothing follows the bytes sent with
                                    // MORE: send their tail now.
                                    corked = false;
                                    uncork(self.dst)?;
                                }
                                continue;
                            }
                        }
                        Err(e) if splice_refused(&e) => {
                            return Ok(Spliced::Refused { pipe, eof });
                        }
                        Err(error) => return Ok(Spliced::Failed { pipe, error }),
                    }
                }
            }

            // Pipe → destination.
            match pipe.as_mut() {
                Some(p) if !p.is_empty() => {
                    if self.cfg.force_copy {
                        return Ok(Spliced::Refused { pipe, eof });
                    }
                    let flags = if more && !eof {
                        FLAGS | SpliceFFlags::SPLICE_F_MORE
                    } else {
                        FLAGS
                    };
                    let dst = self.dst;
                    match dst.try_io(Interest::WRITABLE, || p.splice_into(dst, flags)) {
                        Ok(n) => {
                            Counters::add(self.bytes, n as u64);
                            corked = flags.contains(SpliceFFlags::SPLICE_F_MORE);
                            self.activity.touch();
                        }
                        Err(e) if would_block(&e) => {
                            // Backpressure: wait for the destination only;
                            // the source is not read meanwhile.
                            match self.writable().await {
                                Some(r) => r?,
                                None => return Ok(Spliced::Parked { pipe, eof }),
                            }
                            budget = YIELD_EVERY;
                            continue;
                        }
                        Err(e) if splice_refused(&e) => {
                            return Ok(Spliced::Refused { pipe, eof });
                        }
                        Err(e) => return Err(e),
                    }
                }
                _ if eof => {
                    drop(pipe);
                    self.pass_eof()?;
                    return Ok(Spliced::Done);
                }
                _ => {}
            }

            budget -= 1;
            if budget == 0 {
                budget = YIELD_EVERY;
                tokio::task::yield_now().await;
                if self.park.is_cancelled() {
                    return Ok(Spliced::Parked { pipe, eof });
                }
            }
        }
    }

    /// Wait until the source has bytes, in bulk mode (see
    /// [`TcpRelayConfig::bulk_lowat`]) for `bulk_lowat` of them. `taken` is
    /// what the last wakeup moved; `lowat` the socket's current setting.
    async fn wait_readable(&self, taken: usize, lowat: &mut usize) -> io::Result<()> {
        let bulk = self.cfg.bulk_lowat;
        let want = if bulk > 1 && taken >= bulk { bulk } else { 1 };
        if want != *lowat {
            // Lowering it wakes the waiter at once if bytes are there.
            crate::sockopt::set_rcvlowat(self.src, want)?;
            *lowat = want;
        }
        if *lowat == 1 {
            return self.src.readable().await;
        }
        match tokio::time::timeout(BULK_TAIL, self.src.readable()).await {
            Ok(r) => r,
            Err(_) => {
                // The tail of a burst, or the sender slowed down: take what
                // there is from now on.
                crate::sockopt::set_rcvlowat(self.src, 1)?;
                *lowat = 1;
                self.src.readable().await
            }
        }
    }
}
