//! Found in review: bounds on what cluster clients can make the daemon
//! hold. Connection bounds (a forward's queue, the global cap), the idle timeout in
//! force, and the file descriptors kept for the plugin's control socket
//! and the status server when clients have taken all the others.

use crate::lab::*;
use edgelink_tests::*;
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn active(l: &DLab, name: &str) -> u64 {
    l.forward(name)["activeConnections"].as_u64().unwrap_or(0)
}

/// A connection the daemon accepted and reset at once.
fn assert_reset(l: &DLab, port: u16) {
    match l.connect(port) {
        Ok(mut s) => assert_eq!(read_end(&mut s), Ended::Reset, "port {port}"),
        Err(e) => assert_eq!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset,
            "port {port}: {e}"
        ),
    }
}

fn drain_once(l: &DLab, msg: &[u8]) {
    let mut d = l.connect(DRAIN).expect("connect to drain");
    d.write_all(msg).unwrap();
    d.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = String::new();
    d.read_to_string(&mut answer).unwrap();
    assert_eq!(answer, format!("{}\n", msg.len()));
}

#[test]
fn a_forward_with_max_connections_3_queues_the_4th_until_a_place_frees() {
    let mut l = DLab::with(Opts {
        add: false,
        ..Default::default()
    });
    l.conf["forwards"][0]["maxConnections"] = json!(3);
    l.conf["forwards"][0]["idleTimeoutMs"] = json!(5000);
    assert_eq!(l.conf["forwards"][0]["name"], "api");
    l.add();
    l.wait_serving();
    let api = l.forward("api");
    assert_eq!(api["maxConnections"], 3, "{api:#}");
    assert_eq!(api["idleTimeoutMs"], 5000, "{api:#}");
    // The others: no bound of their own, the daemon's default idle timeout.
    let drain = l.forward("drain");
    assert!(drain.get("maxConnections").is_none(), "{drain:#}");
    assert_eq!(drain["idleTimeoutMs"], 3_600_000, "{drain:#}");

    let mut conns: Vec<TcpStream> = (0..3)
        .map(|i| {
            let mut s = l.connect(API).expect("connect to api");
            let msg = format!("conn {i}\n");
            assert_eq!(echo(&mut s, msg.as_bytes()), msg.as_bytes());
            s
        })
        .collect();
    // The 4th is accepted and waits: its bytes reach the device only once
    // a place frees.
    let mut fourth = l.connect(API).expect("connect to api");
    fourth.write_all(b"queued\n").unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || l.forward("api")["queued"] == 1),
        "not queued: {:#}",
        l.forward("api")
    );
    assert_eq!(l.metric("edgelink_queue_length", "api"), 1.0);
    // Other forwards are not held back by api's bound.
    drain_once(&l, b"not capped");
    // One closes: the waiting one goes on.
    drop(conns.pop());
    let mut got = [0u8; 7];
    fourth.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"queued\n");
    for c in &mut conns {
        assert_eq!(echo(c, b"still here\n"), b"still here\n");
    }
    let api = l.forward("api");
    assert_eq!(api["queued"], 0, "{api:#}");
    assert_eq!(api["queuedTotal"], 1, "{api:#}");
    assert_eq!(api["connectionsRejectedTotal"], 0, "{api:#}");
    assert_eq!(api["totalConnections"], 4, "{api:#}");
}

#[test]
fn max_connections_caps_the_connections_of_all_forwards_together() {
    let l = DLab::with(Opts {
        flags: &["--max-connections", "3", "--tcp-idle-timeout", "120"],
        ..Default::default()
    });
    assert_eq!(l.forward("drain")["idleTimeoutMs"], 120_000);
    let mut api: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = l.connect(API).expect("connect to api");
            assert_eq!(echo(&mut s, b"x\n"), b"x\n");
            s
        })
        .collect();
    // The drain server reads until the end: an open connection to it is
    // counted once the daemon accepted it.
    let mut d = l.connect(DRAIN).expect("connect to drain");
    d.write_all(b"abc").unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || active(&l, "drain") == 1),
        "drain connection not accepted"
    );
    assert_reset(&l, DRAIN);
    assert_reset(&l, API);
    assert_eq!(l.forward("drain")["connectionsRejectedTotal"], 1);
    assert_eq!(l.forward("api")["connectionsRejectedTotal"], 1);
    drop(api.pop());
    assert!(
        wait_until(Duration::from_secs(10), || active(&l, "api") == 1),
        "the closed connection is still counted"
    );
    drain_once(&l, b"admitted");
    // The open ones were never disturbed.
    d.write_all(b"de").unwrap();
    d.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = String::new();
    d.read_to_string(&mut answer).unwrap();
    assert_eq!(answer, "5\n");
    assert_eq!(echo(&mut api[0], b"y\n"), b"y\n");
}

