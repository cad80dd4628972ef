//! Serving one forward: its listener(s) inside the pod's namespace, the
//! accept loop, the connection caps, the connect towards the device, and
//! the relay. What it needs of the daemon comes in [`Shared`].

use crate::config::RunArgs;
use crate::factory::Factory;
use crate::fds::FdReserve;
use crate::model::ForwardRuntime;
use crate::parking::{Adopted, ForwardId, Guard, Item, Lot, ParkedConn};
use crate::private_side::PrivateSide;
use crate::protect::Admission;
use crate::sockopt;
use crate::workers::Workers;
use edgelink_attachment::{ForwardPath, Protocol};
use edgelink_relay::{Counters, PipePool, Relayed, TcpRelayConfig, UdpConfig, UdpForward};
use ipnetwork::IpNetwork;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument;

/// What the forwards of every attachment share.
pub struct Shared {
    pub args: RunArgs,
    pub pipes: Arc<PipePool>,
    /// Descriptors kept back for the control socket and the status server.
    pub fds: Arc<FdReserve>,
    /// TCP connections relayed now, over all forwards (`--max-connections`).
    pub connections: AtomicU64,
    /// The runtimes that serve connections, one per worker thread.
    pub workers: Arc<Workers>,
    /// Where a hand-over parks what the forwards hold, and where the
    /// forwards find what was handed to this daemon.
    pub lot: Arc<Lot>,
}

pub struct Ctx {
    /// The attachment's container ID and interface.
    pub attachment: (String, String),
    pub shared: Arc<Shared>,
    pub factory: Arc<Factory>,
    pub forward: Arc<ForwardRuntime>,
    pub allowed: Vec<IpNetwork>,
    pub private: PrivateSide,
    pub stop: watch::Receiver<bool>,
    /// Set when the attachment is gone: its connections end too.
    pub close: watch::Receiver<bool>,
}

