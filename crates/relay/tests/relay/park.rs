//! relay_tcp parked and resume_tcp going on, in another runtime with
//! another pipe pool each time (as a new process would), while both peers
//! stream and check every byte's value and position.

use crate::harness::*;
use edgelink_relay::{
    relay_tcp, resume_tcp, Counters, ParkedTcp, PipePool, Relayed, TcpRelayConfig,
};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

/// Byte `i` of stream `seed`: position and value are both checked.
fn byte(seed: u8, i: u64) -> u8 {
    (i.wrapping_mul(31).wrapping_add(u64::from(seed)) % 251) as u8
}

/// Write `total` bytes of stream `seed`, `pause` between chunks, then
/// shut the write side.
async fn send(mut w: tokio::net::tcp::OwnedWriteHalf, seed: u8, total: u64, pause: Duration) {
    let mut at = 0u64;
    let mut chunk = vec![0u8; 64 * 1024];
    while at < total {
        let n = (total - at).min(chunk.len() as u64) as usize;
        for (k, b) in chunk[..n].iter_mut().enumerate() {
            *b = byte(seed, at + k as u64);
        }
        w.write_all(&chunk[..n]).await.expect("send");
        at += n as u64;
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
    w.shutdown().await.expect("shutdown");
}

/// Read to end of file, checking every byte against stream `seed`; the
/// count read. Slow readers (`pause`) make the relay's pipes hold bytes.
async fn check(mut r: tokio::net::tcp::OwnedReadHalf, seed: u8, pause: Duration) -> u64 {
    let mut at = 0u64;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = r.read(&mut buf).await.expect("read");
        if n == 0 {
            return at;
        }
        for (k, &b) in buf[..n].iter().enumerate() {
            assert_eq!(
                b,
                byte(seed, at + k as u64),
                "byte {} of stream {seed}",
                at + k as u64
            );
        }
        at += n as u64;
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
}

/// The relay's two sockets and the two peers', over loopback.
async fn legs() -> (TcpStream, TcpStream, TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = l.local_addr().unwrap();
    let client_peer = TcpStream::connect(addr).await.unwrap();
    let (client, _) = l.accept().await.unwrap();
    let upstream = TcpStream::connect(addr).await.unwrap();
    let (upstream_peer, _) = l.accept().await.unwrap();
    (client, upstream, client_peer, upstream_peer)
}

#[derive(Default)]
struct Seen {
    parks: AtomicU64,
    with_bytes: AtomicU64,
    half_closed: AtomicU64,
}

/// Relay in `rt`, parking after `every`, `times` times; each resume runs
/// in a fresh runtime with a fresh pool. The relay's result at the end.
fn relay_parking(
    client: TcpStream,
    upstream: TcpStream,
    cfg: TcpRelayConfig,
    every: Duration,
    times: usize,
    seen: Arc<Seen>,
) -> std::io::Result<()> {
    let counters = Counters::default();
    // The sockets belong to the test's runtime: as plain descriptors first.
    let mut parked = ParkedTcp {
        client: client.into_std().unwrap(),
        upstream: upstream.into_std().unwrap(),
        to_target: Default::default(),
        to_client: Default::default(),
    };
    for round in 0..=times {
        let rt = runtime();
        let pool = PipePool::new(cfg.pipe_size, 4);
        let park = CancellationToken::new();
        let last = round == times;
        let relayed = rt.block_on(async {
            if !last {
                let p = park.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(every).await;
                    p.cancel();
                });
            }
            let relay = async {
                if round == 0 {
                    // A fresh relay, on sockets this runtime registers.
                    let c = TcpStream::from_std(parked.client).unwrap();
                    let u = TcpStream::from_std(parked.upstream).unwrap();
                    relay_tcp(c, u, &pool, &counters, &cfg, &park, None).await
                } else {
                    resume_tcp(parked, &pool, &counters, &cfg, &park, None).await
                }
            };
            timeout(Duration::from_secs(60), relay)
                .await
                .expect("relay stuck")
        });
        parked = match relayed {
            Relayed::Ended(r) => return r,
            Relayed::Parked(p) => p,
        };
        seen.parks.fetch_add(1, Ordering::Relaxed);
        let dirs = [&parked.to_target, &parked.to_client];
        if dirs
            .iter()
            .any(|d| d.pipe.as_ref().is_some_and(|p| p.len > 0))
        {
            seen.with_bytes.fetch_add(1, Ordering::Relaxed);
        }
        if dirs.iter().any(|d| d.done) {
            seen.half_closed.fetch_add(1, Ordering::Relaxed);
        }
        // Nothing of the old pool may be held: the pipes moved out.
        assert_eq!(pool.stats().in_use, 0, "round {round}");
    }
    unreachable!("the last round is never parked")
}

