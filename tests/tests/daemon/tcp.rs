//! TCP forwards: bulk data, many connections, half-close, targets that are
//! down or closed.

use crate::lab::*;
use edgelink_tests::*;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const GIB: u64 = 1 << 30;

#[test]
fn one_gib_through_a_tcp_forward_arrives_with_the_same_sha256() {
    let l = DLab::new();
    let mut sink = ChildGuard::new(
        python(&l.lab.device, SHA_SINK, &[DEVICE_V4, &SINK.to_string()])
            .spawn()
            .expect("python3"),
    );
    let mut line = String::new();
    {
        let out = sink.child().stdout.as_mut().expect("piped");
        let mut b = [0u8; 6];
        out.read_exact(&mut b).expect("sink ready");
        line.push_str(&String::from_utf8_lossy(&b));
    }
    assert_eq!(line, "ready\n");
    let t = Instant::now();
    let sender = ChildGuard::new(
        python(
            &l.client,
            SHA_SENDER,
            &[POD_IP, &SINK.to_string(), &GIB.to_string()],
        )
        .spawn()
        .expect("python3"),
    );
    let out = sender
        .wait_output(Duration::from_secs(90))
        .expect("1 GiB not through within 90 s");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "sender: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // "<sent> <sha> <received> <sha at the sink> <seconds>"
    let w: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(w.len(), 5, "{text}");
    assert_eq!(w[0], GIB.to_string(), "{text}");
    assert_eq!(
        w[2],
        GIB.to_string(),
        "the sink got another byte count: {text}"
    );
    assert_eq!(w[1], w[3], "the hashes differ: {text}");
    let secs: f64 = w[4].parse().unwrap();
    eprintln!(
        "1 GiB through the forward in {secs:.2} s ({:.0} MiB/s; whole test step {:.2} s)",
        1024.0 / secs,
        t.elapsed().as_secs_f64()
    );

    // The counters saw exactly that.
    let answer_len = (w[2].len() + 1 + w[3].len() + 1) as u64;
    let s = l.wait_status(Duration::from_secs(5), "sink counters", |s| {
        let f = forward_of(s, "sink");
        f["activeConnections"] == 0 && f["bytesToClient"] == answer_len
    });
    let f = forward_of(&s, "sink");
    assert_eq!(f["bytesToTarget"], GIB, "{f:#}");
    assert_eq!(f["totalConnections"], 1, "{f:#}");
    assert_eq!(f["errors"], 0, "{f:#}");
    assert_eq!(f["spliceFallbacks"], 0, "{f:#}");
}

#[test]
fn a_thousand_concurrent_connections_each_echo_correctly() {
    thousand_connections(&DLab::new());
}

#[test]
fn a_thousand_connections_with_the_common_soft_fd_limit_of_1024() {
    // systemd's default soft limit, and what containers get from
    // containerd 2: 1000 relayed connections need over 2000 descriptors.
    let l = DLab::with(Opts {
        nofile: Some(1024),
        ..Default::default()
    });
    thousand_connections(&l);
}

