//! splice_duplex between real sockets on loopback.

use crate::harness::*;
use edgelink_relay::{splice_duplex, Counters, PipePool, TcpRelayConfig, DEFAULT_PIPE_SIZE};
use sha2::{Digest, Sha256};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener as StdListener, TcpStream as StdStream};
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

const GIB: u64 = 1 << 30;

#[test]
fn one_gib_arrives_with_the_same_sha256() {
    let _heavy = heavy();
    let rt = runtime();
    let started = Instant::now();

    // The far end hashes everything it receives until end of file.
    let server = StdListener::bind("127.0.0.1:0").unwrap();
    let server_addr = server.local_addr().unwrap();
    let (hash_tx, hash_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (conn, _) = server.accept().unwrap();
        let _ = hash_tx.send(Sha256Sum::of_fd(OwnedFd::from(conn)).finish());
    });

    let relay = rt.block_on(TcpRelay::start(server_addr, TcpRelayConfig::default()));
    let relay_addr = relay.addr;

    // The sender streams 1 GiB and hashes what it sends.
    let (sent_tx, sent_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut conn = StdStream::connect(relay_addr).unwrap();
        conn.set_write_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut expected = Sha256Sum::piped();
        let chunk = 256 * 1024;
        let mut gen = Generator::new(chunk, 0x5eed);
        for _ in 0..GIB / chunk as u64 {
            let data = gen.next_chunk();
            conn.write_all(data).unwrap();
            expected.write(data);
        }
        conn.shutdown(Shutdown::Write).unwrap();
        // The server sends nothing back: end of file once it is done.
        conn.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut rest = Vec::new();
        conn.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
        let _ = sent_tx.send(expected.finish());
    });

    let limit = Duration::from_secs(60);
    let sent = sent_rx.recv_timeout(limit).expect("sender did not finish");
    let received = hash_rx
        .recv_timeout(limit)
        .expect("receiver did not finish");
    assert_eq!(sent.len(), 64);
    assert_eq!(
        received, sent,
        "SHA-256 of what arrived differs from what was sent"
    );
    rt.block_on(relay.wait_finished(1, Duration::from_secs(5)));
    assert!(relay.results.lock().unwrap()[0].is_ok());
    assert_eq!(relay.counters.bytes_to_target.load(Ordering::Relaxed), GIB);
    assert_eq!(relay.counters.bytes_to_client.load(Ordering::Relaxed), 0);
    assert_eq!(relay.counters.splice_fallbacks.load(Ordering::Relaxed), 0);
    let stats = relay.pool.stats();
    assert_eq!(stats.in_use, 0, "{stats:?}");
    eprintln!(
        "1 GiB relayed and hashed in {:?}; pool {stats:?}",
        started.elapsed()
    );
}

#[test]
fn fallback_delivers_the_bytes_already_in_the_pipe() {
    let rt = runtime();
    rt.block_on(async {
        let (echo, _server) = echo_server().await;
        let cfg = TcpRelayConfig {
            force_copy: true,
            ..TcpRelayConfig::default()
        };
        let relay = TcpRelay::start(echo, cfg).await;
        let conn = TcpStream::connect(relay.addr).await.unwrap();
        let (mut rd, mut wr) = conn.into_split();
        const TOTAL: usize = 16 << 20;
        let writer = tokio::spawn(async move {
            let mut gen = Generator::new(64 * 1024, 7);
            let mut hash = Sha256::new();
            for _ in 0..TOTAL / (64 * 1024) {
                let data = gen.next_chunk();
                wr.write_all(data).await.unwrap();
                hash.update(data);
            }
            wr.shutdown().await.unwrap();
            hash.finalize()
        });
        let mut hash = Sha256::new();
        let mut buf = vec![0u8; 256 * 1024];
        let mut got = 0;
        timeout(Duration::from_secs(20), async {
            loop {
                let n = rd.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                hash.update(&buf[..n]);
                got += n;
            }
        })
        .await
        .expect("echo through the copy fallback timed out");
        assert_eq!(got, TOTAL);
        assert_eq!(hash.finalize(), writer.await.unwrap());
        relay.wait_finished(1, Duration::from_secs(5)).await;
        assert!(relay.results.lock().unwrap()[0].is_ok());
        // Both directions fell back, each with bytes in its pipe.
        assert_eq!(Counters::get(&relay.counters.splice_fallbacks), 2);
        assert_eq!(Counters::get(&relay.counters.bytes_to_target), TOTAL as u64);
        assert_eq!(Counters::get(&relay.counters.bytes_to_client), TOTAL as u64);
        assert_eq!(relay.pool.stats().in_use, 0);
    });
}

