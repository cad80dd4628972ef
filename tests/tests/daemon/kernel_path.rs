//! The kernel path (`"path": "kernel"`): edgelinkd installs nftables NAT in
//! the pod's netns for those forwards, beside the relay's; counters come
//! from nft; a daemon restart never doubles a rule; DEL leaves none; the
//! node's conntrack table is checked.

use crate::lab::*;
use edgelink_tests::*;
use serde_json::json;
use std::net::SocketAddr;
use std::time::Duration;

const KAPI: u16 = 8090;
const KUDP: u16 = 5090;

fn nft_missing() -> bool {
    let missing = std::process::Command::new("nft")
        .arg("--version")
        .output()
        .is_err();
    if missing {
        eprintln!("SKIP: nft is not installed (Debian package nftables)");
    }
    missing
}

fn lab(flags: &'static [&'static str]) -> DLab {
    lab_waiting(flags, true)
}

fn lab_waiting(flags: &'static [&'static str], serving: bool) -> DLab {
    let mut l = DLab::with(Opts {
        flags,
        add: false,
        ..Default::default()
    });
    let f = l.conf["forwards"].as_array_mut().unwrap();
    f.push(json!({"name": "kapi", "protocol": "tcp", "port": KAPI,
        "target": format!("{DEVICE_V4}:{API}"), "path": "kernel"}));
    f.push(json!({"name": "kudp", "protocol": "udp", "port": KUDP,
        "target": format!("{DEVICE_V4}:{UDP}"), "path": "kernel"}));
    l.add();
    if serving {
        l.wait_serving();
    }
    l
}

/// `nft -s list ruleset` in the pod.
fn ruleset(l: &DLab) -> String {
    // -s: without the counters' values.
    let out = l.pod.exec(&["nft", "-s", "list", "ruleset"]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn udp_echo(l: &DLab, port: u16) -> bool {
    let dst: SocketAddr = pod_addr(port);
    l.cl.run(async move {
        let s = tokio::net::UdpSocket::bind("0.0.0.0:0").await.unwrap();
        s.connect(dst).await.unwrap();
        for _ in 0..3 {
            let _ = s.send(b"through the kernel").await;
            let mut b = [0u8; 64];
            if let Ok(Ok(n)) =
                tokio::time::timeout(Duration::from_millis(500), s.recv(&mut b)).await
            {
                return &b[..n] == b"through the kernel";
            }
        }
        false
    })
}

#[test]
fn kernel_forwards_relay_tcp_and_udp_count_in_nft_and_survive_a_restart_without_doubling() {
    if nft_missing() {
        return;
    }
    let mut l = lab(&["--kernel-counters-interval", "0.2"]);
    let k = l.forward("kapi");
    assert_eq!(k["path"], "kernel", "{k:#}");
    assert_eq!(k["listener"], "listening", "{k:#}");
    // The relay's bounds are not the kernel's.
    assert!(k.get("maxConnections").is_none(), "{k:#}");
    assert!(k.get("connectLatency").is_none(), "{k:#}");
    let table = ruleset(&l);
    assert_eq!(table.matches("table inet edgelink").count(), 1, "{table}");
    assert!(table.contains("masquerade"), "{table}");
    assert!(!table.contains("random"), "{table}");
    assert_eq!(l.pod.sysctl("net.ipv4.ip_forward"), "1");
    assert_eq!(
        l.pod
            .sysctl("net.netfilter.nf_conntrack_tcp_timeout_time_wait"),
        "65"
    );

    for i in 0..5 {
        let mut s = l.connect(KAPI).expect("connect through the kernel path");
        let msg = format!("kernel {i}\n");
        assert_eq!(echo(&mut s, msg.as_bytes()), msg.as_bytes());
    }
    assert!(udp_echo(&l, KUDP), "UDP through the kernel path");
    // The relay's forwards of the same pod go on beside it.
    l.echo_once(b"relay beside the kernel\n");

    let s = l.wait_status(Duration::from_secs(10), "kernel counters read", |s| {
        let k = forward_of(s, "kapi");
        k["totalConnections"].as_u64() >= Some(5)
            && k["packetsToTarget"].as_u64() > Some(0)
            && k["bytesToClient"].as_u64() > Some(0)
            && forward_of(s, "kudp")["packetsToClient"].as_u64() > Some(0)
    });
    let k = forward_of(&s, "kapi");
    assert!(k["bytesToTarget"].as_u64().unwrap() >= 5 * 9, "{k:#}");
    assert!(l.metric("edgelink_packets_to_target_total", "kapi") > 0.0);
    assert!(l.metric("edgelink_packets_to_client_total", "kudp") > 0.0);
    assert_eq!(forward_of(&s, "kudp")["reachability"]["state"], "reachable");
    // No probe in the lab: the device's replies counted by nft tell.
    assert_eq!(k["reachability"]["state"], "reachable", "{k:#}");
    let before = forward_of(&s, "kapi")["totalConnections"].as_u64().unwrap();

    // A restart installs the same table again, never a second one (its
    // counters start from zero: the new daemon's count is its own).
    let table_before = ruleset(&l);
    l.daemon().kill9();
    // The kernel keeps forwarding while no daemon runs.
    let mut s = l.connect(KAPI).expect("connect with no daemon");
    assert_eq!(echo(&mut s, b"no daemon\n"), b"no daemon\n");
    l.start_daemon();
    l.wait_serving();
    assert_eq!(ruleset(&l), table_before, "a restart changed the table");
    let mut s = l.connect(KAPI).expect("connect after the restart");
    assert_eq!(echo(&mut s, b"after\n"), b"after\n");
    l.wait_status(Duration::from_secs(10), "counted after the restart", |s| {
        forward_of(s, "kapi")["totalConnections"].as_u64() >= Some(1)
    });
    assert!(before >= 5);

    // DEL: no rule is left, and the pod forwards nothing any more.
    l.call("DEL").ok_empty();
    assert!(
        wait_until(Duration::from_secs(10), || !ruleset(&l)
            .contains("table inet edgelink")),
        "the table outlived DEL:\n{}",
        ruleset(&l)
    );
    assert_eq!(l.pod.sysctl("net.ipv4.ip_forward"), "0");
}

#[test]
fn a_conntrack_table_smaller_than_conntrack_min_is_a_warning_in_status() {
    if nft_missing() {
        return;
    }
    let l = lab(&["--conntrack-min", "4294967296"]);
    let s = l.wait_status(Duration::from_secs(10), "a warning", |s| {
        s["warnings"].as_array().is_some_and(|w| !w.is_empty())
    });
    let w = s["warnings"][0].as_str().unwrap();
    assert!(w.contains("nf_conntrack_max"), "{w}");
    assert!(w.contains("4294967296"), "{w}");
    assert_eq!(l.metric_plain("edgelink_warnings"), 1.0);
    // Still served: a warning, not a refusal.
    let mut c = l.connect(KAPI).expect("connect");
    assert_eq!(echo(&mut c, b"warned\n"), b"warned\n");
}

#[test]
fn a_kernel_forward_whose_nft_fails_is_reported_failed_and_the_relay_goes_on() {
    let l = lab_waiting(&["--nft", "/nonexistent/nft"], false);
    let s = l.wait_status(Duration::from_secs(10), "kapi failed", |s| {
        forward_of(s, "kapi")["listener"] == "failed"
            && forward_of(s, "api")["listener"] == "listening"
    });
    let k = forward_of(&s, "kapi");
    let err = k["lastError"].as_str().unwrap_or_default();
    assert!(err.contains("/nonexistent/nft"), "{k:#}");
    l.echo_once(b"the relay is not held back\n");
}