#[test]
fn bad_tcp_bounds_kernel_path_and_audit_flags_exit_64_naming_the_flag() {
    let ns = Netns::new("flags");
    let state = tempfile::tempdir().unwrap();
    let sd = state.path().display().to_string();
    let bin = daemon_bin().display().to_string();
    for (flag, value) in [
        ("--tcp-idle-timeout", "0.5"),
        ("--tcp-idle-timeout", "604801"),
        ("--tcp-idle-timeout", "soon"),
        ("--tcp-keepalive", "32768"),
        ("--tcp-keepalive", "1.5"),
        ("--max-connections", "10000001"),
        ("--max-connections", "many"),
        ("--forward-max-connections", "1000001"),
        ("--queue-timeout", "0"),
        ("--queue-timeout", "soon"),
        ("--max-queue", "0"),
        ("--connect-retries", "11"),
        ("--connect-retry-backoff", "0"),
        ("--connect-retry-backoff", "3"),
        ("--kernel-tcp-time-wait", "0"),
        ("--kernel-udp-timeout", "1.5"),
        ("--kernel-udp-stream-timeout", "86401"),
        ("--kernel-counters-interval", "0"),
        ("--conntrack-min", "many"),
        ("--proc-sys-net", "proc/sys/net"),
        ("--audit", "syslog"),
        ("--audit-files", "yes"),
        ("--audit-file-size", "4095"),
        ("--audit-files-kept", "101"),
    ] {
        let out = ns.exec(&[&bin, "run", "--state-dir", &sd, flag, value]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{flag} {value}: {err}");
        assert!(err.contains(flag), "{flag} {value}: {err}");
    }
    assert!(std::fs::read_dir(state.path()).unwrap().next().is_none());
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // After the ")" of the command name: state is field 3, utime 14.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// UDP clients that keep sending from 64 ports of their own, each port
/// a session of the daemon, until stopped or dropped (30 s at most).
struct UdpFlood {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl UdpFlood {
    fn start(l: &DLab) -> UdpFlood {
        use std::sync::atomic::{AtomicBool, Ordering};
        let socks: Vec<std::net::UdpSocket> = (0..64)
            .map(|_| {
                in_netns(&l.client, || {
                    std::net::UdpSocket::bind(format!("{CLIENT_IP}:0")).unwrap()
                })
            })
            .collect();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut sent = 0u64;
            while !flag.load(Ordering::Relaxed) && Instant::now() < deadline {
                for u in &socks {
                    sent += u64::from(u.send_to(b"new", pod_addr(UDP)).is_ok());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            sent
        });
        UdpFlood {
            stop,
            thread: Some(thread),
        }
    }

    /// Datagrams sent.
    fn stop(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or(0)
    }
}

impl Drop for UdpFlood {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn at_the_fd_limit_the_control_socket_and_the_status_server_still_answer_without_spinning() {
    // UDP sessions that stop sending give their sockets back within 1 s.
    let l = DLab::with(Opts {
        flags: &["--udp-idle-timeout", "1"],
        ..Default::default()
    });
    let pid = l.daemon.as_ref().unwrap().child.id();
    // A low open-file limit (soft and hard, so the daemon cannot raise
    // it): room for a few dozen more descriptors.
    let limit = open_fds(pid) + 40;
    sh(&[
        "prlimit",
        "--pid",
        &pid.to_string(),
        &format!("--nofile={limit}:{limit}"),
    ]);
    // Cluster clients take every descriptor: TCP connections (two each),
    // then UDP sessions (one each) for what an odd count leaves.
    // Connections the daemon accepts but cannot give an upstream socket
    // are reset: keep coming until it holds all but one descriptor.
    let mut tcp = Vec::new();
    for _ in 0..15 {
        for _ in 0..10 {
            if let Ok(s) = l.connect(API) {
                tcp.push(s);
            }
        }
        if wait_until(Duration::from_secs(2), || open_fds(pid) + 1 >= limit) {
            break;
        }
    }
    assert!(
        open_fds(pid) + 1 >= limit,
        "the daemon never neared its fd limit: {} of {limit} open",
        open_fds(pid)
    );
    let udp: Vec<std::net::UdpSocket> = (0..4)
        .map(|_| {
            in_netns(&l.client, || {
                let u = std::net::UdpSocket::bind(format!("{CLIENT_IP}:0")).unwrap();
                u.send_to(b"ping", pod_addr(UDP)).unwrap();
                u
            })
        })
        .collect();
    assert!(
        wait_until(Duration::from_secs(20), || open_fds(pid) >= limit),
        "the daemon never reached its fd limit: {} of {limit} open",
        open_fds(pid)
    );

    // The plugin's CHECK, sent while every descriptor is taken; the daemon
    // must not spin on the pending connection.
    let sock = l.lab.state.path().join("edgelinkd.sock");
    let mut c = std::os::unix::net::UnixStream::connect(&sock).expect("connect the control socket");
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(format!("check {CID} net1\n").as_bytes())
        .unwrap();
    let t0 = cpu_ticks(pid);
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let ticks = cpu_ticks(pid) - t0;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let share = ticks as f64 / hz / start.elapsed().as_secs_f64();
    assert!(
        share < 0.5,
        "the daemon burnt {:.0}% of a core at the fd limit",
        share * 100.0
    );
    let mut answer = String::new();
    let read = c.read_to_string(&mut answer);
    assert!(
        read.is_ok() && answer.contains("\"found\":true"),
        "no answer to check at the fd limit: {read:?} {answer:?}"
    );
    // `reap` needs descriptors of its own (the pod's netns, a netlink
    // socket): an index that does not exist is looked up and refused.
    // Meanwhile UDP clients keep coming from new ports, each a session
    // that wants a socket: the descriptors the reserve frees must go to
    // the request, not to them (review item 24). The request line comes a
    // little after the connection, as from a slow plugin, so that they
    // have every chance to.
    let flood = UdpFlood::start(&l);
    let mut c = std::os::unix::net::UnixStream::connect(&sock).expect("connect the control socket");
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    c.write_all(format!("reap 99999 net1 {}\n", l.pod.path()).as_bytes())
        .unwrap();
    let mut answer = String::new();
    let read = c.read_to_string(&mut answer);
    assert!(
        read.is_ok() && answer.contains("no link #99999"),
        "reap at the fd limit: {read:?} {answer:?}"
    );
    // The status server.
    assert_eq!(l.get("/status").0, 200);
    assert_eq!(l.get("/healthz").0, 200);

    let sent = flood.stop();
    assert!(sent > 0, "the UDP clients sent nothing");

    // The clients go: the forwards accept again.
    drop(tcp);
    drop(udp);
    let mut ok = false;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ok && Instant::now() < deadline {
        ok = l.connect(API).is_ok_and(|mut s| {
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            s.write_all(b"back\n").is_ok() && {
                let mut b = [0u8; 5];
                s.read_exact(&mut b).is_ok() && &b == b"back\n"
            }
        });
    }
    assert!(
        ok,
        "the api forward did not relay again once the clients left: {} fds open of {limit}; api: {:#}",
        open_fds(pid),
        l.forward("api")
    );
}

/// A forward's `idleTimeoutMs` reaches the relay: a connection with nothing
/// moving either way is reset on the client's side (not ended cleanly),
/// counted as an idle timeout and not as an error, while a connection of
/// another forward, idle just as long under the daemon's default, stays.
#[test]
fn an_idle_connection_is_reset_after_the_forwards_idle_timeout_and_counted() {
    let mut l = DLab::with(Opts {
        add: false,
        ..Default::default()
    });
    l.conf["forwards"][0]["idleTimeoutMs"] = json!(1000);
    l.add();
    l.wait_serving();
    let mut s = l.connect(API).expect("connect to api");
    assert_eq!(echo(&mut s, b"before\n"), b"before\n");
    let mut d = l.connect(DRAIN).expect("connect to drain");
    d.write_all(b"abc").unwrap();
    let t = Instant::now();
    // A generous read timeout: the reset must come from the idle timeout
    // (1 s), long before this.
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    assert_eq!(read_end(&mut s), Ended::Reset);
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "reset before the idle timeout: {:?}",
        t.elapsed()
    );
    assert!(
        wait_until(Duration::from_secs(10), || l.forward("api")
            ["idleTimeoutsTotal"]
            == 1),
        "not counted: {:#}",
        l.forward("api")
    );
    assert_eq!(l.forward("api")["errors"], 0, "{:#}", l.forward("api"));
    assert_eq!(l.metric("edgelink_idle_timeouts_total", "api"), 1.0);
    // drain (the default, an hour) was idle as long and is still relayed.
    d.write_all(b"de").unwrap();
    d.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = String::new();
    d.read_to_string(&mut answer).unwrap();
    assert_eq!(answer, "5\n");
    assert_eq!(l.forward("drain")["idleTimeoutsTotal"], 0);
}