/// Start serving; returns the tasks to abort when the attachment goes.
pub async fn start(ctx: Ctx) -> Vec<JoinHandle<()>> {
    let f = ctx.forward.clone();
    let spec = &f.spec;
    if spec.path == ForwardPath::Kernel {
        // Its table is the attachment's (crate::kernel); only the probe
        // that keeps its reachability fresh runs here.
        if spec.protocol == Protocol::Tcp && !ctx.shared.args.probe_interval.is_zero() {
            return vec![tokio::spawn(probe_loop(ctx.clone_for()))];
        }
        return Vec::new();
    }
    // A reverse forward's target must not be in the segment (a loop); the
    // daemon checks it again: the record is a file on disk.
    if let Some(r) = &f.reverse {
        let looped = r
            .spec
            .target
            .addr()
            .and_then(|a| r.in_segment(a.ip()).map(|n| (a, n)));
        if let Some((a, n)) = looped {
            f.set_listener("refused");
            f.error(format!(
                "target {a} is inside the interface's subnet {n}: a loop"
            ));
            tracing::warn!(forward = %spec.name, target = %a, "reverse target in the segment: not serving");
            return Vec::new();
        }
    } else if !spec.target_allowed(&ctx.allowed) {
        // The daemon checks allowedTargets again: the record is a file on disk.
        f.set_listener("refused");
        f.error(format!(
            "target {} is outside allowedTargets {:?}",
            spec.target, ctx.allowed
        ));
        tracing::warn!(forward = %spec.name, target = %spec.target, "target outside allowedTargets: not serving");
        return Vec::new();
    }
    let workers = ctx.shared.workers.clone();
    let stream = spec.protocol == Protocol::Tcp;
    // TCP: a listener on every worker. UDP: one socket on one worker (the
    // forwards spread by port), so that its session table, and the
    // `--udp-max-sessions` bound on it, stay whole.
    let on: Vec<usize> = if stream {
        (0..workers.len()).collect()
    } else {
        vec![usize::from(spec.port) % workers.len()]
    };
    // Handed over (another daemon's, or ours after a hand-over that
    // failed): its sockets, as they are, instead of new ones.
    let adopted = ctx
        .shared
        .lot
        .claim(&ctx.id())
        .filter(|a| adopted_fits(a, spec.port, stream));
    let socks = match adopted {
        Some(a) => {
            tracing::info!(forward = %spec.name, listeners = a.listeners.len() + a.udp.len(),
                connections = a.conns.len(), sessions = a.udp.iter().map(|u| u.sessions.len()).sum::<usize>(),
                "serving what was handed over");
            let mut socks: Vec<(usize, Sock)> = Vec::new();
            for (i, l) in a.listeners.into_iter().enumerate() {
                socks.push((on[i % on.len()], Sock::Tcp(l)));
            }
            for u in a.udp {
                socks.push((on[0], Sock::Udp(u)));
            }
            for (i, c) in a.conns.into_iter().enumerate() {
                let Some(slot) = Slot::take(&ctx) else {
                    drop_conn(c);
                    continue;
                };
                let c2 = ctx.clone_for();
                let guard = ctx.shared.lot.guard();
                workers.spawn(
                    on[i % on.len()],
                    async move { resumed(c, c2, slot, guard).await }.instrument(
                        tracing::debug_span!("conn", forward = %spec.name, resumed = true),
                    ),
                );
            }
            socks
        }
        None => match bind(&ctx, &on).await {
            Some(s) => s,
            None => return Vec::new(),
        },
    };
    let mut tasks = Vec::new();
    for (w, sock) in socks {
        let span = tracing::info_span!("forward", name = %spec.name, port = spec.port, target = %target_name(&f), worker = w);
        let task = match sock {
            Sock::Tcp(std) => {
                let c = ctx.clone_for();
                let guard = ctx.shared.lot.guard();
                workers.spawn(
                    w,
                    async move {
                        // Registered with this worker's runtime: here.
                        let registered = std
                            .set_nonblocking(true)
                            .and_then(|()| tokio::net::TcpListener::from_std(std));
                        match registered {
                            Ok(l) => accept_loop(l, c, guard).await,
                            Err(e) => {
                                c.forward.error(e);
                                c.forward.set_listener("failed");
                            }
                        }
                    }
                    .instrument(span),
                )
            }
            Sock::Udp(forward) => {
                let cfg = UdpConfig {
                    idle_timeout: ctx.shared.args.udp_idle_timeout,
                    max_sessions: ctx.shared.args.udp_max_sessions as usize,
                    gso: ctx.shared.args.udp_gso,
                    ..Default::default()
                };
                let private = ctx.private.clone();
                let refuse: Arc<edgelink_relay::RefuseFn> = match f.reverse.clone() {
                    Some(r) => {
                        Arc::new(move |peer, ifindex| !r.admits(peer, ifindex, private.ifindex))
                    }
                    None => Arc::new(move |peer, ifindex| private.refuses(peer, None, ifindex)),
                };
                let mut stop = ctx.stop.clone();
                let fr = f.clone();
                let source: Arc<dyn edgelink_relay::SocketSource> = ctx.factory.clone();
                let target: edgelink_relay::UdpTarget = match f.reverse.clone() {
                    Some(r) => edgelink_relay::UdpTarget::Dynamic(Arc::new(move || r.target())),
                    None => spec.target.into(),
                };
                let counters = f.counters.clone();
                let (lot, id, guard) = (ctx.shared.lot.clone(), ctx.id(), ctx.shared.lot.guard());
                let park = lot.token();
                workers.spawn(
                    w,
                    async move {
                        let _guard = guard;
                        let shutdown = async move {
                            let _ = stop.wait_for(|s| *s).await;
                        };
                        match edgelink_relay::relay_udp(
                            forward, target, source, cfg, counters, refuse, shutdown, &park,
                        )
                        .await
                        {
                            Ok(Some(parked)) => lot.park(Item::Udp(id, parked)),
                            Ok(None) => fr.set_listener("stopped"),
                            Err(e) => {
                                tracing::warn!(error = %e, "UDP relay stopped");
                                fr.error(e);
                                fr.set_listener("failed");
                            }
                        }
                    }
                    .instrument(span),
                )
            }
        };
        tasks.push(task);
    }
    f.set_listener("listening");
    if let Some(r) = f.reverse.clone().filter(|r| r.spec.target.addr().is_none()) {
        tasks.push(tokio::spawn(crate::follow::run(
            r,
            ctx.factory.clone(),
            ctx.stop.clone(),
        )));
    }
    if spec.protocol == Protocol::Tcp && !ctx.shared.args.probe_interval.is_zero() {
        tasks.push(tokio::spawn(probe_loop(ctx.clone_for())));
    }
    tasks
}

