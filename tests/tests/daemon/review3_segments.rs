//! Third review (issue 20), item 5: a pod with two edgelink attachments does not bridge its segments.
//!
//! The lab's pod has net1 on segment A (the lab's device, the forwards'
//! targets) and net2 on segment B (a second bridge, uplink and device). A
//! device on B aims at net1's forwards through net2: at net2's address and
//! at the pod's eth0 address. Neither may reach segment A.

use crate::lab::*;
use edgelink_tests::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

const DEVICE_B: &str = "172.31.251.10";

/// Segment B: bridge edge1 with uplink1, cabled to a device namespace at
/// 172.31.251.10, and net2 in the lab's pod on it (no forwards).
fn second_segment(l: &DLab) -> (Netns, String) {
    let dev_b = Netns::new("devb");
    l.lab.node.ip(&[
        "link",
        "add",
        "uplink1",
        "type",
        "veth",
        "peer",
        "name",
        "dev0",
        "netns",
        &dev_b.name,
    ]);
    dev_b.ip(&["addr", "add", &format!("{DEVICE_B}/24"), "dev", "dev0"]);
    dev_b.ip(&["link", "set", "dev0", "up"]);
    l.lab.node.ip(&["link", "set", "uplink1", "up"]);
    let mut conf: Value = l.conf.clone();
    conf["name"] = json!("segment-b");
    conf["bridge"] = json!("edge1");
    conf["uplink"] = json!("uplink1");
    conf["ipam"]["ranges"] = json!([[{"subnet": "172.31.251.0/24",
        "rangeStart": "172.31.251.100", "rangeEnd": "172.31.251.150"}]]);
    conf["ipam"].as_object_mut().unwrap().remove("routes");
    conf["forwards"] = json!([]);
    let path = l.pod.path();
    let r = Call::new("ADD", CID, Some(&path), "net2")
        .args("IgnoreUnknown=1;K8S_POD_NAMESPACE=hil;K8S_POD_NAME=proxy-0")
        .run(&l.lab.node, &conf)
        .ok();
    let net2 = r["ips"][0]["address"].as_str().unwrap();
    let net2 = net2.split('/').next().unwrap().to_string();
    // The pod's eth0 address, routed through net2.
    dev_b.ip(&["route", "add", "10.244.1.0/24", "via", &net2]);
    (dev_b, net2)
}

/// What a TCP client on segment B gets back through `to`: the echo of
/// its bytes (it got across), or None (refused, reset, closed).
fn tcp_across(dev_b: &Netns, to: SocketAddr) -> Option<Vec<u8>> {
    let mut s = connect_in(dev_b, to, Duration::from_secs(3)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    s.write_all(b"across").ok()?;
    let mut buf = [0u8; 6];
    s.read_exact(&mut buf).ok().map(|()| buf.to_vec())
}

/// Whether a UDP datagram from segment B to `to` gets an answer.
fn udp_across(dev_b: &Netns, to: SocketAddr) -> bool {
    in_netns(dev_b, || {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(700)))
            .unwrap();
        let mut buf = [0u8; 64];
        (0..3).any(|_| {
            let _ = s.send_to(b"across", to);
            s.recv_from(&mut buf).is_ok()
        })
    })
}

#[test]
fn a_device_on_a_second_segment_reaches_nothing_of_the_first_through_the_relay() {
    let l = DLab::new();
    let (dev_b, net2) = second_segment(&l);
    let net2_addr = |port: u16| -> SocketAddr { format!("{net2}:{port}").parse().unwrap() };
    for to in [net2_addr(API), pod_addr(API)] {
        assert_eq!(
            tcp_across(&dev_b, to),
            None,
            "a device on segment B reached segment A's device through {to}"
        );
    }
    for to in [net2_addr(UDP), pod_addr(UDP)] {
        assert!(
            !udp_across(&dev_b, to),
            "a device on segment B reached segment A's device through {to}"
        );
    }
    // Each was refused and counted; the cluster side is served.
    let api = forward_of(&l.status(), "api");
    assert!(api["refused"].as_u64().unwrap() >= 2, "{api:#}");
    let telemetry = forward_of(&l.status(), "telemetry");
    assert!(telemetry["refused"].as_u64().unwrap() >= 2, "{telemetry:#}");
    l.echo_once(b"from the cluster");
}

#[test]
fn with_a_kernel_forward_a_second_segment_is_not_dnated_and_a_second_add_does_not_stop_it() {
    if std::process::Command::new("nft")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("SKIP: nft is not installed (Debian package nftables)");
        return;
    }
    const KAPI: u16 = 8090;
    let mut l = DLab::with(Opts {
        add: false,
        ..Default::default()
    });
    l.conf["forwards"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "kapi", "protocol": "tcp", "port": KAPI,
            "target": format!("{DEVICE_V4}:{API}"), "path": "kernel"}));
    l.add();
    l.wait_serving();
    let through_kernel = |l: &DLab| {
        let Ok(mut s) = l.connect(KAPI) else {
            return false;
        };
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = [0u8; 6];
        s.write_all(b"kernel").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"kernel"
    };
    assert!(through_kernel(&l));
    // net2's ADD turns forwarding off in the pod; edgelinkd installs
    // net1's table again beside the new attachment, forwarding with it.
    let (dev_b, net2) = second_segment(&l);
    assert!(
        wait_until(Duration::from_secs(10), || through_kernel(&l)),
        "the kernel forward stopped after a second ADD in its pod"
    );
    assert_eq!(l.pod.sysctl("net.ipv4.ip_forward"), "1");
    // Segment B's device at net2's and eth0's addresses: not DNATed.
    for to in [format!("{net2}:{KAPI}").parse().unwrap(), pod_addr(KAPI)] {
        assert_eq!(
            tcp_across(&dev_b, to),
            None,
            "a device on segment B reached segment A's device through {to}"
        );
    }
}