#[test]
fn half_close_from_the_client() {
    let rt = runtime();
    rt.block_on(async {
        // The server answers only after the client's end of file.
        let server = listen("127.0.0.1:0".parse().unwrap());
        let server_addr = server.local_addr().unwrap();
        let reply: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8).collect();
        let server_reply = reply.clone();
        let srv = tokio::spawn(async move {
            let (mut conn, _) = server.accept().await.unwrap();
            let mut request = Vec::new();
            conn.read_to_end(&mut request).await.unwrap();
            conn.write_all(&server_reply).await.unwrap();
            conn.shutdown().await.unwrap();
            request
        });
        let relay = TcpRelay::start(server_addr, TcpRelayConfig::default()).await;
        let mut conn = TcpStream::connect(relay.addr).await.unwrap();
        conn.write_all(b"the whole request").await.unwrap();
        conn.shutdown().await.unwrap();
        let mut got = Vec::new();
        timeout(Duration::from_secs(10), conn.read_to_end(&mut got))
            .await
            .expect("reply after half-close timed out")
            .unwrap();
        assert_eq!(got.len(), reply.len());
        assert!(got == reply);
        assert_eq!(srv.await.unwrap(), b"the whole request");
        relay.wait_finished(1, Duration::from_secs(5)).await;
        assert!(relay.results.lock().unwrap()[0].is_ok());
    });
}

#[test]
fn half_close_from_the_server() {
    let rt = runtime();
    rt.block_on(async {
        // The server says everything and shuts its side first, then keeps
        // reading what the client still sends.
        let server = listen("127.0.0.1:0".parse().unwrap());
        let server_addr = server.local_addr().unwrap();
        let srv = tokio::spawn(async move {
            let (mut conn, _) = server.accept().await.unwrap();
            conn.write_all(&vec![b's'; 2 << 20]).await.unwrap();
            conn.shutdown().await.unwrap();
            let mut request = Vec::new();
            conn.read_to_end(&mut request).await.unwrap();
            request
        });
        let relay = TcpRelay::start(server_addr, TcpRelayConfig::default()).await;
        let mut conn = TcpStream::connect(relay.addr).await.unwrap();
        let mut got = Vec::new();
        timeout(Duration::from_secs(10), conn.read_to_end(&mut got))
            .await
            .expect("server's data timed out")
            .unwrap();
        assert_eq!(got.len(), 2 << 20);
        // Our side is still open: send after the server's end of file.
        let late = vec![b'c'; 3 << 20];
        conn.write_all(&late).await.unwrap();
        conn.shutdown().await.unwrap();
        let request = timeout(Duration::from_secs(10), srv)
            .await
            .expect("server timed out")
            .unwrap();
        assert!(request == late, "server got {} bytes", request.len());
        relay.wait_finished(1, Duration::from_secs(5)).await;
        assert!(relay.results.lock().unwrap()[0].is_ok());
    });
}

/// A server that resets its connection after reading `n` bytes.
async fn resetting_server(n: usize) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let server = listen("127.0.0.1:0".parse().unwrap());
    let addr = server.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (mut conn, _) = server.accept().await.unwrap();
        let mut buf = vec![0u8; n];
        conn.read_exact(&mut buf).await.unwrap();
        conn.set_zero_linger().unwrap();
        drop(conn);
    });
    (addr, task)
}

#[test]
fn server_reset_reaches_the_client() {
    let rt = runtime();
    rt.block_on(async {
        let (server_addr, srv) = resetting_server(5).await;
        let relay = TcpRelay::start(server_addr, TcpRelayConfig::default()).await;
        let mut conn = TcpStream::connect(relay.addr).await.unwrap();
        conn.write_all(b"hello").await.unwrap();
        srv.await.unwrap();
        let mut buf = [0u8; 16];
        let read = timeout(Duration::from_secs(5), conn.read(&mut buf))
            .await
            .expect("no reset seen");
        match read {
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}"),
            Ok(n) => panic!("expected a reset, got a clean read of {n} bytes"),
        }
        relay.wait_finished(1, Duration::from_secs(5)).await;
        assert!(relay.results.lock().unwrap()[0].is_err());
        assert_eq!(relay.pool.stats().in_use, 0);
    });
}