/// A forward's socket, new or handed over, with the worker it goes to.
enum Sock {
    Tcp(std::net::TcpListener),
    Udp(UdpForward),
}

/// New listeners, one per worker in `on` and address: the IPv4 ones are
/// required (and the IPv6 ones for an IPv6 target). A forward comes up
/// whole or not at all: `None` (failed, retried on the next pass).
async fn bind(ctx: &Ctx, on: &[usize]) -> Option<Vec<(usize, Sock)>> {
    let f = &ctx.forward;
    let spec = &f.spec;
    let stream = spec.protocol == Protocol::Tcp;
    let reuse_port = on.len() > 1;
    // Also on IPv6, so clients of a dual-stack cluster reach an IPv4
    // device too; a pod without IPv6 simply has no such listener.
    // A reverse forward: on the interface's own addresses, each required.
    let addrs = match &f.reverse {
        Some(r) => r.listen_addrs(),
        None => vec![
            SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), spec.port),
            SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), spec.port),
        ],
    };
    let mut socks = Vec::new();
    'addrs: for addr in addrs {
        let mut these = Vec::new();
        for &w in on {
            match ctx.factory.listener(addr, stream, reuse_port).await {
                Ok(s) => these.push((
                    w,
                    if stream {
                        Sock::Tcp(s.into())
                    } else {
                        Sock::Udp(UdpForward {
                            listener: s.into(),
                            sessions: Vec::new(),
                        })
                    },
                )),
                Err(e) if addr.is_ipv6() && !spec.target.is_ipv6() && f.reverse.is_none() => {
                    tracing::debug!(forward = %spec.name, %addr, error = %e, "no IPv6 listener");
                    continue 'addrs;
                }
                Err(e) => {
                    f.error(format!("cannot listen on {addr}/{}: {e}", spec.protocol));
                    tracing::warn!(forward = %spec.name, %addr, error = %e, "listener failed");
                    f.set_listener("failed");
                    return None;
                }
            }
        }
        socks.extend(these);
    }
    Some(socks)
}

/// Whether handed-over sockets are this forward's: listeners of its
/// protocol on its port. (A record that changed between the two daemons
/// makes new ones; the old ones are dropped with what no forward claims.)
fn adopted_fits(a: &Adopted, port: u16, stream: bool) -> bool {
    let tcp_ok = a
        .listeners
        .iter()
        .all(|l| l.local_addr().is_ok_and(|x| x.port() == port));
    let udp_ok = a
        .udp
        .iter()
        .all(|u| u.listener.local_addr().is_ok_and(|x| x.port() == port));
    let has = if stream {
        !a.listeners.is_empty() && a.udp.is_empty()
    } else {
        !a.udp.is_empty() && a.listeners.is_empty() && a.conns.is_empty()
    };
    if !(has && tcp_ok && udp_ok) {
        if !a.is_empty() {
            tracing::warn!(
                port,
                "handed-over sockets do not fit the forward's record: new ones are made"
            );
            drop_adopted(a);
        }
        return false;
    }
    true
}

fn drop_adopted(a: &Adopted) {
    a.conns.iter().for_each(ParkedConn::reset);
}

fn drop_conn(c: ParkedConn) {
    tracing::debug!("the daemon's connection cap is reached: a handed-over connection is reset");
    c.reset();
}

impl Ctx {
    pub fn id(&self) -> ForwardId {
        (
            self.attachment.0.clone(),
            self.attachment.1.clone(),
            self.forward.spec.name.clone(),
        )
    }

