//! Sockets made inside a pod's network namespace.
//!
//! setns(2) switches only the calling thread, and a tokio worker must never
//! be switched. So every attachment gets one small OS thread that enters the
//! pod's namespace once and then makes sockets on request: listeners for the
//! forwards, and upstream sockets towards the devices. A socket stays in the
//! namespace it was created in whichever thread uses it afterwards, so tokio
//! drives them all from its workers in the node namespace.
//!
//! Upstream TCP sockets, one per relayed connection, are the exception:
//! the worker that needs one enters the namespace for the socket(2) call
//! and its options and leaves it at once ([`Netns::run_here`]: two
//! setns(2), ~2.5 µs), instead of a round trip to the thread (two
//! cross-thread wakes, ~10 µs of CPU per connection). They can also be
//! kept in a small ready pool refilled by the thread (`--socket-pool`;
//! docs/architecture.md has the measurements behind both).

use edgelink_netns::Netns;
use edgelink_relay::SocketSource;
use futures_util::future::BoxFuture;
use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

enum Request {
    Tcp(Domain, oneshot::Sender<io::Result<Socket>>),
    Udp(Domain, oneshot::Sender<io::Result<Socket>>),
    /// A listener: its address, TCP or not, and whether it may bind an
    /// address the namespace does not have yet (IP_FREEBIND: a virtual
    /// address, present only while the pod holds it).
    Listener(SocketAddr, bool, bool, oneshot::Sender<io::Result<Socket>>),
    /// Work of the namespace's own (a virtual address added, announced).
    Run(Box<dyn FnOnce() + Send>),
    IfIndex(String, oneshot::Sender<io::Result<u32>>),
    /// Any socket (the health probes': TCP, UDP, ICMP datagram or raw).
    Socket(Domain, Type, Protocol, oneshot::Sender<io::Result<Socket>>),
    Refill,
}

/// The socket maker of one network namespace.
pub struct Factory {
    tx: Mutex<mpsc::Sender<Request>>,
    /// The namespace, for the upstream sockets the workers make there.
    netns: Netns,
    /// Ready upstream TCP sockets, IPv4 and IPv6.
    pool4: Mutex<Vec<Socket>>,
    pool6: Mutex<Vec<Socket>>,
    pool_size: usize,
    /// Upstream sockets handed out from the pool (the daemon's, for /metrics).
    pool_taken: Arc<AtomicU64>,
    /// `--tcp-keepalive`, set on every upstream socket when it is made.
    keepalive: Option<Duration>,
}

/// An upstream TCP socket with what the relay wants of it set here, off
/// the connection's path (TCP_NODELAY, SO_OOBINLINE, the keepalive):
/// the relay is told so (`TcpRelayConfig::prepared`).
fn tcp_socket(domain: Domain, keepalive: Option<Duration>) -> io::Result<Socket> {
    let s = Socket::new(
        domain,
        Type::STREAM.nonblocking().cloexec(),
        Some(Protocol::TCP),
    )?;
    s.set_tcp_nodelay(true)?;
    edgelink_relay::prepare_socket(&s, keepalive)?;
    Ok(s)
}

/// Receive buffers of UDP sockets: a session's replies, and a listener's
/// requests from all its clients.
const UDP_SESSION_RCVBUF: usize = 1 << 20;
const UDP_LISTENER_RCVBUF: usize = 4 << 20;

fn udp_socket(domain: Domain) -> io::Result<Socket> {
    let s = Socket::new(
        domain,
        Type::DGRAM.nonblocking().cloexec(),
        Some(Protocol::UDP),
    )?;
    crate::sockopt::grow_rcvbuf(&s, UDP_SESSION_RCVBUF);
    Ok(s)
}

