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

// -- the third review (issue 20): items 14, 19, 20, 21 ----------------------

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A TCP stream through `api` (the device echoes it), written and read
/// back in chunks, every byte's value and place checked, until `finish`.
struct CheckedStream {
    stop: Arc<AtomicBool>,
    checked: Arc<AtomicU64>,
    error: Arc<Mutex<Option<String>>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

fn stream_byte(i: u64) -> u8 {
    (i.wrapping_mul(131).wrapping_add(7) % 251) as u8
}

impl CheckedStream {
    fn start(l: &DLab) -> CheckedStream {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let stop = Arc::new(AtomicBool::new(false));
        let checked = Arc::new(AtomicU64::new(0));
        let error: Arc<Mutex<Option<String>>> = Arc::default();
        let (st, ch, er) = (stop.clone(), checked.clone(), error.clone());
        let task = l.cl.spawn(async move {
            let fail = |e: String| *er.lock().unwrap() = Some(e);
            let mut s = match tokio::net::TcpStream::connect(pod_addr(API)).await {
                Ok(s) => s,
                Err(e) => return fail(format!("connect: {e}")),
            };
            let mut at = 0u64;
            let (mut out, mut back) = (vec![0u8; 32 << 10], vec![0u8; 32 << 10]);
            while !st.load(Ordering::Relaxed) {
                for (k, b) in out.iter_mut().enumerate() {
                    *b = stream_byte(at + k as u64);
                }
                let step = async {
                    s.write_all(&out).await?;
                    s.read_exact(&mut back).await?;
                    Ok::<_, std::io::Error>(())
                };
                match tokio::time::timeout(Duration::from_secs(20), step).await {
                    Ok(Ok(())) if back == out => {}
                    Ok(Ok(())) => return fail(format!("at byte {at}: the bytes differ")),
                    Ok(Err(e)) => return fail(format!("at byte {at}: {e}")),
                    Err(_) => return fail(format!("at byte {at}: stuck for 20 s")),
                }
                at += out.len() as u64;
                ch.store(at, Ordering::Relaxed);
            }
            // A clean end: half-close; the device's echo ends too, with
            // nothing more.
            let _ = s.shutdown().await;
            let mut rest = Vec::new();
            match tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest)).await {
                Ok(Ok(_)) if rest.is_empty() => {}
                other => fail(format!("at the end, after {at} bytes: {other:?}")),
            }
        });
        let s = CheckedStream {
            stop,
            checked,
            error,
            task: Some(task),
        };
        s.advance(1 << 20);
        s
    }

    /// Wait (bounded) until `more` bytes more went both ways and checked.
    fn advance(&self, more: u64) {
        let goal = self.checked.load(Ordering::Relaxed) + more;
        let ok = wait_until(Duration::from_secs(30), || {
            self.checked.load(Ordering::Relaxed) >= goal || self.error.lock().unwrap().is_some()
        });
        let e = self.error.lock().unwrap().clone();
        assert!(ok && e.is_none(), "the checked stream: {e:?}");
    }

    /// End it cleanly; the bytes that went both ways, every one checked.
    fn finish(mut self, l: &DLab) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        l.cl.join(self.task.take().unwrap());
        let e = self.error.lock().unwrap().clone();
        assert!(e.is_none(), "the checked stream: {e:?}");
        self.checked.load(Ordering::Relaxed)
    }
}

/// A "new daemon" that asks for a hand-over and takes the inventory and
/// every descriptor: the channel (to confirm, or drop) and the relayed
/// connections it got.
fn fake_taker(l: &DLab, instance: &str) -> (edgelink_handover::Channel, usize) {
    use edgelink_handover::{Channel, Message, Peer, PROTOCOL};
    let sock = l.lab.state.path().join("edgelinkd.sock");
    let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"handover\n").unwrap();
    let mut ack = [0u8; 12];
    s.read_exact(&mut ack).unwrap();
    assert_eq!(&ack, b"ok handover\n");
    let mut ch = Channel::new(s, Duration::from_secs(20)).unwrap();
    ch.send(&Message::Hello(Peer {
        protocol: PROTOCOL,
        version: "test".into(),
        instance: instance.into(),
    }))
    .unwrap();
    assert!(matches!(ch.expect("Welcome").unwrap(), Message::Welcome(_)));
    let (n, conns) = match ch.expect("Inventory").unwrap() {
        Message::Inventory { fds, state } => {
            state.check(fds as usize).unwrap();
            let conns = state.forwards.iter().map(|f| f.connections.len()).sum();
            (fds as usize, conns)
        }
        m => panic!("{m:?}"),
    };
    assert_eq!(ch.recv_fds(n).unwrap().len(), n);
    (ch, conns)
}

