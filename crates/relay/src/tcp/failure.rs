//! How a connection ends when one of its legs fails, and how a socket
//! changes hands (a hand-over) without a failure looking like a clean end.
//!
//! A failure (a peer's reset, any error on a leg) ends both directions, and
//! both peers see a reset (SO_LINGER 0). Before that, each direction passes
//! on what the relay already took in, as far as its destination takes it
//! without waiting: the bytes in its pipe, then those in its source's
//! receive queue (acknowledged by this kernel, so the sender counts them as
//! delivered). A device that answers and then resets (closes with unread
//! bytes, or with SO_LINGER 0) is answered in full, as over a direct
//! connection, where the answer would already sit in the client's receive
//! queue ahead of the reset. Nothing waits for a peer that does not read:
//! what it does not take at once is dropped with the reset.
//!
//! A direction that waits for its destination (backpressure) watches its
//! source for an error meanwhile: a client that resets while the device is
//! not reading is passed on at once (the device gets its reset, the
//! connection and its place under `maxConnections` end), instead of when
//! the device reads again. The watch is one more readiness future in that
//! wait: nothing while bytes move.

use super::direction::{uncork, Direction, FLAGS};
use super::{reset, DirEnd};
use crate::counters::Counters;
use crate::pipe::Pipe;
use socket2::SockRef;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Run both directions to their end. The first to fail cancels `stop` (the
/// token the directions park on), so that the other stops at its next wait
/// and gives back what it holds, for [`end`]. Each poll starts with the
/// other direction (as tokio's `join!` does), so that neither starves the
/// other of the task's budget. Takes them pinned by reference: an owned
/// future moved in would take its room twice in the connection's future.
///
/// When neither direction holds anything (each is done or waits for its
/// source, `idle`), both are given up: [`Both::Dozed`] says which were done,
/// and the caller waits for the sources without their state (`doze.rs`).
pub(super) async fn both<'p, A, B>(
    mut a: Pin<&mut A>,
    mut b: Pin<&mut B>,
    stop: &CancellationToken,
    idle: [&AtomicBool; 2],
) -> Both<'p>
where
    A: Future<Output = io::Result<DirEnd<'p>>>,
    B: Future<Output = io::Result<DirEnd<'p>>>,
{
    let (mut ra, mut rb) = (None, None);
    let mut a_first = true;
    std::future::poll_fn(|cx| {
        for turn in [a_first, !a_first] {
            let (f, r): (Pin<&mut dyn Future<Output = _>>, _) = if turn {
                (a.as_mut(), &mut ra)
            } else {
                (b.as_mut(), &mut rb)
            };
            if r.is_none() {
                if let Poll::Ready(end) = f.poll(cx) {
                    if failed(&end) {
                        stop.cancel();
                    }
                    *r = Some(end);
                }
            }
        }
        a_first = !a_first;
        match (ra.take(), rb.take()) {
            (Some(ea), Some(eb)) => Poll::Ready(Both::Ended(ea, eb)),
            (ea, eb) => {
                let holds_nothing = |r: &Option<io::Result<DirEnd<'p>>>, idle: &AtomicBool| match r
                {
                    None => idle.load(Ordering::Relaxed),
                    Some(r) => matches!(r, Ok(DirEnd::Done)),
                };
                if holds_nothing(&ea, idle[0])
                    && holds_nothing(&eb, idle[1])
                    && !stop.is_cancelled()
                {
                    return Poll::Ready(Both::Dozed {
                        done: [ea.is_some(), eb.is_some()],
                    });
                }
                (ra, rb) = (ea, eb);
                Poll::Pending
            }
        }
    })
    .await
}

/// How [`both`] ends.
pub(super) enum Both<'p> {
    /// Both directions ended (one may have failed).
    Ended(io::Result<DirEnd<'p>>, io::Result<DirEnd<'p>>),
    /// Neither holds anything: given up, `done` for each that ended.
    Dozed { done: [bool; 2] },
}

/// Whether a direction's end is a failure.
pub(super) fn failed(r: &io::Result<DirEnd<'_>>) -> bool {
    matches!(r, Err(_) | Ok(DirEnd::Failed { .. }))
}

