//! The hand-over's races, found in the third review (issue 20, items 14,
//! 19, 20, 21): a Confirm that comes too late, SIGTERM in the middle of a
//! hand-over, two takers in a row, and a queue under `maxConnections`
//! across a takeover; every stream through them checked byte for byte.

use crate::lab::*;
use edgelink_tests::*;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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

/// SIGTERM to the running daemon as soon as its log says it is handing
/// over; the thread's result tells whether the hand-over started (20 s).
fn sigterm_once_handing_over(l: &mut DLab) -> std::thread::JoinHandle<bool> {
    let (old_pid, old_log) = (l.daemon().pid(), l.daemon().log.clone());
    std::thread::spawn(move || {
        let started = wait_until(Duration::from_secs(20), || {
            std::fs::read_to_string(&old_log).is_ok_and(|t| t.contains("handing over"))
        });
        let _ = nix::sys::signal::kill(old_pid, nix::sys::signal::Signal::SIGTERM);
        started
    })
}

/// Review item 20: SIGTERM to the old daemon while it hands over waits for
/// the hand-over's outcome: it succeeds, the old daemon exits 0 from it,
/// and the new one keeps its control socket (CHECK answers) and every
/// stream.
#[test]
fn sigterm_during_a_handover_waits_for_it_and_leaves_the_new_daemon_whole() {
    let mut l = DLab::new();
    let stream = CheckedStream::start(&l);
    let term = sigterm_once_handing_over(&mut l);
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
    let term = sigterm_once_handing_over(&mut l);
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