fn thousand_connections(l: &DLab) {
    const N: usize = 1000;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<usize, String>>(N);
    let (go_tx, go_rx) = tokio::sync::watch::channel(false);
    let mut handles = Vec::new();
    for i in 0..N {
        let (tx, mut go_rx) = (tx.clone(), go_rx.clone());
        handles.push(l.cl.spawn(async move {
            let bounded = Duration::from_secs(30);
            let run = async {
                let mut s = tokio::net::TcpStream::connect(pod_addr(API))
                    .await
                    .map_err(|e| format!("{i}: connect: {e}"))?;
                // Distinct content and length per connection.
                let msg = format!("connection {i} {}\n", "x".repeat(i % 300));
                let mut back = vec![0u8; msg.len()];
                s.write_all(msg.as_bytes())
                    .await
                    .map_err(|e| format!("{i}: {e}"))?;
                s.read_exact(&mut back)
                    .await
                    .map_err(|e| format!("{i}: {e}"))?;
                if back != msg.as_bytes() {
                    return Err(format!("{i}: got {:?}", String::from_utf8_lossy(&back)));
                }
                let _ = tx.send(Ok(i)).await;
                // Hold the connection until all are open at once.
                go_rx
                    .wait_for(|g| *g)
                    .await
                    .map_err(|e| format!("{i}: {e}"))?;
                let msg2 = format!("second round {i}\n");
                let mut back2 = vec![0u8; msg2.len()];
                s.write_all(msg2.as_bytes())
                    .await
                    .map_err(|e| format!("{i}: {e}"))?;
                s.read_exact(&mut back2)
                    .await
                    .map_err(|e| format!("{i}: {e}"))?;
                if back2 != msg2.as_bytes() {
                    return Err(format!(
                        "{i}: second round got {:?}",
                        String::from_utf8_lossy(&back2)
                    ));
                }
                s.shutdown().await.map_err(|e| format!("{i}: {e}"))?;
                let mut rest = Vec::new();
                s.read_to_end(&mut rest)
                    .await
                    .map_err(|e| format!("{i}: {e}"))?;
                if !rest.is_empty() {
                    return Err(format!("{i}: {} stray bytes", rest.len()));
                }
                Ok(())
            };
            let r = match tokio::time::timeout(bounded, run).await {
                Ok(r) => r,
                Err(_) => Err(format!("{i}: not done within {bounded:?}")),
            };
            if let Err(e) = &r {
                let _ = tx.send(Err(e.clone())).await;
            }
            r
        }));
    }
    drop(tx);
    let t = Instant::now();
    let first = l.cl.run(async move {
        let mut ok = 0;
        let mut errs = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
        while ok + errs.len() < N {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(Ok(_))) => ok += 1,
                Ok(Some(Err(e))) => errs.push(e),
                _ => break,
            }
        }
        (ok, errs)
    });
    assert!(
        first.1.is_empty(),
        "{} failed, e.g. {:?}",
        first.1.len(),
        &first.1[..first.1.len().min(5)]
    );
    assert_eq!(first.0, N, "only {} of {N} connections echoed", first.0);
    eprintln!(
        "{N} connections open and echoed in {:.2} s",
        t.elapsed().as_secs_f64()
    );
    // All of them at once, through the daemon.
    let f = l.forward("api");
    assert_eq!(f["activeConnections"], N as u64, "{f:#}");
    go_tx.send(true).unwrap();
    let mut failures = Vec::new();
    for h in handles {
        if let Err(e) = l.cl.join(h) {
            failures.push(e);
        }
    }
    assert!(
        failures.is_empty(),
        "{} failed, e.g. {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    let s = l.wait_status(Duration::from_secs(10), "all connections closed", |s| {
        forward_of(s, "api")["activeConnections"] == 0
    });
    let f = forward_of(&s, "api");
    assert_eq!(f["totalConnections"], N as u64, "{f:#}");
    assert_eq!(f["errors"], 0, "{f:#}");
    assert_eq!(f["connectErrors"], 0, "{f:#}");
    assert_eq!(f["bytesToTarget"], f["bytesToClient"], "{f:#}");
}

#[test]
fn half_close_is_passed_on_in_both_directions() {
    let l = DLab::new();
    // The client shuts its write side and still gets the device's answer.
    let mut s = l.connect(DRAIN).unwrap();
    let data = vec![7u8; 100_000];
    s.write_all(&data).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer)
        .expect("the answer after our half-close");
    assert_eq!(answer, "100000\n");

    // The device shuts its write side first: the client sees end of file
    // (not a reset) and can still send, and the device gets it all.
    let mut s = l.connect(SPEAK).unwrap();
    let mut hello = Vec::new();
    s.read_to_end(&mut hello)
        .expect("end of file after the device's half-close");
    assert_eq!(hello, HELLO);
    for _ in 0..10 {
        s.write_all(&[1u8; 10_000])
            .expect("send after the device's half-close");
        std::thread::sleep(Duration::from_millis(5));
    }
    s.shutdown(Shutdown::Write).unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || l
            .seen
            .speak
            .lock()
            .unwrap()
            .contains(&100_000)),
        "the device got {:?}",
        l.seen.speak.lock().unwrap()
    );
    // Both ends closed: the relay ends the connection cleanly.
    assert_eq!(read_end(&mut s), Ended::Eof);
    // The upstream socket was made inside the pod's namespace (by the
    // worker, which entered it for that): the device saw the pod's net1.
    let net1: std::net::IpAddr = l.net1_ip().parse().unwrap();
    assert_eq!(*l.seen.speak_peers.lock().unwrap(), vec![net1]);
    let s = l.wait_status(Duration::from_secs(5), "connections ended", |s| {
        forward_of(s, "drain")["activeConnections"] == 0
            && forward_of(s, "speak")["activeConnections"] == 0
    });
    for (name, to_target, to_client) in [
        ("drain", 100_000, 7),
        ("speak", 100_000, HELLO.len() as u64),
    ] {
        let f = forward_of(&s, name);
        assert_eq!(f["bytesToTarget"], to_target, "{f:#}");
        assert_eq!(f["bytesToClient"], to_client, "{f:#}");
        assert_eq!(f["errors"], 0, "{f:#}");
    }
}

