//! serve_udp between UDP sockets on loopback.

use crate::harness::*;
use edgelink_relay::{serve_udp, Counters, RefuseFn, UdpConfig};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::UdpSocket;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::timeout;

/// A UDP echo target on `addr`.
async fn echo_target(addr: &str) -> (SocketAddr, JoinHandle<()>) {
    let socket = UdpSocket::bind(addr).await.unwrap();
    let addr = socket.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut buf = vec![0u8; 65536];
        loop {
            let Ok((n, from)) = socket.recv_from(&mut buf).await else {
                return;
            };
            let _ = socket.send_to(&buf[..n], from).await;
        }
    });
    (addr, task)
}

struct Relay {
    addr: SocketAddr,
    counters: Arc<Counters>,
    source: Arc<LocalSource>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Relay {
    async fn start(
        listen: &str,
        target: SocketAddr,
        cfg: UdpConfig,
        refuse: Arc<RefuseFn>,
    ) -> Relay {
        let listener = std::net::UdpSocket::bind(listen).unwrap();
        // Before anything is sent to it (serve_udp's own runs later).
        if listener.local_addr().unwrap().is_ipv4() {
            nix::sys::socket::setsockopt(
                &listener,
                nix::sys::socket::sockopt::Ipv4PacketInfo,
                &true,
            )
        } else {
            nix::sys::socket::setsockopt(
                &listener,
                nix::sys::socket::sockopt::Ipv6RecvPacketInfo,
                &true,
            )
        }
        .unwrap();
        let mut addr = listener.local_addr().unwrap();
        if addr.ip().is_unspecified() {
            addr.set_ip(if addr.is_ipv4() {
                "127.0.0.1".parse().unwrap()
            } else {
                "::1".parse().unwrap()
            });
        }
        let counters = Arc::new(Counters::default());
        let source = Arc::new(LocalSource::default());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve_udp(
            listener,
            target,
            source.clone(),
            cfg,
            counters.clone(),
            refuse,
            async move {
                let _ = stopped.await;
            },
        ));
        Relay {
            addr,
            counters,
            source,
            stop: Some(stop),
            task,
        }
    }

    /// Shut down; every session must be gone.
    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        timeout(Duration::from_secs(5), &mut self.task)
            .await
            .expect("serve_udp did not return after shutdown")
            .unwrap()
            .expect("serve_udp failed");
        assert_eq!(Counters::get(&self.counters.udp_sessions), 0);
    }
}

fn allow_all() -> Arc<RefuseFn> {
    Arc::new(|_, _| false)
}

/// A client connected to the relay.
async fn client(relay: SocketAddr) -> UdpSocket {
    let bind = if relay.is_ipv4() {
        "127.0.0.1:0"
    } else {
        "[::1]:0"
    };
    let socket = UdpSocket::bind(bind).await.unwrap();
    socket.connect(relay).await.unwrap();
    socket
}

/// Send `msg` and expect it back (the target echoes), retrying a lost one.
async fn round_trip(socket: &UdpSocket, msg: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; 4096];
    for _ in 0..3 {
        socket.send(msg).await.unwrap();
        if let Ok(n) = timeout(Duration::from_secs(2), socket.recv(&mut buf)).await {
            let n = n.unwrap();
            return buf[..n].to_vec();
        }
    }
    panic!("no reply to {:?}", String::from_utf8_lossy(msg));
}

/// Nothing arrives on `socket` for `quiet`.
async fn silent(socket: &UdpSocket, quiet: Duration) -> bool {
    let mut buf = [0u8; 4096];
    timeout(quiet, socket.recv(&mut buf)).await.is_err()
}