fn stream_both_ways(cfg: TcpRelayConfig, each_way: u64, parks: usize) -> Arc<Seen> {
    let rt = runtime();
    let (client, upstream, client_peer, upstream_peer) = rt.block_on(legs());
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    let relay = std::thread::spawn(move || {
        relay_parking(client, upstream, cfg, Duration::from_millis(30), parks, s)
    });
    rt.block_on(async {
        let (cr, cw) = client_peer.into_split();
        let (ur, uw) = upstream_peer.into_split();
        let slow = Duration::from_micros(300);
        let a = tokio::spawn(send(cw, 1, each_way, Duration::ZERO));
        let b = tokio::spawn(check(ur, 1, slow));
        let c = tokio::spawn(send(uw, 2, each_way, Duration::ZERO));
        let d = tokio::spawn(check(cr, 2, slow));
        let all = async {
            a.await.unwrap();
            c.await.unwrap();
            (b.await.unwrap(), d.await.unwrap())
        };
        let (to_target, to_client) = timeout(Duration::from_secs(90), all)
            .await
            .expect("streams stuck");
        assert_eq!((to_target, to_client), (each_way, each_way));
    });
    relay.join().unwrap().expect("relay ended with an error");
    seen
}

#[test]
fn a_connection_parked_and_resumed_ten_times_loses_and_reorders_nothing() {
    let _heavy = heavy();
    let seen = stream_both_ways(TcpRelayConfig::default(), 96 << 20, 10);
    assert_eq!(seen.parks.load(Ordering::Relaxed), 10);
    // Slow readers: some parks found bytes in flight in a pipe.
    assert!(
        seen.with_bytes.load(Ordering::Relaxed) > 0,
        "no park caught bytes in a pipe"
    );
}

#[test]
fn a_copying_connection_parks_its_buffer_into_a_pipe() {
    let _heavy = heavy();
    let cfg = TcpRelayConfig {
        force_copy: true,
        ..Default::default()
    };
    let seen = stream_both_ways(cfg, 32 << 20, 8);
    assert_eq!(seen.parks.load(Ordering::Relaxed), 8);
}

#[test]
fn a_half_closed_connection_keeps_its_half_close_across_parks() {
    let rt = runtime();
    let (client, upstream, client_peer, upstream_peer) = rt.block_on(legs());
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    let relay = std::thread::spawn(move || {
        relay_parking(
            client,
            upstream,
            TcpRelayConfig::default(),
            Duration::from_millis(40),
            6,
            s,
        )
    });
    rt.block_on(async {
        let (cr, cw) = client_peer.into_split();
        let (ur, uw) = upstream_peer.into_split();
        // The client says little and closes its side at once; the device
        // answers slowly, for longer than all the parks take.
        let a = tokio::spawn(send(cw, 3, 100_000, Duration::ZERO));
        let b = tokio::spawn(check(ur, 3, Duration::ZERO));
        let c = tokio::spawn(send(uw, 4, 6 << 20, Duration::from_millis(4)));
        let d = tokio::spawn(check(cr, 4, Duration::ZERO));
        let all = async {
            a.await.unwrap();
            // The device sees the client's end of file (once) while it is
            // still sending.
            let got = b.await.unwrap();
            c.await.unwrap();
            (got, d.await.unwrap())
        };
        let got = timeout(Duration::from_secs(60), all).await.expect("stuck");
        assert_eq!(got, (100_000, 6 << 20));
    });
    relay.join().unwrap().expect("relay");
    assert_eq!(seen.parks.load(Ordering::Relaxed), 6);
    assert!(
        seen.half_closed.load(Ordering::Relaxed) > 0,
        "no park saw the client's direction done"
    );
}

