//! Virtual addresses (issue 24, the reverse direction): the address a
//! device dials for the reverse forwards, held by one proxy pod at a time.
//! Here one pod: held always without an operator; with one, only while its
//! heartbeat answers grant it, dropped at once on a release, and gone
//! with the grant when the operator falls silent or the daemon dies (the
//! kernel lifetime). Taking it is announced: the device's stale
//! neighbour entry points at the pod's net1 at once.
//!
//! ```text
//!   device 172.31.250.10 --segment-- pod net1 (.100..) + 172.31.250.50 :1883/tcp :8125/udp
//!   pod eth0 10.244.1.10 ----- cluster 10.244.1.20 (services)
//! ```

use super::lab::*;
use super::reverse::*;
use crate::visibility::Receiver;
use edgelink_tests::*;
use serde_json::json;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

const VIP: &str = "172.31.250.50";
/// The pod's name as grants use it (the lab's K8S_POD_NAMESPACE/NAME).
const POD: &str = "hil/proxy-0";

fn vip(port: u16) -> SocketAddr {
    format!("{VIP}:{port}").parse().unwrap()
}

fn svc(port: u16) -> SocketAddr {
    format!("{CLIENT_IP}:{port}").parse().unwrap()
}

/// Whether the pod's net1 has the virtual address now.
fn on_net1(l: &DLab) -> bool {
    l.pod
        .ip(&["-o", "addr", "show", "dev", "net1"])
        .contains(&format!("inet {VIP}/32"))
}

/// The MAC the device's neighbour table has for the virtual address.
fn device_neigh(l: &DLab) -> String {
    l.lab.device.ip(&["neigh", "show", VIP])
}

