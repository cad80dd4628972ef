//! Who may connect through a forward, and the audit line of each
//! connection. The attachment's access rules (a Device's `allowedClients`,
//! the lease held, edgelink-operator's resolution of both) give a verdict
//! on a client's address:
//!
//! - on accept, a refused client is reset at once, counted, logged with
//!   who it was, and audited;
//! - a client whose lease waits for the device waits, before it takes a
//!   place under `maxConnections`, until the lease is held, up to the
//!   queue timeout;
//! - when the rules change, every relayed connection of the attachment is
//!   stopped where it stands (its token: `cutoff.rs`) and checked again:
//!   a client still let through goes on from there, bytes in flight and
//!   all; the others are reset (a lease taken ends the connections of
//!   everyone else).

use crate::ctx::Ctx;
use crate::cutoff::Cut;
use edgelink_access::audit::End;
use edgelink_access::{Ended, Refusal, Verdict};
use edgelink_handover::lot::ParkedConn;
use edgelink_relay::{Counters, ParkedTcp, Relayed, Tally};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

/// Milliseconds since the first call: when a connection started, in 8
/// bytes of its task.
pub(crate) fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

fn ended_by(r: Refusal) -> Ended {
    match r {
        Refusal::Policy => Ended::RefusedByPolicy,
        Refusal::Lease => Ended::RefusedByLease,
    }
}

/// The verdict on a client of this forward. A reverse forward's clients
/// are the devices themselves: the rules are for the cluster's clients.
fn verdict(ctx: &Ctx, client: std::net::IpAddr) -> Verdict {
    if ctx.forward.reverse.is_some() {
        return Verdict::Allowed;
    }
    ctx.access.verdict(client)
}

/// Whether a client must wait for its lease first.
pub(crate) fn waits(ctx: &Ctx, client: std::net::IpAddr) -> bool {
    verdict(ctx, client) == Verdict::Wait
}

/// Whether an accepted client is let through (or may wait for its
/// lease); a refused one is reset, counted, logged and audited here.
pub(crate) fn admits(ctx: &Ctx, client: &tokio::net::TcpStream, peer: SocketAddr) -> bool {
    match verdict(ctx, peer.ip()) {
        Verdict::Allowed | Verdict::Wait => true,
        Verdict::Refused(r) => {
            let _ = socket2::SockRef::from(client).set_linger(Some(Duration::ZERO));
            if crate::node_local::is_node_address(peer.ip()) {
                // The kubelet's readiness probe (every 10 s), or a
                // hostNetwork process of the node: refused all the same,
                // counted apart, not audited.
                Counters::inc(&ctx.forward.access.refused_node);
                tracing::debug!(client = %peer, "refused a connection from the node itself");
                return false;
            }
            refused(ctx, peer, r, "refused");
            audit(ctx, peer.ip(), now_ms(), (0, 0), ended_by(r));
            false
        }
    }
}

/// Count and log a refusal (at info once a second per forward, else at
/// debug: a client that retries in a loop does not flood the log).
fn refused(ctx: &Ctx, peer: SocketAddr, r: Refusal, what: &str) {
    let c = &ctx.forward.access;
    Counters::inc(match r {
        Refusal::Policy => &c.refused_policy,
        Refusal::Lease => &c.refused_lease,
    });
    let rule = ctx.access.rule();
    let pod = rule
        .as_ref()
        .and_then(|r| r.pod_of(peer.ip()))
        .unwrap_or("");
    let lease = rule.as_ref().and_then(|r| r.lease()).unwrap_or("");
    let reason = match r {
        Refusal::Policy => "not among allowedClients",
        Refusal::Lease => "the device is leased to another client",
    };
    let second = now_ms() / 1000;
    if c.logged.swap(second, Ordering::Relaxed) != second {
        tracing::info!(forward = %ctx.forward.spec.name, attachment = %ctx.access.key, client = %peer, pod, lease, reason, "{what} a client");
    } else {
        tracing::debug!(forward = %ctx.forward.spec.name, attachment = %ctx.access.key, client = %peer, pod, lease, reason, "{what} a client");
    }
}

/// A client waiting for its place or its connect when the rules changed:
/// still let through (or still waiting for its lease, which its place in
/// the queue does not change), or refused (counted and logged).
pub(crate) fn still_admits(ctx: &Ctx, peer: SocketAddr) -> Result<(), Ended> {
    match verdict(ctx, peer.ip()) {
        Verdict::Allowed | Verdict::Wait => Ok(()),
        Verdict::Refused(r) => {
            refused(ctx, peer, r, "after a change of the rules, refused");
            Err(ended_by(r))
        }
    }
}

/// Why a client did not get through: refused, or the wait ran out.
/// `None` in [`wait_turn`]'s error: the client left.
pub(crate) async fn wait_turn(
    ctx: &Ctx,
    client: &tokio::net::TcpStream,
    peer: SocketAddr,
) -> Result<(), Option<Ended>> {
    let mut changes = ctx.access.subscribe();
    let mut counted = false;
    let deadline = tokio::time::Instant::now() + ctx.forward.protection.limits.queue_timeout;
    loop {
        changes.mark_unchanged();
        match verdict(ctx, peer.ip()) {
            Verdict::Allowed => return Ok(()),
            Verdict::Refused(r) => {
                refused(ctx, peer, r, "after its wait, refused");
                return Err(Some(ended_by(r)));
            }
            Verdict::Wait if !counted => {
                counted = true;
                Counters::inc(&ctx.forward.access.waited);
                tracing::debug!(client = %peer, "waits for its lease");
            }
            Verdict::Wait => {}
        }
        tokio::select! {
            r = changes.changed() => if r.is_err() { return Err(None) },
            () = tokio::time::sleep_until(deadline) => {
                Counters::inc(&ctx.forward.access.wait_timeouts);
                tracing::debug!(client = %peer, "waited for its lease longer than the queue timeout: reset");
                return Err(Some(Ended::QueueTimeout));
            }
            () = crate::protect::reset_by_peer(client) => return Err(None),
        }
    }
}