/// UDP: a forward parked with 20 sessions, a datagram from each client
/// sent while nothing reads, then resumed in another runtime: every
/// datagram is answered, through the same upstream sockets (the target
/// sees no new peer), and no session is made again.
#[test]
fn a_udp_forward_parked_and_resumed_keeps_its_sessions_and_queued_datagrams() {
    use edgelink_relay::UdpForward;
    use std::collections::HashSet;
    use std::sync::Mutex;
    use tokio::net::UdpSocket;

    let rt = runtime();
    let peers: Arc<Mutex<HashSet<SocketAddr>>> = Arc::default();
    let (target, clients, listener) = rt.block_on(async {
        let t = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let target = t.local_addr().unwrap();
        let seen = peers.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 2048];
            while let Ok((n, from)) = t.recv_from(&mut buf).await {
                seen.lock().unwrap().insert(from);
                let _ = t.send_to(&buf[..n], from).await;
            }
        });
        let listener = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap();
        let mut clients = Vec::new();
        for _ in 0..20 {
            let c = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            c.connect(at).await.unwrap();
            clients.push(c);
        }
        (target, clients, listener)
    });
    let round = |clients: &[UdpSocket], tag: &str| {
        rt.block_on(async {
            for (i, c) in clients.iter().enumerate() {
                let msg = format!("{tag} {i}");
                let mut buf = [0u8; 64];
                let mut ok = false;
                for _ in 0..3 {
                    c.send(msg.as_bytes()).await.unwrap();
                    if let Ok(Ok(n)) = timeout(Duration::from_secs(2), c.recv(&mut buf)).await {
                        assert_eq!(&buf[..n], msg.as_bytes());
                        ok = true;
                        break;
                    }
                }
                assert!(ok, "no answer to {msg}");
            }
        })
    };
    let run = |forward: UdpForward, before: &dyn Fn()| {
        udp_until_parked(forward, target, Arc::new(LocalSource::default()), before)
    };
    let first = UdpForward {
        listener,
        sessions: Vec::new(),
    };
    let (parked, counters) = run(first, &|| round(&clients, "before"));
    assert_eq!(parked.sessions.len(), 20);
    assert_eq!(Counters::get(&counters.udp_sessions_total), 20);
    // Sent while parked: waits in the listener's buffer.
    rt.block_on(async {
        for (i, c) in clients.iter().enumerate() {
            c.send(format!("parked {i}").as_bytes()).await.unwrap();
        }
    });
    let (parked, counters) = run(parked, &|| {
        rt.block_on(async {
            for (i, c) in clients.iter().enumerate() {
                let mut buf = [0u8; 64];
                let n = timeout(Duration::from_secs(5), c.recv(&mut buf))
                    .await
                    .expect("the datagram sent while parked was lost")
                    .unwrap();
                assert_eq!(&buf[..n], format!("parked {i}").as_bytes());
            }
        });
        round(&clients, "after");
    });
    assert_eq!(parked.sessions.len(), 20);
    assert_eq!(
        Counters::get(&counters.udp_sessions_total),
        0,
        "sessions were made again"
    );
    assert_eq!(Counters::get(&counters.udp_drops), 0);
    assert_eq!(peers.lock().unwrap().len(), 20, "the target saw new peers");
}

/// A UDP socket source that takes `delay` to make each socket.
struct SlowSource(Duration);

impl edgelink_relay::SocketSource for SlowSource {
    fn udp_socket(
        &self,
        target: SocketAddr,
    ) -> futures_util::future::BoxFuture<'static, std::io::Result<std::net::UdpSocket>> {
        let made = LocalSource::default().udp_socket(target);
        let delay = self.0;
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            made.await
        })
    }

    fn tcp_socket(
        &self,
        target: SocketAddr,
    ) -> futures_util::future::BoxFuture<'static, std::io::Result<socket2::Socket>> {
        LocalSource::default().tcp_socket(target)
    }
}