#[test]
fn fifty_clients_each_get_their_own_replies() {
    let rt = runtime();
    rt.block_on(async {
        let (target, _echo) = echo_target("127.0.0.1:0").await;
        let relay = Relay::start("127.0.0.1:0", target, UdpConfig::default(), allow_all()).await;
        let clients: Vec<_> = (0..50)
            .map(|id| {
                let addr = relay.addr;
                tokio::spawn(async move {
                    let socket = client(addr).await;
                    for seq in 0..20 {
                        let msg = format!("client {id} datagram {seq} {}", "x".repeat(id * 7));
                        let back = round_trip(&socket, msg.as_bytes()).await;
                        assert_eq!(
                            String::from_utf8_lossy(&back),
                            msg,
                            "client {id} got another's reply"
                        );
                    }
                    // No stray datagram for this client afterwards.
                    assert!(silent(&socket, Duration::from_millis(50)).await);
                })
            })
            .collect();
        for c in timeout(
            Duration::from_secs(30),
            futures_util::future::join_all(clients),
        )
        .await
        .expect("timed out")
        {
            c.unwrap();
        }
        let c = &relay.counters;
        assert_eq!(Counters::get(&c.udp_sessions), 50);
        assert_eq!(Counters::get(&c.udp_sessions_total), 50);
        assert_eq!(
            relay.source.made.load(std::sync::atomic::Ordering::SeqCst),
            50
        );
        assert!(Counters::get(&c.udp_datagrams_to_target) >= 1000);
        assert!(Counters::get(&c.udp_datagrams_to_client) >= 1000);
        // Bytes are counted with the datagrams: echoes are as long as requests.
        assert!(Counters::get(&c.bytes_to_target) >= Counters::get(&c.udp_datagrams_to_target));
        assert_eq!(
            Counters::get(&c.bytes_to_client),
            Counters::get(&c.bytes_to_target)
        );
        assert_eq!(Counters::get(&c.udp_evictions), 0);
        relay.stop().await;
    });
}

#[test]
fn idle_sessions_are_closed() {
    let rt = runtime();
    rt.block_on(async {
        let (target, _echo) = echo_target("127.0.0.1:0").await;
        let cfg = UdpConfig {
            idle_timeout: Duration::from_millis(200),
            ..UdpConfig::default()
        };
        let relay = Relay::start("127.0.0.1:0", target, cfg, allow_all()).await;
        let mut clients = Vec::new();
        for i in 0..3 {
            let socket = client(relay.addr).await;
            assert_eq!(
                round_trip(&socket, format!("hello {i}").as_bytes()).await,
                format!("hello {i}").as_bytes()
            );
            clients.push(socket);
        }
        let counters = relay.counters.clone();
        assert_eq!(Counters::get(&counters.udp_sessions), 3);
        eventually(Duration::from_secs(3), "idle sessions closed", || {
            Counters::get(&counters.udp_sessions) == 0
        })
        .await;
        // A client that comes back gets a new session.
        assert_eq!(round_trip(&clients[0], b"again").await, b"again");
        assert_eq!(Counters::get(&counters.udp_sessions), 1);
        assert_eq!(Counters::get(&counters.udp_sessions_total), 4);
        assert_eq!(Counters::get(&counters.udp_evictions), 0);
        relay.stop().await;
    });
}

