//! `edgelinkd run --takeover`: the running daemon hands its listeners,
//! live connections and UDP sessions over and exits 0; the new one serves
//! them on. Refusals and failures leave the old one serving.

use crate::lab::*;
use edgelink_tests::*;
use std::io::{Read, Write};
use std::time::Duration;

#[test]
fn a_takeover_carries_live_connections_udp_sessions_and_listeners() {
    let mut l = DLab::new();
    // A relayed TCP connection with bytes both ways, and a UDP session.
    let mut c = l.connect(API).unwrap();
    assert_eq!(echo(&mut c, b"before\n"), b"before\n");
    let udp = UdpClient::new(&l.client, CLIENT_IP, pod_addr(UDP));
    let udp_echo = |msg: &[u8]| udp.echo(msg);
    assert_eq!(udp_echo(b"u1"), b"u1");
    let old_pid = l.daemon().pid();

    l.take_over();
    assert_ne!(l.daemon().pid(), old_pid);
    // The same connection goes on, through the new daemon.
    assert_eq!(echo(&mut c, b"after\n"), b"after\n");
    assert_eq!(udp_echo(b"u2"), b"u2");
    let s = l.wait_serving();
    assert_eq!(
        l.forward("api")["activeConnections"],
        1,
        "the live connection is counted by the new daemon: {s:#}"
    );
    assert_eq!(l.forward("telemetry")["udpSessions"], 1, "{s:#}");
    assert_eq!(
        l.forward("telemetry")["udpSessionsTotal"],
        0,
        "the session was not made again: {s:#}"
    );
    // New connections too, and the control socket answers (CHECK).
    l.echo_once(b"new\n");
    l.call("CHECK").ok_empty();
    let log = l.daemon().log_text();
    assert!(log.contains("taking over 10 forwards"), "{log}");
    // A half-close passes through the new daemon.
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
}

#[test]
fn a_peer_of_another_protocol_is_refused_and_the_old_daemon_serves_on() {
    let mut l = DLab::new();
    let mut c = l.connect(API).unwrap();
    assert_eq!(echo(&mut c, b"one\n"), b"one\n");
    let mut new = l.spawn_takeover(&["--handover-protocol", "99"]);
    let st = new.wait_exit(Duration::from_secs(10));
    let log = new.log_text();
    assert!(st.is_some_and(|s| s.code() == Some(1)), "{st:?}: {log}");
    let speaks = format!(
        "hand-over protocol {}, the new edgelinkd",
        edgelink_handover::PROTOCOL
    );
    assert!(
        log.contains(&speaks) && log.contains("protocol 99"),
        "{log}"
    );
    assert!(l.daemon().running());
    assert_eq!(echo(&mut c, b"two\n"), b"two\n");
    l.echo_once(b"new\n");
    let old = l.daemon().log_text();
    assert!(old.contains("hand-over refused: serving on"), "{old}");
}

#[test]
fn a_new_daemon_that_fails_before_it_confirms_leaves_the_old_one_serving() {
    use edgelink_handover::{Channel, Message, Peer, PROTOCOL};
    let mut l = DLab::new();
    let mut c = l.connect(API).unwrap();
    assert_eq!(echo(&mut c, b"one\n"), b"one\n");
    // A "new daemon" that takes the inventory and the descriptors, then
    // dies without a Confirm.
    let sock = l.lab.state.path().join("edgelinkd.sock");
    let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"handover\n").unwrap();
    let mut ack = [0u8; 12];
    s.read_exact(&mut ack).unwrap();
    assert_eq!(&ack, b"ok handover\n");
    let mut ch = Channel::new(s, Duration::from_secs(10)).unwrap();
    ch.send(&Message::Hello(Peer {
        protocol: PROTOCOL,
        version: "test".into(),
        instance: "a-test".into(),
    }))
    .unwrap();
    assert!(matches!(ch.expect("Welcome").unwrap(), Message::Welcome(_)));
    let n = match ch.expect("Inventory").unwrap() {
        Message::Inventory { fds, state } => {
            state.check(fds as usize).unwrap();
            assert_eq!(
                state
                    .forwards
                    .iter()
                    .map(|f| f.connections.len())
                    .sum::<usize>(),
                1
            );
            fds as usize
        }
        m => panic!("{m:?}"),
    };
    let fds = ch.recv_fds(n).unwrap();
    assert_eq!(fds.len(), n);
    drop(fds);
    drop(ch);
    // The old daemon takes its own state back: the connection goes on,
    // and new ones are served.
    let d = l.daemon();
    wait_until(Duration::from_secs(10), || {
        d.log_text().contains("hand-over failed: serving on")
    });
    assert!(d.running());
    assert_eq!(echo(&mut c, b"two\n"), b"two\n");
    l.echo_once(b"new\n");
    l.wait_status(Duration::from_secs(5), "the one live connection", |s| {
        forward_of(s, "api")["activeConnections"] == 1
    });
}

