//! A forward's listening sockets and the accept loops on them.
//!
//! One socket per address, never SO_REUSEPORT (the factory module says
//! why: a root process of the pod could join the group and take a share
//! of the connections). A TCP listener is shared by the workers instead:
//! each runs an accept loop over a descriptor of its own (a dup of the one
//! socket, registered with its runtime); a new connection wakes them all,
//! one accepts it and the others find nothing. A connection then lives on
//! the worker that accepted it, from accept to close.
//!
//! What the accept loop learns of a connection (its two addresses) is
//! taken at accept: a client that resets later cannot make a failure that
//! is its own count against the device.

use crate::connection::Slot;
use crate::ctx::{Ctx, Ends};
use crate::sockopt;
use edgelink_attachment::Protocol;
use edgelink_handover::lot::{Guard, Item};
use edgelink_relay::{Counters, UdpForward};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tracing::Instrument;

/// A forward's socket, new or handed over.
pub enum Sock {
    Tcp(std::net::TcpListener),
    Udp(UdpForward),
}

/// New sockets, one per address: the IPv4 one is required (and the IPv6
/// one for an IPv6 target; a reverse forward's, each). A forward comes up
/// whole or not at all: `None` (failed, retried on the next pass). An
/// IPv6 address the pod does not have is skipped; one that is taken (a
/// process of the pod holds the port) fails the forward like any other.
pub async fn bind(ctx: &Ctx) -> Option<Vec<Sock>> {
    let f = &ctx.forward;
    let spec = &f.spec;
    let stream = spec.protocol == Protocol::Tcp;
    // Also on IPv6, so clients of a dual-stack cluster reach an IPv4
    // device too; a pod without IPv6 simply has no such listener.
    // A reverse forward: on the interface's own addresses, each required.
    // Its virtual addresses too, bound before the pod holds them.
    let (addrs, virtuals) = match &f.reverse {
        Some(r) => (r.listen_addrs(), r.virtual_listen_addrs()),
        None => (
            vec![
                SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), spec.port),
                SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), spec.port),
            ],
            Vec::new(),
        ),
    };
    let all = addrs.into_iter().map(|a| (a, false));
    let mut socks = Vec::new();
    for (addr, freebind) in all.chain(virtuals.into_iter().map(|a| (a, true))) {
        let made = if freebind {
            ctx.factory.listener_freebind(addr, stream).await
        } else {
            ctx.factory.listener(addr, stream).await
        };
        match made {
            Ok(s) if stream => socks.push(Sock::Tcp(s.into())),
            Ok(s) => socks.push(Sock::Udp(UdpForward {
                listener: s.into(),
                sessions: Vec::new(),
            })),
            Err(e)
                if addr.is_ipv6()
                    && !spec.target.is_ipv6()
                    && f.reverse.is_none()
                    && e.kind() != std::io::ErrorKind::AddrInUse =>
            {
                tracing::debug!(forward = %spec.name, %addr, error = %e, "no IPv6 listener");
            }
            Err(e) => {
                f.error(format!("cannot listen on {addr}/{}: {e}", spec.protocol));
                tracing::warn!(forward = %spec.name, %addr, error = %e, "listener failed");
                f.set_listener("failed");
                return None;
            }
        }
    }
    Some(socks)
}

