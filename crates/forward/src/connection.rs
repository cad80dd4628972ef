//! One relayed TCP connection: its place under the caps, the admission
//! under `maxConnections`, the connect towards the device (retried, timed,
//! with the PROXY protocol header) and the relay itself (how it ends:
//! `ending.rs`).

use crate::clients::{self, Rechecked};
use crate::ctx::{target_name, Ctx, Ends, Shared};
use crate::cutoff::Cut;
use crate::ending::{finish, relay};
use crate::protect::{Admission, Place, Protection, Turn};
use crate::runtime::ForwardRuntime;
use crate::sockopt;
use edgelink_access::Ended;
use edgelink_handover::lot::{Guard, Item, ParkedConn, Pending};
use edgelink_relay::{relay_tcp, Counters, Relayed, Tally};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a connection comes to its place under `maxConnections`.
pub enum Entry {
    /// Accepted just now: it queues if need be.
    Accepted,
    /// Handed over: its turn, taken in order, and since when it waits.
    Handed(Turn, Instant),
}

impl Entry {
    /// The turn, and since when it waits.
    pub fn turn(self, p: &Protection) -> (Turn, Instant) {
        match self {
            Entry::Accepted => {
                let now = Instant::now();
                (p.enqueue(now), now)
            }
            Entry::Handed(t, since) => (t, since),
        }
    }
}

/// A connection's place under the caps: counted in its forward's active
/// gauge and in the daemon's total until dropped, however the connection
/// ends.
pub(crate) struct Slot {
    forward: Arc<ForwardRuntime>,
    shared: Arc<Shared>,
}

