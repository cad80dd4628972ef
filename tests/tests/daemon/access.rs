//! Who may use a device (issue 26), enforced by edgelinkd on the relay
//! path: the operator's access rules arrive in the heartbeat's answer (an
//! operator's stand-in here), and edgelinkd lets a client through by its
//! address. Two clients in the client namespace, `ALLOWED` and `OTHER`:
//!
//! ```text
//!   client 10.244.1.20 (ci/runner-a), 10.244.1.21 (ci/runner-b)
//!     --- pod eth0 10.244.1.10 [edgelinkd: rules for hil/proxy-0] --- device
//! ```
//!
//! Every refusal is a reset, counted, logged with who it was, and has its
//! audit line; a lease taken resets the others' live connections and
//! lets the holder's go on; a client whose lease waits waits; the rules
//! outlive a restart of the daemon.

use super::lab::*;
use crate::visibility::Receiver;
use edgelink_tests::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

const ALLOWED: &str = "10.244.1.20";
const OTHER: &str = "10.244.1.21";
/// The lab pod's name as the rules key it (K8S_POD_NAMESPACE/NAME).
const POD: &str = "hil/proxy-0";
const DEVICE: &str = "hil/device01-01";

fn client(address: &str, pod: &str) -> Value {
    json!({"address": address, "pod": pod})
}

fn runner_a() -> Value {
    client(ALLOWED, "ci/runner-a")
}

fn runner_b() -> Value {
    client(OTHER, "ci/runner-b")
}

/// The heartbeat's answer with `rule` for the lab's pod.
fn answer(generation: &str, rule: Value) -> String {
    json!({"holds": [], "access": {"generation": generation, "attachments": {POD: rule}}})
        .to_string()
}

/// The lab with a second client address and an operator's stand-in on
/// `port` answering heartbeats (every 200 ms) with `first`; ADDed, served,
/// and the rules taken.
fn access_lab(port: u16, first: String, extra: &[&str]) -> (DLab, Receiver) {
    let url = format!("http://127.0.0.1:{port}/v1/status");
    let mut flags = vec![
        "--status-webhook",
        &url,
        "--status-webhook-heartbeat",
        "200ms",
    ];
    flags.extend_from_slice(extra);
    let mut l = DLab::with(Opts {
        add: false,
        daemon: false,
        flags: &flags,
        ..Default::default()
    });
    l.client
        .ip(&["addr", "add", &format!("{OTHER}/24"), "dev", "eth0"]);
    let r = Receiver::start(&l.lab.node, port);
    *r.grants.lock().unwrap() = Some(first);
    l.start_daemon();
    l.add();
    l.wait_serving();
    (l, r)
}

/// Until the daemon took rules of `generation` (bounded).
fn took(l: &mut DLab, generation: &str) {
    let line = format!("generation={generation}");
    assert!(
        wait_until(Duration::from_secs(10), || l
            .daemon()
            .log_text()
            .contains(&line)),
        "the daemon never took the rules {generation}"
    );
}

/// A TCP connection from `source` in the client namespace to `port`.
fn connect_from(l: &DLab, source: &str, port: u16) -> std::io::Result<TcpStream> {
    let (from, to): (SocketAddr, SocketAddr) =
        (format!("{source}:0").parse().unwrap(), pod_addr(port));
    in_netns(&l.client, move || {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        s.bind(&from.into())?;
        s.connect_timeout(&to.into(), Duration::from_secs(3))?;
        let s: TcpStream = s.into();
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        Ok(s)
    })
}

/// Whether an echo round trip from `source` through `api` works.
fn echoes(l: &DLab, source: &str) -> bool {
    let Ok(mut s) = connect_from(l, source, API) else {
        return false;
    };
    s.write_all(b"ping").is_ok() && {
        let mut b = [0u8; 4];
        s.read_exact(&mut b).is_ok() && &b == b"ping"
    }
}