/// Review item 19: a new daemon that confirms after the old one gave up
/// waiting (`--handover-timeout`) is told so and exits without serving;
/// the old one took everything back and alone serves on: the stream
/// through it goes on, every byte checked.
#[test]
fn a_confirm_that_comes_too_late_is_refused_and_only_the_old_daemon_serves() {
    let mut l = DLab::with(Opts {
        flags: &["--handover-timeout", "1"],
        ..Default::default()
    });
    let stream = CheckedStream::start(&l);
    let old_pid = l.daemon().pid();
    let mut new = l.spawn_takeover(&["--test-stall-confirm-ms", "3000"]);
    let st = new.wait_exit(Duration::from_secs(20));
    let log = new.log_text();
    assert!(st.is_some_and(|s| s.code() == Some(1)), "{st:?}: {log}");
    assert!(
        log.contains("did not acknowledge the Confirm") && log.contains("no Confirm within 1s"),
        "{log}"
    );
    assert!(!log.contains("took over"), "{log}");
    let d = l.daemon();
    assert!(d.running() && d.pid() == old_pid);
    assert!(d.log_text().contains("hand-over failed: serving on"));
    stream.advance(4 << 20);
    l.echo_once(b"new, through the old daemon\n");
    l.call("CHECK").ok_empty();
    l.wait_status(Duration::from_secs(5), "the one live connection", |s| {
        forward_of(s, "api")["activeConnections"] == 1
    });
    let n = stream.finish(&l);
    eprintln!("{n} bytes checked");
}

/// Review item 20: SIGTERM to the old daemon while it hands over waits for
/// the hand-over's outcome: it succeeds, the old daemon exits 0 from it,
/// and the new one keeps its control socket (CHECK answers) and every
/// stream.
#[test]
fn sigterm_during_a_handover_waits_for_it_and_leaves_the_new_daemon_whole() {
    let mut l = DLab::new();
    let stream = CheckedStream::start(&l);
    let (old_pid, old_log) = (l.daemon().pid(), l.daemon().log.clone());
    let term = std::thread::spawn(move || {
        let started = wait_until(Duration::from_secs(20), || {
            std::fs::read_to_string(&old_log).is_ok_and(|t| t.contains("handing over"))
        });
        let _ = nix::sys::signal::kill(old_pid, nix::sys::signal::Signal::SIGTERM);
        started
    });
    l.flags = vec!["--test-stall-confirm-ms".into(), "2000".into()];
    l.take_over();
    assert!(term.join().unwrap(), "the hand-over never started");
    let log = l.daemon().log_text();
    assert!(log.contains("took over"), "{log}");
    assert!(l.lab.state.path().join("edgelinkd.sock").exists());
    l.call("CHECK").ok_empty();
    stream.advance(4 << 20);
    l.echo_once(b"new, through the new daemon\n");
    let n = stream.finish(&l);
    eprintln!("{n} bytes checked");
}

/// Review item 20: SIGTERM during a hand-over that then fails: the old
/// daemon takes everything back and drains it as a SIGTERM does (the
/// stream goes on until it ends by itself, every byte checked), then
/// exits 0.
#[test]
fn sigterm_during_a_handover_that_fails_drains_what_it_took_back() {
    let mut l = DLab::with(Opts {
        flags: &["--handover-timeout", "1"],
        ..Default::default()
    });
    let stream = CheckedStream::start(&l);
    let (old_pid, old_log) = (l.daemon().pid(), l.daemon().log.clone());
    let term = std::thread::spawn(move || {
        let started = wait_until(Duration::from_secs(20), || {
            std::fs::read_to_string(&old_log).is_ok_and(|t| t.contains("handing over"))
        });
        let _ = nix::sys::signal::kill(old_pid, nix::sys::signal::Signal::SIGTERM);
        started
    });
    let mut new = l.spawn_takeover(&["--test-stall-confirm-ms", "3000"]);
    assert!(term.join().unwrap(), "the hand-over never started");
    let st = new.wait_exit(Duration::from_secs(20));
    assert!(st.is_some_and(|s| s.code() == Some(1)), "{st:?}");
    // Draining: the live stream goes on.
    let old = l.daemon();
    wait_until(Duration::from_secs(10), || {
        old.log_text().contains("draining")
    });
    assert!(old.running(), "{}", old.log_text());
    stream.advance(4 << 20);
    let n = stream.finish(&l);
    let st = l.daemon().wait_exit(Duration::from_secs(20));
    assert!(st.is_some_and(|s| s.success()), "{st:?}");
    let log = l.daemon().log_text();
    assert!(
        log.contains("waiting for the hand-over under way to end")
            && log.contains("hand-over failed: serving on"),
        "{log}"
    );
    eprintln!("{n} bytes checked");
}

/// Review item 21: a take-over right after a failed one (the first taker
/// took everything and went away; the second asked meanwhile) gets what
/// the first one gave back: the stream goes on through the second taker.
#[test]
fn a_takeover_right_after_a_failed_one_carries_everything() {
    let mut l = DLab::new();
    let stream = CheckedStream::start(&l);
    let (first, conns) = fake_taker(&l, "first-taker");
    assert_eq!(conns, 1);
    // The real taker asks while the first one holds the hand-over; the
    // first one goes away a moment later, without a Confirm.
    let gone = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        drop(first);
    });
    l.take_over();
    gone.join().unwrap();
    let log = l.daemon().log_text();
    assert!(log.contains("1 connections"), "{log}");
    l.wait_status(Duration::from_secs(5), "the live connection", |s| {
        forward_of(s, "api")["activeConnections"] == 1
    });
    stream.advance(4 << 20);
    let n = stream.finish(&l);
    eprintln!("{n} bytes checked");
}