/// How a relay that was stopped for the rules' change ended.
pub(crate) enum Rechecked {
    /// It went on, and ended so (or parked for a hand-over).
    Relayed(Option<Relayed>),
    /// Its client is no longer let through: reset.
    Cut(Ended),
}

/// A relay parked because the access rules changed ([`Cut::Revoked`]):
/// its client checked again, then resumed where it stood (as many times
/// as the rules change) or reset.
pub(crate) async fn go_on(ctx: &Ctx, mut p: ParkedTcp, tally: &Tally) -> Rechecked {
    loop {
        p = match recheck(ctx, p, tally) {
            Ok(p) => p,
            Err(e) => return Rechecked::Cut(e),
        };
        let cfg = ctx.relay_config(true);
        let fds = [p.client.as_raw_fd(), p.upstream.as_raw_fd()];
        let park = ctx.cutoff.token(&ctx.shared.lot);
        let (c, pipes) = (&ctx.forward.counters, &ctx.shared.pipes);
        let run = edgelink_relay::resume_tcp(p, pipes, c, cfg, &park, Some(tally));
        let r = crate::ending::relay(std::pin::pin!(run), fds, &ctx.cutoff).await;
        match r {
            Some(Relayed::Parked(next)) if ctx.cutoff.why(&ctx.shared.lot) == Cut::Revoked => {
                p = next;
            }
            r => return Rechecked::Relayed(r),
        }
    }
}

/// A stopped relay whose client is still let through, to resume; else
/// reset (counted, logged), and how it ended. A client waiting for its
/// lease is not let through: the lease is someone else's.
pub(crate) fn recheck(ctx: &Ctx, p: ParkedTcp, tally: &Tally) -> Result<ParkedTcp, Ended> {
    let peer = p.client.peer_addr().ok();
    let r = match peer.map_or(Verdict::Allowed, |a| verdict(ctx, a.ip())) {
        Verdict::Allowed => return Ok(p),
        Verdict::Wait => Refusal::Lease,
        Verdict::Refused(r) => r,
    };
    tally.take_from(&p.client);
    ParkedConn::Relaying(p).reset();
    Counters::inc(&ctx.forward.access.reset);
    if let Some(peer) = peer {
        refused(ctx, peer, r, "reset the connection of");
    }
    Err(ended_by(r))
}

/// How a relay's end reads in the audit; `None`: parked for a hand-over
/// (the next daemon writes its line).
pub(crate) fn ended(r: &Option<Relayed>) -> Option<Ended> {
    match r {
        Some(Relayed::Ended(Ok(()))) => Some(Ended::Closed),
        Some(Relayed::Ended(Err(e))) if e.kind() == std::io::ErrorKind::TimedOut => {
            Some(Ended::IdleTimeout)
        }
        Some(Relayed::Ended(Err(_))) | None => Some(Ended::Reset),
        Some(Relayed::Parked(_)) => None,
    }
}

/// The audit line of one connection from `peer`, started at `since`
/// ([`now_ms`]), that moved `bytes` (to the device, to the client): handed
/// to the trail's thread, which makes the line.
pub(crate) fn audit(
    ctx: &Ctx,
    peer: std::net::IpAddr,
    since: u64,
    bytes: (u64, u64),
    ended: Ended,
) {
    audit_with(ctx, peer, since, bytes, ended, None);
}

/// [`audit`], with a multiplexed Modbus/TCP client's request count.
pub(crate) fn audit_with(
    ctx: &Ctx,
    peer: std::net::IpAddr,
    since: u64,
    bytes: (u64, u64),
    ended: Ended,
    requests: Option<u64>,
) {
    let trail = &ctx.shared.audit;
    if !trail.is_on() {
        return;
    }
    trail.log(End {
        origin: ctx.audit_origin(),
        client: peer,
        duration_ms: now_ms().saturating_sub(since),
        bytes,
        ended,
        requests,
        at: SystemTime::now(),
    });
}

/// The audit line of a UDP session (`edgelink-relay`'s session hook): one
/// per session, as it ends. Refused datagrams are counted, not audited.
pub(crate) fn udp_hook(ctx: &Ctx) -> Option<edgelink_relay::SessionHook> {
    use edgelink_relay::SessionEnded;
    let trail = ctx.shared.audit.clone();
    if !trail.is_on() {
        return None;
    }
    let origin = ctx.audit_origin();
    Some(edgelink_relay::SessionHook(std::sync::Arc::new(
        move |end| {
            let ended = match end.how {
                SessionEnded::Idle => Ended::IdleTimeout,
                SessionEnded::Evicted => Ended::Evicted,
                SessionEnded::Failed => Ended::Reset,
                SessionEnded::Closed => Ended::Closed,
            };
            trail.log(End {
                origin: origin.clone(),
                client: end.peer.ip(),
                duration_ms: u64::try_from(end.duration.as_millis()).unwrap_or(u64::MAX),
                bytes: (end.bytes_to_target, end.bytes_to_client),
                ended,
                requests: None,
                at: SystemTime::now(),
            });
        },
    )))
}
