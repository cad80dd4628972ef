//! A relayed connection that finds no descriptor for a splice pipe copies
//! what it has instead of ending, and splices again once it can. A test binary of its own: it lowers the process's
//! RLIMIT_NOFILE and fills it.
//!
//! Found by scripts/soak/tcp_hold.py: 10,000 connections held through
//! edgelinkd at a hard limit of 20,000 descriptors; when echoes crowded in,
//! the pipes they needed could not be made and 74 established connections
//! ended with EMFILE (docs/reliability.md, item 34).

use edgelink_relay::{
    relay_tcp, resume_tcp, splice_duplex, Counters, PipePool, Relayed, TcpRelayConfig,
};
use nix::sys::resource::{getrlimit, setrlimit, Resource};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// The tests of this binary take the process's descriptors: one at a time.
fn alone() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Every descriptor the soft limit still allows, taken.
fn fill_descriptors() -> Vec<OwnedFd> {
    let null = std::fs::File::open("/dev/null").expect("open /dev/null");
    let mut held = Vec::new();
    loop {
        match null.try_clone() {
            Ok(f) => held.push(OwnedFd::from(f)),
            Err(e) if e.raw_os_error() == Some(libc::EMFILE) => return held,
            Err(e) => panic!("dup: {e}"),
        }
    }
}

#[test]
fn a_direction_that_gets_no_pipe_copies_a_burst_and_splices_again_later() {
    let _alone = alone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // An echo server as the target.
        let target = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target_addr = target.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = target.accept().await.unwrap();
            let mut buf = vec![0u8; 65536];
            loop {
                let n = match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if s.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        });
        // The relay's two legs.
        let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(front.local_addr().unwrap())
            .await
            .unwrap();
        let (accepted, _) = front.accept().await.unwrap();
        let upstream = TcpStream::connect(target_addr).await.unwrap();
        // No idle pipes: every direction that has bytes makes one.
        let pool = PipePool::new(65536, 0);
        let counters = Arc::new(Counters::default());
        let relay = {
            let (counters, pool) = (counters.clone(), pool.clone());
            tokio::spawn(async move {
                splice_duplex(
                    accepted,
                    upstream,
                    &pool,
                    &counters,
                    &TcpRelayConfig::default(),
                )
                .await
            })
        };

        // Out of descriptors, with the connection established.
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
        setrlimit(Resource::RLIMIT_NOFILE, open + 16, hard).unwrap();
        let held = fill_descriptors();

        let msg = b"through a copy, not a pipe\n";
        client.write_all(msg).await.unwrap();
        let mut got = vec![0u8; msg.len()];
        let read = tokio::time::timeout(Duration::from_secs(5), client.read_exact(&mut got)).await;

        drop(held);
        setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
        assert!(
            matches!(read, Ok(Ok(_))),
            "the echo did not come back: {read:?}; relay: {:?}",
            if relay.is_finished() {
                Some(relay.await.unwrap())
            } else {
                None
            }
        );
        assert_eq!(&got, msg);
        let fallbacks = Counters::get(&counters.splice_fallbacks);
        assert!(fallbacks >= 1);

        // With descriptors back, the connection splices again (pipes are
        // made): no copy buffer is kept for the rest of its life.
        let pipes = pool.stats().created;
        client.write_all(msg).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), client.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&got, msg);
        assert_eq!(Counters::get(&counters.splice_fallbacks), fallbacks);
        assert!(pool.stats().created > pipes, "{:?}", pool.stats());

        // And it ends cleanly.
        drop(client);
        let ended = tokio::time::timeout(Duration::from_secs(5), relay).await;
        assert!(matches!(ended, Ok(Ok(Ok(())))), "{ended:?}");
    });
}

/// Byte `i` of the stream of the test below.
fn pattern(i: usize) -> u8 {
    (i * 7 + i / 4099) as u8
}

