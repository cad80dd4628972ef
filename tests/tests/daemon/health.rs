//! Device health probes (issue 24): each type against a device that
//! answers and one that does not, the thresholds, the error naming the
//! cause, a probe as one of the device's `maxConnections`, and the
//! webhook told of a transition.

use crate::lab::*;
use crate::visibility::Receiver;
use edgelink_tests::*;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// HTTP on the device: `/healthz` 200, anything else 500.
const HTTP: u16 = 8090;
/// A Modbus/TCP responder: register 0 read, any other an exception 2.
const MODBUS: u16 = 5020;
/// A UDP port nothing listens on.
const UDP_CLOSED: u16 = 5009;
/// A forward to the echo with maxConnections 1.
const PLC: u16 = 8095;

/// The lab with `health` (probing every 200 ms, thresholds 2 and 2 unless
/// `h` says otherwise), `extra` forwards, the device's HTTP and Modbus
/// servers, daemon flags `flags`.
fn lab(flags: &[&str], h: Value, extra: Value) -> DLab {
    let mut l = DLab::with(Opts {
        flags,
        add: false,
        ..Default::default()
    });
    start_http(&l);
    start_modbus(&l);
    let mut spec = json!({"intervalMs": 200, "timeoutMs": 150,
        "failureThreshold": 2, "successThreshold": 2});
    for (k, v) in h.as_object().expect("an object") {
        spec[k] = v.clone();
    }
    l.conf["health"] = spec;
    let f = l.conf["forwards"].as_array_mut().unwrap();
    f.extend(extra.as_array().expect("an array").iter().cloned());
    l.add();
    l.wait_serving();
    l
}

fn health_of(s: &Value) -> Value {
    s["attachments"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["containerId"] == CID))
        .map(|a| a["health"].clone())
        .unwrap_or(Value::Null)
}

/// Wait (10 s at most) until the health state is `state`; its report.
fn wait_state(l: &DLab, state: &str) -> Value {
    let s = l.wait_status(Duration::from_secs(10), &format!("health {state}"), |s| {
        health_of(s)["state"] == state
    });
    health_of(&s)
}

fn n(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))
}

/// A state reached only after its threshold: at least `k` probes of its
/// kind since the last of the other.
fn assert_reached(h: &Value, state: &str) {
    let (probes, failures) = (n(h, "probesTotal"), n(h, "failuresTotal"));
    match state {
        "reachable" => {
            assert!(probes - failures >= 2, "{h}");
            assert!(h["lastSeen"].is_u64() && h["latencyMs"].is_f64(), "{h}");
            assert!(h.get("error").is_none(), "{h}");
        }
        _ => assert!(failures >= 2, "{h}"),
    }
    assert!(
        n(h, "sinceMs") / 1000 == n(h, "since") && h["checkedAt"].is_u64(),
        "{h}"
    );
}

/// Poll (10 s at most) until the health is `state`, holding at every
/// look that it is `state` exactly when `enough` says the threshold is
/// met (each report is one consistent snapshot): the state moves on the
/// probe that reaches the threshold, neither before nor after it.
fn watch_until(l: &DLab, state: &str, enough: impl Fn(&Value) -> bool) -> Value {
    let s = l.wait_status(Duration::from_secs(10), &format!("health {state}"), |s| {
        let h = health_of(s);
        let reached = h["state"] == state;
        let counted = h.get("probesTotal").is_some();
        assert!(
            !counted || reached == enough(&h),
            "state and counts disagree: {h}"
        );
        if !reached {
            assert_eq!(h["state"], "unknown", "{h}");
        }
        reached
    });
    health_of(&s)
}

fn start_http(l: &DLab) {
    let listener = l
        .dev
        .run(async { tokio::net::TcpListener::bind(device_addr(HTTP)).await })
        .expect("bind the device's HTTP");
    l.dev.spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") && got.len() < 4096 {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(k) => got.extend_from_slice(&buf[..k]),
                    }
                }
                let text = String::from_utf8_lossy(&got);
                let ok = text.starts_with("GET /healthz HTTP/1.1\r\n")
                    && text.contains(&format!("\r\nHost: {DEVICE_V4}:{HTTP}\r\n"))
                    && text.contains("\r\nConnection: close\r\n");
                let answer: &[u8] = if ok {
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                } else {
                    b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n"
                };
                let _ = s.write_all(answer).await;
                let _ = s.shutdown().await;
            });
        }
    });
}

fn start_modbus(l: &DLab) {
    let listener = l
        .dev
        .run(async { tokio::net::TcpListener::bind(device_addr(MODBUS)).await })
        .expect("bind the device's Modbus");
    l.dev.spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut req = [0u8; 12];
                while s.read_exact(&mut req).await.is_ok() {
                    let (tid, unit) = ([req[0], req[1]], req[6]);
                    let register = u16::from_be_bytes([req[8], req[9]]);
                    let pdu: Vec<u8> = match (req[7], register) {
                        (3, 0) => vec![3, 2, 0x12, 0x34],
                        (f, _) => vec![f | 0x80, 2],
                    };
                    let len = (pdu.len() + 1) as u16;
                    let mut frame = vec![tid[0], tid[1], 0, 0];
                    frame.extend_from_slice(&len.to_be_bytes());
                    frame.push(unit);
                    frame.extend_from_slice(&pdu);
                    if s.write_all(&frame).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
}

/// The device's link down: nothing it had answers any more.
fn device_down(l: &DLab) {
    l.lab.device.ip(&["link", "set", "dev0", "down"]);
}

fn assert_error(h: &Value, want: &str) {
    let e = h["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error in {h}"));
    assert!(e.contains(want), "the error {e:?} does not name {want:?}");
}

