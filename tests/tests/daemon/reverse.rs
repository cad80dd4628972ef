//! Reverse forwards: a device on the segment dials the pod's net1 address
//! and reaches a service of the cluster (here: the "cluster" namespace
//! behind the pod's eth0, the lab's client namespace), as the pod.
//!
//! ```text
//!   device 172.31.250.10 (+ .11) --segment-- pod net1 :1883/tcp :8125/udp
//!   pod eth0 10.244.1.10 ----- cluster 10.244.1.20 (services), 10.244.1.1 (the node)
//! ```

use super::lab::*;
use edgelink_tests::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const MQTT: u16 = 1883;
pub const STATS: u16 = 8125;
/// A second address of the device, outside a narrow `allowedSources`.
pub const OTHER_DEVICE: &str = "172.31.250.11";
/// The node's address on the cluster side (the pods' gateway), in the
/// cluster namespace: a device must not reach it through the pod.
pub const NODE_IP: &str = "10.244.1.1";

/// The cluster's services: a TCP server that says `banner` then echoes,
/// and a UDP echo; each notes the peers it saw.
#[derive(Default)]
pub struct Cluster {
    pub tcp_peers: Mutex<Vec<SocketAddr>>,
    pub udp_peers: Mutex<Vec<SocketAddr>>,
}

