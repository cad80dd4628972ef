//! Third review (issue 20), items 8, 22, 23: who may join a forward's listener, a queued client's half-close, a client that leaves during the connect.

use crate::lab::*;
use edgelink_tests::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

/// A root process of the pod with no capability at all (setpriv drops
/// the bounding, inheritable and so effective sets): it tries every way
/// onto the lab's `api` (TCP) and `telemetry` (UDP) ports that needs no
/// capability (SO_REUSEPORT and SO_REUSEADDR, the wildcard and the pod's
/// own address), prints `bound ...` or `refused ...` for each, then
/// `ready`, and counts what reaches the sockets it got until its stdin
/// closes (or 60 s): `took <connections> <datagrams>`.
const STRANGER: &str = r#"
import os, select, socket, sys, time
print("uid", os.getuid(), flush=True)
for l in open("/proc/self/status"):
    if l.startswith("CapEff"):
        print("capeff", l.split()[1], flush=True)
pod, api, udp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tries = [(socket.AF_INET, "tcp", "0.0.0.0", api), (socket.AF_INET, "tcp", pod, api),
         (socket.AF_INET6, "tcp", "::", api), (socket.AF_INET, "udp", "0.0.0.0", udp),
         (socket.AF_INET, "udp", pod, udp), (socket.AF_INET6, "udp", "::", udp)]
