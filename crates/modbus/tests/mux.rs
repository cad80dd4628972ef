//! The multiplexer against a PLC that serves one connection and one
//! request at a time (tests/plc.rs), on loopback: 20 clients polling
//! different registers, a client killed mid-request, the device
//! restarted, malformed frames from both sides, a response that never
//! comes.

use edgelink_modbus::testing::{read_register, Plc, Seen, GARBAGE, SILENT};
use edgelink_modbus::{Config, Connect, Mux, Stats};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn config() -> Config {
    Config {
        max_connections: 1,
        max_in_flight: 1,
        queue_timeout: Duration::from_secs(10),
        response_timeout: Duration::from_millis(300),
        max_queue: 4096,
        connect_retries: 2,
        retry_backoff: Duration::from_millis(50),
    }
}

/// The multiplexer of the device at `device`, serving clients on a
/// loopback port: (its address, the multiplexer).
async fn front(device: SocketAddr, cfg: Config) -> (SocketAddr, Arc<Mux>) {
    let connect: Connect = Arc::new(move || Box::pin(TcpStream::connect(device)));
    let mux = Arc::new(Mux::new(cfg, connect));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let m = mux.clone();
    tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            let m = m.clone();
            tokio::spawn(async move { m.serve(c).await });
        }
    });
    (addr, mux)
}

/// A PLC serving each request in `service`, and its multiplexer in front:
/// (the PLC, what it saw, the multiplexer's address, the multiplexer).
async fn lab(service: Duration) -> (Plc, Arc<Seen>, SocketAddr, Arc<Mux>) {
    let seen = Arc::new(Seen::default());
    let plc = Plc::start("127.0.0.1:0".parse().unwrap(), service, seen.clone()).await;
    let (addr, mux) = front(plc.addr, config()).await;
    (plc, seen, addr, mux)
}