#[test]
fn target_down_the_client_sees_the_connection_end_within_the_connect_timeout() {
    let l = DLab::new();
    let (end, took) = connect_and_read(&l.client, pod_addr(DOWN));
    assert!(
        matches!(end, Ended::Reset | Ended::Eof),
        "{end:?} after {took:?}"
    );
    // connectTimeoutMs is 500.
    assert!(
        took >= Duration::from_millis(400),
        "ended after {took:?}, before the timeout"
    );
    // Ended by the forward's connect timeout (a hang would have ended
    // connect_and_read's own 5 s read timeout, as Other), whatever the
    // machine's load made of the wall clock.
    let f = l.forward("down");
    assert!(
        f["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("no answer within 500ms")),
        "{f:#}"
    );
    assert_eq!(f["connectErrors"], 1, "{f:#}");
    assert_eq!(f["reachability"]["state"], "unreachable", "{f:#}");
    assert!(
        f["lastError"].as_str().is_some_and(|e| e.contains(DEAD_IP)),
        "{f:#}"
    );
    assert_eq!(f["activeConnections"], 0, "{f:#}");
    // The listener is still there for the next try.
    assert_eq!(f["listener"], "listening");
}

#[test]
fn target_port_closed_is_an_immediate_reset() {
    let l = DLab::new();
    for _ in 0..3 {
        let (end, took) = connect_and_read(&l.client, pod_addr(CLOSED));
        assert!(matches!(end, Ended::Reset | Ended::Eof), "{end:?}");
        eprintln!("ended after {took:?}");
    }
    let f = l.forward("closed");
    // Immediate: the device's reset ended the connect (ECONNREFUSED), not
    // the forward's connect timeout.
    assert!(
        f["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("refused") && !e.contains("timed out")),
        "{f:#}"
    );
    assert_eq!(f["connectErrors"], 3, "{f:#}");
    assert_eq!(f["totalConnections"], 3, "{f:#}");
    assert_eq!(f["reachability"]["state"], "unreachable", "{f:#}");
    // The other forwards are unaffected.
    l.echo_once(b"still fine\n");
}

/// Close with a reset (SO_LINGER 0) when dropped.
fn linger0(s: &std::net::TcpStream) {
    let zero = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    nix::sys::socket::setsockopt(s, nix::sys::socket::sockopt::Linger, &zero).expect("SO_LINGER");
}

#[test]
fn a_reset_is_passed_on_in_both_directions() {
    let l = DLab::new();
    // The client resets: the device sees a reset, not a clean end of file.
    let mut s = l.connect(OBSERVE).unwrap();
    s.write_all(&[5u8; 50_000]).unwrap();
    l.wait_status(Duration::from_secs(5), "bytes relayed", |s| {
        forward_of(s, "observe")["bytesToTarget"] == 50_000
    });
    linger0(&s);
    drop(s);
    assert!(
        wait_until(Duration::from_secs(5), || !l
            .seen
            .observed
            .lock()
            .unwrap()
            .is_empty()),
        "the device never saw the connection end"
    );
    assert_eq!(
        *l.seen.observed.lock().unwrap(),
        vec!["reset 50000".to_string()]
    );

    // The device resets: the client gets what was sent, then a reset.
    let mut s = l.connect(RESET).unwrap();
    let mut hello = vec![0u8; HELLO.len()];
    s.read_exact(&mut hello).unwrap();
    assert_eq!(hello, HELLO);
    assert_eq!(read_end(&mut s), Ended::Reset);

    let st = l.wait_status(Duration::from_secs(5), "connections ended", |s| {
        forward_of(s, "observe")["activeConnections"] == 0
            && forward_of(s, "reset")["activeConnections"] == 0
    });
    for name in ["observe", "reset"] {
        let f = forward_of(&st, name);
        assert_eq!(f["totalConnections"], 1, "{f:#}");
        assert_eq!(
            f["errors"], 1,
            "a reset ends the connection with an error: {f:#}"
        );
    }
}

/// Resident memory of a process, in bytes.
fn rss(pid: nix::unistd::Pid) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[test]
fn a_slow_reader_holds_the_sender_back_instead_of_the_daemon_buffering() {
    let mut l = DLab::new();
    let pid = l.daemon().pid();
    let rss_before = rss(pid);
    let mut s = l.connect(STALL).unwrap();
    s.set_write_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    let chunk = vec![3u8; 1 << 20];
    let mut sent = 0u64;
    let t = Instant::now();
    // Write until the device's stall pushes back (bounded in bytes and time).
    while sent < 256 << 20 && t.elapsed() < Duration::from_secs(20) {
        match again(|| s.write(&chunk)) {
            Ok(n) => sent += n as u64,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break
            }
            Err(e) => panic!("write: {e}"),
        }
    }
    let rss_stalled = rss(pid);
    eprintln!(
        "{:.1} MiB in flight against a reader that reads nothing; daemon RSS {:.1} -> {:.1} MiB",
        sent as f64 / (1 << 20) as f64,
        rss_before as f64 / (1 << 20) as f64,
        rss_stalled as f64 / (1 << 20) as f64
    );
    // What is in flight sits in the kernel's socket buffers (up to
    // tcp_wmem/tcp_rmem max on each leg) and one pipe: never the lot.
    assert!(
        sent < 128 << 20,
        "{sent} bytes accepted while the device reads nothing"
    );
    // The daemon itself holds one pipe's worth, in the kernel, and nothing
    // in user space.
    assert!(l.metric_plain("edgelink_pipes_in_use") <= 1.0);
    assert!(
        rss_stalled < rss_before + (8 << 20),
        "the daemon grew from {rss_before} to {rss_stalled} bytes"
    );

    // Released, the device gets every byte.
    l.seen.stall_release.notify_one();
    s.shutdown(Shutdown::Write).unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || !l
            .seen
            .stall
            .lock()
            .unwrap()
            .is_empty()),
        "the device never got to the end"
    );
    assert_eq!(*l.seen.stall.lock().unwrap(), vec![sent]);
    let f = l.forward("stall");
    assert_eq!(f["bytesToTarget"], sent, "{f:#}");
}