/// Protocol 2 added the Ack; protocol 1 (before it) still hands over to
/// it and takes over from it, so a rolling update from a protocol-1
/// daemon, or back to one, is a hand-over too. (A daemon started with
/// `--handover-protocol 1` speaks protocol 1 as both sides; its
/// messages are those of protocol 1, without the fields added since.)
#[test]
fn protocol_1_and_protocol_2_hand_over_to_each_other() {
    let mut l = DLab::with(Opts {
        flags: &["--handover-protocol", "1"],
        ..Default::default()
    });
    let mut c = l.connect(API).unwrap();
    assert_eq!(echo(&mut c, b"one\n"), b"one\n");
    // Protocol 1 to 2: the new daemon is refused, asks again in 1.
    l.flags = Vec::new();
    l.take_over();
    let log = l.daemon().log_text();
    assert!(
        log.contains("asking again in hand-over protocol 1") && log.contains("protocol=1"),
        "{log}"
    );
    assert_eq!(echo(&mut c, b"two\n"), b"two\n");
    // Protocol 2 to 1.
    l.flags = vec!["--handover-protocol".into(), "1".into()];
    l.take_over();
    assert!(l.daemon().log_text().contains("protocol=1"));
    assert_eq!(echo(&mut c, b"three\n"), b"three\n");
    l.echo_once(b"new\n");
    l.wait_status(Duration::from_secs(5), "the one live connection", |s| {
        forward_of(s, "api")["activeConnections"] == 1
    });
}

#[test]
fn an_instance_that_handed_over_does_not_take_back() {
    let mut l = DLab::with(Opts {
        daemon: false,
        ..Default::default()
    });
    // pod-a starts afresh, pod-b takes over from it.
    let a = l.spawn_takeover(&["--instance-id", "pod-a"]);
    l.daemon = Some(a);
    l.wait_serving();
    let new = l.spawn_takeover(&["--instance-id", "pod-b"]);
    let mut old = l.daemon.replace(new).unwrap();
    assert!(old
        .wait_exit(Duration::from_secs(10))
        .is_some_and(|s| s.success()));
    // pod-a's container restarts with --takeover: it idles.
    let mut again_a = l.spawn_takeover(&["--instance-id", "pod-a"]);
    let log = again_a.log_text();
    assert!(again_a.running(), "{log}");
    assert!(
        log.contains("idle until stopped") && log.contains("pod-a handed everything"),
        "{log}"
    );
    assert!(l.daemon().running());
    l.echo_once(b"still served by pod-b\n");
    again_a.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(again_a
        .wait_exit(Duration::from_secs(5))
        .is_some_and(|s| s.success()));
}

#[test]
fn takeover_with_nobody_running_starts_afresh() {
    let mut l = DLab::with(Opts {
        daemon: false,
        ..Default::default()
    });
    let new = l.spawn_takeover(&[]);
    l.daemon = Some(new);
    assert!(l.daemon().log_text().contains("starting afresh"));
    l.wait_serving();
    l.echo_once(b"fresh\n");
}