#[test]
fn client_reset_reaches_the_server() {
    let rt = runtime();
    rt.block_on(async {
        let server = listen("127.0.0.1:0".parse().unwrap());
        let server_addr = server.local_addr().unwrap();
        let srv = tokio::spawn(async move {
            let (mut conn, _) = server.accept().await.unwrap();
            let mut buf = [0u8; 5];
            conn.read_exact(&mut buf).await.unwrap();
            let mut more = [0u8; 16];
            timeout(Duration::from_secs(5), conn.read(&mut more))
                .await
                .expect("no reset seen")
        });
        let relay = TcpRelay::start(server_addr, TcpRelayConfig::default()).await;
        let mut conn = TcpStream::connect(relay.addr).await.unwrap();
        conn.write_all(b"hello").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        conn.set_zero_linger().unwrap();
        drop(conn);
        match srv.await.unwrap() {
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}"),
            Ok(n) => panic!("expected a reset, got a clean read of {n} bytes"),
        }
        relay.wait_finished(1, Duration::from_secs(5)).await;
        assert!(relay.results.lock().unwrap()[0].is_err());
    });
}

#[test]
fn a_reader_that_stops_stops_the_writer() {
    let _heavy = heavy();
    let rt = runtime();
    rt.block_on(async {
        // The server accepts and then reads nothing until told to.
        let server = listen("127.0.0.1:0".parse().unwrap());
        let server_addr = server.local_addr().unwrap();
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let srv = tokio::spawn(async move {
            let (mut conn, _) = server.accept().await.unwrap();
            let _ = go_rx.await;
            let mut sink = Vec::new();
            conn.read_to_end(&mut sink).await.unwrap();
            sink.len()
        });
        let relay = TcpRelay::start(server_addr, TcpRelayConfig::default()).await;
        let conn = TcpStream::connect(relay.addr).await.unwrap();
        let (_rd, mut wr) = conn.into_split();

        // Write until the writer is blocked: no write progress and nothing
        // moving upstream for three 300 ms windows in a row (one stalled
        // window may just be a busy machine).
        let chunk = vec![0xabu8; 256 * 1024];
        let mut written = 0usize;
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut still = 0;
        let mut moved = Counters::get(&relay.counters.bytes_to_target);
        loop {
            assert!(
                Instant::now() < deadline,
                "the writer never blocked ({written} bytes written)"
            );
            assert!(
                written < 512 << 20,
                "the relay keeps accepting bytes: {written} written"
            );
            match timeout(Duration::from_millis(300), wr.write(&chunk)).await {
                Ok(n) => {
                    written += n.unwrap();
                    still = 0;
                }
                Err(_) => {
                    let now = Counters::get(&relay.counters.bytes_to_target);
                    still = if now == moved { still + 1 } else { 0 };
                    moved = now;
                    if still == 3 {
                        break;
                    }
                }
            }
        }
        let delivered = Counters::get(&relay.counters.bytes_to_target);
        let stats = relay.pool.stats();
        eprintln!(
            "writer blocked after {written} bytes; {delivered} delivered upstream; pool {stats:?}"
        );
        // One direction holds a (full) pipe; the idle one holds none.
        assert_eq!(stats.in_use, 1, "{stats:?}");
        // Nothing more moves while the reader does not read.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(Counters::get(&relay.counters.bytes_to_target), delivered);
        // The relay holds at most one pipe of what the writer wrote; the
        // rest sits in the kernel's socket buffers.
        assert!(written as u64 >= delivered);
        assert!(
            written < 256 << 20,
            "{written} bytes accepted from a blocked writer"
        );

        // The reader wakes up: everything arrives.
        go_tx.send(()).unwrap();
        wr.shutdown().await.unwrap();
        let got = timeout(Duration::from_secs(10), srv)
            .await
            .expect("drain timed out")
            .unwrap();
        assert_eq!(got, written);
        relay.wait_finished(1, Duration::from_secs(5)).await;
        assert_eq!(relay.pool.stats().in_use, 0);
    });
}