#[test]
fn a_full_table_evicts_the_least_recently_used() {
    let rt = runtime();
    rt.block_on(async {
        let (target, _echo) = echo_target("127.0.0.1:0").await;
        let cfg = UdpConfig {
            max_sessions: 4,
            ..UdpConfig::default()
        };
        let relay = Relay::start("127.0.0.1:0", target, cfg, allow_all()).await;
        let mut clients = Vec::new();
        for i in 0..6 {
            let socket = client(relay.addr).await;
            let msg = format!("client {i}");
            assert_eq!(round_trip(&socket, msg.as_bytes()).await, msg.as_bytes());
            clients.push(socket);
            // Distinct last-use times (the table's clock counts milliseconds).
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let c = relay.counters.clone();
        assert_eq!(Counters::get(&c.udp_evictions), 2);
        assert_eq!(Counters::get(&c.udp_sessions), 4);
        // The four newest are still served, without new sessions.
        for (i, socket) in clients.iter().enumerate().skip(2) {
            let msg = format!("still here {i}");
            assert_eq!(round_trip(socket, msg.as_bytes()).await, msg.as_bytes());
        }
        assert_eq!(Counters::get(&c.udp_evictions), 2);
        assert_eq!(Counters::get(&c.udp_sessions_total), 6);
        // An evicted client comes back: it evicts the least recent (client 2).
        assert_eq!(round_trip(&clients[0], b"back").await, b"back");
        assert_eq!(Counters::get(&c.udp_evictions), 3);
        assert_eq!(Counters::get(&c.udp_sessions), 4);
        relay.stop().await;
    });
}

#[test]
fn refused_datagrams_are_dropped_and_counted() {
    let rt = runtime();
    rt.block_on(async {
        let (target, _echo) = echo_target("127.0.0.1:0").await;
        let blocked = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let blocked_addr = blocked.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let refuse: Arc<RefuseFn> = {
            let seen = seen.clone();
            Arc::new(move |peer: SocketAddr, ifindex: Option<u32>| {
                seen.lock().unwrap().push(ifindex);
                peer == blocked_addr
            })
        };
        let relay = Relay::start("127.0.0.1:0", target, UdpConfig::default(), refuse).await;
        blocked.connect(relay.addr).await.unwrap();
        for _ in 0..5 {
            blocked.send(b"let me in").await.unwrap();
        }
        let allowed = client(relay.addr).await;
        assert_eq!(round_trip(&allowed, b"hello").await, b"hello");
        assert!(
            silent(&blocked, Duration::from_millis(200)).await,
            "a refused client got a reply"
        );
        let c = &relay.counters;
        assert_eq!(Counters::get(&c.refused), 5);
        assert_eq!(Counters::get(&c.udp_sessions_total), 1);
        // The hook is told the interface: loopback.
        let lo = nix::net::if_::if_nametoindex("lo").unwrap();
        assert!(
            seen.lock().unwrap().iter().all(|i| *i == Some(lo)),
            "{:?}",
            seen.lock().unwrap()
        );
        relay.stop().await;
    });
}

#[test]
fn ipv6_loopback() {
    let rt = runtime();
    rt.block_on(async {
        let (target, _echo) = echo_target("[::1]:0").await;
        let relay = Relay::start("[::1]:0", target, UdpConfig::default(), allow_all()).await;
        for i in 0..3 {
            let socket = client(relay.addr).await;
            let msg = format!("v6 client {i}");
            assert_eq!(round_trip(&socket, msg.as_bytes()).await, msg.as_bytes());
        }
        assert_eq!(Counters::get(&relay.counters.udp_sessions), 3);
        relay.stop().await;
    });
}

#[test]
fn a_wildcard_listener_answers_from_the_address_written_to() {
    let rt = runtime();
    rt.block_on(async {
        let (target, _echo) = echo_target("127.0.0.1:0").await;
        let relay = Relay::start("0.0.0.0:0", target, UdpConfig::default(), allow_all()).await;
        // A connected socket accepts replies from 127.0.0.2 only: without
        // IP_PKTINFO on the way back the kernel would answer from 127.0.0.1.
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        socket
            .connect(("127.0.0.2", relay.addr.port()))
            .await
            .unwrap();
        assert_eq!(
            round_trip(&socket, b"to a secondary address").await,
            b"to a secondary address"
        );
        relay.stop().await;
    });
}

#[test]
fn a_dual_stack_listener_serves_ipv4_clients() {
    let rt = runtime();
    rt.block_on(async {
        let (target, _echo) = echo_target("127.0.0.1:0").await;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let refuse: Arc<RefuseFn> = {
            let seen = seen.clone();
            Arc::new(move |peer: SocketAddr, _| {
                seen.lock().unwrap().push(peer);
                false
            })
        };
        let relay = Relay::start("[::]:0", target, UdpConfig::default(), refuse).await;
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        socket
            .connect(("127.0.0.1", relay.addr.port()))
            .await
            .unwrap();
        assert_eq!(round_trip(&socket, b"v4 over v6").await, b"v4 over v6");
        // The hook sees the IPv4 address, not the mapped one.
        assert!(seen
            .lock()
            .unwrap()
            .iter()
            .all(|p| *p == socket.local_addr().unwrap()));
        relay.stop().await;
    });
}

#[test]
fn a_burst_is_relayed_in_batches() {
    let rt = runtime();
    rt.block_on(async {
        let (target, _echo) = echo_target("127.0.0.1:0").await;
        let relay = Relay::start("127.0.0.1:0", target, UdpConfig::default(), allow_all()).await;
        let socket = client(relay.addr).await;
        // The first datagrams wait while the session's socket is made.
        for i in 0..200u32 {
            socket.send(&i.to_be_bytes()).await.unwrap();
        }
        let mut got = std::collections::BTreeSet::new();
        let mut buf = [0u8; 64];
        while let Ok(Ok(n)) = timeout(Duration::from_millis(500), socket.recv(&mut buf)).await {
            assert_eq!(n, 4);
            got.insert(u32::from_be_bytes(buf[..4].try_into().unwrap()));
        }
        let c = &relay.counters;
        let (to_target, drops) = (
            Counters::get(&c.udp_datagrams_to_target),
            Counters::get(&c.udp_drops),
        );
        eprintln!(
            "burst of 200: {} back, {to_target} to target, {drops} dropped",
            got.len()
        );
        // Every datagram is accounted for, and on loopback none is lost:
        // while the new session's queue is full the relay leaves the rest
        // of the burst in the listener's socket buffer.
        assert_eq!(to_target + drops, 200);
        assert_eq!(got.len() as u64, Counters::get(&c.udp_datagrams_to_client));
        assert_eq!(got.len(), 200, "datagrams of the first burst were lost");
        relay.stop().await;
    });
}
