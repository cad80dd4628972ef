//! Serving the TCP connections a hand-over brought to a forward (from the
//! daemon this one took over from, or back to this one after a hand-over
//! that failed), under the forward's `maxConnections` as they were:
//!
//! 1. every connection that held a place (relayed, or connecting) takes
//!    one again at once, beyond the bound if need be (a debt, paid back
//!    before anyone waiting gets a place: [`crate::protect::Place`]);
//! 2. then the clients that were waiting take their turns in the queue,
//!    longest wait first, with the queue timeout counted from when they
//!    first arrived;
//!
//! all before the forward's listeners accept anything new, so a new client
//! queues behind them.

use crate::connection::{connection, settle, Entry, Slot};
use crate::ctx::{Ctx, Ends};
use crate::ending::{finish, relay};
use crate::protect::{Admission, Place, Turn};
use edgelink_handover::lot::{Guard, ParkedConn, Pending};
use edgelink_relay::ParkedTcp;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument;

/// What to do with one handed-over connection.
enum Job {
    /// Relayed: resume it, with its place.
    Relay(edgelink_relay::ParkedTcp, Option<Place>),
    /// Not relayed yet: admit (its turn is taken) and connect.
    Connect(std::net::TcpStream, Turn, Instant),
}

/// Take places and turns for `conns` in the order above, then serve each
/// on one of the workers `on` (in turn).
pub fn spawn(ctx: &Ctx, conns: Vec<ParkedConn>, on: &[usize]) {
    let p = &ctx.forward.protection;
    let mut placed = Vec::new();
    let mut waiting = Vec::new();
    for c in conns {
        match c {
            ParkedConn::Pending(Pending {
                client,
                queued_since: Some(since),
            }) => waiting.push((client, since)),
            other => placed.push(other),
        }
    }
    // Longest wait first; equal (a protocol-1 peer sends no wait) keep the
    // order they came in.
    waiting.sort_by_key(|(_, since)| *since);
    let mut jobs = Vec::with_capacity(placed.len() + waiting.len());
    for c in placed {
        // The daemon's `--max-connections` first: a connection beyond it is
        // reset and takes no place.
        let Some(slot) = Slot::take(ctx) else {
            drop_conn(c);
            continue;
        };
        let now = Instant::now();
        let job = match c {
            ParkedConn::Relaying(t) => Job::Relay(t, p.take_place()),
            ParkedConn::Pending(Pending { client, .. }) => {
                Job::Connect(client, Turn::Decided(Admission::Go(p.take_place())), now)
            }
        };
        jobs.push((slot, job));
    }
    for (client, since) in waiting {
        let Some(slot) = Slot::take(ctx) else {
            drop_conn(ParkedConn::Pending(Pending {
                client,
                queued_since: Some(since),
            }));
            continue;
        };
        jobs.push((slot, Job::Connect(client, p.enqueue(since), since)));
    }
    let workers = &ctx.shared.workers;
    let name = &ctx.forward.spec.name;
    // What every resumed connection shares (one copy, not one each).
    let shared = Arc::new(ctx.clone_for());
    for (i, (slot, job)) in jobs.into_iter().enumerate() {
        let guard = ctx.shared.lot.guard();
        // The future itself, not an async block around it (see listen.rs).
        let conn = resumed(job, shared.clone(), slot, guard);
        workers.spawn(
            on[i % on.len()],
            conn.instrument(tracing::debug_span!("conn", forward = %name, resumed = true)),
        );
    }
}

fn drop_conn(c: ParkedConn) {
    tracing::debug!("the daemon's connection cap is reached: a handed-over connection is reset");
    c.reset();
}

/// A connection handed over to this daemon (or back to it): one still to
/// connect, or one relayed before. Not an `async fn`, which would keep its
/// arguments twice in the connection's task (rust-lang/rust#62958).
fn resumed(
    job: Job,
    ctx: Arc<Ctx>,
    slot: Slot,
    guard: Guard,
) -> impl std::future::Future<Output = ()> + Send {
    use futures_util::future::Either;
    match job {
        Job::Connect(s, turn, since) => {
            Either::Left(connect_again(s, turn, since, ctx, slot, guard))
        }
        Job::Relay(p, place) => Either::Right(relay_again(p, place, ctx, slot, guard)),
    }
}

/// A handed-over connection that waited for its place or its connect:
/// registered with the worker's runtime when first polled (there), then
/// served as one accepted here.
fn connect_again(
    s: std::net::TcpStream,
    turn: Turn,
    since: Instant,
    ctx: Arc<Ctx>,
    slot: Slot,
    guard: Guard,
) -> impl std::future::Future<Output = ()> + Send {
    use futures_util::future::{lazy, Either, FutureExt};
    lazy(move |_| {
        // Its addresses as they are now (its PROXY protocol header names
        // them): a client that has gone fails here, before any connect,
        // and nothing is counted against the device.
        let client = s
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpStream::from_std(s))
            .and_then(|c| Ends::of(&c).map(|e| (c, e)));
        match client {
            Ok((client, ends)) => {
                let entry = Entry::Handed(turn, since);
                Either::Left(connection(client, ends, ctx, slot, guard, entry))
            }
            Err(e) => {
                tracing::debug!(error = %e, "a handed-over connection is unusable");
                Either::Right(std::future::ready(()))
            }
        }
    })
    .flatten()
}

/// A handed-over connection that was relayed: relayed on from where it
/// stood, with its place under `maxConnections`.
#[allow(clippy::manual_async_fn)] // See `resumed`.
fn relay_again(
    p: ParkedTcp,
    place: Option<Place>,
    ctx: Arc<Ctx>,
    slot: Slot,
    guard: Guard,
) -> impl std::future::Future<Output = ()> + Send {
    async move {
        let cfg = ctx.relay_config(true);
        let fds = [p.client.as_raw_fd(), p.upstream.as_raw_fd()];
        // Its audit line counts from here; the bytes are the kernel's, so
        // from the connection's start.
        let unknown = std::net::IpAddr::from([0, 0, 0, 0]);
        let peer = p.client.peer_addr().map_or(unknown, |a| a.ip());
        let since = crate::clients::now_ms();
        let tally = edgelink_relay::Tally::default();
        // The rules may have changed during the hand-over.
        let p = match crate::clients::recheck(&ctx, p, &tally) {
            Ok(p) => p,
            Err(e) => {
                crate::clients::audit(&ctx, peer, since, tally.get(), e);
                return finish(&ctx, None, (slot, place), guard);
            }
        };
        let park = ctx.cutoff.token(&ctx.shared.lot);
        let audited = ctx.shared.audit.is_on().then_some(&tally);
        let (c, pipes) = (&ctx.forward.counters, &ctx.shared.pipes);
        let run = edgelink_relay::resume_tcp(p, pipes, c, cfg, &park, audited);
        let r = relay(std::pin::pin!(run), fds, &ctx.cutoff).await;
        let r = settle(&ctx, r, &tally, peer, since).await;
        finish(&ctx, r, (slot, place), guard);
    }
}
