//! Private-side refusal, one rule at a time. `PrivateSide::refuses`
//! (crates/edgelinkd/src/forward.rs) refuses a connection or datagram that
//! arrived on the edgelink interface, OR was addressed to one of its
//! addresses, OR comes from inside one of its subnets (IPv4-mapped IPv6
//! peers judged as IPv4). security.rs covers the case where all three hold
//! at once; each test here makes only some of them hold, and checks that
//! the refusal is counted and that a cluster client is still served.

use crate::lab::*;
use edgelink_tests::*;
use std::net::{IpAddr, SocketAddr, SocketAddrV6};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How a TCP attempt through the `api` (echo) forward ended.
#[derive(Debug, PartialEq)]
enum Tcp {
    Relayed,
    /// Reset or closed without an answer.
    Refused,
    Other(String),
}

/// From `src` (port 0) to `dst`, on `rt`'s namespace: one byte, echoed back
/// if relayed.
fn tcp_from(rt: &NsRuntime, src: SocketAddr, dst: SocketAddr) -> Tcp {
    rt.run(async move {
        let sock = if dst.is_ipv4() {
            tokio::net::TcpSocket::new_v4()
        } else {
            tokio::net::TcpSocket::new_v6()
        }
        .unwrap();
        if let Err(e) = sock.bind(src) {
            return Tcp::Other(format!("bind {src}: {e}"));
        }
        let mut s = match tokio::time::timeout(Duration::from_secs(5), sock.connect(dst)).await {
            Err(_) => return Tcp::Other(format!("connect {dst}: timed out")),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => return Tcp::Refused,
            Ok(Err(e)) => return Tcp::Other(format!("connect {dst}: {e}")),
            Ok(Ok(s)) => s,
        };
        // A write may already meet the reset; the read tells.
        let _ = s.write_all(b"x").await;
        let mut b = [0u8; 16];
        match tokio::time::timeout(Duration::from_secs(10), s.read(&mut b)).await {
            Err(_) => Tcp::Other("no answer and no end in 10 s".into()),
            Ok(Ok(0)) => Tcp::Refused,
            Ok(Ok(n)) if &b[..n] == b"x" => Tcp::Relayed,
            Ok(Ok(n)) => Tcp::Other(format!("unexpected {:?}", &b[..n])),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => Tcp::Refused,
            Ok(Err(e)) => Tcp::Other(format!("read: {e}")),
        }
    })
}

/// Three datagrams from `src` to `dst` through the `telemetry` (echo)
/// forward; whether any answer came back.
fn udp_from(rt: &NsRuntime, src: SocketAddr, dst: SocketAddr) -> bool {
    rt.run(async move {
        let s = tokio::net::UdpSocket::bind(src).await.unwrap();
        s.connect(dst).await.unwrap();
        for _ in 0..3 {
            let _ = s.send(b"let me in").await;
        }
        let mut b = [0u8; 64];
        matches!(
            tokio::time::timeout(Duration::from_millis(500), s.recv(&mut b)).await,
            Ok(Ok(_))
        )
    })
}

fn wait_refused(l: &DLab, fwd: &str, n: u64) {
    let s = l.wait_status(
        Duration::from_secs(5),
        &format!("{fwd}: {n} refused"),
        |s| forward_of(s, fwd)["refused"] == n,
    );
    let f = forward_of(&s, fwd);
    assert_eq!(f["refused"], n, "{f:#}");
    if fwd.starts_with("api") {
        assert_eq!(f["totalConnections"], 0, "relayed: {f:#}");
    } else {
        assert_eq!(f["udpSessionsTotal"], 0, "relayed: {f:#}");
    }
}

/// The cluster side is served all the same.
fn cluster_still_served(l: &DLab) {
    let any4: SocketAddr = "0.0.0.0:0".parse().unwrap();
    assert_eq!(tcp_from(&l.cl, any4, pod_addr(API)), Tcp::Relayed);
    assert!(crate::udp::udp_clients(l, 1, 1).is_empty());
}

/// A device on a routed segment (its address 172.30.0.7 lies outside
/// net1's subnet, the pod routes it back through net1) sends to the pod's
/// *eth0* address through net1: neither its source nor the destination is
/// net1's, only the ingress interface is. Refused.
#[test]
fn a_device_routing_to_the_pods_eth0_address_through_net1_is_refused() {
    let l = DLab::new();
    let net1 = l.net1_ip();
    l.lab
        .device
        .ip(&["addr", "add", "172.30.0.7/32", "dev", "dev0"]);
    l.lab
        .device
        .ip(&["route", "add", &format!("{POD_IP}/32"), "via", &net1]);
    l.pod.ip(&[
        "route",
        "add",
        "172.30.0.7/32",
        "via",
        DEVICE_V4,
        "dev",
        "net1",
    ]);
    let src: SocketAddr = "172.30.0.7:0".parse().unwrap();
    assert_eq!(tcp_from(&l.dev, src, pod_addr(API)), Tcp::Refused);
    wait_refused(&l, "api", 1);
    assert!(
        !udp_from(&l.dev, src, pod_addr(UDP)),
        "a UDP reply through net1"
    );
    wait_refused(&l, "telemetry", 3);
    cluster_still_served(&l);
}

