//! What the daemon refuses: connections and datagrams from the private
//! side, targets outside allowedTargets; its files' modes; a read-only
//! HTTP endpoint bound only where it is told.

use crate::lab::*;
use edgelink_tests::*;
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

#[test]
fn connections_and_datagrams_through_the_private_side_are_refused() {
    let l = DLab::new();
    let net1: std::net::SocketAddr = format!("{}:{API}", l.net1_ip()).parse().unwrap();
    // The device reaches the pod's net1 address (the handshake completes)
    // but is closed by the daemon, never relayed: the read ends (a
    // connection held open would time out in connect_and_read, as Other).
    for _ in 0..2 {
        let (end, took) = connect_and_read(&l.lab.device, net1);
        assert!(matches!(end, Ended::Reset | Ended::Eof), "{end:?}");
        eprintln!("refused after {took:?}");
    }
    let f = l.wait_status(Duration::from_secs(5), "refused counted", |s| {
        forward_of(s, "api")["refused"] == 2
    });
    let f = forward_of(&f, "api");
    assert_eq!(f["totalConnections"], 0, "{f:#}");
    assert_eq!(f["bytesToTarget"], 0, "{f:#}");

    // UDP from the device side: dropped, counted, no session, no reply.
    let net1_udp: std::net::SocketAddr = format!("{}:{UDP}", l.net1_ip()).parse().unwrap();
    let got = l.dev.run(async move {
        let s = tokio::net::UdpSocket::bind("0.0.0.0:0").await.unwrap();
        s.connect(net1_udp).await.unwrap();
        for _ in 0..3 {
            s.send(b"let me in").await.unwrap();
        }
        let mut b = [0u8; 64];
        tokio::time::timeout(Duration::from_millis(500), s.recv(&mut b)).await
    });
    assert!(
        !matches!(got, Ok(Ok(_))),
        "the private side got a UDP reply: {got:?}"
    );
    let s = l.wait_status(Duration::from_secs(5), "UDP refused counted", |s| {
        forward_of(s, "telemetry")["refused"] == 3
    });
    let f = forward_of(&s, "telemetry");
    assert_eq!(f["udpSessionsTotal"], 0, "{f:#}");
    assert_eq!(f["udpDatagramsToTarget"], 0, "{f:#}");
    // The cluster side is served all the same.
    l.echo_once(b"from the cluster\n");
    assert!(crate::udp::udp_clients(&l, 1, 1).is_empty());
}

#[test]
fn a_target_outside_allowed_targets_in_a_hand_edited_record_is_refused() {
    let l = DLab::new();
    let path = l.record_path();
    let mut rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(rec["allowedTargets"], json!(["172.31.250.0/24"]));
    rec["forwards"].as_array_mut().unwrap().push(json!(
        {"name": "evil", "protocol": "tcp", "port": 7070, "target": "10.99.0.1:80", "connectTimeoutMs": 500}
    ));
    rec["forwards"].as_array_mut().unwrap().push(json!(
        {"name": "evil-udp", "protocol": "udp", "port": 7071, "target": "10.99.0.1:53", "connectTimeoutMs": 500}
    ));
    // Atomically, as the plugin writes.
    let tmp = path.with_file_name(".edit.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&rec).unwrap()).unwrap();
    std::fs::rename(&tmp, &path).unwrap();

    let s = l.wait_status(Duration::from_secs(5), "evil refused", |s| {
        forward_of(s, "evil")["listener"] == "refused"
            && forward_of(s, "api")["listener"] == "listening"
    });
    for name in ["evil", "evil-udp"] {
        let f = forward_of(&s, name);
        assert_eq!(f["listener"], "refused", "{f:#}");
        assert!(
            f["lastError"]
                .as_str()
                .is_some_and(|e| e.contains("allowedTargets") && e.contains("10.99.0.1")),
            "{f:#}"
        );
    }
    assert!(l.refused(7070), "port 7070 is open");
    let got = l.cl.run(async {
        let s = tokio::net::UdpSocket::bind("0.0.0.0:0").await.unwrap();
        s.connect(pod_addr(7071)).await.unwrap();
        s.send(b"x").await.unwrap();
        let mut b = [0u8; 16];
        tokio::time::timeout(Duration::from_millis(300), s.recv(&mut b)).await
    });
    assert!(!matches!(got, Ok(Ok(_))), "port 7071/udp answered: {got:?}");
    assert_eq!(l.metric("edgelink_listener_up", "evil"), 0.0);
    // The rest of the attachment is served.
    l.echo_once(b"still served\n");
    // CHECK reports the refused forward.
    let (code, msg) = l.call("CHECK").err();
    assert_eq!(code, 104, "{msg}");
    assert!(msg.contains("evil"), "{msg}");
}

#[test]
fn the_state_dir_is_0700_and_the_socket_0600() {
    let node = Netns::new("node");
    let tmp = tempfile::tempdir().unwrap();
    // A fresh directory is made 0700...
    let fresh = tmp.path().join("a/b/state");
    let mut d = Edgelinkd::start(&node, &fresh, tmp.path().join("fresh.log"), &[]);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&fresh), 0o700);
    assert_eq!(mode(&fresh.join("edgelinkd.sock")), 0o600);
    d.kill9();
    // ...and an existing one is tightened.
    let open = tmp.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    let _d = Edgelinkd::start(&node, &open, tmp.path().join("open.log"), &[]);
    assert_eq!(mode(&open), 0o700);
    assert_eq!(mode(&open.join("edgelinkd.sock")), 0o600);
}

#[test]
fn the_http_endpoint_is_read_only_and_bound_only_where_it_is_told() {
    let l = DLab::new();
    for method in ["POST", "PUT", "DELETE", "PATCH"] {
        for path in ["/status", "/metrics", "/healthz"] {
            let (code, _, body) = l.http(method, path);
            assert_eq!(code, 405, "{method} {path}: {body}");
        }
    }
    let (code, _, _) = l.http("GET", "/nothing-here");
    assert_eq!(code, 404);
    // Nothing changed.
    l.wait_serving();
    // In the node namespace it listens on 127.0.0.1:9310 and nowhere else.
    let out = l.lab.node.exec(&["ss", "-Hltnu"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let listening: Vec<&str> = text
        .lines()
        .filter_map(|line| line.split_whitespace().nth(4))
        .collect();
    assert_eq!(listening, vec!["127.0.0.1:9310"], "{text}");
}