/// A new client's first datagram, read just before a park while its
/// session waits for its upstream socket, is not lost: the park lets the
/// socket come, the datagram goes out, and the session is handed over
/// Ready, so the target's answer reaches the client through the relay that
/// adopts it. It was counted as a drop (a new UDP flow lost in a take-over:
/// kube lab F6, CI 2026-11-26).
#[test]
fn a_udp_session_waiting_for_its_socket_at_a_park_is_handed_over_ready() {
    use edgelink_relay::{SocketSource, UdpForward};
    use tokio::net::UdpSocket;

    let rt = runtime();
    let (target, client, listener) = rt.block_on(async {
        let t = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let target = t.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 2048];
            while let Ok((n, from)) = t.recv_from(&mut buf).await {
                let _ = t.send_to(&buf[..n], from).await;
            }
        });
        let listener = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let c = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        c.connect(listener.local_addr().unwrap()).await.unwrap();
        (target, c, listener)
    });
    let run = |forward: UdpForward, source: Arc<dyn SocketSource>, before: &dyn Fn()| {
        udp_until_parked(forward, target, source, before)
    };
    let first = UdpForward {
        listener,
        sessions: Vec::new(),
    };
    // The socket takes 100 ms; the park comes 20 ms after the datagram.
    let slow = Arc::new(SlowSource(Duration::from_millis(100)));
    let (parked, counters) = run(first, slow, &|| {
        rt.block_on(client.send(b"first")).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    });
    assert_eq!(
        Counters::get(&counters.udp_drops),
        0,
        "the datagram was dropped"
    );
    assert_eq!(parked.sessions.len(), 1, "the session was not handed over");
    let (_, counters) = run(parked, Arc::new(LocalSource::default()), &|| {
        let mut buf = [0u8; 64];
        let n = rt
            .block_on(async { timeout(Duration::from_secs(5), client.recv(&mut buf)).await })
            .expect("the answer to the first datagram was lost")
            .unwrap();
        assert_eq!(&buf[..n], b"first");
    });
    assert_eq!(Counters::get(&counters.udp_sessions_total), 0);
}

/// Relay `forward` to `target` on a runtime of its own, run `before`, then
/// park it: the parked forward and the relay's counters.
fn udp_until_parked(
    forward: edgelink_relay::UdpForward,
    target: SocketAddr,
    source: Arc<dyn edgelink_relay::SocketSource>,
    before: &dyn Fn(),
) -> (edgelink_relay::UdpForward, Arc<Counters>) {
    use edgelink_relay::{relay_udp, UdpConfig};
    let relay_rt = runtime();
    let counters = Arc::new(Counters::default());
    let park = CancellationToken::new();
    let (c, p) = (counters.clone(), park.clone());
    let task = relay_rt.spawn(async move {
        let refuse = Arc::new(|_, _| false);
        let cfg = UdpConfig::default();
        relay_udp(
            forward,
            target,
            source,
            cfg,
            c,
            refuse,
            std::future::pending(),
            &p,
        )
        .await
    });
    before();
    park.cancel();
    let parked = relay_rt
        .block_on(async { timeout(Duration::from_secs(5), task).await })
        .expect("park stuck")
        .unwrap()
        .expect("relay_udp failed")
        .expect("parked, not stopped");
    (parked, counters)
}

/// The tally of a connection is the kernel's count of its client socket
/// as the relay ends: what the client sent, and what it was sent.
#[test]
fn the_tally_counts_the_bytes_each_way_when_the_relay_ends() {
    let rt = runtime();
    rt.block_on(async {
        let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let back = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (fa, ba) = (front.local_addr().unwrap(), back.local_addr().unwrap());
        let client = tokio::spawn(async move {
            let mut c = TcpStream::connect(fa).await.unwrap();
            c.write_all(&[7u8; 300_000]).await.unwrap();
            c.shutdown().await.unwrap();
            let mut got = Vec::new();
            c.read_to_end(&mut got).await.unwrap();
            got.len()
        });
        let (accepted, _) = front.accept().await.unwrap();
        let upstream = TcpStream::connect(ba).await.unwrap();
        let device = tokio::spawn(async move {
            let (mut d, _) = back.accept().await.unwrap();
            let mut got = Vec::new();
            d.read_to_end(&mut got).await.unwrap();
            d.write_all(&vec![9u8; 1234]).await.unwrap();
            got.len()
        });
        let (pool, counters) = (PipePool::new(65536, 4), Counters::default());
        let (cfg, park) = (TcpRelayConfig::default(), CancellationToken::new());
        let tally = edgelink_relay::Tally::default();
        let r = timeout(
            Duration::from_secs(20),
            relay_tcp(
                accepted,
                upstream,
                &pool,
                &counters,
                &cfg,
                &park,
                Some(&tally),
            ),
        )
        .await
        .expect("the relay ends");
        assert!(matches!(r, Relayed::Ended(Ok(()))), "{r:?}");
        assert_eq!(device.await.unwrap(), 300_000);
        assert_eq!(client.await.unwrap(), 1234);
        assert_eq!(tally.get(), (300_000, 1234));
    });
}