kept = []
for fam, kind, addr, port in tries:
    s = socket.socket(fam, socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if fam == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    try:
        s.bind((addr, port))
        if kind == "tcp":
            s.listen(64)
        s.setblocking(False)
        kept.append((kind, s))
        print("bound", kind, addr, flush=True)
    except OSError as e:
        print("refused", kind, addr, e.errno, flush=True)
print("ready", flush=True)
conns = grams = 0
end = time.time() + 60
while time.time() < end:
    r, _, _ = select.select([sys.stdin] + [s for _, s in kept], [], [], 0.5)
    if sys.stdin in r and not sys.stdin.readline():
        break
    for kind, s in kept:
        if s in r:
            try:
                if kind == "tcp":
                    s.accept()[0].close(); conns += 1
                else:
                    s.recvfrom(65536); grams += 1
            except OSError:
                pass
print("took", conns, grams, flush=True)
"#;

/// Item 8: a root process in the pod (uid 0 as the daemon, no capability)
/// cannot join a forward's port, neither TCP (SO_REUSEPORT) nor UDP
/// (SO_REUSEADDR): every bind fails, every connection and datagram of a
/// client is the daemon's, and /status says `listening` truthfully. With
/// two workers, so that the old code's per-worker SO_REUSEPORT listeners
/// are there to join.
#[test]
fn a_root_process_of_the_pod_without_capabilities_cannot_take_a_forwards_connections() {
    let l = DLab::with(Opts {
        flags: &["--workers", "2"],
        ..Default::default()
    });
    let mut child = ChildGuard::new(
        Command::new("ip")
            .args(["netns", "exec", &l.pod.name])
            .args(["setpriv", "--inh-caps=-all", "--bounding-set=-all"])
            .args(["python3", "-c", STRANGER, POD_IP])
            .args([API.to_string(), UDP.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 in the pod"),
    );
    let mut out = BufReader::new(child.child().stdout.take().unwrap());
    let mut said = Vec::new();
    loop {
        let mut line = String::new();
        assert!(
            out.read_line(&mut line).expect("the stranger's output") > 0,
            "the stranger ended early: {said:?}"
        );
        if line.trim() == "ready" {
            break;
        }
        said.push(line.trim().to_string());
    }
    // It is what the review describes: root, without any capability.
    assert!(said.contains(&"uid 0".to_string()), "{said:?}");
    assert!(
        said.contains(&"capeff 0000000000000000".to_string()),
        "{said:?}"
    );
    let bound: Vec<&String> = said.iter().filter(|s| s.starts_with("bound")).collect();

    // Clients use the forwards meanwhile.
    let mut echoed = 0;
    for i in 0..30 {
        let msg = format!("client {i}\n");
        let Ok(mut s) = l.connect(API) else { continue };
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut back = vec![0u8; msg.len()];
        if s.write_all(msg.as_bytes()).is_ok() && s.read_exact(&mut back).is_ok() {
            echoed += usize::from(back == msg.as_bytes());
        }
    }
    let answered = l.cl.run(async {
        let u = tokio::net::UdpSocket::bind(format!("{CLIENT_IP}:0"))
            .await
            .unwrap();
        u.connect(pod_addr(UDP)).await.unwrap();
        let mut n = 0;
        for i in 0..10 {
            let msg = format!("datagram {i}");
            u.send(msg.as_bytes()).await.unwrap();
            let mut b = [0u8; 64];
            if let Ok(Ok(k)) = tokio::time::timeout(Duration::from_secs(1), u.recv(&mut b)).await {
                n += usize::from(&b[..k] == msg.as_bytes());
            }
        }
        n
    });
    drop(child.child().stdin.take());
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let api = l.forward("api");
    assert!(
        bound.is_empty(),
        "a root process of the pod bound a forward's port: {bound:?}; then {}; \
         {echoed}/30 connections and {answered}/10 datagrams were the daemon's while /status said {}",
        rest.trim(),
        api["listener"]
    );
    assert_eq!(rest.trim(), "took 0 0");
    assert_eq!((echoed, answered), (30, 10));
    assert_eq!(api["listener"], "listening", "{api:#}");
    assert_eq!(l.forward("telemetry")["listener"], "listening");
}

/// The lab with `extra` forwards and `flags`.
fn lab_with(flags: &[&str], extra: Value) -> DLab {
    DLab::with_forwards(flags, extra)
}

/// Item 22: a client waiting for a `maxConnections` place that shuts its
/// write side (it only reads) stays queued, is let in when the place
/// frees, and gets the device's answer after its FIN was passed on; one
/// that resets leaves at once and frees its queue place (`--max-queue 1`)
/// for the next.
#[test]
fn a_queued_client_that_half_closes_stays_and_gets_the_answer_one_that_resets_leaves() {
    let l = lab_with(
        &["--max-queue", "1"],
        json!([{
            "name": "narrow", "protocol": "tcp", "port": 9030,
            "target": format!("{DEVICE_V4}:{DRAIN}"), "maxConnections": 1,
            "queueTimeoutMs": 60000
        }]),
    );
    let fwd = |k: &str| l.forward("narrow")[k].clone();
    let wait = |k: &str, v: u64| {
        assert!(
            wait_until(Duration::from_secs(10), || fwd(k) == v),
            "{k} is not {v}: {:#}",
            l.forward("narrow")
        )
    };
    // The first holds the only place (the drain server answers at its FIN).
    let mut first = l.connect(9030).expect("connect");
    first.write_all(b"held").unwrap();
    wait("targetConnections", 1);

    // One that resets while waiting leaves and frees the queue's place.
    let gone = l.connect(9030).expect("connect");
    wait("queued", 1);
    socket2::SockRef::from(&gone)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(gone);
    wait("queueAbandonedTotal", 1);
    wait("queued", 0);

    // The next gets the place in the queue (not reset as the queue is
    // full), and half-closes at once: it only reads.
    let mut reader = l.connect(9030).expect("connect");
    wait("queued", 1);
    reader.shutdown(std::net::Shutdown::Write).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let f = l.forward("narrow");
    assert_eq!(
        (f["queued"].as_u64(), f["queueAbandonedTotal"].as_u64()),
        (Some(1), Some(1)),
        "a half-closed client left the queue: {f:#}"
    );
    assert_eq!(f["queueFullTotal"], 0, "{f:#}");

    // The place frees: it is let in, its FIN reaches the device, which
    // answers with the byte count (none).
    first.shutdown(std::net::Shutdown::Write).unwrap();
    let mut got = String::new();
    first.read_to_string(&mut got).unwrap();
    assert_eq!(got, "4\n");
    drop(first);
    let mut answer = String::new();
    reader
        .read_to_string(&mut answer)
        .expect("the device's answer");
    assert_eq!(
        answer, "0\n",
        "a queued client that half-closed did not get the device's answer"
    );
    wait("activeConnections", 0);
    let f = l.forward("narrow");
    assert_eq!(f["queueAbandonedTotal"], 1, "{f:#}");
    assert_eq!(f["queueTimeoutsTotal"], 0, "{f:#}");
    assert_eq!(f["connectErrors"], 0, "{f:#}");
}

/// A device whose listen backlog (0: one connection) is full until the
/// test accepts: a connect to it waits for the SYN to be sent again.
fn slow_device(l: &DLab, port: u16) -> std::net::TcpListener {
    let addr = device_addr(port);
    in_netns(&l.lab.device, || {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        s.set_reuse_address(true)?;
        s.bind(&addr.into())?;
        s.listen(0)?;
        s.set_nonblocking(true)?;
        Ok::<_, std::io::Error>(std::net::TcpListener::from(s))
    })
    .unwrap_or_else(|e| panic!("slow device on {addr}: {e}"))
}

/// Accept what is queued on `dev` now, waiting up to `within` for the first.
fn accept_one(dev: &std::net::TcpListener, within: Duration) -> Option<std::net::TcpStream> {
    let mut got = None;
    wait_until(within, || {
        got = dev.accept().ok().map(|(s, _)| s);
        got.is_some()
    });
    got
}

/// Item 23: with `proxyProtocol`, a client that resets while the connect
/// to the device is under way (the device's backlog is full, the SYN goes
/// again a second later) is its own failure: no connect error, and the
/// device stays `reachable`.
#[test]
fn a_client_that_resets_during_a_proxy_protocol_connect_leaves_the_device_reachable() {
    const PORT: u16 = 9040;
    const DEV: u16 = 9041;
    let l = lab_with(
        &[],
        json!([{
            "name": "pp", "protocol": "tcp", "port": PORT, "proxyProtocol": "v1",
            "target": format!("{DEVICE_V4}:{DEV}"), "connectTimeoutMs": 10000,
            "connectRetries": 0
        }]),
    );
    let dev = slow_device(&l, DEV);
    // One that goes through: the device is known reachable, the header
    // names the client.
    let mut ok = l.connect(PORT).expect("connect");
    let mut seen = accept_one(&dev, Duration::from_secs(10)).expect("the relayed connect");
    seen.set_nonblocking(false).unwrap();
    seen.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut header = [0u8; 11];
    seen.read_exact(&mut header).unwrap();
    assert_eq!(&header, b"PROXY TCP4 ");
    drop(seen);
    let _ = read_end(&mut ok);
    drop(ok);
    assert!(wait_until(Duration::from_secs(10), || {
        let f = l.forward("pp");
        f["reachability"]["state"] == "reachable" && f["activeConnections"] == 0
    }));

    // The backlog full: the next connect's SYN is dropped.
    let filler = connect_in(&l.lab.device, device_addr(DEV), Duration::from_secs(5))
        .expect("the filler fills the device's backlog");
    let client = l.connect(PORT).expect("connect");
    assert!(
        wait_until(Duration::from_secs(10), || l.forward("pp")
            ["activeConnections"]
            == 1),
        "{:#}",
        l.forward("pp")
    );
    std::thread::sleep(Duration::from_millis(200));
    // The client resets while the daemon waits for the device.
    socket2::SockRef::from(&client)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(client);
    // The device takes connections again: the SYN sent again gets in.
    let taken = accept_one(&dev, Duration::from_secs(5)).expect("the filler");
    drop((filler, taken));
    assert!(
        wait_until(Duration::from_secs(15), || l.forward("pp")
            ["activeConnections"]
            == 0),
        "{:#}",
        l.forward("pp")
    );
    // Whatever of it reached the device, accepted and closed.
    while accept_one(&dev, Duration::from_millis(300)).is_some() {}
    let f = l.forward("pp");
    assert_eq!(
        f["connectErrors"], 0,
        "a client's reset counted against the device: {f:#}"
    );
    assert_eq!(f["reachability"]["state"], "reachable", "{f:#}");
    // The device still serves the next client.
    let mut next = l.connect(PORT).expect("connect");
    let seen = accept_one(&dev, Duration::from_secs(10)).expect("the next relayed connect");
    drop(seen);
    let _ = read_end(&mut next);
}