/// Review item 81: a direction copying a burst (no descriptor for a pipe)
/// while its destination is full parks when asked, and loses or repeats
/// no byte: the bytes it peeked are still in the source. Before, it
/// waited for the destination without looking at the park, and a
/// hand-over waited for it in vain (and then left it parked, frozen).
#[test]
fn a_burst_copy_waiting_for_a_full_destination_parks_and_loses_nothing() {
    const TOTAL: usize = 16 << 20;
    let _alone = alone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // A device that reads nothing until told to, then checks every byte.
        // Small socket buffers all along, so that the path fills up fast.
        let small = 64 * 1024;
        let device =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        device.set_recv_buffer_size(small).unwrap();
        device
            .bind(&std::net::SocketAddr::from(([127, 0, 0, 1], 0)).into())
            .unwrap();
        device.listen(8).unwrap();
        device.set_nonblocking(true).unwrap();
        let device = TcpListener::from_std(device.into()).unwrap();
        let device_addr = device.local_addr().unwrap();
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let checker = tokio::spawn(async move {
            let (mut s, _) = device.accept().await.unwrap();
            let _ = wait.await;
            let mut buf = vec![0u8; 65536];
            let mut at = 0usize;
            loop {
                let n = s.read(&mut buf).await.unwrap();
                if n == 0 {
                    return at;
                }
                for (k, b) in buf[..n].iter().enumerate() {
                    assert_eq!(*b, pattern(at + k), "byte {}", at + k);
                }
                at += n;
            }
        });
        let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(front.local_addr().unwrap())
            .await
            .unwrap();
        let (accepted, _) = front.accept().await.unwrap();
        let upstream = TcpStream::connect(device_addr).await.unwrap();
        socket2::SockRef::from(&client)
            .set_send_buffer_size(small)
            .unwrap();
        socket2::SockRef::from(&accepted)
            .set_recv_buffer_size(small)
            .unwrap();
        socket2::SockRef::from(&upstream)
            .set_send_buffer_size(small)
            .unwrap();
        let pool = PipePool::new(65536, 0);
        let counters = Arc::new(Counters::default());
        let park = CancellationToken::new();
        let cfg = TcpRelayConfig::default();
        let relay = {
            let (pool, counters, park, cfg) =
                (pool.clone(), counters.clone(), park.clone(), cfg.clone());
            tokio::spawn(async move {
                relay_tcp(accepted, upstream, &pool, &counters, &cfg, &park, None).await
            })
        };

        // Out of descriptors, then the client pushes more than the path holds.
        let data: Vec<u8> = (0..TOTAL).map(pattern).collect();
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
        setrlimit(Resource::RLIMIT_NOFILE, open + 16, hard).unwrap();
        let held = fill_descriptors();
        let (mut rd, mut wr) = client.into_split();
        let writer = tokio::spawn(async move {
            wr.write_all(&data).await.unwrap();
            wr.shutdown().await.unwrap();
        });
        // Until the relay copies bursts and the device's side is full.
        let mut last = (0, std::time::Instant::now());
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            assert!(
                std::time::Instant::now() < deadline,
                "the path never filled up"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
            let moved = Counters::get(&counters.bytes_to_target);
            if moved != last.0 {
                last = (moved, std::time::Instant::now());
            } else if moved > 0
                && Counters::get(&counters.splice_fallbacks) > 0
                && last.1.elapsed() > Duration::from_millis(300)
            {
                break;
            }
        }
        eprintln!(
            "parking with {} bytes moved to the device, {} burst copies",
            Counters::get(&counters.bytes_to_target),
            Counters::get(&counters.splice_fallbacks)
        );
        park.cancel();
        let parked = tokio::time::timeout(Duration::from_secs(5), relay).await;
        drop(held);
        setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
        let parked = match parked {
            Ok(Ok(Relayed::Parked(p))) => p,
            Ok(other) => panic!("not parked: {other:?}"),
            Err(_) => {
                panic!("the relay did not park within 5 s (a burst copy waits for the device)")
            }
        };
        assert!(parked.to_target.pipe.is_none(), "bytes held in a pipe");

        // Resumed (as the next daemon would), everything arrives once.
        let resumed = {
            let (pool, counters) = (pool.clone(), counters.clone());
            tokio::spawn(async move {
                resume_tcp(
                    parked,
                    &pool,
                    &counters,
                    &cfg,
                    &CancellationToken::new(),
                    None,
                )
                .await
            })
        };
        let _ = go.send(());
        let received = tokio::time::timeout(Duration::from_secs(30), checker)
            .await
            .expect("the device got the end of the stream")
            .unwrap();
        assert_eq!(received, TOTAL);
        writer.await.unwrap();
        let mut rest = Vec::new();
        rd.read_to_end(&mut rest).await.unwrap();
        let end = tokio::time::timeout(Duration::from_secs(5), resumed).await;
        assert!(matches!(end, Ok(Ok(Relayed::Ended(Ok(()))))), "{end:?}");
    });
}
