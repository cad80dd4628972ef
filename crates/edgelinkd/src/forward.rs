//! Serving one forward: its listener(s) inside the pod's namespace, the
//! accept loop, the connect towards the device, and the relay.

use crate::daemon::Daemon;
use crate::factory::Factory;
use crate::model::ForwardRuntime;
use crate::sockopt;
use edgelink_attachment::{Protocol, Record};
use edgelink_relay::{Counters, TcpRelayConfig, UdpConfig};
use ipnetwork::IpNetwork;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument;

/// Tells connections that come from the private side (through the
/// edgelink interface itself) from those of the cluster.
#[derive(Clone, Debug)]
pub struct PrivateSide {
    /// Index of the edgelink interface in the pod.
    ifindex: Option<u32>,
    /// Its addresses and subnets.
    nets: Vec<IpNetwork>,
}

impl PrivateSide {
    pub fn new(rec: &Record, ifindex: Option<u32>) -> PrivateSide {
        PrivateSide {
            ifindex,
            nets: rec.interface.ips.clone(),
        }
    }

    /// A device must not use the relay to reach into the cluster: refuse
    /// what arrived on the edgelink interface, what was addressed to it, and
    /// what comes from its segment.
    pub fn refuses(
        &self,
        peer: SocketAddr,
        local: Option<SocketAddr>,
        ingress: Option<u32>,
    ) -> bool {
        if ingress.is_some() && ingress == self.ifindex {
            return true;
        }
        let peer_ip = canonical(peer.ip());
        self.nets
            .iter()
            .any(|n| n.contains(peer_ip) || local.is_some_and(|l| canonical(l.ip()) == n.ip()))
    }
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

pub struct Ctx {
    pub daemon: Arc<Daemon>,
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
    // The daemon checks allowedTargets again: the record is a file on disk.
    if !spec.target_allowed(&ctx.allowed) {
        f.set_listener("refused");
        f.error(format!(
            "target {} is outside allowedTargets {:?}",
            spec.target, ctx.allowed
        ));
        tracing::warn!(forward = %spec.name, target = %spec.target, "target outside allowedTargets: not serving");
        return Vec::new();
    }
    let mut addrs = vec![SocketAddr::new(
        IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        spec.port,
    )];
    // Also on IPv6, so clients of a dual-stack cluster reach an IPv4
    // device too; a pod without IPv6 simply has no such listener.
    addrs.push(SocketAddr::new(
        IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        spec.port,
    ));
    let mut tasks = Vec::new();
    // The IPv4 listener is required (and the IPv6 one for an IPv6 target):
    // a forward half up is reported failed, so it is retried.
    let mut required_failed = false;
    for addr in addrs {
        let stream = spec.protocol == Protocol::Tcp;
        let sock = match ctx.factory.listener(addr, stream).await {
            Ok(s) => s,
            Err(e) if addr.is_ipv6() && !spec.target.is_ipv6() => {
                tracing::debug!(forward = %spec.name, %addr, error = %e, "no IPv6 listener");
                continue;
            }
            Err(e) => {
                f.error(format!("cannot listen on {addr}/{}: {e}", spec.protocol));
                tracing::warn!(forward = %spec.name, %addr, error = %e, "listener failed");
                required_failed = true;
                continue;
            }
        };
        let span = tracing::info_span!("forward", name = %spec.name, port = spec.port, target = %spec.target);
        let task = match spec.protocol {
            Protocol::Tcp => {
                let std: std::net::TcpListener = sock.into();
                match tokio::net::TcpListener::from_std(std) {
                    Ok(l) => tokio::spawn(accept_loop(l, ctx.clone_for()).instrument(span)),
                    Err(e) => {
                        f.error(e);
                        required_failed = true;
                        continue;
                    }
                }
            }
            Protocol::Udp => {
                let cfg = UdpConfig {
                    idle_timeout: ctx.daemon.args.udp_idle_timeout,
                    max_sessions: ctx.daemon.args.udp_max_sessions as usize,
                    gso: ctx.daemon.args.udp_gso,
                    ..Default::default()
                };
                let private = ctx.private.clone();
                let refuse: Arc<edgelink_relay::RefuseFn> =
                    Arc::new(move |peer, ifindex| private.refuses(peer, None, ifindex));
                let mut stop = ctx.stop.clone();
                let fr = f.clone();
                let source: Arc<dyn edgelink_relay::SocketSource> = ctx.factory.clone();
                let target = spec.target;
                let counters = f.counters.clone();
                tokio::spawn(
                    async move {
                        let shutdown = async move {
                            let _ = stop.wait_for(|s| *s).await;
                        };
                        if let Err(e) = edgelink_relay::serve_udp(
                            sock.into(),
                            target,
                            source,
                            cfg,
                            counters,
                            refuse,
                            shutdown,
                        )
                        .await
                        {
                            tracing::warn!(error = %e, "UDP relay stopped");
                            fr.error(e);
                            fr.set_listener("failed");
                        } else {
                            fr.set_listener("stopped");
                        }
                    }
                    .instrument(span),
                )
            }
        };
        tasks.push(task);
    }
    if !required_failed && !tasks.is_empty() {
        f.set_listener("listening");
        if spec.protocol == Protocol::Tcp && !ctx.daemon.args.probe_interval.is_zero() {
            tasks.push(tokio::spawn(probe_loop(ctx.clone_for())));
        }
    } else {
        f.set_listener("failed");
    }
    tasks
}

impl Ctx {
    fn clone_for(&self) -> Ctx {
        Ctx {
            daemon: self.daemon.clone(),
            factory: self.factory.clone(),
            forward: self.forward.clone(),
            allowed: self.allowed.clone(),
            private: self.private.clone(),
            stop: self.stop.clone(),
            close: self.close.clone(),
        }
    }
}

async fn accept_loop(listener: tokio::net::TcpListener, mut ctx: Ctx) {
    let v6 = listener.local_addr().map(|a| a.is_ipv6()).unwrap_or(false);
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = ctx.stop.wait_for(|s| *s) => break,
        };
        let (client, peer) = match accepted {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and friends: note it, breathe, go on.
                ctx.forward.error(format!("accept: {e}"));
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let ingress = sockopt::ingress_ifindex(&client, v6);
        if ctx.private.refuses(peer, client.local_addr().ok(), ingress) {
            Counters::inc(&ctx.forward.counters.refused);
            tracing::debug!(%peer, ?ingress, "refused a connection from the private side");
            let _ = socket2::SockRef::from(&client).set_linger(Some(Duration::ZERO));
            continue;
        }
        let c = ctx.clone_for();
        tokio::spawn(
            async move { connection(client, c).await }
                .instrument(tracing::debug_span!("conn", %peer)),
        );
    }
    drop(listener);
    ctx.forward.set_listener("stopped");
}