#[test]
fn thousand_concurrent_connections_echo() {
    let _heavy = heavy();
    raise_nofile();
    let rt = runtime();
    rt.block_on(async {
        let (echo, _server) = echo_server().await;
        let relay = TcpRelay::start(echo, TcpRelayConfig::default()).await;
        let started = Instant::now();
        let clients: Vec<_> = (0..1000u32)
            .map(|id| {
                let addr = relay.addr;
                tokio::spawn(async move {
                    let mut conn = TcpStream::connect(addr).await?;
                    let msg: Vec<u8> = (0..4096u32)
                        .map(|i| (id.wrapping_mul(31).wrapping_add(i) % 253) as u8)
                        .collect();
                    conn.write_all(&msg).await?;
                    let mut back = vec![0u8; msg.len()];
                    conn.read_exact(&mut back).await?;
                    conn.shutdown().await?;
                    let mut rest = Vec::new();
                    conn.read_to_end(&mut rest).await?;
                    io::Result::Ok(back == msg && rest.is_empty())
                })
            })
            .collect();
        let all = timeout(
            Duration::from_secs(30),
            futures_util::future::join_all(clients),
        )
        .await
        .expect("1000 echoes timed out");
        let ok = all
            .into_iter()
            .filter(|r| matches!(r, Ok(Ok(true))))
            .count();
        assert_eq!(ok, 1000, "connections that echoed correctly");
        relay.wait_finished(1000, Duration::from_secs(10)).await;
        let failed = relay
            .results
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.is_err())
            .count();
        assert_eq!(failed, 0);
        relay.wait_no_pipe_in_use(Duration::from_secs(5)).await;
        let stats = relay.pool.stats();
        eprintln!("1000 echoes in {:?}; pool {stats:?}", started.elapsed());
        // Pipes came back and were reused.
        assert!(stats.reused > 0 && stats.idle <= 64, "{stats:?}");
        assert_eq!(Counters::get(&relay.counters.bytes_to_target), 4096 * 1000);
        assert_eq!(Counters::get(&relay.counters.bytes_to_client), 4096 * 1000);
    });
}

#[test]
fn idle_connections_hold_no_pipe() {
    raise_nofile();
    let rt = runtime();
    rt.block_on(async {
        let (echo, _server) = echo_server().await;
        let relay = TcpRelay::start(echo, TcpRelayConfig::default()).await;
        let mut conns = Vec::new();
        for i in 0..200u32 {
            let mut conn = TcpStream::connect(relay.addr).await.unwrap();
            conn.write_all(&i.to_le_bytes()).await.unwrap();
            let mut back = [0u8; 4];
            timeout(Duration::from_secs(5), conn.read_exact(&mut back))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(back, i.to_le_bytes());
            conns.push(conn);
        }
        // All 200 relays are alive and idle: no pipe held.
        relay.wait_no_pipe_in_use(Duration::from_secs(5)).await;
        assert_eq!(relay.started.load(Ordering::SeqCst), 200);
        assert_eq!(relay.finished(), 0);
        let stats = relay.pool.stats();
        assert!(
            stats.created <= 64 + 2,
            "pipes are shared, not one per connection: {stats:?}"
        );
        drop(conns);
        relay.wait_finished(200, Duration::from_secs(10)).await;
        let stats = relay.pool.stats();
        assert_eq!(stats.in_use, 0, "{stats:?}");
        assert!(stats.idle <= 64);
    });
}

#[test]
fn a_pool_of_undersized_pipes_still_relays() {
    let rt = runtime();
    rt.block_on(async {
        let (echo, _server) = echo_server().await;
        // Pipes of one page: every direction works through a tiny pipe.
        let cfg = TcpRelayConfig {
            pipe_size: 4096,
            ..TcpRelayConfig::default()
        };
        let relay = TcpRelay::start(echo, cfg).await;
        let mut conn = TcpStream::connect(relay.addr).await.unwrap();
        let msg: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 241) as u8).collect();
        let (mut rd, mut wr) = conn.split();
        let (_, back) = timeout(Duration::from_secs(10), async {
            tokio::join!(
                async {
                    wr.write_all(&msg).await.unwrap();
                    wr.shutdown().await.unwrap();
                },
                async {
                    let mut back = Vec::new();
                    rd.read_to_end(&mut back).await.unwrap();
                    back
                }
            )
        })
        .await
        .unwrap();
        assert!(back == msg);
    });
}