/// [`bind`], after the handed-over listeners of the port were closed: the
/// daemon that handed them over may hold them a moment longer, until it
/// exits on the Confirm. Tried for up to 2 s, then left to the next pass.
pub async fn bind_when_free(ctx: &Ctx) -> Option<Vec<Sock>> {
    for _ in 0..20 {
        if let Some(s) = bind(ctx).await {
            return Some(s);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bind(ctx).await
}

/// Whether a handed-over TCP listener has SO_REUSEPORT (made by a daemon
/// before this one's, one per worker): a root process of the pod could
/// join it. Such listeners are closed and bound again.
pub fn joinable(l: &std::net::TcpListener) -> bool {
    socket2::SockRef::from(l).reuse_port().unwrap_or(false)
}

/// A handed-over UDP socket: without SO_REUSEADDR from now on (a daemon
/// before this one's set it), so that no other socket binds its port.
pub fn seal_udp(u: &UdpForward) {
    if let Err(e) = socket2::SockRef::from(&u.listener).set_reuse_address(false) {
        tracing::debug!(error = %e, "cannot clear SO_REUSEADDR on a handed-over UDP socket");
    }
}

/// Accept on `listener` from every worker in `on`; the tasks to abort when
/// the forward stops, or `None` when the socket cannot be shared (out of
/// descriptors: the forward is `failed` and retried).
pub fn serve_tcp(
    ctx: &Ctx,
    on: &[usize],
    listener: std::net::TcpListener,
) -> Option<Vec<JoinHandle<()>>> {
    let f = &ctx.forward;
    // Its accepted sockets inherit the cap on their buffers, and what the
    // relay wants of them (`relay_config`: prepared). A handed-over
    // listener gets them here too, whatever the daemon before set.
    crate::sockopt::cap_buffers(&listener, ctx.shared.settings.socket_buffer);
    let keepalive = Some(ctx.shared.settings.tcp_keepalive).filter(|k| !k.is_zero());
    if let Err(e) = edgelink_relay::prepare_socket(&listener, keepalive) {
        f.error(format!("cannot set the listener's options: {e}"));
        f.set_listener("failed");
        return None;
    }
    // A descriptor of its own for each worker; the socket's is closed
    // when this returns.
    let fds: std::io::Result<Vec<_>> = on.iter().map(|_| listener.try_clone()).collect();
    let fds = match fds {
        Ok(fds) => fds,
        Err(e) => {
            f.error(format!("cannot share the listener with the workers: {e}"));
            f.set_listener("failed");
            return None;
        }
    };
    // Connections already in its queue (a handed-over listener's) were
    // made before the options were: those accepted in the first moment
    // get them one by one.
    let settled = std::time::Instant::now() + OPTIONS_SETTLE;
    // A hand-over parks the one socket once, whichever loop sees it first.
    let parked = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (&w, fd) in on.iter().zip(fds) {
        let span = tracing::info_span!("forward", name = %f.spec.name, port = f.spec.port,
            target = %crate::ctx::target_name(f), worker = w);
        let (c, guard, parked) = (ctx.clone_for(), ctx.shared.lot.guard(), parked.clone());
        tasks.push(
            ctx.shared.workers.spawn(
                w,
                async move {
                    // Registered with this worker's runtime: here.
                    let registered = fd
                        .set_nonblocking(true)
                        .and_then(|()| tokio::net::TcpListener::from_std(fd));
                    match registered {
                        Ok(l) => accept_loop(l, c, guard, parked, settled).await,
                        Err(e) => {
                            c.forward.error(e);
                            c.forward.set_listener("failed");
                        }
                    }
                }
                .instrument(span),
            ),
        );
    }
    Some(tasks)
}

/// How long after a listener got its options ([`serve_tcp`]) accepted
/// connections get them one by one: those queued before (a handed-over
/// listener's backlog, drained in milliseconds) did not inherit them.
const OPTIONS_SETTLE: Duration = Duration::from_secs(1);

async fn accept_loop(
    listener: tokio::net::TcpListener,
    mut ctx: Ctx,
    guard: Guard,
    parked: Arc<AtomicBool>,
    settled: std::time::Instant,
) {
    let v6 = listener.local_addr().map(|a| a.is_ipv6()).unwrap_or(false);
    // What every connection of this loop shares (one copy, not one each).
    let shared = Arc::new(ctx.clone_for());
    let mut warned: Option<std::time::Instant> = None;
    let park = ctx.shared.lot.token();
    loop {
        if park.is_cancelled() {
            // A hand-over: the listener goes as it is, with the
            // connections waiting in its queue (once; the other workers'
            // descriptors of it are closed).
            if !parked.swap(true, Ordering::AcqRel) {
                match listener.into_std() {
                    Ok(l) => ctx.shared.lot.park(Item::Listener(ctx.id(), l)),
                    Err(e) => tracing::warn!(error = %e, "cannot hand a listener over"),
                }
            }
            drop(guard);
            return;
        }
        let fds = &ctx.shared.fds;
        if !fds.whole() {
            fds.refill();
        }
        if fds.paused() {
            // The descriptors kept for the control socket and the status
            // server are lent out or not back yet: leave what is free to
            // them, accept nothing for now.
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => continue,
                _ = ctx.stop.wait_for(|s| *s) => break,
            }
        }
        let accepted = tokio::select! {
            biased;
            () = park.cancelled() => continue,
            r = listener.accept() => r,
            _ = ctx.stop.wait_for(|s| *s) => break,
        };
        let (client, peer) = match accepted {
            Ok(c) => c,
            Err(e) => {
                accept_failed(&ctx, e, &mut warned);
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(50)) => continue,
                    _ = ctx.stop.wait_for(|s| *s) => break,
                }
            }
        };
        if std::time::Instant::now() < settled && !prepare_early(&ctx, &client) {
            continue;
        }
        let Some((ends, slot)) = admit(&ctx, &client, peer, v6) else {
            continue;
        };
        serve_client(&shared, client, ends, slot);
    }
    drop(listener);
    ctx.forward.set_listener("stopped");
}

