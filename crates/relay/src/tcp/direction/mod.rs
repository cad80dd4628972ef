//! One direction of a relayed connection: splice from its source into a
//! pipe and out to its destination, with the urgent mark, SPLICE_F_MORE,
//! the idle clock and a park at the next wait; a plain copy where splice
//! is refused (copy.rs). What is still in flight when a source fails is
//! the connection's to deliver (tcp/failure.rs).

mod copy;

use super::bounds::Activity;
use super::{DirEnd, Start, TcpRelayConfig, BULK_TAIL, YIELD_EVERY};
use crate::counters::Counters;
use crate::pipe::{Pipe, PipePool};
use copy::Burst;
use nix::fcntl::SpliceFFlags;
use socket2::SockRef;
use std::io;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// One direction of a connection.
pub(super) struct Direction<'a, 'p> {
    pub(super) src: &'a TcpStream,
    pub(super) dst: &'a TcpStream,
    pub(super) pool: &'p PipePool,
    pub(super) bytes: &'a AtomicU64,
    pub(super) fallbacks: &'a AtomicU64,
    pub(super) ended: &'a AtomicBool,
    pub(super) activity: &'a Activity,
    pub(super) cfg: &'a TcpRelayConfig,
    /// Cancelled: stop at the next wait and give the state back (a park,
    /// or the other direction failed).
    pub(super) park: &'a CancellationToken,
    /// Set while the direction waits for its source with nothing in
    /// flight (no pipe, no SO_RCVLOWAT raised, nothing corked): it may be
    /// dropped there and started afresh without a loss (`tcp/doze.rs`).
    pub(super) idle: &'a AtomicBool,
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

pub(super) const FLAGS: SpliceFFlags =
    SpliceFFlags::SPLICE_F_NONBLOCK.union(SpliceFFlags::SPLICE_F_MOVE);

fn splice_refused(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS))
}

/// Send what MSG_MORE held back on `dst`: clearing TCP_CORK pushes the
/// pending frames (TCP_NODELAY is left as it is).
pub(super) fn uncork(dst: &TcpStream) -> io::Result<()> {
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
    pub(super) async fn run(&self, start: Start<'p>) -> io::Result<DirEnd<'p>> {
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

    /// `fut`, unless the relay is asked to park first (`None`). `fut` is
    /// pinned where the caller keeps it: taken by value, it would be held
    /// twice in this future (the argument and select!'s copy), and this
    /// is where an idle connection waits.
    async fn unless_parked<F: std::future::Future>(
        &self,
        mut fut: std::pin::Pin<&mut F>,
    ) -> Option<F::Output> {
        tokio::select! {
            biased;
            () = self.park.cancelled() => None,
            r = fut.as_mut() => Some(r),
        }
    }

    /// [`Self::wait_readable`] unless the relay is asked to park first:
    /// the idle connection's wait, a future of its own so that the state of
    /// `splice` holds the waiting future only while it waits.
    async fn readable_unless_parked(
        &self,
        taken: usize,
        lowat: &mut usize,
    ) -> Option<io::Result<()>> {
        let readable = std::pin::pin!(self.wait_readable(taken, lowat));
        self.unless_parked(readable).await
    }

    /// The source readable: what `TcpStream::readable` waits for, without
    /// that future (152 bytes) in the state of every waiting direction: the
    /// stream keeps the waker (one task polls both directions).
    fn src_readable(&self) -> impl std::future::Future<Output = io::Result<()>> + '_ {
        std::future::poll_fn(move |cx| self.src.poll_read_ready(cx))
    }

    /// [`Self::src_readable`] where the direction holds nothing: `idle` is
    /// set while it waits.
    fn src_idle(&self) -> impl std::future::Future<Output = io::Result<()>> + '_ {
        std::future::poll_fn(move |cx| {
            let r = self.src.poll_read_ready(cx);
            self.idle.store(r.is_pending(), Ordering::Relaxed);
            r
        })
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
    pub(super) fn room(&self, pipe: &Pipe<'_>) -> usize {
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
                    let Some(ready) = self.readable_unless_parked(taken, &mut lowat).await else {
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
            return self.src_idle().await;
        }
        match tokio::time::timeout(BULK_TAIL, self.src_readable()).await {
            Ok(r) => r,
            Err(_) => {
                // The tail of a burst, or the sender slowed down: take what
                // there is from now on.
                crate::sockopt::set_rcvlowat(self.src, 1)?;
                *lowat = 1;
                self.src_idle().await
            }
        }
    }
}
