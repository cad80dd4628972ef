//! Found in review: a failed forward must not restart its attachment on
//! every reconcile pass, and connections the daemon ends before they ended
//! (attachment gone, SIGTERM grace over) must end with a reset, never with
//! a clean end of file.

use crate::lab::*;
use edgelink_tests::*;
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// How many times the daemon's log says a listener failed.
fn listener_failures(l: &DLab) -> usize {
    l.daemon
        .as_ref()
        .map_or(0, |d| d.log_text().matches("listener failed").count())
}

#[test]
fn a_forward_whose_port_is_taken_is_retried_alone_and_the_others_connections_go_on() {
    // About reconcile: a short interval, so that many passes happen.
    let mut l = DLab::with(Opts {
        flags: &["--reconcile-interval", "0.2"],
        add: false,
        ..Default::default()
    });
    // A process in the pod holds the drain forward's port.
    let holder = in_netns(&l.pod, || std::net::TcpListener::bind(("0.0.0.0", DRAIN)))
        .expect("hold the drain port in the pod");
    l.add();
    l.wait_status(Duration::from_secs(10), "api up, drain failed", |s| {
        forward_of(s, "api")["listener"] == "listening"
            && forward_of(s, "drain")["listener"] == "failed"
    });
    let mut open = l.connect(API).expect("connect to api");
    assert_eq!(echo(&mut open, b"before\n"), b"before\n");

    // Several passes, each retrying the drain forward.
    let seen = listener_failures(&l);
    assert!(
        wait_until(Duration::from_secs(30), || listener_failures(&l)
            >= seen + 5),
        "the failed listener was not retried on every pass"
    );
    for i in 0..3 {
        let msg = format!("after the passes {i}\n");
        assert_eq!(echo(&mut open, msg.as_bytes()), msg.as_bytes());
    }
    let api = l.forward("api");
    assert_eq!(api["listener"], "listening", "{api:#}");
    assert_eq!(api["totalConnections"], 1, "{api:#}");
    assert_eq!(api["activeConnections"], 1, "{api:#}");

    // The port is freed: the drain forward comes up on a later pass, and
    // the open connection does not notice.
    drop(holder);
    l.wait_status(Duration::from_secs(10), "drain listening", |s| {
        forward_of(s, "drain")["listener"] == "listening"
    });
    assert_eq!(echo(&mut open, b"after\n"), b"after\n");
    let mut d = l.connect(DRAIN).expect("connect to drain");
    d.write_all(b"12345").unwrap();
    d.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = String::new();
    d.read_to_string(&mut answer).unwrap();
    assert_eq!(answer, "5\n");
    assert_eq!(echo(&mut open, b"still\n"), b"still\n");
    assert_eq!(l.forward("api")["totalConnections"], 1);
}

/// Device port that sends up to 256 MiB to whoever connects and reads
/// nothing.
const FLOOD: u16 = 9010;