/// The proof: 200 long TCP connections streaming through the echo
/// forward and checking every byte, 50 UDP clients, and a loop of new
/// connections, while edgelinkd is upgraded 20 times in a row. Nothing is
/// refused, reset, lost or reordered; UDP loss is counted and printed.
#[test]
fn twenty_takeovers_in_a_row_under_load_lose_nothing() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const STREAMS: usize = 200;
    const UDP_CLIENTS: usize = 50;
    const UPGRADES: usize = 20;
    let _nofile = raise_nofile();
    let mut l = DLab::new();
    let stop = Arc::new(AtomicBool::new(false));
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let verified = Arc::new(AtomicU64::new(0));
    let byte =
        |conn: usize, i: u64| (i.wrapping_mul(131).wrapping_add(conn as u64 * 7) % 253) as u8;

    // The long connections: write a chunk, read it back, check it.
    let mut streams = Vec::new();
    for conn in 0..STREAMS {
        let (stop, errors, verified) = (stop.clone(), errors.clone(), verified.clone());
        streams.push(l.cl.spawn(async move {
            let mut s = match tokio::net::TcpStream::connect(pod_addr(API)).await {
                Ok(s) => s,
                Err(e) => {
                    return errors
                        .lock()
                        .unwrap()
                        .push(format!("stream {conn}: connect: {e}"))
                }
            };
            let mut at = 0u64;
            let mut out = vec![0u8; 4096];
            let mut back = vec![0u8; 4096];
            while !stop.load(Ordering::Relaxed) {
                for (k, b) in out.iter_mut().enumerate() {
                    *b = byte(conn, at + k as u64);
                }
                let step = async {
                    s.write_all(&out).await?;
                    s.read_exact(&mut back).await?;
                    Ok::<_, std::io::Error>(())
                };
                match tokio::time::timeout(Duration::from_secs(10), step).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        return errors
                            .lock()
                            .unwrap()
                            .push(format!("stream {conn} at {at}: {e}"))
                    }
                    Err(_) => {
                        return errors
                            .lock()
                            .unwrap()
                            .push(format!("stream {conn} at {at}: stuck 10 s"))
                    }
                }
                if back != out {
                    return errors
                        .lock()
                        .unwrap()
                        .push(format!("stream {conn} at {at}: bytes differ"));
                }
                at += out.len() as u64;
                verified.fetch_add(out.len() as u64, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // A clean end: half-close, the echo ends too.
            let _ = s.shutdown().await;
            let mut rest = Vec::new();
            match tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest)).await {
                Ok(Ok(_)) if rest.is_empty() => {}
                other => errors
                    .lock()
                    .unwrap()
                    .push(format!("stream {conn}: end {other:?}")),
            }
        }));
    }
    // New connections, one after the other.
    let fresh_ok = Arc::new(AtomicU64::new(0));
    let slowest = Arc::new(AtomicU64::new(0));
    let fresh = {
        let (stop, errors, ok) = (stop.clone(), errors.clone(), fresh_ok.clone());
        let slowest = slowest.clone();
        l.cl.spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let msg = format!("new {i}\n");
                let t = std::time::Instant::now();
                let one = async {
                    let mut s = tokio::net::TcpStream::connect(pod_addr(API)).await?;
                    s.write_all(msg.as_bytes()).await?;
                    let mut b = vec![0u8; msg.len()];
                    s.read_exact(&mut b).await?;
                    Ok::<_, std::io::Error>(b)
                };
                match tokio::time::timeout(Duration::from_secs(10), one).await {
                    Ok(Ok(b)) if b == msg.as_bytes() => {
                        ok.fetch_add(1, Ordering::Relaxed);
                        slowest.fetch_max(t.elapsed().as_micros() as u64, Ordering::Relaxed);
                    }
                    other => errors
                        .lock()
                        .unwrap()
                        .push(format!("new connection {i}: {other:?}")),
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    // UDP clients: a datagram every 50 ms each; replies counted.
    let (udp_sent, udp_got) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut udp = Vec::new();
    for c in 0..UDP_CLIENTS {
        let (stop, sent, got, errors) = (
            stop.clone(),
            udp_sent.clone(),
            udp_got.clone(),
            errors.clone(),
        );
        udp.push(l.cl.spawn(async move {
            let s = tokio::net::UdpSocket::bind(format!("{CLIENT_IP}:0"))
                .await
                .unwrap();
            s.connect(pod_addr(UDP)).await.unwrap();
            let mut seq = 0u64;
            let mut b = [0u8; 64];
            while !stop.load(Ordering::Relaxed) {
                let msg = format!("{c} {seq}");
                if s.send(msg.as_bytes()).await.is_ok() {
                    sent.fetch_add(1, Ordering::Relaxed);
                }
                seq += 1;
                let deadline = tokio::time::Instant::now() + Duration::from_millis(50);
                while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, s.recv(&mut b)).await {
                    if !b[..n].starts_with(format!("{c} ").as_bytes()) {
                        errors
                            .lock()
                            .unwrap()
                            .push(format!("UDP client {c} got another's datagram"));
                    }
                    got.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }

    std::thread::sleep(Duration::from_secs(2));
    let started = std::time::Instant::now();
    for n in 0..UPGRADES {
        l.take_over();
        assert!(
            errors.lock().unwrap().is_empty(),
            "after upgrade {n}: {:?}",
            errors.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(400));
    }
    let took = started.elapsed();
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    for t in streams.into_iter().chain(udp).chain([fresh]) {
        l.cl.join(t);
    }
    let errors = errors.lock().unwrap().clone();
    let (sent, got) = (
        udp_sent.load(Ordering::Relaxed),
        udp_got.load(Ordering::Relaxed),
    );
    let log = l.daemon().log_text();
    eprintln!(
        "{UPGRADES} take-overs in {took:?}: {STREAMS} streams, {} MiB echoed and checked, \
         {} new connections (slowest round trip {:.1} ms), 0 failed; \
         UDP {sent} sent, {got} answered, {} lost ({:.3}%)",
        verified.load(Ordering::Relaxed) >> 20,
        fresh_ok.load(Ordering::Relaxed),
        slowest.load(Ordering::Relaxed) as f64 / 1000.0,
        sent.saturating_sub(got),
        100.0 * sent.saturating_sub(got) as f64 / sent.max(1) as f64
    );
    assert!(errors.is_empty(), "{} failures: {errors:#?}", errors.len());
    assert!(fresh_ok.load(Ordering::Relaxed) > 100);
    assert!(log.contains("took over"), "{log}");
}