const ONE: u16 = 9100;

/// The device behind forward `one`: echoes each connection, and notes
/// when each opens (the first line, its name, and how many were open
/// then, itself included) and closes.
fn counting_echo(l: &DLab) -> Arc<Mutex<Vec<(String, u64)>>> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let events: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let live = Arc::new(AtomicU64::new(0));
    let listener = l
        .dev
        .run(async { tokio::net::TcpListener::bind(device_addr(ONE)).await })
        .unwrap();
    let ev = events.clone();
    l.dev.spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let (ev, live) = (ev.clone(), live.clone());
            let open = live.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::spawn(async move {
                let (r, mut w) = s.into_split();
                let mut r = tokio::io::BufReader::new(r);
                let mut name = String::new();
                if r.read_line(&mut name).await.is_ok() {
                    ev.lock()
                        .unwrap()
                        .push((format!("open {}", name.trim()), open));
                    let _ = w.write_all(name.as_bytes()).await;
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                }
                let left = live.fetch_sub(1, Ordering::SeqCst) - 1;
                ev.lock()
                    .unwrap()
                    .push((format!("close {}", name.trim()), left));
                let _ = w.shutdown().await;
            });
        }
    });
    events
}

/// Review item 14: a forward with `maxConnections` across a take-over.
/// The old daemon relays two connections (its bound is 2) and three
/// clients wait; the new one's bound is 1. The two relayed keep going
/// (beyond the bound: a debt), nobody waiting gets a place until both
/// ended, and then the waiting ones go one at a time, in the order they
/// came: the device never holds more than the bound once the debt is
/// paid, every byte checked.
#[test]
fn a_queue_under_max_connections_keeps_its_places_and_order_across_a_takeover() {
    let mut l = DLab::with(Opts {
        flags: &["--forward-max-connections", "2"],
        add: false,
        ..Default::default()
    });
    let events = counting_echo(&l);
    l.conf["forwards"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!(
            {"name": "one", "protocol": "tcp", "port": ONE,
             "target": format!("{DEVICE_V4}:{ONE}"), "queueTimeoutMs": 60000}
        ));
    l.add();
    l.wait_serving();
    let say =
        |s: &mut std::net::TcpStream, m: &str| assert_eq!(echo(s, m.as_bytes()), m.as_bytes());
    let mut relayed: Vec<std::net::TcpStream> = Vec::new();
    for name in ["c1", "c2"] {
        let mut s = l.connect(ONE).unwrap();
        say(&mut s, &format!("{name}\n"));
        relayed.push(s);
    }
    let mut waiting: Vec<std::net::TcpStream> = Vec::new();
    for (i, name) in ["q1", "q2", "q3"].into_iter().enumerate() {
        let mut s = l.connect(ONE).unwrap();
        s.write_all(format!("{name}\n").as_bytes()).unwrap();
        waiting.push(s);
        l.wait_status(Duration::from_secs(10), "queued in order", |s| {
            forward_of(s, "one")["queued"] == i as u64 + 1
        });
    }
    l.flags = vec!["--forward-max-connections".into(), "1".into()];
    l.take_over();
    // Both relayed go on; the three still wait.
    for (i, s) in relayed.iter_mut().enumerate() {
        say(s, &format!("more from c{}\n", i + 1));
    }
    l.wait_status(Duration::from_secs(10), "2 at the device, 3 waiting", |s| {
        let f = forward_of(s, "one");
        f["targetConnections"] == 2 && f["queued"] == 3
    });
    let end = |mut s: std::net::TcpStream| {
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
    };
    end(relayed.remove(0));
    say(&mut relayed[0], "c2 once c1 ended\n");
    end(relayed.remove(0));
    for (i, mut s) in waiting.into_iter().enumerate() {
        let name = format!("q{}\n", i + 1);
        let mut back = vec![0u8; name.len()];
        s.read_exact(&mut back)
            .expect("the echo of the next waiting client");
        assert_eq!(back, name.as_bytes());
        say(&mut s, &format!("more from q{}\n", i + 1));
        end(s);
    }
    let ev = events.lock().unwrap().clone();
    let opens: Vec<&(String, u64)> = ev.iter().filter(|(e, _)| e.starts_with("open")).collect();
    let names: Vec<&str> = opens.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(
        names,
        ["open c1", "open c2", "open q1", "open q2", "open q3"],
        "{ev:?}"
    );
    assert!(
        opens[2..].iter().all(|(_, open)| *open == 1),
        "a waiting client went while the device held others: {ev:?}"
    );
}