#[test]
fn tcp_health_rises_then_falls_when_the_device_goes_and_replaces_the_reachability_probe() {
    let l = lab(
        &["--probe-interval", "1"],
        json!({"type": "tcp", "target": format!("{DEVICE_V4}:{API}")}),
        json!([]),
    );
    let h = wait_state(&l, "reachable");
    assert_reached(&h, "reachable");
    assert_eq!(
        (h["type"].as_str(), h["target"].as_str()),
        (Some("tcp"), Some("172.31.250.10:8080"))
    );
    // Health replaces the forwards' reachability probe: nobody connected,
    // so theirs stays unknown.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(l.forward("api")["reachability"]["state"], "unknown");
    device_down(&l);
    let h = wait_state(&l, "unreachable");
    assert_reached(&h, "unreachable");
    assert_error(&h, "tcp 172.31.250.10:8080: no answer within 150 ms");
    assert!(h["lastSeen"].is_u64(), "lastSeen stays: {h}");
    // /metrics and the table.
    let (_, m) = l.get("/metrics");
    assert!(
        m.lines()
            .any(|x| x.starts_with("edgelink_health_up{") && x.ends_with(" 0")),
        "{m}"
    );
    assert!(m.contains("result=\"failure\""), "{m}");
}

#[test]
fn tcp_health_to_a_closed_port_says_refused() {
    let l = lab(
        &[],
        json!({"target": format!("{DEVICE_V4}:{CLOSED}"), "failureThreshold": 3}),
        json!([]),
    );
    // Every probe fails: unreachable exactly from the third on.
    let h = watch_until(&l, "unreachable", |h| n(h, "failuresTotal") >= 3);
    assert_error(&h, "connect 172.31.250.10:8081: Connection refused");
    assert!(
        h.get("lastSeen").is_none() && h.get("latencyMs").is_none(),
        "{h}"
    );
}

#[test]
fn icmp_health_is_answered_by_the_kernel_and_fails_with_the_link() {
    let l = lab(
        &[],
        json!({"type": "icmp", "target": DEVICE_V4, "failureThreshold": 3}),
        json!([]),
    );
    let h = wait_state(&l, "reachable");
    assert_reached(&h, "reachable");
    assert_eq!(h["target"], DEVICE_V4);
    device_down(&l);
    let h = wait_state(&l, "unreachable");
    assert!(n(&h, "failuresTotal") >= 3, "failureThreshold 3: {h}");
    assert_error(&h, "icmp 172.31.250.10: no answer within 150 ms");
}

/// From an ICMP datagram socket: the pod's ping_group_range lets group 0
/// make one (containerd 2 sets it so for every pod), and the probe tries
/// it before a raw socket (the other tests, where the range is the
/// kernel's default "1 0": raw, as root with CAP_NET_RAW).
#[test]
fn icmp_health_over_ipv6_from_a_datagram_socket() {
    let mut l = DLab::with(Opts {
        add: false,
        v6: true,
        ..Default::default()
    });
    let set = l
        .pod
        .exec(&["sysctl", "-w", "net.ipv4.ping_group_range=0 2147483647"]);
    assert!(set.status.success(), "{set:?}");
    l.conf["health"] =
        json!({"type": "icmp", "target": DEVICE_V6, "intervalMs": 200, "timeoutMs": 150});
    l.add();
    l.wait_serving();
    let h = wait_state(&l, "reachable");
    assert_reached(&h, "reachable");
}

#[test]
fn http_health_reads_the_status_line() {
    let l = lab(
        &[],
        json!({"type": "http", "target": format!("{DEVICE_V4}:{HTTP}"), "path": "/healthz",
            "expectStatus": 200, "successThreshold": 3}),
        json!([]),
    );
    // Every probe succeeds: reachable exactly from the third on.
    let h = watch_until(&l, "reachable", |h| n(h, "probesTotal") >= 3);
    assert_eq!(n(&h, "failuresTotal"), 0, "{h}");
    assert_reached(&h, "reachable");
}

#[test]
fn http_health_with_an_unexpected_status_is_unreachable() {
    let l = lab(
        &[],
        json!({"type": "http", "target": format!("{DEVICE_V4}:{HTTP}"), "path": "/broken", "expectStatus": 200}),
        json!([]),
    );
    let h = wait_state(&l, "unreachable");
    assert_reached(&h, "unreachable");
    assert_error(
        &h,
        "http 172.31.250.10:8090/broken: status 500, expected 200",
    );
}