/// Issue 25: the relay no longer sets SO_OOBINLINE and the keepalive on
/// each connection; the listener carries them (accepted sockets inherit)
/// and the factory sets them on each upstream socket when it makes it.
/// Both legs of a relayed connection must still have the keepalive timer
/// (`--tcp-keepalive`, 60 s by default), and urgent data still arrives.
#[test]
fn both_legs_of_a_relayed_connection_have_the_keepalive_without_a_setsockopt_each() {
    let l = DLab::new();
    let mut s = l.connect(API).unwrap();
    assert_eq!(echo(&mut s, b"keepalive?\n"), b"keepalive?\n");
    // Urgent data: passed on inline, in order.
    socket2::SockRef::from(&s).send_out_of_band(b"!").unwrap();
    s.write_all(b"after\n").unwrap();
    let mut back = [0u8; 7];
    s.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"!after\n");
    // ss shows one timer per socket: a leg with bytes in flight shows its
    // retransmit timer until they are acknowledged.
    let ss = || {
        sh(&[
            "ip",
            "netns",
            "exec",
            &l.pod.name,
            "ss",
            "-tnoH",
            "state",
            "established",
        ])
    };
    let both = |t: &str| {
        let legs: Vec<&str> = t
            .lines()
            .filter(|x| x.contains(&format!(":{API}")))
            .collect();
        legs.len() == 2 && legs.iter().all(|x| x.contains("timer:(keepalive,"))
    };
    assert!(
        wait_until(Duration::from_secs(3), || both(&ss())),
        "both legs (the client's, the device's) with the keepalive timer: {}",
        ss()
    );
}