    /// Whether an accepted connection must be reset: a forward refuses
    /// the private side; a reverse forward admits only its sources, on
    /// the interface.
    fn refuses(&self, peer: SocketAddr, local: Option<SocketAddr>, ingress: Option<u32>) -> bool {
        match &self.forward.reverse {
            Some(r) => !r.admits(peer, ingress, self.private.ifindex),
            None => self.private.refuses(peer, local, ingress),
        }
    }

    /// Where the next connect goes. A reverse target that is a name and
    /// has no address yet is waited for, up to the connect timeout.
    async fn target(&self) -> std::io::Result<SocketAddr> {
        match &self.forward.reverse {
            Some(r) => {
                let wait = Duration::from_millis(self.forward.spec.connect_timeout_ms);
                r.target_within(wait).await
            }
            None => Ok(self.forward.spec.target),
        }
    }

    fn clone_for(&self) -> Ctx {
        Ctx {
            attachment: self.attachment.clone(),
            shared: self.shared.clone(),
            factory: self.factory.clone(),
            forward: self.forward.clone(),
            allowed: self.allowed.clone(),
            private: self.private.clone(),
            stop: self.stop.clone(),
            close: self.close.clone(),
        }
    }
}

async fn accept_loop(listener: tokio::net::TcpListener, mut ctx: Ctx, guard: Guard) {
    let v6 = listener.local_addr().map(|a| a.is_ipv6()).unwrap_or(false);
    let mut warned: Option<std::time::Instant> = None;
    let park = ctx.shared.lot.token();
    loop {
        if park.is_cancelled() {
            // A hand-over: the listener goes as it is, with the
            // connections waiting in its queue.
            match listener.into_std() {
                Ok(l) => ctx.shared.lot.park(Item::Listener(ctx.id(), l)),
                Err(e) => tracing::warn!(error = %e, "cannot hand a listener over"),
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
                // EMFILE and friends: note it, breathe, go on. At the fd
                // limit this repeats every 50 ms: one warning a minute.
                ctx.forward.error(format!("accept: {e}"));
                if warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                    warned = Some(std::time::Instant::now());
                    tracing::warn!(error = %e, "accept failed (repeats logged at debug for a minute)");
                } else {
                    tracing::debug!(error = %e, "accept failed");
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(50)) => continue,
                    _ = ctx.stop.wait_for(|s| *s) => break,
                }
            }
        };
        let ingress = sockopt::ingress_ifindex(&client, v6);
        if ctx.refuses(peer, client.local_addr().ok(), ingress) {
            Counters::inc(&ctx.forward.counters.refused);
            tracing::debug!(%peer, ?ingress, "refused a connection (private side, or not an allowed source)");
            let _ = socket2::SockRef::from(&client).set_linger(Some(Duration::ZERO));
            continue;
        }
        let Some(slot) = Slot::take(&ctx) else {
            Counters::inc(&ctx.forward.rejected);
            tracing::debug!(%peer, "the daemon's connection cap is reached: reset");
            let _ = socket2::SockRef::from(&client).set_linger(Some(Duration::ZERO));
            continue;
        };
        let c = ctx.clone_for();
        let g = ctx.shared.lot.guard();
        tokio::spawn(
            async move { connection(client, c, slot, g).await }
                .instrument(tracing::debug_span!("conn", %peer)),
        );
    }
    drop(listener);
    ctx.forward.set_listener("stopped");
}

/// A connection's place under the caps: counted in its forward's active
/// gauge and in the daemon's total until dropped, however the connection
/// ends.
struct Slot {
    forward: Arc<ForwardRuntime>,
    shared: Arc<Shared>,
}