#[test]
fn udp_health_takes_any_reply_and_a_closed_port_is_refused() {
    let l = lab(&[], json!({"type": "udp", "payload": "ping\n"}), json!([]));
    let h = wait_state(&l, "reachable");
    assert_reached(&h, "reachable");
    assert_eq!(
        h["target"],
        format!("{DEVICE_V4}:{UDP}"),
        "the first UDP forward's"
    );
    let l = lab(
        &[],
        json!({"type": "udp", "payload": "ping\n", "target": format!("{DEVICE_V4}:{UDP_CLOSED}")}),
        json!([]),
    );
    let h = wait_state(&l, "unreachable");
    assert_error(&h, "udp 172.31.250.10:5009: Connection refused");
}

#[test]
fn modbus_health_reads_a_register_and_an_exception_is_a_failure() {
    let l = lab(
        &[],
        json!({"type": "modbus", "target": format!("{DEVICE_V4}:{MODBUS}"), "unitId": 7}),
        json!([]),
    );
    assert_reached(&wait_state(&l, "reachable"), "reachable");
    let l = lab(
        &[],
        json!({"type": "modbus", "target": format!("{DEVICE_V4}:{MODBUS}"), "register": 9}),
        json!([]),
    );
    let h = wait_state(&l, "unreachable");
    assert_reached(&h, "unreachable");
    assert_error(
        &h,
        "modbus 172.31.250.10:5020: exception 2 (illegal data address) from unit 1",
    );
}

#[test]
fn a_probe_takes_a_place_under_max_connections_and_is_skipped_when_none_is_free() {
    let l = lab(
        &[],
        json!({"type": "tcp", "target": format!("{DEVICE_V4}:{API}")}),
        json!([{"name": "plc", "port": PLC, "target": format!("{DEVICE_V4}:{API}"), "maxConnections": 1}]),
    );
    wait_state(&l, "reachable");
    // A client holds the only place.
    let mut c = l.connect(PLC).expect("connect to plc");
    assert_eq!(echo(&mut c, b"mine"), b"mine");
    let held = wait_state(&l, "reachable");
    // (The client may have waited a moment behind a probe that held the
    // place when it came: a probe is one of the connections.)
    let queued_before = forward_of(&l.status(), "plc")["queuedTotal"].clone();
    let s = l.wait_status(Duration::from_secs(10), "probes skipped", |s| {
        n(&health_of(s), "skippedTotal") >= n(&held, "skippedTotal") + 3
    });
    let h = health_of(&s);
    assert_eq!(
        h["state"], "reachable",
        "a skipped probe changes nothing: {h}"
    );
    let plc = forward_of(&s, "plc");
    assert_eq!(
        (plc["targetConnections"].as_u64(), plc["queued"].as_u64()),
        (Some(1), Some(0)),
        "no probe waits for the place: {plc}"
    );
    assert_eq!(plc["queuedTotal"], queued_before, "{plc}");
    // The client was not disturbed.
    assert_eq!(echo(&mut c, b"still mine"), b"still mine");
    drop(c);
    let skipped = n(&h, "skippedTotal");
    let probes = n(&h, "probesTotal");
    let s = l.wait_status(Duration::from_secs(10), "probing again", |s| {
        n(&health_of(s), "probesTotal") >= probes + 2
    });
    let plc = forward_of(&s, "plc");
    assert_eq!(
        plc["queuedTotal"], queued_before,
        "nobody waited behind a probe: {plc}"
    );
    assert!(n(&health_of(&s), "skippedTotal") <= skipped + 1, "{s:#}");
    let (_, m) = l.get("/metrics");
    assert!(
        m.lines()
            .any(|x| x.starts_with("edgelink_health_probes_total{")
                && x.contains("result=\"skipped\"")
                && !x.ends_with(" 0")),
        "{m}"
    );
}

#[test]
fn a_health_transition_is_posted_to_the_webhook_at_once() {
    // The heartbeat an hour away: any POST is a change.
    let flags = [
        "--status-webhook",
        "http://127.0.0.1:18097/v1/status",
        "--status-webhook-interval",
        "3600",
    ];
    let mut l = DLab::with(Opts {
        flags: &flags,
        daemon: false,
        add: false,
        ..Default::default()
    });
    let r = Receiver::start(&l.lab.node, 18097);
    l.start_daemon();
    l.conf["health"] = json!({"type": "icmp", "target": DEVICE_V4, "intervalMs": 200, "timeoutMs": 150,
        "failureThreshold": 2, "successThreshold": 2});
    l.add();
    l.wait_serving();
    let posted = |state: &str| {
        r.got.lock().unwrap().iter().any(|(_, body)| {
            serde_json::from_str::<Value>(body).is_ok_and(|s| health_of(&s)["state"] == state)
        })
    };
    assert!(
        wait_until(Duration::from_secs(10), || posted("reachable")),
        "no POST with health reachable"
    );
    device_down(&l);
    assert!(
        wait_until(Duration::from_secs(10), || posted("unreachable")),
        "no POST with health unreachable"
    );
}
