//! Attachment records the daemon cannot use are reported and skipped.

use crate::lab::*;
use edgelink_tests::DEVICE_V4;
use std::time::Duration;

#[test]
fn malformed_records_are_reported_and_survived() {
    let mut l = DLab::new();
    let dir = l.lab.state.path().join("attachments");
    // Garbage, and a good record with one bad field.
    std::fs::write(dir.join("junk.json"), b"{ this is not json").unwrap();
    let mut rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(l.record_path()).unwrap()).unwrap();
    rec["containerId"] = "other".into();
    rec["forwards"][0]["protocol"] = "sctp".into();
    std::fs::write(
        dir.join("other_net1.json"),
        serde_json::to_vec(&rec).unwrap(),
    )
    .unwrap();

    // (A reader may catch a file half-written: wait for the final word.)
    let s = l.wait_status(Duration::from_secs(5), "malformed records listed", |s| {
        s["malformedRecords"].as_array().is_some_and(|m| {
            m.len() == 2 && m[1]["error"].as_str().is_some_and(|e| e.contains("sctp"))
        })
    });
    let m = s["malformedRecords"].as_array().unwrap();
    assert!(
        m[0]["path"].as_str().unwrap().ends_with("junk.json"),
        "{m:?}"
    );
    assert!(
        m[1]["path"].as_str().unwrap().ends_with("other_net1.json"),
        "{m:?}"
    );
    assert!(m[1]["error"].as_str().unwrap().contains("sctp"), "{m:?}");
    assert!(m
        .iter()
        .all(|r| r["error"].as_str().is_some_and(|e| !e.is_empty())));
    assert_eq!(l.metric_plain("edgelink_malformed_records"), 2.0);

    // The good attachment is served, the daemon is healthy and alive.
    l.echo_once(b"still here\n");
    assert!(crate::udp::udp_clients(&l, 2, 2).is_empty());
    assert_eq!(l.get("/healthz").0, 200);
    assert!(l.daemon().running());
    // The malformed records and the good reservation are left alone.
    assert!(dir.join("junk.json").exists() && dir.join("other_net1.json").exists());
    assert_eq!(l.lab.reserved(NET), vec![l.net1_ip()]);

    // A restart reads them again without trouble.
    l.daemon().kill9();
    l.start_daemon();
    l.wait_serving();
    l.wait_status(
        Duration::from_secs(5),
        "malformed records listed after a restart",
        |s| s["malformedRecords"].as_array().map(Vec::len) == Some(2),
    );
    l.echo_once(b"after a restart\n");

    // Fixed or removed: the list empties.
    std::fs::remove_file(dir.join("junk.json")).unwrap();
    std::fs::remove_file(dir.join("other_net1.json")).unwrap();
    l.wait_status(Duration::from_secs(5), "malformed list emptied", |s| {
        s["malformedRecords"]
            .as_array()
            .is_some_and(|m| m.is_empty())
    });
    assert!(l.daemon().running());
}