/// A cluster-side client whose source address lies inside net1's subnet
/// (the pod routes it back through eth0): it arrives on eth0, at eth0's
/// address, but from the private segment's range. The design refuses it:
/// the daemon cannot tell it from a device (docs/security.md), so a
/// cluster network must not overlap the private segment.
#[test]
fn a_cluster_client_with_a_source_inside_the_private_subnet_is_refused() {
    let l = DLab::new();
    let inside = "172.31.250.77";
    l.client
        .ip(&["addr", "add", &format!("{inside}/32"), "dev", "eth0"]);
    l.pod
        .ip(&["route", "add", &format!("{inside}/32"), "dev", "eth0"]);
    let src: SocketAddr = format!("{inside}:0").parse().unwrap();
    assert_eq!(tcp_from(&l.cl, src, pod_addr(API)), Tcp::Refused);
    wait_refused(&l, "api", 1);
    assert!(!udp_from(&l.cl, src, pod_addr(UDP)), "a UDP reply");
    wait_refused(&l, "telemetry", 3);
    cluster_still_served(&l);
}

/// Clients on IPv6 sockets using IPv4-mapped addresses (`::ffff:a.b.c.d`,
/// as a dual-stack program does): judged as the IPv4 peers they are. The
/// device to net1's address and a cluster client from inside the private
/// subnet are refused; the cluster client from its own address is relayed.
#[test]
fn ipv4_mapped_ipv6_peers_are_judged_as_ipv4() {
    let l = DLab::new();
    let mapped = |ip: &str, port: u16| -> SocketAddr {
        let v4: std::net::Ipv4Addr = ip.parse().unwrap();
        SocketAddr::new(IpAddr::V6(v4.to_ipv6_mapped()), port)
    };
    // The device, to net1's address.
    let dst = mapped(&l.net1_ip(), API);
    assert_eq!(
        tcp_from(&l.dev, mapped(DEVICE_V4, 0), dst),
        Tcp::Refused,
        "{dst}"
    );
    wait_refused(&l, "api", 1);
    assert!(!udp_from(
        &l.dev,
        mapped(DEVICE_V4, 0),
        mapped(&l.net1_ip(), UDP)
    ));
    wait_refused(&l, "telemetry", 3);

    // A cluster client from inside the private subnet, to eth0.
    let inside = "172.31.250.77";
    l.client
        .ip(&["addr", "add", &format!("{inside}/32"), "dev", "eth0"]);
    l.pod
        .ip(&["route", "add", &format!("{inside}/32"), "dev", "eth0"]);
    assert_eq!(
        tcp_from(&l.cl, mapped(inside, 0), mapped(POD_IP, API)),
        Tcp::Refused
    );
    wait_refused(&l, "api", 2);

    // The cluster client from its own address, mapped: relayed.
    assert_eq!(
        tcp_from(&l.cl, mapped(CLIENT_IP, 0), mapped(POD_IP, API)),
        Tcp::Relayed
    );
    assert!(udp_from(&l.cl, mapped(CLIENT_IP, 0), mapped(POD_IP, UDP)));
    cluster_still_served(&l);
}

/// net1 with an IPv6 subnet. The device reaches the pod over IPv6 at net1's
/// *link-local* address, from its own link-local address: neither is in
/// net1's recorded addresses or subnets, only the ingress interface is
/// net1. Refused, on the IPv6 listener of an IPv4 forward and of an IPv6
/// one alike.
#[test]
fn ipv6_link_local_through_net1_is_refused() {
    let l = DLab::with(Opts {
        v6: true,
        ..Opts::default()
    });
    let link_local = |ns: &Netns, dev: &str| -> Option<String> {
        let out = ns.ip(&["-6", "-o", "addr", "show", "dev", dev, "scope", "link"]);
        if out.contains("tentative") {
            return None;
        }
        out.split_whitespace()
            .skip_while(|w| *w != "inet6")
            .nth(1)
            .map(|a| a.split('/').next().unwrap_or(a).to_string())
    };
    let mut pod_ll = None;
    let mut dev_ll = None;
    assert!(
        wait_until(Duration::from_secs(10), || {
            pod_ll = link_local(&l.pod, "net1");
            dev_ll = link_local(&l.lab.device, "dev0");
            pod_ll.is_some() && dev_ll.is_some()
        }),
        "no usable link-local addresses on net1 / dev0"
    );
    let (pod_ll, dev_ll) = (pod_ll.unwrap(), dev_ll.unwrap());
    let scope: u32 = l
        .lab
        .device
        .ip(&["-o", "link", "show", "dev", "dev0"])
        .split(':')
        .next()
        .and_then(|i| i.trim().parse().ok())
        .expect("dev0's ifindex");
    let at = |ip: &str, port: u16| -> SocketAddr {
        SocketAddr::V6(SocketAddrV6::new(ip.parse().unwrap(), port, 0, scope))
    };
    for (fwd, port, n) in [("api", API, 1), ("api6", API6, 1)] {
        assert_eq!(
            tcp_from(&l.dev, at(&dev_ll, 0), at(&pod_ll, port)),
            Tcp::Refused,
            "{fwd}"
        );
        wait_refused(&l, fwd, n);
    }
    assert!(!udp_from(&l.dev, at(&dev_ll, 0), at(&pod_ll, UDP6)));
    wait_refused(&l, "tel6", 3);
    cluster_still_served(&l);
}
