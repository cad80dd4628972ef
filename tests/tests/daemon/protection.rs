//! Device protection (issue 12): a fragile device (listen backlog 5, one
//! accept every 5 ms, like an embedded TCP stack) behind a forward with
//! `maxConnections`: bursts of 200 and 1000 clients all complete, the queue
//! drains; a client that waits too long is closed and counted; connects
//! refused while a device restarts are retried.

use crate::lab::*;
use edgelink_tests::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const FRAGILE: u16 = 9010;
const LATE: u16 = 9011;
const ONCE: u16 = 9012;

/// A device's TCP stack that accepts one connection every `every` from a
/// backlog of `backlog`, and echoes on each until the client closes. Stops
/// when dropped.
struct FragileDevice {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FragileDevice {
    fn start(ns: &Netns, addr: SocketAddr, backlog: i32, every: Duration) -> FragileDevice {
        let l = in_netns(ns, || {
            let s = socket2::Socket::new(
                socket2::Domain::IPV4,
                socket2::Type::STREAM,
                Some(socket2::Protocol::TCP),
            )?;
            s.set_reuse_address(true)?;
            s.bind(&addr.into())?;
            s.listen(backlog)?;
            s.set_nonblocking(true)?;
            Ok::<_, std::io::Error>(std::net::TcpListener::from(s))
        })
        .unwrap_or_else(|e| panic!("fragile device on {addr}: {e}"));
        let stop = Arc::new(AtomicBool::new(false));
        let halt = stop.clone();
        let thread = std::thread::spawn(move || {
            while !halt.load(Ordering::Relaxed) {
                std::thread::sleep(every);
                let Ok((mut c, _)) = again(|| l.accept()) else {
                    continue;
                };
                let _ = c.set_nonblocking(false);
                let _ = c.set_read_timeout(Some(Duration::from_secs(60)));
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = again(|| c.read(&mut buf)) {
                        if n == 0 || c.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        FragileDevice {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for FragileDevice {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn lab_with(extra: Value) -> DLab {
    DLab::with_forwards(&[], extra)
}

/// `n` clients at once from the client namespace, each: connect, send 64
/// bytes, read them back, close. Returns how many completed.
fn burst(l: &DLab, port: u16, n: usize) -> usize {
    let addr = pod_addr(port);
    l.cl.run(async move {
        let start = Arc::new(tokio::sync::Barrier::new(n));
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let start = start.clone();
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    start.wait().await;
                    let work = async {
                        let mut s = tokio::net::TcpStream::connect(addr).await?;
                        let msg = format!("{i:063}\n");
                        s.write_all(msg.as_bytes()).await?;
                        let mut got = vec![0u8; msg.len()];
                        s.read_exact(&mut got).await?;
                        s.shutdown().await?;
                        Ok::<bool, std::io::Error>(got == msg.as_bytes())
                    };
                    matches!(
                        tokio::time::timeout(Duration::from_secs(60), work).await,
                        Ok(Ok(true))
                    )
                })
            })
            .collect();
        let mut done = 0;
        for t in tasks {
            done += usize::from(t.await.unwrap_or(false));
        }
        done
    })
}

#[test]
fn bursts_of_200_and_1000_clients_to_a_fragile_device_all_complete_and_the_queue_drains() {
    let l = lab_with(json!([{
        "name": "fragile", "protocol": "tcp", "port": FRAGILE,
        "target": format!("{DEVICE_V4}:{FRAGILE}"), "maxConnections": 4
    }]));
    let _device = FragileDevice::start(
        &l.lab.device,
        device_addr(FRAGILE),
        5,
        Duration::from_millis(5),
    );
    let f = l.forward("fragile");
    assert_eq!(f["maxConnections"], 4, "{f:#}");
    assert_eq!(f["queueTimeoutMs"], 30_000, "{f:#}");
    assert_eq!(f["connectRetries"], 2, "{f:#}");
    for n in [200, 1000] {
        assert_eq!(burst(&l, FRAGILE, n), n, "a burst of {n}: some were lost");
    }
    assert!(
        wait_until(Duration::from_secs(10), || {
            let f = l.forward("fragile");
            f["queued"] == 0 && f["activeConnections"] == 0 && f["targetConnections"] == 0
        }),
        "the queue did not drain: {:#}",
        l.forward("fragile")
    );
    let f = l.forward("fragile");
    assert_eq!(f["totalConnections"], 1200, "{f:#}");
    assert_eq!(f["connectErrors"], 0, "{f:#}");
    assert_eq!(f["queueTimeoutsTotal"], 0, "{f:#}");
    assert_eq!(f["queueFullTotal"], 0, "{f:#}");
    // Most had to wait: 4 at a time against 1200.
    assert!(f["queuedTotal"].as_u64().unwrap() > 600, "{f:#}");
    assert_eq!(f["connectLatency"]["count"], 1200, "{f:#}");
    assert_eq!(l.metric("edgelink_queue_length", "fragile"), 0.0);
    assert!(l.metric("edgelink_queued_total", "fragile") > 600.0);
    assert_eq!(
        l.metric("edgelink_connect_latency_seconds_count", "fragile"),
        1200.0
    );
}

#[test]
fn a_client_that_waits_longer_than_queue_timeout_is_closed_and_counted() {
    let l = lab_with(json!([{
        "name": "narrow", "protocol": "tcp", "port": 9013,
        "target": format!("{DEVICE_V4}:{STALL}"), "maxConnections": 1,
        "queueTimeoutMs": 300
    }]));
    // The first holds the only place (the stall server reads nothing).
    let mut first = l.connect(9013).expect("connect");
    first.write_all(b"held").unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || l.forward("narrow")
            ["targetConnections"]
            == 1),
        "{:#}",
        l.forward("narrow")
    );
    let started = Instant::now();
    let mut second = l.connect(9013).expect("connect");
    assert!(
        wait_until(Duration::from_secs(5), || l.forward("narrow")["queued"]
            == 1),
        "the second client is not queued: {:#}",
        l.forward("narrow")
    );
    assert_eq!(read_end(&mut second), Ended::Reset);
    assert!(started.elapsed() >= Duration::from_millis(300));
    let f = l.forward("narrow");
    assert_eq!(f["queueTimeoutsTotal"], 1, "{f:#}");
    assert_eq!(f["queued"], 0, "{f:#}");
    assert_eq!(l.metric("edgelink_queue_timeouts_total", "narrow"), 1.0);
    // A client that gives up while waiting (a reset: a FIN alone is a
    // half-close, and stays) leaves the queue at once.
    let third = l.connect(9013).expect("connect");
    assert!(wait_until(Duration::from_secs(5), || l.forward("narrow")
        ["queued"]
        == 1));
    socket2::SockRef::from(&third)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(third);
    assert!(
        wait_until(Duration::from_secs(5), || l.forward("narrow")
            ["queueAbandonedTotal"]
            == 1),
        "{:#}",
        l.forward("narrow")
    );
    assert_eq!(l.forward("narrow")["queued"], 0);
    drop(first);
    l.seen.stall_release.notify_waiters();
}

#[test]
fn a_connect_refused_while_the_device_restarts_is_retried_with_backoff() {
    let l = lab_with(json!([
        {"name": "late", "protocol": "tcp", "port": LATE,
         "target": format!("{DEVICE_V4}:{LATE}"), "connectRetries": 5},
        {"name": "once", "protocol": "tcp", "port": ONCE,
         "target": format!("{DEVICE_V4}:{ONCE}"), "connectRetries": 0}
    ]));
    // Nothing listens yet: the first connects are refused. The device's
    // service comes up 300 ms later, inside the backoff (0.1+0.2+0.4+...).
    let client = {
        let ns_client = l.client.path();
        std::thread::spawn(move || {
            let ns = edgelink_netns::Netns::open(&ns_client).unwrap();
            let mut s = ns
                .run(|| {
                    std::net::TcpStream::connect_timeout(&pod_addr(LATE), Duration::from_secs(5))
                })
                .unwrap()
                .expect("connect to late");
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            echo(&mut s, b"after the restart\n")
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let _device = FragileDevice::start(
        &l.lab.device,
        device_addr(LATE),
        16,
        Duration::from_millis(1),
    );
    assert_eq!(client.join().unwrap(), b"after the restart\n");
    let f = l.forward("late");
    assert!(f["connectRetriesTotal"].as_u64().unwrap() >= 1, "{f:#}");
    assert_eq!(f["connectErrors"], 0, "{f:#}");
    assert!(l.metric("edgelink_connect_retries_total", "late") >= 1.0);

    // connectRetries 0: refused once, the client is reset at once (maybe
    // before its own connect returned).
    match l.connect(ONCE) {
        Ok(mut s) => assert_eq!(read_end(&mut s), Ended::Reset),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    let f = l.forward("once");
    assert_eq!(f["connectRetriesTotal"], 0, "{f:#}");
    assert_eq!(f["connectErrors"], 1, "{f:#}");
}