/// After a failure: each direction delivers what it holds (see the
/// module's documentation), then both legs are reset. Returns the first
/// error, to_target's before to_client's.
pub(super) fn end<'p>(
    directions: [(&Direction<'_, 'p>, io::Result<DirEnd<'p>>); 2],
    client: &TcpStream,
    upstream: &TcpStream,
) -> io::Error {
    let mut first = None;
    for (direction, r) in directions {
        let held = match r {
            Ok(DirEnd::Parked { pipe, .. }) => Some(pipe),
            Ok(DirEnd::Failed { pipe, error }) => {
                first.get_or_insert(error);
                Some(pipe)
            }
            Ok(DirEnd::Done) => None,
            Err(e) => {
                first.get_or_insert(e);
                None
            }
        };
        if let Some(pipe) = held {
            direction.deliver(pipe);
        }
    }
    reset(client);
    reset(upstream);
    first.unwrap_or_else(|| io::Error::other("a direction of the connection failed"))
}

impl<'p> Direction<'_, 'p> {
    /// Wait until the destination takes bytes again (`Some`), unless the
    /// direction is asked to park first (`None`), watching the source for
    /// an error meanwhile: the source's error if it comes first. One
    /// select, not two nested: this future is part of every connection's.
    pub(super) async fn writable(&self) -> Option<io::Result<()>> {
        tokio::select! {
            biased;
            () = self.park.cancelled() => None,
            r = std::future::poll_fn(|cx| self.dst.poll_write_ready(cx)) => Some(r),
            r = self.src.ready(Interest::ERROR) => Some(r.and_then(|_| {
                let e = self.src.take_error()?;
                Err(e.unwrap_or_else(|| io::ErrorKind::ConnectionReset.into()))
            })),
        }
    }

    /// Pass on, without waiting, the bytes in `pipe`, then those the source
    /// has received and the relay not read yet (SIOCINQ now: no more, so
    /// that a live source cannot keep this going), as far as the
    /// destination takes them; then push them out. An error just ends it:
    /// both legs are reset next.
    fn deliver(&self, mut pipe: Option<Pipe<'p>>) {
        let mut left = crate::sockopt::unread(self.src).unwrap_or(0);
        loop {
            if let Some(p) = pipe.as_mut().filter(|p| !p.is_empty()) {
                match p.splice_into(self.dst, FLAGS) {
                    Ok(n) if n > 0 => {
                        Counters::add(self.bytes, n as u64);
                        continue;
                    }
                    _ => break,
                }
            }
            if left == 0 {
                break;
            }
            if pipe.is_none() {
                match self.pool.acquire() {
                    Ok(p) => pipe = Some(p),
                    Err(_) => break,
                }
            }
            let Some(p) = pipe.as_mut() else { break };
            let want = self.room(p).min(left);
            match p.splice_from(self.src, want, FLAGS) {
                Ok(n) if n > 0 => left = left.saturating_sub(n),
                _ => break,
            }
        }
        let _ = uncork(self.dst);
    }
}

/// Both sockets as plain descriptors, for a hand-over. tokio closes a
/// socket whose conversion fails: both are set to reset on close first, so
/// that neither peer takes that end for a clean one (the bytes in flight
/// are lost with it), and back once both are through.
pub(super) fn into_std(
    client: TcpStream,
    upstream: TcpStream,
) -> io::Result<(std::net::TcpStream, std::net::TcpStream)> {
    reset(&client);
    reset(&upstream);
    match (client.into_std(), upstream.into_std()) {
        (Ok(c), Ok(u)) => {
            SockRef::from(&c).set_linger(None)?;
            SockRef::from(&u).set_linger(None)?;
            Ok((c, u))
        }
        // The other one is closed here, with a reset.
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

/// [`into_std`]'s counterpart for a connection taken over: registered with
/// this runtime, or both reset.
pub(super) fn from_std(
    client: std::net::TcpStream,
    upstream: std::net::TcpStream,
) -> io::Result<(TcpStream, TcpStream)> {
    for s in [&client, &upstream] {
        // An error here means the socket is unusable anyway.
        let _ = SockRef::from(s).set_linger(Some(std::time::Duration::ZERO));
    }
    match (TcpStream::from_std(client), TcpStream::from_std(upstream)) {
        (Ok(c), Ok(u)) => {
            SockRef::from(&c).set_linger(None)?;
            SockRef::from(&u).set_linger(None)?;
            Ok((c, u))
        }
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}
