//! Many clients, one PLC connection (issue 27): a forward with
//! `"appProtocol": "modbus-tcp", "multiplex": true` in front of a PLC that
//! serves one connection and one request at a time (edgelink-modbus's
//! testing PLC, in the device's namespace), 20 clients polling their own
//! registers through the pod, as a client of the cluster would.

use super::lab::*;
use edgelink_modbus::testing::{read_register, Plc, Seen};
use edgelink_tests::*;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PLC: u16 = 502;

fn plc_lab(service: Duration) -> (DLab, Plc, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let l = DLab::with_forwards(
        &[],
        json!([{"name": "plc", "protocol": "tcp", "port": PLC,
                "target": format!("{DEVICE_V4}:{PLC}"), "appProtocol": "modbus-tcp",
                "multiplex": true, "responseTimeoutMs": 500}]),
    );
    let s = seen.clone();
    let addr = format!("{DEVICE_V4}:{PLC}").parse().unwrap();
    let plc = l.dev.run(async move { Plc::start(addr, service, s).await });
    (l, plc, seen)
}

#[test]
fn twenty_clients_poll_one_plc_through_one_connection_each_with_its_own_answers() {
    let (l, _plc, seen) = plc_lab(Duration::from_millis(2));
    let to = pod_addr(PLC);
    let all = l.cl.run(async move {
        let mut clients = Vec::new();
        for i in 0..20u16 {
            clients.push(tokio::spawn(async move {
                let mut c = TcpStream::connect(to).await.unwrap();
                for k in 0..10u16 {
                    let register = i * 100 + k;
                    let got = read_register(&mut c, k, i as u8, register).await.unwrap();
                    assert_eq!(got, Ok(register), "client {i}, request {k}");
                }
            }));
        }
        let mut ok = 0;
        for c in clients {
            if tokio::time::timeout(Duration::from_secs(30), c)
                .await
                .is_ok_and(|r| r.is_ok())
            {
                ok += 1;
            }
        }
        ok
    });
    assert_eq!(all, 20, "every client got its own answers");
    assert_eq!(Seen::get(&seen.connections), 1, "one connection to the PLC");
    assert_eq!(Seen::get(&seen.second_connections), 0);
    assert_eq!(Seen::get(&seen.served), 200);
    let m = &l.forward("plc")["modbus"];
    assert_eq!(
        (m["requestsTotal"].as_u64(), m["responsesTotal"].as_u64()),
        (Some(200), Some(200))
    );
    assert_eq!(l.metric("edgelink_modbus_requests_total", "plc"), 200.0);
    // One audit line per client, with its request count.
    assert!(wait_until(Duration::from_secs(5), || {
        let (_, body) = l.get("/audit");
        body.lines()
            .filter(|x| x.contains("\"forward\":\"plc\"") && x.contains("\"requests\":10"))
            .count()
            == 20
    }));
}

#[test]
fn a_malformed_client_is_reset_alone_and_a_restarted_plc_is_connected_again() {
    let (l, plc, seen) = plc_lab(Duration::from_millis(1));
    let to = pod_addr(PLC);
    let reset = l.cl.run(async move {
        let mut good = TcpStream::connect(to).await.unwrap();
        assert_eq!(read_register(&mut good, 1, 1, 5).await.unwrap(), Ok(5));
        let mut bad = TcpStream::connect(to).await.unwrap();
        bad.write_all(&[0, 1, 0, 9, 0, 6, 1, 3, 0, 0, 0, 1])
            .await
            .unwrap();
        let mut b = [0u8; 8];
        let r = tokio::time::timeout(Duration::from_secs(5), bad.read(&mut b)).await;
        assert_eq!(read_register(&mut good, 2, 1, 6).await.unwrap(), Ok(6));
        matches!(r, Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset)
    });
    assert!(reset, "the malformed client is reset");
    assert_eq!(l.forward("plc")["modbus"]["malformedFromClientsTotal"], 1);
    // The PLC restarts: a request meanwhile is answered 0x0A or 0x0B, and
    // once it is back the next is served over a new connection.
    drop(plc);
    let s = seen.clone();
    let addr = format!("{DEVICE_V4}:{PLC}").parse().unwrap();
    let during = l.cl.run(async move {
        let mut c = TcpStream::connect(to).await.unwrap();
        read_register(&mut c, 3, 1, 7).await.unwrap()
    });
    assert!(matches!(during, Err(0x0A) | Err(0x0B)), "{during:?}");
    let _plc = l
        .dev
        .run(async move { Plc::start(addr, Duration::from_millis(1), s).await });
    let after = l.cl.run(async move {
        let mut c = TcpStream::connect(to).await.unwrap();
        read_register(&mut c, 4, 1, 8).await.unwrap()
    });
    assert_eq!(after, Ok(8));
    assert!(Seen::get(&seen.connections) >= 2);
    assert_eq!(Seen::get(&seen.second_connections), 0);
}

#[test]
fn a_client_gone_mid_request_leaves_nothing_queued_and_no_answer_reaches_another() {
    let (l, _plc, seen) = plc_lab(Duration::from_millis(150));
    let to = pod_addr(PLC);
    let answers = l.cl.run(async move {
        // Three requests, then gone while the first is at the PLC.
        let mut gone = TcpStream::connect(to).await.unwrap();
        for k in 0..3u16 {
            let [a0, a1] = (900 + k).to_be_bytes();
            gone.write_all(&[0, k as u8, 0, 0, 0, 6, 1, 3, a0, a1, 0, 1])
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(gone);
        // Another client, same transaction ids: only its own answers.
        let mut c = TcpStream::connect(to).await.unwrap();
        let mut got = Vec::new();
        for k in 0..3u16 {
            got.push(read_register(&mut c, k, 1, 500 + k).await.unwrap());
        }
        got
    });
    assert_eq!(answers, vec![Ok(500), Ok(501), Ok(502)]);
    assert_eq!(
        Seen::get(&seen.served),
        1 + 3,
        "the two queued requests never left"
    );
    let m = &l.forward("plc")["modbus"];
    assert_eq!(
        m["lateResponsesTotal"], 1,
        "the answer on its way was dropped"
    );
}