/// An admitted client: relayed, or handed to the forward's Modbus/TCP
/// multiplexer.
fn serve_client(shared: &Arc<Ctx>, client: tokio::net::TcpStream, ends: Ends, slot: Slot) {
    let peer = ends.peer;
    if let Some(mux) = shared.modbus.get() {
        let served = crate::modbus::client(mux.clone(), client, shared.clone(), slot, peer.ip());
        tokio::spawn(served.instrument(tracing::debug_span!("conn", %peer)));
        return;
    }
    // The future itself, not an async block around it: that would keep
    // its arguments a second time in every connection's task.
    let accepted = crate::connection::Entry::Accepted;
    let guard = shared.shared.lot.guard();
    let conn = crate::connection::connection(client, ends, shared.clone(), slot, guard, accepted);
    tokio::spawn(conn.instrument(tracing::debug_span!("conn", %peer)));
}

/// The relay's options on a connection accepted in a listener's first
/// moment (see [`OPTIONS_SETTLE`]); false (and the client reset) when they
/// cannot be set.
fn prepare_early(ctx: &Ctx, client: &tokio::net::TcpStream) -> bool {
    let keepalive = Some(ctx.shared.settings.tcp_keepalive).filter(|k| !k.is_zero());
    match edgelink_relay::prepare_socket(client, keepalive) {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!(error = %e, "cannot set a connection's options: reset");
            let _ = socket2::SockRef::from(client).set_linger(Some(Duration::ZERO));
            false
        }
    }
}

/// An accept that failed (EMFILE and friends): noted in the forward's
/// last error; at the fd limit this repeats every 50 ms, so one warning a
/// minute and the rest at debug.
fn accept_failed(ctx: &Ctx, e: std::io::Error, warned: &mut Option<std::time::Instant>) {
    ctx.forward.error(format!("accept: {e}"));
    if warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
        *warned = Some(std::time::Instant::now());
        tracing::warn!(error = %e, "accept failed (repeats logged at debug for a minute)");
    } else {
        tracing::debug!(error = %e, "accept failed");
    }
}

/// Whether an accepted client is served: not gone already, not from the
/// private side (or, for a reverse forward, an allowed source), let
/// through by the access rules, and under the daemon's connection cap. A refused one is reset and counted.
fn admit(
    ctx: &Ctx,
    client: &tokio::net::TcpStream,
    peer: SocketAddr,
    v6: bool,
) -> Option<(Ends, Slot)> {
    // Gone already (reset before it was accepted): nothing to serve.
    let Ok(local) = client.local_addr() else {
        tracing::debug!(%peer, "the client left before it was served");
        return None;
    };
    let ingress = sockopt::ingress_ifindex(client, v6);
    if ctx.refuses(peer, Some(local), ingress) {
        Counters::inc(&ctx.forward.counters.refused);
        tracing::debug!(%peer, ingress = %ingress.map_or("unknown".to_string(), |i| i.to_string()), "refused a connection (private side, or not an allowed source)");
        let _ = socket2::SockRef::from(client).set_linger(Some(Duration::ZERO));
        return None;
    }
    if !crate::clients::admits(ctx, client, peer) {
        return None;
    }
    let Some(slot) = Slot::take(ctx) else {
        Counters::inc(&ctx.forward.rejected);
        tracing::debug!(%peer, "the daemon's connection cap is reached: reset");
        let _ = socket2::SockRef::from(client).set_linger(Some(Duration::ZERO));
        return None;
    };
    Some((Ends { peer, local }, slot))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_with_so_reuseport_is_joinable_and_ours_is_not() {
        let ours = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(!joinable(&ours));
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.set_reuse_port(true).unwrap();
        s.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
            .unwrap();
        s.listen(4).unwrap();
        assert!(joinable(&s.into()));
    }
}