fn get(c: &std::sync::atomic::AtomicU64) -> u64 {
    Stats::get(c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_clients_share_one_connection_and_each_gets_its_own_answers() {
    let (_plc, seen, addr, mux) = lab(Duration::from_millis(2)).await;
    let mut clients = Vec::new();
    for i in 0..20u16 {
        clients.push(tokio::spawn(async move {
            let mut c = TcpStream::connect(addr).await.unwrap();
            for k in 0..20u16 {
                // Every client uses the same transaction ids: the device
                // sees only its own.
                let register = i * 100 + k;
                let got = read_register(&mut c, k, i as u8, register).await.unwrap();
                assert_eq!(got, Ok(register), "client {i}, request {k}");
            }
        }));
    }
    for c in clients {
        tokio::time::timeout(Duration::from_secs(30), c)
            .await
            .expect("in time")
            .unwrap();
    }
    assert_eq!(Seen::get(&seen.connections), 1, "one connection to the PLC");
    assert_eq!(Seen::get(&seen.second_connections), 0, "never a second one");
    assert_eq!(Seen::get(&seen.served), 400);
    let s = mux.stats();
    assert_eq!((get(&s.requests), get(&s.responses)), (400, 400));
    assert_eq!(get(&s.queued), 0);
    let waited: u64 = s.wait_buckets.iter().map(get).sum();
    assert_eq!(waited, 400, "every request's wait in the histogram");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_leaves_nothing_in_the_queue_and_its_answer_goes_nowhere() {
    let (_plc, seen, addr, mux) = lab(Duration::from_millis(100)).await;
    // Five requests, then gone before the first is answered.
    let mut gone = TcpStream::connect(addr).await.unwrap();
    for k in 0..5u16 {
        let [a0, a1] = (1000 + k).to_be_bytes();
        gone.write_all(&[0, k as u8, 0, 0, 0, 6, 1, 3, a0, a1, 0, 1])
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    drop(gone);
    let mut c = TcpStream::connect(addr).await.unwrap();
    for k in 0..3u16 {
        assert_eq!(
            read_register(&mut c, 7, 9, 2000 + k).await.unwrap(),
            Ok(2000 + k)
        );
    }
    // The first request was on its way; the four others never left.
    assert_eq!(Seen::get(&seen.served), 1 + 3);
    assert_eq!(get(&mux.stats().late_responses), 1, "its answer dropped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_restarted_mid_run_fails_what_was_on_its_way_with_0x0b_and_serves_again() {
    let seen = Arc::new(Seen::default());
    let plc = Plc::start(
        "127.0.0.1:0".parse().unwrap(),
        Duration::from_millis(50),
        seen.clone(),
    )
    .await;
    let device = plc.addr;
    let (addr, mux) = front(device, config()).await;
    let mut c = TcpStream::connect(addr).await.unwrap();
    assert_eq!(read_register(&mut c, 1, 1, 10).await.unwrap(), Ok(10));
    // A request on its way when the device goes.
    let asked = tokio::spawn(async move {
        let r = read_register(&mut c, 2, 1, 11).await.unwrap();
        (c, r)
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    drop(plc);
    let (mut c, r) = asked.await.unwrap();
    assert_eq!(r, Err(0x0B), "failed, not lost");
    // Back after a while: the next request makes the connection again.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _plc = Plc::start(device, Duration::from_millis(5), seen.clone()).await;
    assert_eq!(read_register(&mut c, 3, 1, 12).await.unwrap(), Ok(12));
    assert_eq!(get(&mux.stats().reconnects), 1);
    assert_eq!(get(&mux.stats().exceptions[0x0B]), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_cannot_be_reached_is_answered_0x0a() {
    let unused = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let device = unused.local_addr().unwrap();
    drop(unused);
    let (addr, mux) = front(device, config()).await;
    let mut c = TcpStream::connect(addr).await.unwrap();
    assert_eq!(read_register(&mut c, 4, 1, 10).await.unwrap(), Err(0x0A));
    assert_eq!(get(&mux.stats().exceptions[0x0A]), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_frame_from_a_client_resets_that_client_only() {
    let (_plc, seen, addr, mux) = lab(Duration::from_millis(1)).await;
    let mut good = TcpStream::connect(addr).await.unwrap();
    assert_eq!(read_register(&mut good, 1, 1, 5).await.unwrap(), Ok(5));
    for bad in [
        vec![0, 1, 0, 5, 0, 6, 1, 3, 0, 0, 0, 1], // protocol id 5
        vec![0, 1, 0, 0, 1, 0, 1, 3, 0, 0, 0, 1], // length 256
    ] {
        let mut b = TcpStream::connect(addr).await.unwrap();
        b.write_all(&bad).await.unwrap();
        let mut buf = [0u8; 16];
        let r = tokio::time::timeout(Duration::from_secs(5), b.read(&mut buf))
            .await
            .unwrap();
        assert!(
            matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
            "reset: {r:?}"
        );
    }
    assert_eq!(read_register(&mut good, 2, 1, 6).await.unwrap(), Ok(6));
    assert_eq!(get(&mux.stats().malformed_from_clients), 2);
    assert_eq!(
        Seen::get(&seen.served),
        2,
        "nothing of theirs reached the device"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_answer_drops_the_devices_connection_and_its_request_gets_0x0b() {
    let (_plc, seen, addr, mux) = lab(Duration::from_millis(1)).await;
    let mut c = TcpStream::connect(addr).await.unwrap();
    assert_eq!(read_register(&mut c, 1, 1, 5).await.unwrap(), Ok(5));
    assert_eq!(
        read_register(&mut c, 2, 1, GARBAGE).await.unwrap(),
        Err(0x0B)
    );
    assert_eq!(read_register(&mut c, 3, 1, 7).await.unwrap(), Ok(7));
    let s = mux.stats();
    assert_eq!((get(&s.malformed_from_device), get(&s.reconnects)), (1, 1));
    assert_eq!(Seen::get(&seen.connections), 2, "made again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_that_never_comes_is_answered_0x0b_and_the_next_request_is_served() {
    let (_plc, _seen, addr, mux) = lab(Duration::from_millis(1)).await;
    let mut c = TcpStream::connect(addr).await.unwrap();
    let t = std::time::Instant::now();
    assert_eq!(
        read_register(&mut c, 1, 1, SILENT).await.unwrap(),
        Err(0x0B)
    );
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(3),
        "{took:?}"
    );
    // The connection is given up after another timeout, then made again.
    assert_eq!(read_register(&mut c, 2, 1, 8).await.unwrap(), Ok(8));
    assert_eq!(get(&mux.stats().exceptions[0x0B]), 1);
}
