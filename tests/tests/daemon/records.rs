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