fn net1_mac(l: &DLab) -> String {
    let s = l.status();
    s["attachments"][0]["interface"]["mac"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn vip_lab(flags: &'static [&'static str]) -> DLab {
    let mut l = DLab::with(Opts {
        add: false,
        flags,
        ..Default::default()
    });
    l.conf["reverse"] = mqtt_and_stats();
    l.conf["virtualAddresses"] = json!([VIP]);
    l.add();
    l.wait_serving();
    l
}

/// The lab with an operator's stand-in on loopback `port` (heartbeats
/// every 200 ms, each answered with `answer`), the reverse forwards and
/// the virtual address, ADDed and served.
fn granted_lab(port: u16, answer: String) -> (DLab, Receiver) {
    let url = format!("http://127.0.0.1:{port}/v1/status");
    let flags = [
        "--status-webhook",
        &url,
        "--status-webhook-heartbeat",
        "200ms",
    ];
    let mut l = DLab::with(Opts {
        add: false,
        daemon: false,
        flags: &flags,
        ..Default::default()
    });
    let r = Receiver::start(&l.lab.node, port);
    *r.grants.lock().unwrap() = Some(answer);
    l.start_daemon();
    l.conf["reverse"] = mqtt_and_stats();
    l.conf["virtualAddresses"] = json!([VIP]);
    l.add();
    l.wait_serving();
    (l, r)
}

#[test]
fn without_an_operator_the_pod_holds_it_and_the_device_reaches_the_cluster_through_it() {
    let l = vip_lab(&[]);
    let cluster = Arc::new(Cluster::default());
    tcp_service(&l, svc(MQTT), "broker", cluster.clone());
    udp_service(&l, svc(STATS), cluster.clone());
    assert!(
        wait_until(Duration::from_secs(5), || on_net1(&l)),
        "the address is not on net1: {}",
        l.pod.ip(&["addr"])
    );
    let mut s = device_connect(&l, DEVICE_V4, vip(MQTT)).expect("connect to the virtual address");
    assert_eq!(banner(&mut s).unwrap(), "broker");
    drop(s);
    let answer = device_udp(&l, DEVICE_V4, vip(STATS), b"t:1|c", Duration::from_secs(5));
    assert_eq!(answer.as_deref(), Some(&b"t:1|c"[..]));
    let st = l.wait_status(Duration::from_secs(5), "held, unmanaged", |s| {
        s["attachments"][0]["virtualAddresses"]["held"] == true
    });
    let v = &st["attachments"][0]["virtualAddresses"];
    assert_eq!(v["addresses"], json!([VIP]), "{v:#}");
    assert_eq!(v["grantedBy"], "unmanaged", "{v:#}");
    assert_eq!(v["takenTotal"], 1, "{v:#}");
    // The listeners on it were bound from the start.
    assert!(
        forward_of(&st, "mqtt")["listen"]
            .as_array()
            .unwrap()
            .contains(&json!(vip(MQTT).to_string())),
        "{st:#}"
    );
    let (_, m) = l.get("/metrics");
    let held = m
        .lines()
        .find(|x| x.starts_with("edgelink_virtual_address_held{"))
        .unwrap_or_default();
    assert!(
        held.contains(&format!("addresses=\"{VIP}\"")) && held.ends_with(" 1"),
        "{m}"
    );
}

#[test]
fn with_an_operator_it_is_held_only_while_granted_and_announced_when_taken() {
    let (l, r) = granted_lab(18096, r#"{"holdMs": 1000}"#.to_string());
    let grant = |json: &str| *r.grants.lock().unwrap() = Some(json.to_string());
    let cluster = Arc::new(Cluster::default());
    tcp_service(&l, svc(MQTT), "broker", cluster.clone());

    // Not granted: not held.
    let st = l.wait_status(Duration::from_secs(5), "granted by the operator", |s| {
        s["attachments"][0]["virtualAddresses"]["grantedBy"] == "operator"
    });
    assert_eq!(st["attachments"][0]["virtualAddresses"]["held"], false);
    std::thread::sleep(Duration::from_millis(600));
    assert!(!on_net1(&l), "held without a grant");
    let last_beat = || r.beats.lock().unwrap().last().cloned().unwrap_or_default();
    assert!(last_beat().contains(r#""holding":[]"#), "{}", last_beat());

    // The device has a stale entry for it, pointing elsewhere.
    l.lab.device.ip(&[
        "neigh",
        "replace",
        VIP,
        "lladdr",
        "02:00:00:00:00:99",
        "dev",
        "dev0",
        "nud",
        "stale",
    ]);
    grant(&format!(r#"{{"holds": ["{POD}"], "holdMs": 1000}}"#));
    assert!(
        wait_until(Duration::from_secs(3), || on_net1(&l)),
        "not taken"
    );
    let mac = net1_mac(&l);
    assert!(
        wait_until(Duration::from_secs(2), || device_neigh(&l).contains(&mac)),
        "not announced: the device has {:?}, net1 is {mac}",
        device_neigh(&l)
    );
    let mut s = device_connect(&l, DEVICE_V4, vip(MQTT)).expect("connect while held");
    assert_eq!(banner(&mut s).unwrap(), "broker");
    assert!(
        wait_until(Duration::from_secs(2), || last_beat().contains(POD)),
        "the heartbeat says what it holds: {}",
        last_beat()
    );

    // Released: gone at once, and the next heartbeat says so.
    grant(&format!(r#"{{"releases": ["{POD}"], "holdMs": 1000}}"#));
    assert!(
        wait_until(Duration::from_millis(1500), || !on_net1(&l)),
        "not released"
    );
    assert!(wait_until(Duration::from_secs(1), || last_beat()
        .contains(r#""holding":[]"#)));
    // The live connection through it is no longer reached.
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));

    // Granted again, then the operator falls silent: gone with the grant.
    grant(&format!(r#"{{"holds": ["{POD}"], "holdMs": 1000}}"#));
    assert!(
        wait_until(Duration::from_secs(3), || on_net1(&l)),
        "not taken again"
    );
    drop(r);
    assert!(
        wait_until(Duration::from_secs(3), || !on_net1(&l)),
        "still held with the operator silent"
    );
    let st = l.status();
    let v = &st["attachments"][0]["virtualAddresses"];
    assert_eq!(
        (v["takenTotal"].as_u64(), v["releasedTotal"].as_u64()),
        (Some(2), Some(2)),
        "{v:#}"
    );
    assert!(v["announcementsTotal"].as_u64().unwrap_or(0) >= 2, "{v:#}");
}

#[test]
fn the_kernel_drops_a_dead_daemons_address_by_itself() {
    let (mut l, _operator) =
        granted_lab(18097, format!(r#"{{"holds": ["{POD}"], "holdMs": 1500}}"#));
    assert!(
        wait_until(Duration::from_secs(5), || on_net1(&l)),
        "not taken"
    );
    let lft = l.pod.ip(&["-o", "addr", "show", "dev", "net1"]);
    assert!(
        lft.contains("valid_lft 2sec") || lft.contains("valid_lft 1sec"),
        "{lft}"
    );
    l.daemon().kill9();
    // At most the kernel lifetime (2 s) and its once-a-second check.
    assert!(
        wait_until(Duration::from_secs(5), || !on_net1(&l)),
        "the address outlived its daemon: {}",
        l.pod.ip(&["-o", "addr", "show", "dev", "net1"])
    );
}

#[test]
fn a_take_over_keeps_the_address_and_its_listeners() {
    let (mut l, _operator) =
        granted_lab(18098, format!(r#"{{"holds": ["{POD}"], "holdMs": 1500}}"#));
    let cluster = Arc::new(Cluster::default());
    tcp_service(&l, svc(MQTT), "broker", cluster.clone());
    assert!(
        wait_until(Duration::from_secs(5), || on_net1(&l)),
        "not taken"
    );
    let mut s = device_connect(&l, DEVICE_V4, vip(MQTT)).expect("before the take-over");
    assert_eq!(banner(&mut s).unwrap(), "broker");
    l.take_over();
    for round in 0..3 {
        std::thread::sleep(Duration::from_secs(1));
        assert!(
            on_net1(&l),
            "round {round}: gone after the take-over: {}",
            l.daemon().log_text()
        );
        let mut s = device_connect(&l, DEVICE_V4, vip(MQTT)).unwrap_or_else(|e| {
            panic!(
                "round {round}: after the take-over: {e}\n{}",
                l.daemon().log_text()
            )
        });
        assert_eq!(banner(&mut s).unwrap(), "broker");
    }
    // The connection made before it goes on.
    s.write_all(b"still here\n").unwrap();
    let mut back = [0u8; 11];
    s.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"still here\n");
}

/// The F6 regression on the kube lab: the new daemon's first report went
/// out before its first pass had filed what was handed over, saying it
/// served no attachment; the operator took the proxy out of its Service
/// and moved the address. Every report and heartbeat the new daemon sends
/// names the attachment it took over, from the first.
#[test]
fn a_take_over_reports_what_it_serves_from_its_first_report() {
    let (mut l, operator) =
        granted_lab(18099, format!(r#"{{"holds": ["{POD}"], "holdMs": 1500}}"#));
    assert!(
        wait_until(Duration::from_secs(5), || on_net1(&l)),
        "not taken"
    );
    for round in 0..3 {
        let (reports, beats) = (
            operator.got.lock().unwrap().len(),
            operator.beats.lock().unwrap().len(),
        );
        l.take_over();
        // Long enough for the new daemon's first report and a few beats.
        std::thread::sleep(Duration::from_millis(1500));
        let got = operator.got.lock().unwrap()[reports..].to_vec();
        assert!(
            !got.is_empty(),
            "round {round}: no report after the take-over"
        );
        for (_, body) in &got {
            let v: serde_json::Value = serde_json::from_str(body).unwrap();
            let served: Vec<&str> = v["attachments"]
                .as_array()
                .map(|a| a.iter().filter_map(|x| x["containerId"].as_str()).collect())
                .unwrap_or_default();
            assert_eq!(
                served.len(),
                1,
                "round {round}: a report after the take-over serves {served:?}: {body}\n{}",
                l.daemon().log_text()
            );
        }
        let beats = operator.beats.lock().unwrap()[beats..].to_vec();
        assert!(beats.len() >= 2, "round {round}: {beats:?}");
    }
}