#[test]
fn a_rewritten_record_is_served_again_on_the_same_ports() {
    let l = DLab::new();
    let path = l.record_path();
    let base: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let n = l.conf["forwards"].as_array().unwrap().len();
    // Keep the daemon busy meanwhile: clients connecting and echoing in a
    // loop (failures are expected while the listeners are rebound).
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let load: Vec<_> = (0..16)
        .map(|_| {
            let stop = stop_rx.clone();
            l.cl.spawn(async move {
                while !*stop.borrow() {
                    if let Ok(Ok(mut s)) = tokio::time::timeout(
                        Duration::from_secs(1),
                        tokio::net::TcpStream::connect(pod_addr(API)),
                    )
                    .await
                    {
                        use tokio::io::{AsyncReadExt, AsyncWriteExt};
                        let mut b = [0u8; 4096];
                        let _ = s.write_all(&b).await;
                        let _ = tokio::time::timeout(Duration::from_secs(1), s.read_exact(&mut b))
                            .await;
                    } else {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            })
        })
        .collect();
    // Each rewrite changes the record (one more forward): the daemon stops
    // the attachment and starts it again, binding the same ports.
    for i in 0..20u16 {
        let mut rec = base.clone();
        let name = format!("extra{i}");
        rec["forwards"].as_array_mut().unwrap().push(serde_json::json!(
            {"name": name, "protocol": "tcp", "port": 7100 + i, "target": format!("{DEVICE_V4}:{API}"),
             "connectTimeoutMs": 1000}
        ));
        let tmp = path.with_file_name(".rewrite.tmp");
        std::fs::write(&tmp, serde_json::to_vec(&rec).unwrap()).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        let s = l.wait_status(Duration::from_secs(5), "the rewritten record served", |s| {
            let f = forward_of(s, &name);
            !f.is_null() && f["listener"] != "starting"
        });
        assert!(
            all_listening(&s, CID, n + 1),
            "rewrite {i}: not every forward is listening: {:#}",
            s["attachments"][0]["forwards"]
        );
        l.echo_once(b"after a rewrite\n");
    }
    stop_tx.send(true).unwrap();
    for h in load {
        l.cl.join(h);
    }
}

/// A reservation file as the IPAM store writes it, last written an hour ago
/// (past any GC grace).
fn old_reservation(l: &DLab, ip: &str, cid: &str) -> std::path::PathBuf {
    let path = l.lab.state.path().join("ipam").join(NET).join(ip);
    std::fs::write(
        &path,
        serde_json::to_vec(&serde_json::json!(
            {"containerId": cid, "ifname": "net1", "reservedAt": "2026-01-01T00:00:00Z"}))
        .unwrap(),
    )
    .unwrap();
    let f = std::fs::File::options().write(true).open(&path).unwrap();
    f.set_modified(std::time::SystemTime::now() - Duration::from_secs(3600))
        .unwrap();
    path
}

#[test]
fn ipam_gc_goes_on_past_a_malformed_record_and_keeps_only_what_it_may_own() {
    // About the periodic pass: GC runs on it.
    let l = DLab::with(Opts {
        fast_reconcile: true,
        ..Opts::default()
    });
    let store = edgelink_attachment::RecordStore::new(l.lab.state.path());
    let dir = store.dir().to_path_buf();
    // The lab pod's own reservation is old too: only its record keeps it.
    let own = old_reservation(&l, &l.net1_ip(), CID);
    // Unreadable records, under the current naming (one cut and hashed:
    // a 256-character ID) and under the old one; each one's reservation
    // must stay: nobody can tell whose it is.
    let long = "7".repeat(256);
    std::fs::write(store.path("torn.1", "net1"), b"").unwrap();
    std::fs::write(store.path(&long, "net1"), b"{\"version\":").unwrap();
    std::fs::write(dir.join("old.1_net1.json"), b"{ not json").unwrap();
    // Under a name no record has: protects nothing.
    std::fs::write(dir.join("junk.json"), b"{").unwrap();
    let kept: Vec<_> = [
        ("172.31.250.141", "torn.1"),
        ("172.31.250.142", long.as_str()),
        ("172.31.250.143", "old.1"),
    ]
    .into_iter()
    .map(|(ip, cid)| old_reservation(&l, ip, cid))
    .collect();
    // Orphans: no record at all ("junk" would be "junk_net1.json").
    let orphans = [
        old_reservation(&l, "172.31.250.144", "orphan"),
        old_reservation(&l, "172.31.250.145", "junk"),
    ];
    // A temp file a crashed writer left, and one being written.
    let stale = dir.join(".crashed_net1.4242.0.tmp");
    std::fs::File::create(&stale)
        .unwrap()
        .set_modified(std::time::SystemTime::now() - Duration::from_secs(600))
        .unwrap();
    let fresh = dir.join(".writing_net1.4243.0.tmp");
    std::fs::write(&fresh, b"{").unwrap();

    assert!(
        edgelink_tests::wait_until(Duration::from_secs(20), || orphans
            .iter()
            .all(|p| !p.exists())
            && !stale.exists()),
        "GC released no orphan: {:?}; stale temp there: {}",
        l.lab.reserved(NET),
        stale.exists()
    );
    // Nothing else went, then or in the passes after.
    let t0 = l.status()["lastReconcileAt"].as_u64().unwrap();
    l.wait_status(Duration::from_secs(20), "two more passes", |s| {
        s["lastReconcileAt"].as_u64().unwrap() >= t0 + 2
    });
    assert!(own.exists());
    for p in &kept {
        assert!(p.exists(), "{} released", p.display());
    }
    assert!(fresh.exists());
    assert_eq!(
        l.status()["malformedRecords"].as_array().map(Vec::len),
        Some(4)
    );
    l.echo_once(b"still served\n");
}

/// A full reconcile pass, finished: a `check` of an attachment the daemon
/// does not serve makes it run one before it answers (after any pass in
/// progress: passes take turns).
fn after_a_pass(l: &DLab) {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(
        l.lab.state.path().join(edgelink_attachment::DAEMON_SOCKET),
    )
    .expect("connect to the control socket");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"check no-such-container net1\n").unwrap();
    let mut reply = String::new();
    edgelink_tests::again(|| s.read_to_string(&mut reply)).unwrap();
}

#[test]
fn a_torn_record_of_a_served_pod_is_reported_and_its_forwards_and_connections_go_on() {
    // Found by scripts/chaos/truncated_record.py: the daemon took the torn
    // record for a DEL, closed the pod's listeners and reset its
    // connections, though the pod was alive (docs/reliability.md, item 32).
    let l = DLab::new();
    let mut held = l.connect(API).unwrap();
    assert_eq!(echo(&mut held, b"before\n"), b"before\n");
    let path = l.record_path();
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    l.wait_status(Duration::from_secs(5), "the torn record listed", |s| {
        s["malformedRecords"].as_array().map(Vec::len) == Some(1)
    });
    after_a_pass(&l);

    let s = l.status();
    assert!(
        all_listening(&s, CID, forwards().as_array().unwrap().len()),
        "{s:#}"
    );
    assert_eq!(echo(&mut held, b"after\n"), b"after\n");
    l.echo_once(b"a new connection\n");
    assert_eq!(l.lab.reserved(NET), vec![l.net1_ip()]);

    // The DEL removes the torn record; the daemon then stops the
    // attachment and the report clears.
    l.call("DEL").ok_empty();
    l.wait_status(Duration::from_secs(5), "the attachment gone", |s| {
        s["attachments"].as_array().is_some_and(|a| a.is_empty())
            && s["malformedRecords"]
                .as_array()
                .is_some_and(|m| m.is_empty())
    });
    assert!(l.released());
}