#[test]
fn the_future_of_a_connection_is_small() {
    let rt = runtime();
    rt.block_on(async {
        let listener = listen("127.0.0.1:0".parse().unwrap());
        let a = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (b, _) = listener.accept().await.unwrap();
        let pool = PipePool::new(DEFAULT_PIPE_SIZE, 1);
        let counters = Counters::default();
        let cfg = TcpRelayConfig::default();
        let fut = splice_duplex(a, b, &pool, &counters, &cfg);
        // An idle connection costs its future and two registrations; the
        // issue's budget is 4 KiB of user space per idle connection. Each
        // wait also listens for a hand-over's park request, which took the
        // future from 1.7 KB to 3.4 KB (release and debug alike).
        let size = std::mem::size_of_val(&fut);
        eprintln!("splice_duplex future: {size} bytes");
        assert!(size <= 3584, "splice_duplex future is {size} bytes");
    });
}

/// Bulk mode raises SO_RCVLOWAT after a large burst; a small message after
/// it (the tail of a transfer, or a request on the same connection) must
/// still go through, and the connection must fall back to small messages.
#[test]
fn small_messages_after_a_bulk_burst_are_not_held_back() {
    let rt = runtime();
    rt.block_on(async {
        let (echo, _server) = echo_server().await;
        let relay = TcpRelay::start(echo, TcpRelayConfig::default()).await;
        let conn = TcpStream::connect(relay.addr).await.unwrap();
        conn.set_nodelay(true).unwrap();
        let (mut rd, mut wr) = conn.into_split();
        const BULK: usize = 8 << 20;
        // Far above the bulk threshold, so that both directions go bulk.
        let reader = tokio::spawn(async move {
            let mut buf = vec![0u8; 1 << 20];
            let mut got = 0;
            while got < BULK {
                let n = rd.read(&mut buf).await.unwrap();
                assert!(n > 0, "end of file after {got} bytes");
                got += n;
            }
            rd
        });
        let chunk = vec![0x5au8; 1 << 20];
        for _ in 0..BULK / chunk.len() {
            wr.write_all(&chunk).await.unwrap();
        }
        let mut rd = timeout(Duration::from_secs(20), reader)
            .await
            .expect("bulk echo timed out")
            .unwrap();
        // Then request/reply with a few bytes each: each reply must come
        // (a held-back tail would stall here until the deadline).
        for i in 0..200u32 {
            let msg = format!("request {i:05}");
            wr.write_all(msg.as_bytes()).await.unwrap();
            let mut reply = vec![0u8; msg.len()];
            timeout(Duration::from_secs(5), rd.read_exact(&mut reply))
                .await
                .unwrap_or_else(|_| panic!("reply {i} never came"))
                .unwrap();
            assert_eq!(reply, msg.as_bytes());
        }
        wr.shutdown().await.unwrap();
        let mut rest = Vec::new();
        timeout(Duration::from_secs(5), rd.read_to_end(&mut rest))
            .await
            .expect("end of file timed out")
            .expect("a clean end of file, not a reset");
        assert!(rest.is_empty());
        relay.wait_finished(1, Duration::from_secs(5)).await;
        assert!(relay.results.lock().unwrap()[0].is_ok());
        let total = (BULK + 200 * 13) as u64;
        assert_eq!(
            relay.counters.bytes_to_target.load(Ordering::Relaxed),
            total
        );
        assert_eq!(
            relay.counters.bytes_to_client.load(Ordering::Relaxed),
            total
        );
    });
}

/// Thousands of one-byte segments: the pipe's slots run out long before
/// its bytes do, so a short splice must not be taken for a drained socket.
#[test]
fn many_one_byte_segments_all_arrive() {
    let rt = runtime();
    rt.block_on(async {
        let server = listen("127.0.0.1:0".parse().unwrap());
        let server_addr = server.local_addr().unwrap();
        const N: usize = 20_000;
        let srv = tokio::spawn(async move {
            let (mut conn, _) = server.accept().await.unwrap();
            let mut all = Vec::new();
            conn.read_to_end(&mut all).await.unwrap();
            all
        });
        let cfg = TcpRelayConfig {
            pipe_size: 64 * 1024,
            ..TcpRelayConfig::default()
        };
        let relay = TcpRelay::start(server_addr, cfg).await;
        let mut conn = TcpStream::connect(relay.addr).await.unwrap();
        conn.set_nodelay(true).unwrap();
        for i in 0..N {
            conn.write_all(&[(i % 251) as u8]).await.unwrap();
        }
        conn.shutdown().await.unwrap();
        let all = timeout(Duration::from_secs(20), srv)
            .await
            .expect("the server never saw end of file")
            .unwrap();
        assert_eq!(all.len(), N);
        assert!(all.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        relay.wait_finished(1, Duration::from_secs(5)).await;
    });
}
