//! A relayed connection that finds no descriptor for a splice pipe copies
//! what it has instead of ending, and splices again once it can. A test binary of its own: it lowers the process's
//! RLIMIT_NOFILE and fills it.
//!
//! Found by scripts/soak/tcp_hold.py: 10,000 connections held through
//! edgelinkd at a hard limit of 20,000 descriptors; when echoes crowded in,
//! the pipes they needed could not be made and 74 established connections
//! ended with EMFILE (docs/reliability.md, item 34).

use edgelink_relay::{splice_duplex, Counters, PipePool, TcpRelayConfig};
use nix::sys::resource::{getrlimit, setrlimit, Resource};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

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
