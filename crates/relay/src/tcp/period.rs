//! One period of a connection's relay: both directions from where they
//! stand until both end, one fails, or neither holds anything (then the
//! connection waits without them, `doze.rs`). The period's future (the
//! directions', 2.1 KiB) is boxed by the caller, so only a connection that
//! moves bytes holds it.

use super::bounds::Activity;
use super::direction::Direction;
use super::{failure, reset, DirEnd, Relayed, Start, TcpRelayConfig};
use crate::counters::Counters;
use crate::pipe::PipePool;
use std::io;
use std::sync::atomic::AtomicBool;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// What a period of the relay's directions ended with.
pub(super) enum Period<'p> {
    /// Neither direction held anything: `done` for each that ended.
    Dozed { done: [bool; 2] },
    /// The connection ended (a failure or the idle timeout: both legs reset).
    Ended(Relayed),
    /// Both directions stopped without a failure: closed, or parked.
    Concluded(io::Result<DirEnd<'p>>, io::Result<DirEnd<'p>>),
}

/// What the directions of one connection share.
pub(super) struct Legs<'s, 'p> {
    pub(super) client: &'s TcpStream,
    pub(super) upstream: &'s TcpStream,
    pub(super) pool: &'p PipePool,
    pub(super) counters: &'s Counters,
    pub(super) cfg: &'s TcpRelayConfig,
    /// The connection's park: the doze waits on it, and each period's
    /// directions on a child of it ([`Legs::period`]).
    pub(super) park: &'s CancellationToken,
    pub(super) activity: &'s Activity,
    pub(super) ended: &'s AtomicBool,
    /// Filled from the client's socket as the relay ends, if asked for.
    pub(super) tally: Option<&'s super::Tally>,
}

impl<'p> Legs<'_, 'p> {
    /// The directions from `starts` until both end, or neither holds
    /// anything.
    pub(super) async fn period(&self, starts: [Start<'p>; 2]) -> Period<'p> {
        let [start_target, start_client] = starts;
        // The directions' park: cancelled by a park, or by the failure of
        // either direction, which makes the other give back what it holds.
        // A period's own, so that an idle connection keeps no second node
        // in the cancellation tree.
        let stop = self.park.child_token();
        let idle = [AtomicBool::new(false), AtomicBool::new(false)];
        let direction = |src, dst, bytes, idle| Direction {
            src,
            dst,
            pool: self.pool,
            bytes,
            fallbacks: &self.counters.splice_fallbacks,
            ended: self.ended,
            activity: self.activity,
            cfg: self.cfg,
            park: &stop,
            idle,
        };
        let counters = self.counters;
        let to_target = direction(
            self.client,
            self.upstream,
            &counters.bytes_to_target,
            &idle[0],
        );
        let to_client = direction(
            self.upstream,
            self.client,
            &counters.bytes_to_client,
            &idle[1],
        );
        let outcome = {
            // Pinned once: moved into either branch, it would take its room
            // twice in this future.
            let a = to_target.run(start_target);
            let b = to_client.run(start_client);
            tokio::pin!(a, b);
            let relay = failure::both(a, b, &stop, [&idle[0], &idle[1]]);
            tokio::pin!(relay);
            match self.cfg.idle_timeout {
                None => Some(relay.await),
                Some(timeout) => tokio::select! {
                    biased;
                    r = &mut relay => Some(r),
                    () = self.activity.idle_for(timeout) => None,
                },
            }
        };
        let (a, b) = match outcome {
            None => return Period::Ended(self.idle_timeout()),
            Some(failure::Both::Dozed { done }) => return Period::Dozed { done },
            Some(failure::Both::Ended(a, b)) => (a, b),
        };
        if failure::failed(&a) || failure::failed(&b) {
            let e = failure::end(
                [(&to_target, a), (&to_client, b)],
                self.client,
                self.upstream,
            );
            return Period::Ended(Relayed::Ended(Err(e)));
        }
        Period::Concluded(a, b)
    }

    /// `r`, once the connection's counts are in the tally (if any): called
    /// as the relay ends, while its sockets are still open.
    pub(super) fn tallied<T>(&self, r: T) -> T {
        if let Some(t) = self.tally {
            t.take_from(self.client);
        }
        r
    }

    /// No byte moved either way for the idle timeout: both legs reset.
    pub(super) fn idle_timeout(&self) -> Relayed {
        let timeout = self.cfg.idle_timeout.unwrap_or_default();
        Counters::inc(&self.counters.idle_timeouts);
        tracing::debug!(?timeout, "connection idle: reset");
        reset(self.client);
        reset(self.upstream);
        Relayed::Ended(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no byte moved either way for {timeout:?}"),
        )))
    }
}