/// A TCP server on `addr` in the cluster namespace: writes `banner` and a
/// newline, then echoes until end of file. Aborting the task closes the
/// listener (new connects are refused).
pub fn tcp_service(
    l: &DLab,
    addr: SocketAddr,
    banner: &'static str,
    seen: Arc<Cluster>,
) -> tokio::task::JoinHandle<()> {
    let listener = l.cl.run(async move {
        tokio::net::TcpListener::bind(addr)
            .await
            .unwrap_or_else(|e| panic!("bind {addr}: {e}"))
    });
    l.cl.spawn(async move {
        loop {
            let Ok((mut s, peer)) = listener.accept().await else {
                return;
            };
            seen.tcp_peers.lock().unwrap().push(peer);
            tokio::spawn(async move {
                let _ = s.write_all(format!("{banner}\n").as_bytes()).await;
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if s.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    })
}

/// A UDP echo on `addr` in the cluster namespace.
pub fn udp_service(l: &DLab, addr: SocketAddr, seen: Arc<Cluster>) {
    let sock = l.cl.run(async move {
        tokio::net::UdpSocket::bind(addr)
            .await
            .unwrap_or_else(|e| panic!("bind {addr}: {e}"))
    });
    l.cl.spawn(async move {
        let mut buf = vec![0u8; 65536];
        loop {
            let Ok((n, peer)) = sock.recv_from(&mut buf).await else {
                return;
            };
            seen.udp_peers.lock().unwrap().push(peer);
            let _ = sock.send_to(&buf[..n], peer).await;
        }
    });
}

/// The lab with `reverse` in its config, ADDed and served.
pub fn reverse_lab(reverse: Value, edit: impl FnOnce(&mut Value)) -> DLab {
    let mut l = DLab::with(Opts {
        add: false,
        ..Default::default()
    });
    l.conf["reverse"] = reverse;
    edit(&mut l.conf);
    l.add();
    l.wait_serving();
    l
}

fn svc(port: u16) -> SocketAddr {
    format!("{CLIENT_IP}:{port}").parse().unwrap()
}

/// The lab's reverse forwards: MQTT over TCP and statsd over UDP, both to
/// the cluster namespace.
pub fn mqtt_and_stats() -> Value {
    json!([
        {"name": "mqtt", "protocol": "tcp", "port": MQTT, "target": svc(MQTT).to_string()},
        {"name": "stats", "protocol": "udp", "port": STATS, "target": svc(STATS).to_string()}
    ])
}

/// TCP from the device (from `source`, one of its addresses) to `addr`.
pub fn device_connect(l: &DLab, source: &str, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let source: IpAddr = source.parse().unwrap();
    let s = in_netns(&l.lab.device, move || -> std::io::Result<TcpStream> {
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        sock.bind(&SocketAddr::new(source, 0).into())?;
        sock.connect_timeout(&addr.into(), Duration::from_secs(3))?;
        Ok(sock.into())
    })?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    Ok(s)
}

/// Read the service's banner line.
pub fn banner(s: &mut TcpStream) -> std::io::Result<String> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while line.last() != Some(&b'\n') {
        match again(|| s.read(&mut b))? {
            0 => break,
            _ => line.push(b[0]),
        }
    }
    Ok(String::from_utf8_lossy(&line).trim().to_string())
}

/// One UDP datagram from the device (from `source`) to `addr`; the answer,
/// if one came within `wait`.
pub fn device_udp(
    l: &DLab,
    source: &str,
    addr: SocketAddr,
    msg: &[u8],
    wait: Duration,
) -> Option<Vec<u8>> {
    let source: SocketAddr = format!("{source}:0").parse().unwrap();
    let sock =
        in_netns(&l.lab.device, move || UdpSocket::bind(source)).expect("bind in the device");
    sock.set_read_timeout(Some(wait)).unwrap();
    sock.send_to(msg, addr).expect("send");
    let mut buf = [0u8; 2048];
    match again(|| sock.recv_from(&mut buf)) {
        Ok((n, _)) => Some(buf[..n].to_vec()),
        Err(_) => None,
    }
}

fn net1(l: &DLab, port: u16) -> SocketAddr {
    format!("{}:{port}", l.net1_ip()).parse().unwrap()
}

#[test]
fn a_device_reaches_a_cluster_service_over_tcp_and_udp_as_the_pod() {
    let l = reverse_lab(mqtt_and_stats(), |_| {});
    let cluster = Arc::new(Cluster::default());
    tcp_service(&l, svc(MQTT), "broker", cluster.clone());
    udp_service(&l, svc(STATS), cluster.clone());

    // TCP: the device publishes through the pod's net1 address.
    let mut s = device_connect(&l, DEVICE_V4, net1(&l, MQTT)).expect("connect to net1:1883");
    assert_eq!(banner(&mut s).unwrap(), "broker");
    let msg = vec![b'm'; 300_000];
    s.write_all(&msg).unwrap();
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back).unwrap();
    assert_eq!(back, msg);
    drop(s);
    // The service saw the pod (its eth0 address), not the device.
    let peers = cluster.tcp_peers.lock().unwrap().clone();
    assert_eq!(peers.len(), 1, "{peers:?}");
    assert_eq!(peers[0].ip().to_string(), POD_IP, "{peers:?}");

    // UDP the same.
    let answer = device_udp(
        &l,
        DEVICE_V4,
        net1(&l, STATS),
        b"temp:21.5|g",
        Duration::from_secs(5),
    );
    assert_eq!(answer.as_deref(), Some(&b"temp:21.5|g"[..]));
    let peers = cluster.udp_peers.lock().unwrap().clone();
    assert_eq!(peers.len(), 1, "{peers:?}");
    assert_eq!(peers[0].ip().to_string(), POD_IP, "{peers:?}");

    // Status: both reported as reverse, listening on net1 only, counted.
    let s = l.wait_status(Duration::from_secs(10), "the TCP connection counted", |s| {
        forward_of(s, "mqtt")["totalConnections"] == 1
            && forward_of(s, "mqtt")["activeConnections"] == 0
    });
    let mqtt = forward_of(&s, "mqtt");
    assert_eq!(mqtt["direction"], "reverse", "{mqtt:#}");
    assert_eq!(
        mqtt["listen"],
        json!([net1(&l, MQTT).to_string()]),
        "{mqtt:#}"
    );
    assert_eq!(
        mqtt["allowedSources"],
        json!(["172.31.250.0/24"]),
        "{mqtt:#}"
    );
    assert_eq!(mqtt["target"], svc(MQTT).to_string());
    assert_eq!(mqtt["bytesToTarget"], 300_000, "{mqtt:#}");
    let stats = forward_of(&s, "stats");
    assert_eq!(stats["direction"], "reverse", "{stats:#}");
    assert_eq!(stats["udpDatagramsToTarget"], 1, "{stats:#}");
    assert!(forward_of(&s, "api").get("direction").is_none());
    // The same families in /metrics as forwards, with their direction.
    let (_, metrics) = l.get("/metrics");
    let line = metrics
        .lines()
        .find(|l| l.starts_with("edgelink_connections_total{") && l.contains("forward=\"mqtt\""))
        .unwrap_or_else(|| panic!("no connections of mqtt in {metrics}"));
    assert!(
        line.contains("direction=\"reverse\"") && line.ends_with(" 1"),
        "{line}"
    );
    assert!(metrics.contains("direction=\"forward\""), "{metrics}");
    // The table marks them.
    let out = l.lab.node.exec(&[daemon_bin().to_str().unwrap(), "status"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("mqtt/tcp (reverse)"),
        "{table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn sources_outside_allowed_sources_and_the_cluster_side_are_refused_and_counted() {
    let reverse = json!([
        {"name": "mqtt", "protocol": "tcp", "port": MQTT, "target": svc(MQTT).to_string(),
         "allowedSources": [format!("{DEVICE_V4}/32")]},
        {"name": "stats", "protocol": "udp", "port": STATS, "target": svc(STATS).to_string(),
         "allowedSources": [format!("{DEVICE_V4}/32")]}
    ]);
    let l = reverse_lab(reverse, |_| {});
    l.lab
        .device
        .ip(&["addr", "add", &format!("{OTHER_DEVICE}/24"), "dev", "dev0"]);
    let cluster = Arc::new(Cluster::default());
    tcp_service(&l, svc(MQTT), "broker", cluster.clone());
    udp_service(&l, svc(STATS), cluster.clone());

    // The allowed device is served.
    let mut s = device_connect(&l, DEVICE_V4, net1(&l, MQTT)).unwrap();
    assert_eq!(banner(&mut s).unwrap(), "broker");
    drop(s);
    // Another address of the segment is reset before anything is relayed.
    match device_connect(&l, OTHER_DEVICE, net1(&l, MQTT)) {
        Ok(mut s) => {
            let end = read_end(&mut s);
            assert!(matches!(end, Ended::Reset | Ended::Eof), "{end:?}");
        }
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    assert_eq!(
        device_udp(
            &l,
            OTHER_DEVICE,
            net1(&l, STATS),
            b"x",
            Duration::from_millis(500)
        ),
        None
    );
    // The cluster side cannot use a reverse port either: a client that
    // routes to net1 through the pod's eth0 is not a source.
    l.client
        .ip(&["route", "add", "172.31.250.0/24", "via", POD_IP]);
    match connect_in(&l.client, net1(&l, MQTT), Duration::from_secs(3)) {
        Ok(mut s) => {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let end = read_end(&mut s);
            assert!(matches!(end, Ended::Reset | Ended::Eof), "{end:?}");
        }
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    let s = l.wait_status(Duration::from_secs(10), "refusals counted", |s| {
        forward_of(s, "mqtt")["refused"] == 2 && forward_of(s, "stats")["refused"] == 1
    });
    // Only the allowed device reached the service.
    assert_eq!(cluster.tcp_peers.lock().unwrap().len(), 1);
    assert!(cluster.udp_peers.lock().unwrap().is_empty());
    assert_eq!(forward_of(&s, "mqtt")["totalConnections"], 1, "{s:#}");
}

#[test]
fn a_device_reaches_nothing_else_through_the_pod() {
    let mut l = DLab::with(Opts {
        add: false,
        ..Default::default()
    });
    // As on a node that forwards (a new netns copies the node's IPv4
    // forwarding): the pod would route for anyone.
    let out = l.pod.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    assert!(out.status.success(), "{out:?}");
    l.conf["reverse"] = mqtt_and_stats();
    l.add();
    l.wait_serving();
    // ADD turned off forwarding in the whole pod.
    let sysctl = |key: &str| {
        let out = l.pod.exec(&["sysctl", "-n", key]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(sysctl("net.ipv4.conf.net1.forwarding"), "0");
    assert_eq!(sysctl("net.ipv4.conf.eth0.forwarding"), "0");
    let cluster = Arc::new(Cluster::default());
    tcp_service(&l, svc(MQTT), "broker", cluster.clone());
    // More services in the cluster, and the node's own address.
    l.client
        .ip(&["addr", "add", &format!("{NODE_IP}/24"), "dev", "eth0"]);
    let node_addr: SocketAddr = format!("{NODE_IP}:10250").parse().unwrap();
    tcp_service(&l, node_addr, "kubelet", cluster.clone());
    tcp_service(&l, svc(6443), "apiserver", cluster.clone());
    // The device tries the pod as a router into the cluster; the worst
    // case: the cluster routes the segment back through the pod, so
    // replies would come back.
    l.lab
        .device
        .ip(&["route", "add", "10.244.1.0/24", "via", &l.net1_ip()]);
    l.client
        .ip(&["route", "add", "172.31.250.0/24", "via", POD_IP]);

    // A port not declared on net1: nothing listens.
    let e = device_connect(&l, DEVICE_V4, net1(&l, MQTT + 1)).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
    // The forward direction's rule holds: a forward's port reached from the
    // segment is reset (nothing arriving on net1 is relayed into the
    // cluster except the reverse ports).
    match device_connect(&l, DEVICE_V4, net1(&l, API)) {
        Ok(mut s) => assert!(matches!(read_end(&mut s), Ended::Reset | Ended::Eof)),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    // The pod's eth0 address is not a way in: the reverse listener is on
    // net1 only, and forwards refuse what arrives on net1.
    let pod_eth0 = |port: u16| -> SocketAddr { format!("{POD_IP}:{port}").parse().unwrap() };
    let e = device_connect(&l, DEVICE_V4, pod_eth0(MQTT)).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
    match device_connect(&l, DEVICE_V4, pod_eth0(API)) {
        Ok(mut s) => assert!(matches!(read_end(&mut s), Ended::Reset | Ended::Eof)),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    // Other cluster addresses and ports, and the node's own address: the
    // pod does not route for the device (connects fail, nothing arrives).
    for addr in [svc(MQTT), svc(6443), node_addr] {
        let r = device_connect(&l, DEVICE_V4, addr);
        assert!(r.is_err(), "the device reached {addr} through the pod");
    }
    assert!(
        cluster.tcp_peers.lock().unwrap().is_empty(),
        "{:?}",
        cluster.tcp_peers.lock().unwrap()
    );
    // While the declared reverse port works.
    let mut s = device_connect(&l, DEVICE_V4, net1(&l, MQTT)).unwrap();
    assert_eq!(banner(&mut s).unwrap(), "broker");
    assert_eq!(cluster.tcp_peers.lock().unwrap().len(), 1);
}

#[test]
fn reverse_config_errors_leave_nothing_behind() {
    let mut l = DLab::with(Opts {
        add: false,
        ..Default::default()
    });
    let cases = [
        (
            json!([{"name": "mqtt", "port": API, "target": svc(MQTT).to_string()}]),
            "collides with forwards[0]",
        ),
        (
            json!([{"name": "mqtt", "port": MQTT, "target": format!("{DEVICE_V4}:1883")}]),
            "a loop",
        ),
        (
            json!([{"name": "mqtt", "port": MQTT, "target": svc(MQTT).to_string(),
                    "allowedSources": ["192.168.7.0/24"]}]),
            "allowForeignSources",
        ),
    ];
    for (reverse, needle) in cases {
        l.conf["reverse"] = reverse;
        let (code, msg) = l.call("ADD").err();
        assert_eq!(code, 7, "{msg}");
        assert!(msg.contains(needle), "{needle}: {msg}");
        assert!(l.lab.records().is_empty());
        assert!(l.lab.reserved(NET).is_empty());
        assert!(!l.pod.has_link("net1"));
    }
    // A foreign source is fine when the config says so.
    l.conf["allowForeignSources"] = json!(true);
    l.add();
    l.wait_serving();
    assert_eq!(
        forward_of(&l.status(), "mqtt")["allowedSources"],
        json!(["192.168.7.0/24"])
    );
}

#[test]
fn reverse_connections_and_sessions_survive_a_takeover_and_listeners_come_back_after_a_restart() {
    let mut l = reverse_lab(mqtt_and_stats(), |_| {});
    let cluster = Arc::new(Cluster::default());
    tcp_service(&l, svc(MQTT), "broker", cluster.clone());
    udp_service(&l, svc(STATS), cluster.clone());
    let mut c = device_connect(&l, DEVICE_V4, net1(&l, MQTT)).unwrap();
    assert_eq!(banner(&mut c).unwrap(), "broker");
    assert_eq!(echo(&mut c, b"before\n"), b"before\n");
    let udp = UdpClient::new(&l.lab.device, DEVICE_V4, net1(&l, STATS));
    let udp_echo = |msg: &[u8]| udp.echo(msg);
    assert_eq!(udp_echo(b"u1"), b"u1");

    l.take_over();
    // The same connection and session go on through the new daemon.
    assert_eq!(echo(&mut c, b"after\n"), b"after\n");
    assert_eq!(udp_echo(b"u2"), b"u2");
    let s = l.wait_serving();
    assert_eq!(forward_of(&s, "mqtt")["activeConnections"], 1, "{s:#}");
    assert_eq!(forward_of(&s, "stats")["udpSessionsTotal"], 0, "{s:#}");
    assert_eq!(cluster.tcp_peers.lock().unwrap().len(), 1);
    // Both datagrams left from the same pod socket: the session went on.
    let udp_peers = cluster.udp_peers.lock().unwrap().clone();
    assert!(
        udp_peers.len() == 2 && udp_peers[0] == udp_peers[1],
        "{udp_peers:?}"
    );
    drop(c);

    // A plain restart (SIGKILL, start again): the reverse listeners come
    // back from the record, on net1 only.
    l.daemon().kill9();
    l.start_daemon();
    let s = l.wait_serving();
    assert_eq!(forward_of(&s, "mqtt")["direction"], "reverse", "{s:#}");
    let mut c = device_connect(&l, DEVICE_V4, net1(&l, MQTT)).unwrap();
    assert_eq!(banner(&mut c).unwrap(), "broker");
    assert_eq!(echo(&mut c, b"again\n"), b"again\n");
}

#[test]
fn a_reverse_target_in_the_segment_in_a_hand_edited_record_is_not_served() {
    let l = reverse_lab(mqtt_and_stats(), |_| {});
    let path = l.record_path();
    let mut rec: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    // The plugin refuses this at ADD; the daemon checks the file again.
    rec["reverse"][0]["target"] = json!(format!("{DEVICE_V4}:1883"));
    let tmp = path.with_file_name(".edit.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&rec).unwrap()).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    let s = l.wait_status(Duration::from_secs(10), "the loop refused", |s| {
        forward_of(s, "mqtt")["listener"] == "refused"
            && forward_of(s, "stats")["listener"] == "listening"
    });
    let f = forward_of(&s, "mqtt");
    assert!(
        f["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("a loop") && e.contains(DEVICE_V4)),
        "{f:#}"
    );
    // Nothing listens on net1:1883.
    let e = device_connect(&l, DEVICE_V4, net1(&l, MQTT)).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
}
