//! An idle connection's wait. When neither direction holds anything (each
//! has ended or waits for its source with no pipe, no SO_RCVLOWAT raised
//! and nothing corked), the relay gives their state up and waits here for
//! either source, a park or the idle timeout, then starts the directions
//! afresh. The directions' futures (2.1 KiB with their readiness and park
//! waiters) live in a box only while bytes move: 10 000 idle connections
//! keep the sockets and this wait, not 10 000 sets of directions.

use super::period::Legs;
use std::future::Future;
use std::task::Poll;

/// Why [`doze`] returned.
pub(super) enum Woke {
    /// A source has bytes (or an error, or its end of file).
    Readable,
    /// The relay is asked to park: nothing is in flight.
    Parked,
    /// No byte moved either way for the idle timeout.
    IdleTimeout,
}

/// Wait, holding nothing, until a source that has not ended is readable
/// (`done`: the directions that ended, client → upstream first). No byte
/// moves meanwhile, so the idle timeout is one timer to the last byte's
/// time plus the timeout.
pub(super) async fn doze(legs: &Legs<'_, '_>, done: [bool; 2]) -> Woke {
    let due = legs.cfg.idle_timeout.map(|t| legs.activity.due(t));
    let idle = due.map(|due| tokio::time::sleep_until(due));
    let parked = legs.park.cancelled();
    tokio::pin!(idle, parked);
    std::future::poll_fn(|cx| {
        if parked.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Woke::Parked);
        }
        for (src, done) in [(legs.client, done[0]), (legs.upstream, done[1])] {
            if !done && src.poll_read_ready(cx).is_ready() {
                return Poll::Ready(Woke::Readable);
            }
        }
        match idle.as_mut().as_pin_mut().map(|sleep| sleep.poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Woke::IdleTimeout),
            _ => Poll::Pending,
        }
    })
    .await
}