fn listener(addr: SocketAddr, stream: bool, freebind: bool) -> io::Result<Socket> {
    let domain = Domain::for_address(addr);
    let s = if stream {
        Socket::new(
            domain,
            Type::STREAM.nonblocking().cloexec(),
            Some(Protocol::TCP),
        )?
    } else {
        Socket::new(
            domain,
            Type::DGRAM.nonblocking().cloexec(),
            Some(Protocol::UDP),
        )?
    };
    // One socket per address and forward, never SO_REUSEPORT: the kernel
    // lets any socket of the same uid join a reuseport group, and in a pod
    // without a user namespace uid 0 is the daemon's, so a root process of
    // the pod (no capability needed) would take a share of the
    // connections. Without it, its bind fails: the port is ours
    // (listen.rs shares the one listener among the workers).
    // SO_REUSEADDR only for TCP (rebinding beside the TIME_WAITs of the
    // last daemon's connections); a listening TCP socket still refuses any
    // other bind of its port. Two UDP sockets with it may share a port,
    // and a stranger's on the pod's address would take the datagrams.
    if stream {
        s.set_reuse_address(true)?;
    }
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    if freebind {
        if addr.is_ipv6() {
            s.set_freebind_v6(true)?;
        } else {
            s.set_freebind_v4(true)?;
        }
    }
    // The ingress interface of each accepted connection (IP_PKTOPTIONS) and
    // of each datagram (IP_PKTINFO) tells the private side apart: on before
    // bind, so that nothing arrives without it.
    crate::sockopt::enable_pktinfo(&s, addr.is_ipv6())?;
    if stream {
        // Accepted sockets inherit TCP_NODELAY: no setsockopt per connection.
        s.set_tcp_nodelay(true)?;
        s.bind(&addr.into())?;
        s.listen(1024)?;
    } else {
        crate::sockopt::grow_rcvbuf(&s, UDP_LISTENER_RCVBUF);
        s.bind(&addr.into())?;
    }
    Ok(s)
}