/// Decrements the active gauge however the connection ends.
struct Active<'a>(&'a Counters);
impl Drop for Active<'_> {
    fn drop(&mut self) {
        Counters::dec(&self.0.active);
    }
}

async fn connection(client: tokio::net::TcpStream, ctx: Ctx) {
    let f = &ctx.forward;
    let c = &f.counters;
    Counters::inc(&c.total);
    Counters::inc(&c.active);
    let _active = Active(c);
    // TCP_NODELAY: the client's comes from the listener, the upstream's
    // from the factory.
    let target = f.spec.target;
    let upstream = match connect(&ctx, target).await {
        Ok(s) => {
            f.reach(true, None);
            s
        }
        Err(e) => {
            Counters::inc(&c.connect_errors);
            f.error(format!("connect {target}: {e}"));
            f.reach(false, Some(e.to_string()));
            tracing::debug!(error = %e, "connect to the target failed");
            // The client sees a reset at once, as if the target refused.
            let _ = socket2::SockRef::from(&client).set_linger(Some(Duration::ZERO));
            return;
        }
    };
    let cfg = TcpRelayConfig {
        pipe_size: ctx.daemon.args.pipe_size,
        bulk_lowat: ctx.daemon.args.bulk_lowat,
        set_nodelay: false,
        ..Default::default()
    };
    let mut close = ctx.close.clone();
    tokio::select! {
        r = edgelink_relay::splice_duplex(client, upstream, &ctx.daemon.pipes, c, &cfg) => {
            if let Err(e) = r {
                Counters::inc(&c.errors);
                tracing::debug!(error = %e, "connection ended with an error");
            }
        }
        // The attachment is gone (DEL, netns gone, record changed): its
        // connections end with it, so that nothing keeps the pod's
        // namespace alive.
        _ = close.wait_for(|c| *c) => tracing::debug!("attachment stopped: connection closed"),
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

/// Keep `reachability` fresh for forwards nobody uses right now.
async fn probe_loop(mut ctx: Ctx) {
    let every = ctx.daemon.args.probe_interval;
    loop {
        let recent = {
            let s = ctx.forward.lock();
            crate::model::now().saturating_sub(s.reachability.checked_at) < every.as_secs()
        };
        if !recent {
            match connect(&ctx, ctx.forward.spec.target).await {
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