impl Slot {
    /// A place for one more accepted connection, or `None` when the
    /// daemon's `--max-connections` is reached. (A forward's own
    /// `maxConnections` queues instead: [`crate::protect`].)
    fn take(ctx: &Ctx) -> Option<Slot> {
        let max = u64::from(ctx.shared.args.max_connections);
        let total = ctx.shared.connections.fetch_add(1, Ordering::AcqRel);
        if max > 0 && total >= max {
            ctx.shared.connections.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Counters::inc(&ctx.forward.counters.active);
        Some(Slot {
            forward: ctx.forward.clone(),
            shared: ctx.shared.clone(),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        Counters::dec(&self.forward.counters.active);
        self.shared.connections.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Resets both sockets of a relay that is dropped before it ended by
/// itself (its attachment stopped, the grace period of a SIGTERM ran out,
/// the task was aborted): the bytes still in its pipes are lost, and a
/// close(2) with a FIN would tell both peers the stream was whole.
///
/// Holds the raw descriptors, not the sockets (the relay owns those), so it
/// must be dropped before the relay and disarmed as soon as the relay ends
/// by itself (its sockets are closed then, and the numbers may be reused).
struct ResetUnlessDone {
    fds: [RawFd; 2],
    armed: bool,
}

impl ResetUnlessDone {
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for ResetUnlessDone {
    fn drop(&mut self) {
        if self.armed {
            for fd in self.fds {
                // Fails only on a socket that is unusable anyway.
                let _ = sockopt::linger_zero(fd);
            }
        }
    }
}

async fn connection(client: tokio::net::TcpStream, ctx: Ctx, slot: Slot, guard: Guard) {
    let f = &ctx.forward;
    let c = &f.counters;
    Counters::inc(&c.total);
    let reset = |client: &tokio::net::TcpStream| {
        let _ = socket2::SockRef::from(client).set_linger(Some(Duration::ZERO));
    };
    // A token of its own, cancelled with the daemon's: every wait of the
    // relay registers with it, and the daemon-wide one is not a lock all
    // connections of all workers contend for.
    let park = ctx.shared.lot.token().child_token();
    // Admission under `maxConnections` (first in, first out; the permit is
    // held until the relay ends), then the connect. A hand-over meanwhile
    // takes the client as it is: the next daemon does both again.
    let setup = tokio::select! {
        biased;
        () = park.cancelled() => None,
        r = admit_and_connect(&ctx, &client) => Some(r),
    };
    let Some(setup) = setup else {
        match client.into_std() {
            Ok(s) => ctx
                .shared
                .lot
                .park(Item::Conn(ctx.id(), ParkedConn::Pending(s))),
            Err(e) => tracing::debug!(error = %e, "cannot hand a waiting connection over"),
        }
        drop((slot, guard));
        return;
    };
    let (permit, upstream) = match setup {
        Setup::Go(permit, upstream) => (permit, upstream),
        Setup::Refused => return reset(&client),
        Setup::Left => return,
    };
    let cfg = relay_config(&ctx);
    let fds = [client.as_raw_fd(), upstream.as_raw_fd()];
    let pipes = ctx.shared.pipes.clone();
    let run = edgelink_relay::relay_tcp(client, upstream, &pipes, c, &cfg, &park);
    finish(
        &ctx,
        relay(run, fds, ctx.close.clone()).await,
        (slot, guard, permit),
    );
}

/// How admission and the connect ended.
enum Setup {
    Go(
        Option<tokio::sync::OwnedSemaphorePermit>,
        tokio::net::TcpStream,
    ),
    /// Queue timeout, full queue, or the target cannot be reached: the
    /// client is reset.
    Refused,
    /// The client left the queue.
    Left,
}

async fn admit_and_connect(ctx: &Ctx, client: &tokio::net::TcpStream) -> Setup {
    let f = &ctx.forward;
    let permit = match f.protection.admit(client).await {
        Admission::Go(p) => p,
        Admission::TimedOut => {
            tracing::debug!("waited longer than the queue timeout: reset");
            return Setup::Refused;
        }
        Admission::Full => {
            tracing::debug!("queue full: reset");
            return Setup::Refused;
        }
        Admission::Left => return Setup::Left,
    };
    // TCP_NODELAY: the client's comes from the listener, the upstream's
    // from the factory.
    match connect_with_header(ctx, client).await {
        Ok(s) => {
            f.reach(true, None);
            Setup::Go(permit, s)
        }
        Err(e) => {
            Counters::inc(&f.counters.connect_errors);
            f.error(format!("connect {}: {e}", target_name(f)));
            f.reach(false, Some(e.to_string()));
            tracing::debug!(error = %e, "connect to the target failed");
            // The client sees a reset at once, as if the target refused.
            Setup::Refused
        }
    }
}

fn relay_config(ctx: &Ctx) -> TcpRelayConfig {
    let args = &ctx.shared.args;
    TcpRelayConfig {
        pipe_size: args.pipe_size,
        bulk_lowat: args.bulk_lowat,
        set_nodelay: false,
        idle_timeout: ctx.forward.idle_timeout,
        keepalive: (!args.tcp_keepalive.is_zero()).then_some(args.tcp_keepalive),
        ..Default::default()
    }
}

/// A connection handed over to this daemon (or back to it).
async fn resumed(conn: ParkedConn, ctx: Ctx, slot: Slot, guard: Guard) {
    match conn {
        ParkedConn::Pending(s) => {
            let client = s
                .set_nonblocking(true)
                .and_then(|()| tokio::net::TcpStream::from_std(s));
            match client {
                Ok(client) => connection(client, ctx, slot, guard).await,
                Err(e) => tracing::debug!(error = %e, "a handed-over connection is unusable"),
            }
        }
        ParkedConn::Relaying(p) => {
            // Its place under `maxConnections`, if there is one free; it is
            // relayed either way (its target holds it already).
            let permit = ctx.forward.protection.try_take();
            let cfg = relay_config(&ctx);
            let fds = [p.client.as_raw_fd(), p.upstream.as_raw_fd()];
            let park = ctx.shared.lot.token().child_token();
            let pipes = ctx.shared.pipes.clone();
            let c = &ctx.forward.counters;
            let run = edgelink_relay::resume_tcp(p, &pipes, c, &cfg, &park);
            finish(
                &ctx,
                relay(run, fds, ctx.close.clone()).await,
                (slot, guard, permit),
            );
        }
    }
}

/// After the relay: count how it ended, or park it.
fn finish(
    ctx: &Ctx,
    r: Option<Relayed>,
    held: (Slot, Guard, Option<tokio::sync::OwnedSemaphorePermit>),
) {
    let c = &ctx.forward.counters;
    match r {
        Some(Relayed::Ended(Ok(()))) => {}
        // Reset on both legs and counted in `idle_timeouts` by the relay.
        Some(Relayed::Ended(Err(e))) if e.kind() == std::io::ErrorKind::TimedOut => {
            tracing::debug!(error = %e, "connection idle for too long: reset");
        }
        Some(Relayed::Ended(Err(e))) => {
            Counters::inc(&c.errors);
            tracing::debug!(error = %e, "connection ended with an error");
        }
        Some(Relayed::Parked(p)) => {
            ctx.shared
                .lot
                .park(Item::Conn(ctx.id(), ParkedConn::Relaying(p)));
        }
        None => tracing::debug!("attachment stopped: connection reset"),
    }
    // The guard last: a hand-over waits for it, and the item is in the lot.
    let (slot, guard, permit) = held;
    drop((slot, permit));
    drop(guard);
}

/// Run a relay until it ends or parks (`Some`), or until `close` is set
/// (`None`): the attachment is gone (DEL, netns gone, record changed) or
/// the grace period of a SIGTERM is over, and its connections end with
/// it, so that nothing keeps the pod's namespace alive. Ended that way, or
/// dropped (the task aborted), both sockets (`fds`) are reset: bytes in
/// flight are lost.
async fn relay(
    run: impl std::future::Future<Output = Relayed>,
    fds: [RawFd; 2],
    mut close: watch::Receiver<bool>,
) -> Option<Relayed> {
    tokio::pin!(run);
    // Declared after `run`: dropped before it, while its sockets are
    // still open (also when this future is dropped unfinished).
    let mut reset = ResetUnlessDone { fds, armed: true };
    tokio::select! {
        r = &mut run => {
            // Ended by itself (its sockets are closed, reset already on an
            // error) or parked (they are handed on): the descriptors must
            // not be touched again.
            reset.disarm();
            Some(r)
        }
        _ = close.wait_for(|c| *c) => None,
    }
}

/// Connect, and after a failure (timeout, refusal, no route while the
/// device restarts) try again `connectRetries` times with a doubling wait.
/// Successful connects are timed in the forward's latency histogram.
///
/// A reverse forward's target is asked for again before each try: a name
/// whose address failed is looked up again meanwhile.
async fn connect_retrying(ctx: &Ctx) -> std::io::Result<tokio::net::TcpStream> {
    let p = &ctx.forward.protection;
    let mut close = ctx.close.clone();
    let mut tried = 0;
    loop {
        let started = std::time::Instant::now();
        let attempt = match ctx.target().await {
            Ok(target) => connect(ctx, target).await.inspect_err(|_| {
                if let Some(r) = &ctx.forward.reverse {
                    r.connect_failed();
                }
            }),
            Err(e) => Err(e),
        };
        match attempt {
            Ok(s) => {
                p.latency.observe(started.elapsed());
                return Ok(s);
            }
            Err(e) if tried < p.limits.connect_retries => {
                let wait = p.limits.backoff(tried);
                tried += 1;
                Counters::inc(&p.retries);
                tracing::debug!(error = %e, retry = tried, ?wait, "connect failed: trying again");
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    // The attachment is gone: no point in waiting.
                    _ = close.wait_for(|c| *c) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    }
}

async fn connect(ctx: &Ctx, target: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
    let sock = ctx.factory.tcp(target.is_ipv6()).await?;
    let std: std::net::TcpStream = sock.into();
    let sock = tokio::net::TcpSocket::from_std_stream(std);
    let timeout = Duration::from_millis(ctx.forward.spec.connect_timeout_ms);
    match tokio::time::timeout(timeout, sock.connect(target)).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {timeout:?}"),
        )),
    }
}

/// [`connect`], then the forward's PROXY protocol header, if it has one,
/// written whole before any byte of the client and within the connect
/// timeout again: a target that does not take it fails as a connect does.
/// (The connect itself is retried: [`connect_retrying`].)
/// The header names the client's address and the one it dialed (the pod's,
/// the forward's port); it is not the client's, so not in `bytes_to_target`.
async fn connect_with_header(
    ctx: &Ctx,
    client: &tokio::net::TcpStream,
) -> std::io::Result<tokio::net::TcpStream> {
    use edgelink_relay::proxy_header::{self, Version};
    let mut upstream = connect_retrying(ctx).await?;
    let version = match ctx.forward.spec.proxy_protocol {
        None => return Ok(upstream),
        Some(edgelink_attachment::ProxyProtocol::V1) => Version::V1,
        Some(edgelink_attachment::ProxyProtocol::V2) => Version::V2,
    };
    let header = proxy_header::build(version, client.peer_addr()?, client.local_addr()?)?;
    let timeout = Duration::from_millis(ctx.forward.spec.connect_timeout_ms);
    let write = tokio::io::AsyncWriteExt::write_all(&mut upstream, &header);
    match tokio::time::timeout(timeout, write).await {
        Ok(Ok(())) => Ok(upstream),
        Ok(Err(e)) => Err(std::io::Error::new(
            e.kind(),
            format!("PROXY protocol header: {e}"),
        )),
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("PROXY protocol header not taken within {timeout:?}"),
        )),
    }
}

/// The target as the status names it: a reverse forward's as configured
/// (a name, maybe).
fn target_name(f: &ForwardRuntime) -> String {
    match &f.reverse {
        Some(r) => r.spec.target.to_string(),
        None => f.spec.target.to_string(),
    }
}

/// Keep `reachability` fresh for forwards nobody uses right now.
async fn probe_loop(mut ctx: Ctx) {
    let every = ctx.shared.args.probe_interval;
    loop {
        let recent = {
            let s = ctx.forward.lock();
            crate::model::now().saturating_sub(s.reachability.checked_at) < every.as_secs()
        };
        if !recent {
            let probe = match ctx.target().await {
                Ok(target) => connect(&ctx, target).await,
                Err(e) => Err(e),
            };
            match probe {
                Ok(s) => {
                    drop(s);
                    ctx.forward.reach(true, None);
                }
                Err(e) => ctx.forward.reach(false, Some(e.to_string())),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = ctx.stop.wait_for(|s| *s) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// A connected pair over loopback: (the relay's end, the peer's end).
    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (ours, _) = l.accept().await.unwrap();
        (ours, peer)
    }

    /// How a read on `s` ends: `Ok(bytes)` at end of file, or the error.
    async fn read_end(s: &mut TcpStream) -> std::io::Result<usize> {
        let mut buf = vec![0u8; 1 << 16];
        let mut n = 0;
        loop {
            match tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await {
                Ok(Ok(0)) => return Ok(n),
                Ok(Ok(k)) => n += k,
                Ok(Err(e)) => return Err(e),
                Err(_) => panic!("no end within 10 s"),
            }
        }
    }

    /// [`relay`] of a fresh relay that nobody parks.
    async fn run_relay(
        client: TcpStream,
        upstream: TcpStream,
        pipes: &PipePool,
        counters: &Counters,
        cfg: &TcpRelayConfig,
        close: watch::Receiver<bool>,
    ) -> Option<Relayed> {
        let fds = [client.as_raw_fd(), upstream.as_raw_fd()];
        let park = tokio_util::sync::CancellationToken::new();
        let run = edgelink_relay::relay_tcp(client, upstream, pipes, counters, cfg, &park);
        relay(run, fds, close).await
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_relay_aborted_or_closed_resets_both_peers() {
        runtime().block_on(async {
            let pipes = PipePool::new(1 << 16, 4);
            let cfg = TcpRelayConfig::default();
            for abort in [true, false] {
                let (client, mut client_peer) = pair().await;
                let (upstream, mut upstream_peer) = pair().await;
                let (close_tx, close) = watch::channel(false);
                let p = pipes.clone();
                let c = cfg.clone();
                let task = tokio::spawn(async move {
                    let counters = Counters::default();
                    run_relay(client, upstream, &p, &counters, &c, close).await
                });
                // Bytes in flight, and proof that the relay runs.
                upstream_peer.write_all(b"partial").await.unwrap();
                let mut got = [0u8; 7];
                client_peer.read_exact(&mut got).await.unwrap();
                if abort {
                    task.abort();
                    assert!(task.await.unwrap_err().is_cancelled());
                } else {
                    close_tx.send(true).unwrap();
                    assert!(task.await.unwrap().is_none());
                }
                for peer in [&mut client_peer, &mut upstream_peer] {
                    let end = read_end(peer).await;
                    assert_eq!(
                        end.as_ref().map_err(std::io::Error::kind).err(),
                        Some(std::io::ErrorKind::ConnectionReset),
                        "abort={abort}: {end:?}"
                    );
                }
            }
        });
    }

    #[test]
    fn a_relay_that_ends_by_itself_ends_cleanly() {
        runtime().block_on(async {
            let pipes = PipePool::new(1 << 16, 4);
            let (client, mut client_peer) = pair().await;
            let (upstream, mut upstream_peer) = pair().await;
            let (_close_tx, close) = watch::channel(false);
            let p = pipes.clone();
            let task = tokio::spawn(async move {
                let counters = Counters::default();
                run_relay(
                    client,
                    upstream,
                    &p,
                    &counters,
                    &TcpRelayConfig::default(),
                    close,
                )
                .await
            });
            upstream_peer.write_all(b"whole").await.unwrap();
            upstream_peer.shutdown().await.unwrap();
            assert_eq!(read_end(&mut client_peer).await.unwrap(), 5);
            client_peer.shutdown().await.unwrap();
            assert_eq!(read_end(&mut upstream_peer).await.unwrap(), 0);
            assert!(matches!(task.await.unwrap(), Some(Relayed::Ended(Ok(())))));
        });
    }
}