impl Factory {
    /// Start the thread inside `netns`. Fails if the namespace cannot be
    /// entered. Every socket taken from the ready pool counts in
    /// `pool_taken`; every upstream socket gets `keepalive`
    /// (`--tcp-keepalive`).
    pub fn start(
        netns: Netns,
        pool_size: usize,
        pool_taken: Arc<AtomicU64>,
        keepalive: Option<Duration>,
    ) -> io::Result<Arc<Factory>> {
        let (tx, rx) = mpsc::channel::<Request>();
        let (ready_tx, ready_rx) = mpsc::channel::<io::Result<()>>();
        let here = netns.try_clone().map_err(io::Error::other)?;
        let f = Arc::new(Factory {
            tx: Mutex::new(tx),
            netns: here,
            pool4: Mutex::new(Vec::new()),
            pool6: Mutex::new(Vec::new()),
            pool_size,
            pool_taken,
            keepalive,
        });
        let weak = Arc::downgrade(&f);
        let name = format!(
            "netns:{}",
            netns
                .path()
                .file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default()
        );
        std::thread::Builder::new()
            .name(name.chars().take(15).collect())
            .spawn(move || {
                // The thread ends with the channel: its namespace never leaks.
                if let Err(e) = nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET) {
                    let _ = ready_tx.send(Err(io::Error::from(e)));
                    return;
                }
                drop(netns);
                let _ = ready_tx.send(Ok(()));
                while let Ok(req) = rx.recv() {
                    match req {
                        Request::Tcp(d, reply) => {
                            let _ = reply.send(tcp_socket(d, keepalive));
                        }
                        Request::Udp(d, reply) => {
                            let _ = reply.send(udp_socket(d));
                        }
                        Request::Listener(addr, stream, freebind, reply) => {
                            let _ = reply.send(listener(addr, stream, freebind));
                        }
                        Request::Run(work) => work(),
                        Request::IfIndex(name, reply) => {
                            let _ = reply.send(
                                nix::net::if_::if_nametoindex(name.as_str())
                                    .map_err(io::Error::from),
                            );
                        }
                        Request::Socket(d, t, p, reply) => {
                            let _ = reply.send(Socket::new(d, t.cloexec(), Some(p)));
                        }
                        Request::Refill => {
                            let Some(f) = weak.upgrade() else { return };
                            f.refill();
                        }
                    }
                }
            })?;
        ready_rx
            .recv()
            .map_err(|_| io::Error::other("netns thread died"))??;
        if pool_size > 0 {
            f.send(Request::Refill);
        }
        Ok(f)
    }

    /// Top the ready pools up (on the namespace's thread).
    fn refill(&self) {
        for (pool, domain) in [(&self.pool4, Domain::IPV4), (&self.pool6, Domain::IPV6)] {
            loop {
                let missing = {
                    let p = pool.lock().unwrap_or_else(|e| e.into_inner());
                    self.pool_size.saturating_sub(p.len())
                };
                if missing == 0 {
                    break;
                }
                match tcp_socket(domain, self.keepalive) {
                    Ok(s) => pool.lock().unwrap_or_else(|e| e.into_inner()).push(s),
                    Err(_) => break, // no IPv6 in this pod, or out of fds
                }
            }
        }
    }

    fn send(&self, r: Request) {
        let _ = self.tx.lock().unwrap_or_else(|e| e.into_inner()).send(r);
    }

    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<io::Result<T>>) -> Request,
    ) -> io::Result<T> {
        let (tx, rx) = oneshot::channel();
        self.send(make(tx));
        rx.await
            .map_err(|_| io::Error::other("netns thread is gone"))?
    }

    /// A listening socket bound to `addr` inside the namespace, the only
    /// one on its port (no SO_REUSEPORT).
    pub async fn listener(&self, addr: SocketAddr, stream: bool) -> io::Result<Socket> {
        self.ask(|tx| Request::Listener(addr, stream, false, tx))
            .await
    }

    /// [`listener`](Self::listener) on an address the namespace may not
    /// have (yet): a virtual address, there only while the pod holds it.
    pub async fn listener_freebind(&self, addr: SocketAddr, stream: bool) -> io::Result<Socket> {
        self.ask(|tx| Request::Listener(addr, stream, true, tx))
            .await
    }

    /// Run `work` on the namespace's thread (inside the pod's netns): for
    /// what is not a socket, such as netlink requests and raw frames.
    pub async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> io::Result<T> {
        let (tx, rx) = oneshot::channel();
        self.send(Request::Run(Box::new(move || {
            let _ = tx.send(work());
        })));
        rx.await
            .map_err(|_| io::Error::other("netns thread is gone"))
    }

    /// The index of interface `name` inside the namespace.
    pub async fn ifindex(&self, name: &str) -> io::Result<u32> {
        let name = name.to_string();
        self.ask(|tx| Request::IfIndex(name, tx)).await
    }

    /// An upstream TCP socket: from the pool when one is ready, else made
    /// here, on the calling thread, inside the namespace.
    pub async fn tcp(&self, v6: bool) -> io::Result<Socket> {
        if self.pool_size > 0 {
            let pool = if v6 { &self.pool6 } else { &self.pool4 };
            let popped = pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
            if let Some(s) = popped {
                self.pool_taken.fetch_add(1, Ordering::Relaxed);
                self.send(Request::Refill);
                return Ok(s);
            }
        }
        let d = if v6 { Domain::IPV6 } else { Domain::IPV4 };
        self.netns
            .run_here(|| tcp_socket(d, self.keepalive))
            .map_err(io::Error::other)?
    }
}

impl SocketSource for Factory {
    fn udp_socket(
        &self,
        target: SocketAddr,
    ) -> BoxFuture<'static, io::Result<std::net::UdpSocket>> {
        let (tx, rx) = oneshot::channel();
        let d = Domain::for_address(target);
        self.send(Request::Udp(d, tx));
        Box::pin(async move {
            let s = rx
                .await
                .map_err(|_| io::Error::other("netns thread is gone"))??;
            Ok(s.into())
        })
    }

    fn tcp_socket(&self, target: SocketAddr) -> BoxFuture<'static, io::Result<Socket>> {
        let (tx, rx) = oneshot::channel();
        self.send(Request::Tcp(Domain::for_address(target), tx));
        Box::pin(async move {
            rx.await
                .map_err(|_| io::Error::other("netns thread is gone"))?
        })
    }
}

/// The health probes' sockets, made inside the pod's namespace.
impl edgelink_health::Sockets for Factory {
    fn socket(
        &self,
        domain: Domain,
        ty: Type,
        protocol: Protocol,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = io::Result<Socket>> + Send + 'static>>
    {
        let (tx, rx) = oneshot::channel();
        self.send(Request::Socket(domain, ty, protocol, tx));
        Box::pin(async move {
            rx.await
                .map_err(|_| io::Error::other("netns thread is gone"))?
        })
    }
}