impl Slot {
    /// A place for one more accepted connection, or `None` when the
    /// daemon's `--max-connections` is reached. (A forward's own
    /// `maxConnections` queues instead: [`crate::protect`].)
    pub(crate) fn take(ctx: &Ctx) -> Option<Slot> {
        let max = u64::from(ctx.shared.settings.max_connections);
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

/// Serve an accepted client: `ends` are its addresses as they were at
/// accept (its PROXY protocol header names them); `entry` how it comes to
/// its place under `maxConnections`.
///
/// Two futures one after the other ([`setup`], then [`Relay::run`]), not
/// one `async fn`: the task holds the larger of the two, not both, and
/// this is every relayed connection's task (an idle one's too).
pub(crate) fn connection(
    client: tokio::net::TcpStream,
    ends: Ends,
    ctx: Arc<Ctx>,
    slot: Slot,
    guard: Guard,
    entry: Entry,
) -> impl std::future::Future<Output = ()> + Send {
    use futures_util::future::{Either, FutureExt};
    setup(client, ends, ctx, slot, guard, entry).then(|next| match next {
        Some(relay) => Either::Left(relay.run()),
        None => Either::Right(std::future::ready(())),
    })
}

/// A connection admitted and connected: what its relay needs.
struct Relay {
    ctx: Arc<Ctx>,
    client: tokio::net::TcpStream,
    upstream: tokio::net::TcpStream,
    held: (Slot, Guard, Option<Place>),
    park: tokio_util::sync::CancellationToken,
    handed: bool,
    /// The client's address at accept, and when it came
    /// ([`clients::now_ms`]): for its audit line.
    peer: std::net::IpAddr,
    since: u64,
}

/// Admission under `maxConnections`, then the connect: the relay to run,
/// or `None` when the connection ended here (refused, left, handed over).
// Not an `async fn`: it would keep its arguments twice (rust-lang/rust#62958).
#[allow(clippy::manual_async_fn)]
fn setup(
    client: tokio::net::TcpStream,
    ends: Ends,
    ctx: Arc<Ctx>,
    slot: Slot,
    guard: Guard,
    entry: Entry,
) -> impl std::future::Future<Output = Option<Relay>> + Send {
    async move {
        let f = &ctx.forward;
        Counters::inc(&f.counters.total);
        // A token of its own, cancelled by a hand-over or the attachment's
        // close (cutoff.rs): every wait of the relay registers with it, and
        // the daemon-wide one is not a lock all connections contend for.
        let mut park = ctx.cutoff.token(&ctx.shared.lot);
        // Admission under `maxConnections` (first in, first out; the place is
        // held until the relay ends), then the connect. A hand-over meanwhile
        // takes the client as it is, with its place or its wait: the next
        // daemon connects it, or queues it again in its turn. The attachment
        // gone meanwhile: reset, the target never dialed.
        // A connection handed over while it waited was accepted by the daemon
        // before, whose listener may not have carried the relay's options.
        let handed = matches!(entry, Entry::Handed(..));
        let (turn, since) = entry.turn(&f.protection);
        let started = clients::now_ms();
        let mut admitted = false;
        // Boxed: the wait for a place and the connect (1.3 KiB) would
        // otherwise stay in the future of every relayed connection.
        let mut work = Box::pin(admit_and_connect(&ctx, &client, ends, turn, &mut admitted));
        let setup = loop {
            tokio::select! {
                biased;
                () = park.cancelled() => match ctx.cutoff.why(&ctx.shared.lot) {
                    Cut::Closed => break Some(Setup::Refused(Ended::Reset)),
                    Cut::HandOver => break None,
                    // The access rules changed: a client still let through
                    // waits on, with a fresh token.
                    Cut::Revoked => match clients::still_admits(&ctx, ends.peer) {
                        Ok(()) => park = ctx.cutoff.token(&ctx.shared.lot),
                        Err(e) => break Some(Setup::Refused(e)),
                    },
                },
                r = &mut work => break Some(r),
            }
        };
        drop(work);
        let Some(setup) = setup else {
            park_pending(&ctx, client, (!admitted).then_some(since));
            drop((slot, guard));
            return None;
        };
        match setup {
            Setup::Go(permit, upstream) => Some(Relay {
                ctx,
                client,
                upstream,
                held: (slot, guard, permit),
                park,
                handed,
                peer: ends.peer.ip(),
                since: started,
            }),
            Setup::Refused(ended) => {
                let _ = socket2::SockRef::from(&client).set_linger(Some(Duration::ZERO));
                clients::audit(&ctx, ends.peer.ip(), started, (0, 0), ended);
                None
            }
            Setup::Left => None,
        }
    }
}

impl Relay {
    /// Relay until the connection ends, is parked for a hand-over, or its
    /// attachment goes (both legs reset).
    #[allow(clippy::manual_async_fn)] // See `setup`.
    fn run(self) -> impl std::future::Future<Output = ()> + Send {
        // The fields are used where they lie: moved into locals, they would
        // take their room twice in this future.
        async move {
            let cfg = self.ctx.relay_config(!self.handed);
            let fds = [self.client.as_raw_fd(), self.upstream.as_raw_fd()];
            let (c, pipes) = (&self.ctx.forward.counters, &self.ctx.shared.pipes);
            let tally = Tally::default();
            let audited = self.ctx.shared.audit.is_on().then_some(&tally);
            let run = relay_tcp(
                self.client,
                self.upstream,
                pipes,
                c,
                cfg,
                &self.park,
                audited,
            );
            let r = relay(std::pin::pin!(run), fds, &self.ctx.cutoff).await;
            let r = settle(&self.ctx, r, &tally, self.peer, self.since).await;
            let (slot, guard, permit) = self.held;
            finish(&self.ctx, r, (slot, permit), guard);
        }
    }
}

/// After a relay: one stopped for the access rules' change goes on (or
/// is reset), and the connection's audit line is written; what is left
/// for [`finish`].
pub(crate) async fn settle(
    ctx: &Ctx,
    r: Option<Relayed>,
    tally: &Tally,
    peer: std::net::IpAddr,
    since: u64,
) -> Option<Relayed> {
    let revoked =
        matches!(r, Some(Relayed::Parked(_))) && ctx.cutoff.why(&ctx.shared.lot) == Cut::Revoked;
    let (r, ended) = match r {
        Some(Relayed::Parked(p)) if revoked => {
            // Boxed: only a connection that lives through a change of the
            // rules holds this.
            match Box::pin(clients::go_on(ctx, p, tally)).await {
                Rechecked::Relayed(r) => {
                    let e = clients::ended(&r);
                    (r, e)
                }
                Rechecked::Cut(e) => (None, Some(e)),
            }
        }
        r => {
            let e = clients::ended(&r);
            (r, e)
        }
    };
    if let Some(e) = ended {
        clients::audit(ctx, peer, since, tally.get(), e);
    }
    r
}

/// A client that waited for its place or its connect, handed over as it
/// is: the next daemon connects it, or queues it again in its turn.
fn park_pending(ctx: &Ctx, client: tokio::net::TcpStream, queued_since: Option<Instant>) {
    match client.into_std() {
        Ok(client) => ctx.shared.lot.park(Item::Conn(
            ctx.id(),
            ParkedConn::Pending(Pending {
                client,
                queued_since,
            }),
        )),
        Err(e) => tracing::debug!(error = %e, "cannot hand a waiting connection over"),
    }
}

/// How admission and the connect ended.
enum Setup {
    Go(Option<Place>, tokio::net::TcpStream),
    /// Waited too long for the lease or a place, full queue, refused
    /// after its wait, or the target cannot be reached: the client is
    /// reset.
    Refused(Ended),
    /// The client reset while it waited for a place or for the connect.
    Left,
}

async fn admit_and_connect(
    ctx: &Ctx,
    client: &tokio::net::TcpStream,
    ends: Ends,
    turn: Turn,
    admitted: &mut bool,
) -> Setup {
    let f = &ctx.forward;
    if clients::waits(ctx, ends.peer.ip()) {
        match clients::wait_turn(ctx, client, ends.peer).await {
            Ok(()) => {}
            Err(Some(e)) => return Setup::Refused(e),
            Err(None) => return Setup::Left,
        }
    }
    let permit = match f.protection.wait(turn, client).await {
        Admission::Go(p) => p,
        Admission::TimedOut => {
            tracing::debug!("waited longer than the queue timeout: reset");
            return Setup::Refused(Ended::QueueTimeout);
        }
        Admission::Full => {
            tracing::debug!("queue full: reset");
            return Setup::Refused(Ended::Reset);
        }
        Admission::Left => return Setup::Left,
    };
    *admitted = true;
    // TCP_NODELAY: the client's comes from the listener, the upstream's
    // from the factory.
    // A client that resets meanwhile ends it: its own failure, nothing
    // counted against the device.
    let connected = tokio::select! {
        r = connect_with_header(ctx, ends) => r,
        () = crate::protect::reset_by_peer(client) => {
            tracing::debug!("the client reset during the connect");
            return Setup::Left;
        }
    };
    match connected {
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
            Setup::Refused(Ended::ConnectFailed)
        }
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

pub(crate) async fn connect(
    ctx: &Ctx,
    target: SocketAddr,
) -> std::io::Result<tokio::net::TcpStream> {
    let timeout = Duration::from_millis(ctx.forward.spec.connect_timeout_ms);
    let make = || ctx.factory.tcp(target.is_ipv6());
    let sock = edgelink_fd_reserve::outside_a_lease(&ctx.shared.fds, timeout, make).await?;
    sockopt::cap_buffers(&sock, ctx.shared.settings.socket_buffer);
    let sock = tokio::net::TcpSocket::from_std_stream(sock.into());
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
/// the forward's port) as they were at accept, so that a client gone since
/// makes no failure of the target's; it is not the client's bytes, so not
/// in `bytes_to_target`.
async fn connect_with_header(ctx: &Ctx, ends: Ends) -> std::io::Result<tokio::net::TcpStream> {
    use edgelink_relay::proxy_header::{self, Version};
    let mut upstream = connect_retrying(ctx).await?;
    let version = match ctx.forward.spec.proxy_protocol {
        None => return Ok(upstream),
        Some(edgelink_attachment::ProxyProtocol::V1) => Version::V1,
        Some(edgelink_attachment::ProxyProtocol::V2) => Version::V2,
    };
    let header = proxy_header::build(version, ends.peer, ends.local)?;
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