/// The lab with one more forward, `flood`, to the device's FLOOD port.
fn flood_lab(flags: &'static [&'static str]) -> DLab {
    let mut l = DLab::with(Opts {
        flags,
        add: false,
        ..Default::default()
    });
    let addr = device_addr(FLOOD);
    let listener = l
        .dev
        .run(async move { tokio::net::TcpListener::bind(addr).await })
        .expect("bind the flood port in the device");
    l.dev.spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let chunk = vec![0x5a_u8; 1 << 20];
                for _ in 0..256 {
                    if s.write_all(&chunk).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    l.conf["forwards"].as_array_mut().unwrap().push(json!({
        "name": "flood", "protocol": "tcp", "port": FLOOD,
        "target": format!("{DEVICE_V4}:{FLOOD}")
    }));
    l.add();
    l.wait_serving();
    l
}

/// A client of the flood forward that reads nothing until the relay holds
/// bytes in its pipe (the client's receive buffer and the daemon's send
/// buffer are full).
fn stuck_transfer(l: &DLab) -> TcpStream {
    let s = l.connect(FLOOD).expect("connect to flood");
    assert!(
        wait_until(Duration::from_secs(20), || {
            l.metric_plain("edgelink_pipes_in_use") >= 1.0
        }),
        "the relay never held bytes in a pipe"
    );
    s
}

/// Read until the stream ends: how it ended, and the bytes before.
fn read_to_end(s: &mut TcpStream) -> (Ended, u64) {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let mut n = 0u64;
    // Bounded: the flood sends 256 MiB at most.
    loop {
        match again(|| s.read(&mut buf)) {
            Ok(0) => return (Ended::Eof, n),
            Ok(k) => n += k as u64,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (Ended::Reset, n),
            Err(e) => return (Ended::Other(e.to_string()), n),
        }
    }
}

#[test]
fn a_transfer_cut_by_del_ends_with_a_reset_not_a_clean_end_of_file() {
    let l = flood_lab(&[]);
    let mut s = stuck_transfer(&l);
    l.call("DEL").ok_empty();
    let (end, n) = read_to_end(&mut s);
    assert_eq!(
        end,
        Ended::Reset,
        "the client read {n} bytes of a cut transfer, then {end:?}"
    );
}

#[test]
fn a_transfer_cut_when_the_sigterm_grace_runs_out_ends_with_a_reset() {
    let mut l = flood_lab(&["--grace-period", "1"]);
    let mut s = stuck_transfer(&l);
    l.daemon().signal(nix::sys::signal::Signal::SIGTERM);
    let st = l
        .daemon()
        .wait_exit(Duration::from_secs(10))
        .expect("no exit after the grace period");
    assert!(st.success(), "{st}");
    let (end, n) = read_to_end(&mut s);
    assert_eq!(
        end,
        Ended::Reset,
        "the client read {n} bytes of a cut transfer, then {end:?}"
    );
}

#[test]
fn every_worker_accepts_on_one_listener_and_a_worker_that_dies_is_replaced() {
    let l = DLab::with(Opts {
        flags: &["--workers", "3", "--reconcile-interval", "0.2"],
        ..Default::default()
    });
    let s = l.status();
    assert_eq!(s["workers"], 3, "{s:#}");
    // IPv4 and IPv6, one each, accepted on by the three workers (no
    // SO_REUSEPORT: nobody else may join).
    assert_eq!(l.tcp_listeners_on(API), 2);
    // Whichever worker accepts a connection: all are served.
    for i in 0..30 {
        let mut c = l.connect(API).expect("connect");
        let msg = format!("conn {i}\n");
        assert_eq!(echo(&mut c, msg.as_bytes()), msg.as_bytes());
    }
    // A worker's thread dies (debug builds: SIGUSR2 kills worker 0 the way
    // a panic would): it is replaced, and every forward listens again on
    // every worker.
    l.kill_worker_0();
    assert_eq!(l.tcp_listeners_on(API), 2);
    assert_eq!(l.metric_plain("edgelink_worker_replacements_total"), 1.0);
    for i in 0..30 {
        let mut c = l.connect(API).expect("connect after the replacement");
        let msg = format!("after {i}\n");
        assert_eq!(echo(&mut c, msg.as_bytes()), msg.as_bytes());
    }
    // UDP: one socket per forward and family, on one worker; back too.
    assert_eq!(listeners_on_udp(&l, UDP), 2);
}

fn listeners_on_udp(l: &DLab, port: u16) -> usize {
    let out = l.pod.exec(&["ss", "-Hlun", &format!("sport = :{port}")]);
    String::from_utf8_lossy(&out.stdout).lines().count()
}

#[test]
fn bad_workers_flags_exit_64() {
    let ns = Netns::new("wflags");
    let state = tempfile::tempdir().unwrap();
    let sd = state.path().display().to_string();
    let bin = daemon_bin().display().to_string();
    for value in ["0", "1025", "many"] {
        let out = ns.exec(&[&bin, "run", "--state-dir", &sd, "--workers", value]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "--workers {value}: {err}");
        assert!(err.contains("--workers"), "--workers {value}: {err}");
    }
}