/// The audit lines the daemon keeps (`/audit`), as JSON.
fn audit(l: &DLab, query: &str) -> Vec<Value> {
    let (code, body) = l.get(&format!("/audit{query}"));
    assert_eq!(code, 200, "{body}");
    body.lines()
        .map(|x| serde_json::from_str(x).unwrap())
        .collect()
}

/// Until an audit line matches (bounded: the writer thread batches).
fn audited(l: &DLab, what: impl Fn(&Value) -> bool) -> Value {
    let mut last = Vec::new();
    for _ in 0..100 {
        last = audit(l, "");
        if let Some(v) = last.iter().find(|v| what(v)) {
            return v.clone();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no such audit line in {last:#?}");
}

#[test]
fn only_the_allowed_clients_get_through_and_each_refusal_is_counted_logged_and_audited() {
    let rule = json!({"device": DEVICE, "allowed": [runner_a()]});
    let flags = ["--udp-idle-timeout", "1", "--status-webhook-interval", "1"];
    let (mut l, r) = access_lab(18190, answer("g1", rule), &flags);
    took(&mut l, "g1");
    assert!(echoes(&l, ALLOWED), "the allowed client gets through");
    assert!(!echoes(&l, OTHER), "the other one is refused");
    // The handshake is the kernel's: the reset comes after it, or before
    // the client saw it complete.
    let ended = match connect_from(&l, OTHER, API) {
        Ok(mut s) => read_end(&mut s),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ended::Reset,
        Err(e) => Ended::Other(e.to_string()),
    };
    assert_eq!(ended, Ended::Reset, "refused with a reset");
    assert!(l.metric("edgelink_refused_by_policy_total", "api") >= 2.0);
    // UDP: the other client's datagrams are dropped, the allowed one's
    // relayed.
    let udp = |source: &str| UdpClient::new(&l.client, source, pod_addr(UDP));
    assert_eq!(udp(ALLOWED).echo(b"t:1"), b"t:1");
    let refused = udp(OTHER);
    let before = l.forward("telemetry")["refused"].as_u64().unwrap_or(0);
    refused.send(b"t:2");
    assert!(wait_until(Duration::from_secs(5), || {
        l.forward("telemetry")["refused"].as_u64().unwrap_or(0) > before
    }));
    // A UDP session has its line as it ends (idle here).
    let session = audited(&l, |v| {
        v["protocol"] == "udp" && v["client"] == "ci/runner-a"
    });
    assert_eq!(session["ended"], "idle-timeout");
    assert_eq!(
        (
            session["bytesToDevice"].as_u64(),
            session["bytesToClient"].as_u64()
        ),
        (Some(3), Some(3))
    );
    // Logged with who it was.
    let log = l.daemon().log_text();
    assert!(
        log.contains("refused a client") && log.contains(&format!("{OTHER}:")),
        "{log}"
    );
    // Audited: the allowed connection by its pod, with its bytes; the
    // refusal by address (the rules do not name it).
    let ok = audited(&l, |v| {
        v["client"] == "ci/runner-a" && v["ended"] == "closed"
    });
    assert_eq!(ok["device"], DEVICE);
    assert_eq!(ok["bytesToDevice"], 4);
    assert_eq!(ok["bytesToClient"], 4);
    assert_eq!(ok["direction"], "to-device");
    let no = audited(&l, |v| v["clientAddress"] == OTHER);
    assert_eq!(no["ended"], "refused-by-policy");
    assert_eq!(no["client"], OTHER);
    // `edgelinkd audit` prints them, by device.
    let out = l.lab.node.exec(&[
        daemon_bin().to_str().unwrap(),
        "audit",
        "--device",
        "device01-01",
        "--since",
        "1h",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("ci/runner-a") && text.contains("refused-by-policy"),
        "{text}"
    );
    assert!(audit(&l, "?device=hil%2Fother").is_empty());
    // The status webhook carries them to the operator, once each.
    let sent = || -> Vec<Value> {
        let got = r.got.lock().unwrap().clone();
        got.iter()
            .filter_map(|(_, b)| serde_json::from_str::<Value>(b).ok())
            .flat_map(|v| v["audit"].as_array().cloned().unwrap_or_default())
            .collect()
    };
    assert!(wait_until(Duration::from_secs(10), || sent()
        .iter()
        .any(|v| v["ended"] == "refused-by-policy")));
    let closed = sent()
        .iter()
        .filter(|v| v["client"] == "ci/runner-a" && v["protocol"] == "tcp")
        .count();
    assert_eq!(closed, 1, "each line once: {:#?}", sent());
}

#[test]
fn a_lease_taken_resets_the_others_live_connections_and_the_holders_go_on() {
    let open = json!({"device": DEVICE});
    let (mut l, r) = access_lab(18191, answer("g1", open), &[]);
    took(&mut l, "g1");
    let mut a = connect_from(&l, ALLOWED, API).unwrap();
    let mut b = connect_from(&l, OTHER, API).unwrap();
    assert_eq!(echo(&mut a, b"before"), b"before");
    assert_eq!(echo(&mut b, b"before"), b"before");
    // ci/hil-1 is taken by runner-a.
    let lease = json!({"device": DEVICE, "lease": {"name": "ci/hil-1", "holders": [runner_a()]}});
    *r.grants.lock().unwrap() = Some(answer("g2", lease));
    took(&mut l, "g2");
    assert_eq!(
        read_end(&mut b),
        Ended::Reset,
        "the other's connection is reset"
    );
    assert_eq!(echo(&mut a, b"after"), b"after", "the holder's goes on");
    assert!(!echoes(&l, OTHER), "and the other is refused from now on");
    assert!(echoes(&l, ALLOWED));
    assert_eq!(l.metric("edgelink_access_resets_total", "api"), 1.0);
    assert!(l.metric("edgelink_refused_by_lease_total", "api") >= 1.0);
    let cut = audited(&l, |v| {
        v["clientAddress"] == OTHER && v["bytesToDevice"] == 6
    });
    assert_eq!(cut["ended"], "refused-by-lease");
    assert_eq!(cut["lease"], "ci/hil-1");
    assert_eq!(cut["bytesToClient"], 6);
    drop(a);
    let held = audited(&l, |v| {
        v["client"] == "ci/runner-a" && v["bytesToDevice"] == 11
    });
    assert_eq!(
        held["ended"], "closed",
        "the holder's connection lived through it"
    );
}

#[test]
fn a_client_whose_lease_waits_waits_and_goes_when_its_lease_is_held() {
    let waiting = json!({"device": DEVICE, "lease": {"name": "ci/hil-1",
        "holders": [runner_a()], "waiting": [runner_b()]}});
    let (mut l, r) = access_lab(
        18192,
        answer("g1", waiting.clone()),
        &["--queue-timeout", "3"],
    );
    took(&mut l, "g1");
    // runner-b's connection is taken and waits: nothing comes back yet.
    let mut b = connect_from(&l, OTHER, API).unwrap();
    b.write_all(b"queued").unwrap();
    b.set_read_timeout(Some(Duration::from_millis(800)))
        .unwrap();
    assert_eq!(read_end(&mut b), Ended::TimedOut, "it waits");
    // runner-a's lease ends, runner-b's is held: the waiting connection
    // goes on with what it sent.
    let next = json!({"device": DEVICE, "lease": {"name": "ci/hil-2", "holders": [runner_b()]}});
    *r.grants.lock().unwrap() = Some(answer("g2", next));
    took(&mut l, "g2");
    b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut back = [0u8; 6];
    b.read_exact(&mut back)
        .expect("the waiting client got through");
    assert_eq!(&back, b"queued");
    assert!(l.metric("edgelink_lease_waits_total", "api") >= 1.0);
    // Waiting longer than the queue timeout: reset, and audited so.
    *r.grants.lock().unwrap() = Some(answer("g3", waiting));
    took(&mut l, "g3");
    let mut late = connect_from(&l, OTHER, API).unwrap();
    late.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    assert_eq!(
        read_end(&mut late),
        Ended::Reset,
        "reset after the queue timeout"
    );
    assert_eq!(l.metric("edgelink_lease_wait_timeouts_total", "api"), 1.0);
    audited(&l, |v| {
        v["ended"] == "queue-timeout" && v["client"] == "ci/runner-b"
    });
    // The lease released (no rule left): everyone again.
    *r.grants.lock().unwrap() =
        Some(json!({"holds": [], "access": {"generation": "g4"}}).to_string());
    took(&mut l, "g4");
    assert!(echoes(&l, OTHER) && echoes(&l, ALLOWED));
}

#[test]
fn the_rules_outlive_a_restart_of_the_daemon_without_an_operator() {
    let rule = json!({"device": DEVICE, "allowed": [runner_a()]});
    let (mut l, r) = access_lab(18193, answer("g1", rule), &[]);
    took(&mut l, "g1");
    assert!(!echoes(&l, OTHER));
    // The operator is gone, and the daemon restarts: the rules it kept in
    // the state directory hold until the operator answers again.
    drop(r);
    l.daemon().signal(nix::sys::signal::Signal::SIGTERM);
    assert!(l.daemon().wait_exit(Duration::from_secs(10)).is_some());
    l.daemon = None;
    l.flags.clear();
    l.start_daemon();
    l.wait_serving();
    assert!(echoes(&l, ALLOWED));
    assert!(!echoes(&l, OTHER), "still refused after the restart");
    let kept: Value = serde_json::from_slice(
        &std::fs::read(std::path::Path::new(&l.lab.state_dir()).join("access.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(kept["generation"], "g1");
}

#[test]
fn reverse_forwards_and_pods_without_rules_are_not_touched() {
    // Rules for another pod only: this one's clients all get through, and
    // nothing is refused.
    let other = json!({"holds": [], "access": {"generation": "g1", "attachments":
        {"hil/else-0": {"device": "hil/else", "allowed": []}}}});
    let (mut l, _r) = access_lab(18194, other.to_string(), &[]);
    took(&mut l, "g1");
    assert!(echoes(&l, OTHER) && echoes(&l, ALLOWED));
    assert_eq!(l.metric("edgelink_refused_by_policy_total", "api"), 0.0);
}

/// The kubelet probes a proxy pod from the node's own address: a refusal
/// of an address the node has is counted apart and not audited. The
/// stand-in: an address on the node namespace's loopback, which the client
/// namespace uses as its source.
#[test]
fn a_refusal_of_the_node_itself_is_counted_apart_and_not_audited() {
    const NODE_ADDR: &str = "10.244.1.30";
    let rule = json!({"device": DEVICE, "allowed": [runner_a()]});
    let (mut l, _r) = access_lab(18195, answer("g1", rule), &[]);
    took(&mut l, "g1");
    l.lab
        .node
        .ip(&["addr", "add", &format!("{NODE_ADDR}/32"), "dev", "lo"]);
    l.client
        .ip(&["addr", "add", &format!("{NODE_ADDR}/24"), "dev", "eth0"]);
    assert!(!echoes(&l, NODE_ADDR), "refused all the same");
    assert!(!echoes(&l, OTHER));
    assert!(wait_until(Duration::from_secs(5), || {
        l.metric("edgelink_refused_from_node_total", "api") >= 1.0
    }));
    assert_eq!(
        l.metric("edgelink_refused_by_policy_total", "api"),
        1.0,
        "the other client only"
    );
    audited(&l, |v| v["clientAddress"] == OTHER);
    assert!(
        audit(&l, "")
            .iter()
            .all(|v| v["clientAddress"] != NODE_ADDR),
        "the node's refusal is not audited"
    );
}
