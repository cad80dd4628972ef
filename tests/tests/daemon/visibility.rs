//! What the daemon shows: /status, /metrics, /healthz, /livez, the
//! `edgelinkd status` table, the status webhook.

use crate::lab::*;
use edgelink_tests::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[test]
fn metrics_and_status_show_the_traffic_that_was_sent() {
    let l = DLab::new();
    // TCP: three echo connections of 1000 bytes each.
    for i in 0..3u8 {
        let msg = vec![b'a' + i; 1000];
        let mut s = l.connect(API).unwrap();
        assert_eq!(echo(&mut s, &msg), msg);
        s.shutdown(Shutdown::Write).unwrap();
        assert_eq!(read_end(&mut s), Ended::Eof);
    }
    // One upload of 4321 bytes, answered with "4321\n".
    let mut s = l.connect(DRAIN).unwrap();
    s.write_all(&[0u8; 4321]).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut a = String::new();
    s.read_to_string(&mut a).unwrap();
    assert_eq!(a, "4321\n");
    // UDP: one client, seven round trips.
    assert!(crate::udp::udp_clients(&l, 1, 7).is_empty());

    let s = l.wait_status(Duration::from_secs(5), "connections closed", |s| {
        forward_of(s, "api")["activeConnections"] == 0
            && forward_of(s, "drain")["activeConnections"] == 0
    });
    let a = &s["attachments"][0];
    assert_eq!(s["attachments"].as_array().unwrap().len(), 1);
    assert_eq!(a["containerId"], CID);
    assert_eq!(a["ifname"], "net1");
    assert_eq!(a["network"], NET);
    assert_eq!(a["podNamespace"], "hil");
    assert_eq!(a["podName"], "proxy-0");
    assert_eq!(a["netns"], l.pod.path());
    assert_eq!(a["mode"], "bridge");
    assert_eq!(a["state"], "serving");
    assert_eq!(a["interface"]["name"], "net1");
    assert_eq!(a["interface"]["ips"][0], format!("{}/24", l.net1_ip()));
    assert_eq!(s["draining"], false);
    assert!(s["lastReconcileAt"].as_u64().unwrap() > 0);
    assert!(s["malformedRecords"].as_array().unwrap().is_empty());

    let api = forward_of(&s, "api");
    let want = [
        ("totalConnections", 3),
        ("activeConnections", 0),
        ("bytesToTarget", 3000),
        ("bytesToClient", 3000),
        ("connectErrors", 0),
        ("errors", 0),
        ("refused", 0),
    ];
    for (k, v) in want {
        assert_eq!(api[k], v, "api {k}: {api:#}");
    }
    assert_eq!(api["reachability"]["state"], "reachable");
    assert_eq!(api["target"], format!("{DEVICE_V4}:{API}"));
    assert_eq!(api["protocol"], "tcp");
    let drain = forward_of(&s, "drain");
    assert_eq!(
        (
            drain["bytesToTarget"].as_u64(),
            drain["bytesToClient"].as_u64()
        ),
        (Some(4321), Some(5))
    );
    assert_eq!(drain["totalConnections"], 1);
    let udp = forward_of(&s, "telemetry");
    assert_eq!(udp["protocol"], "udp");
    assert_eq!(udp["udpSessionsTotal"], 1, "{udp:#}");
    assert_eq!(udp["udpDatagramsToTarget"], 7, "{udp:#}");
    assert_eq!(udp["udpDatagramsToClient"], 7, "{udp:#}");
    assert_eq!(udp["udpDrops"], 0, "{udp:#}");
    // Untouched forwards show nothing.
    for name in ["sink", "speak", "closed", "down"] {
        let f = forward_of(&s, name);
        assert_eq!(f["totalConnections"], 0, "{f:#}");
        assert_eq!(f["bytesToTarget"], 0, "{f:#}");
        assert_eq!(f["reachability"]["state"], "unknown", "{f:#}");
    }

    // /metrics has the same numbers, labelled by pod and forward.
    let (code, head, text) = l.http("GET", "/metrics");
    assert_eq!(code, 200);
    assert!(
        head.to_lowercase()
            .contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    let m = |name: &str, fwd: &str| {
        metric_value(&text, name, fwd).unwrap_or_else(|| panic!("{name} {fwd}:\n{text}"))
    };
    assert_eq!(m("edgelink_connections_total", "api"), 3.0);
    assert_eq!(m("edgelink_bytes_to_target_total", "api"), 3000.0);
    assert_eq!(m("edgelink_bytes_to_client_total", "api"), 3000.0);
    assert_eq!(m("edgelink_active_connections", "api"), 0.0);
    assert_eq!(m("edgelink_connect_errors_total", "api"), 0.0);
    assert_eq!(m("edgelink_bytes_to_target_total", "drain"), 4321.0);
    assert_eq!(m("edgelink_bytes_to_client_total", "drain"), 5.0);
    assert_eq!(m("edgelink_udp_sessions_total", "telemetry"), 1.0);
    assert_eq!(
        m("edgelink_udp_datagrams_to_target_total", "telemetry"),
        7.0
    );
    assert_eq!(
        m("edgelink_udp_datagrams_to_client_total", "telemetry"),
        7.0
    );
    assert_eq!(m("edgelink_listener_up", "api"), 1.0);
    assert_eq!(m("edgelink_target_reachable", "api"), 1.0);
    assert_eq!(m("edgelink_target_reachable", "sink"), -1.0);
    assert_eq!(l.metric_plain("edgelink_attachments"), 1.0);
    // A pass has run (the attachment is served): it took some time, and
    // far less than a second on a node of one attachment.
    let pass = l.metric_plain("edgelink_reconcile_pass_seconds");
    assert!(pass > 0.0 && pass < 1.0, "reconcile_pass_seconds {pass}");
    let api_line = text
        .lines()
        .find(|x| x.starts_with("edgelink_connections_total{") && x.contains("forward=\"api\""))
        .unwrap();
    for label in [
        "pod=\"proxy-0\"",
        "pod_namespace=\"hil\"",
        "network=\"plant-floor\"",
        "protocol=\"tcp\"",
    ] {
        assert!(api_line.contains(label), "{api_line}");
    }
    assert!(text.trim_end().ends_with("# EOF"), "not OpenMetrics text");
}

/// A UDP forward's sessions are its connections, the same number in
/// /status (`totalConnections` = `udpSessionsTotal`), in /metrics
/// (`edgelink_connections_total` = `edgelink_udp_sessions_total`) and in the
/// `edgelinkd status` table (TOTAL). /metrics said 0 connections while the
/// table showed the sessions.
#[test]
fn a_udp_forwards_sessions_are_its_connections_in_status_metrics_and_the_table() {
    let l = DLab::new();
    // Three clients (three sessions), two round trips each.
    assert!(crate::udp::udp_clients(&l, 3, 2).is_empty());

    let s = l.wait_status(Duration::from_secs(5), "three sessions", |s| {
        forward_of(s, "telemetry")["udpSessionsTotal"] == 3
    });
    let udp = forward_of(&s, "telemetry");
    assert_eq!(udp["totalConnections"], 3, "{udp:#}");
    assert_eq!(udp["activeConnections"], udp["udpSessions"], "{udp:#}");
    // TCP forwards count connections only.
    assert_eq!(forward_of(&s, "api")["totalConnections"], 0);

    let (code, _, text) = l.http("GET", "/metrics");
    assert_eq!(code, 200);
    let m = |name: &str, fwd: &str| {
        metric_value(&text, name, fwd).unwrap_or_else(|| panic!("{name} {fwd}:\n{text}"))
    };
    assert_eq!(m("edgelink_connections_total", "telemetry"), 3.0);
    assert_eq!(m("edgelink_udp_sessions_total", "telemetry"), 3.0);
    assert_eq!(
        m("edgelink_active_connections", "telemetry"),
        m("edgelink_active_udp_sessions", "telemetry")
    );
    assert_eq!(m("edgelink_connections_total", "api"), 0.0);

    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &l.lab.node.name])
        .arg(daemon_bin())
        .args(["status", "--status-addr", "127.0.0.1:9310"])
        .output()
        .expect("edgelinkd status");
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    let row: Vec<&str> = table
        .lines()
        .find(|r| r.contains("telemetry/udp"))
        .unwrap_or_else(|| panic!("no telemetry row: {table}"))
        .split_whitespace()
        .collect();
    // POD ADDRESS FORWARD TARGET LISTENER ACTIVE TOTAL ...
    assert_eq!(row[6], "3", "TOTAL: {table}");
}

#[test]
fn healthz_and_livez_answer_200_with_json() {
    let l = DLab::new();
    for path in ["/healthz", "/livez"] {
        let (code, head, body) = l.http("GET", path);
        assert_eq!(code, 200, "{path}: {body}");
        assert!(
            head.to_lowercase()
                .contains("content-type: application/json"),
            "{head}"
        );
        let j: Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
        assert!(j["lastUpdated"].as_u64().unwrap() > 0, "{j}");
        assert!(
            j["currentTime"].as_u64().unwrap() >= j["lastUpdated"].as_u64().unwrap(),
            "{j}"
        );
        assert_eq!(j["draining"], false);
    }
}

#[test]
fn edgelinkd_status_prints_a_table_naming_the_pod_and_its_forwards() {
    let mut l = DLab::new();
    l.echo_once(b"count me\n");
    let node = l.lab.node.name.clone();
    let run = |args: &[&str]| {
        std::process::Command::new("ip")
            .args(["netns", "exec", &node])
            .arg(daemon_bin())
            .arg("status")
            .args(args)
            .output()
            .expect("edgelinkd status")
    };
    let out = run(&["--status-addr", "127.0.0.1:9310"]);
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{table} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(table.contains("attachments 1"), "{table}");
    let rows: Vec<&str> = table
        .lines()
        .filter(|r| r.starts_with("hil/proxy-0"))
        .collect();
    assert_eq!(rows.len(), forwards().as_array().unwrap().len(), "{table}");
    for (fwd, target) in [
        ("api/tcp", format!("{DEVICE_V4}:{API}")),
        ("telemetry/udp", format!("{DEVICE_V4}:{UDP}")),
        ("down/tcp", format!("{DEAD_IP}:{DOWN}")),
    ] {
        let row = rows
            .iter()
            .find(|r| r.contains(fwd))
            .unwrap_or_else(|| panic!("no {fwd}: {table}"));
        assert!(row.contains(&target) && row.contains("listening"), "{row}");
    }
    let api = rows.iter().find(|r| r.contains("api/tcp")).unwrap();
    assert!(api.contains("reachable"), "{api}");
    // --json is /status itself.
    let out = run(&["--status-addr", "127.0.0.1:9310", "--json"]);
    let j: Value = serde_json::from_slice(&out.stdout).expect("--json is JSON");
    assert_eq!(forward_of(&j, "api")["totalConnections"], 1);

    // No daemon: a clear error, quickly.
    l.daemon().kill9();
    let t = Instant::now();
    let out = run(&["--status-addr", "127.0.0.1:9310"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach edgelinkd"), "{err}");
    // Refused at once on loopback; the bound only proves it does not hang.
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
}

/// Issue 21: `edgelinkd status` narrowed to a namespace, a pod or a
/// forward, with net1's address, QUEUED and REFUSED, and an exit status a
/// script or probe can use: 0 all well, 2 something shown is not.
#[test]
fn edgelinkd_status_filters_shows_the_address_and_says_by_its_exit_status_what_is_unwell() {
    let l = DLab::with_forwards(&["--probe-interval", "1"], json!([]));
    l.wait_status(
        Duration::from_secs(30),
        "api reachable, down unreachable",
        |s| {
            forward_of(s, "api")["reachability"]["state"] == "reachable"
                && forward_of(s, "down")["reachability"]["state"] == "unreachable"
        },
    );
    let node = l.lab.node.name.clone();
    let run = |args: &[&str]| {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &node])
            .arg(daemon_bin())
            .args(["status", "--status-addr", "127.0.0.1:9310"])
            .args(args)
            .output()
            .expect("edgelinkd status");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let header = |t: &str| t.lines().nth(1).unwrap_or("").to_string();

    // Everything: "down" is unreachable, so not well.
    let (code, t) = run(&[]);
    assert_eq!(code, Some(2), "{t}");
    assert!(
        t.contains(&format!(
            "NOT WELL: hil/proxy-0: forward down: target {DEAD_IP}:{DOWN} is unreachable"
        )),
        "{t}"
    );
    for h in ["ADDRESS", "QUEUED", "REFUSED"] {
        assert!(header(&t).contains(h), "{h}: {t}");
    }
    let api = t
        .lines()
        .find(|r| r.contains("api/tcp"))
        .unwrap_or_else(|| panic!("{t}"));
    assert!(api.contains(&l.net1_ip()), "net1's address: {api}");

    // One forward that is well: only its row, exit 0.
    let (code, t) = run(&["--forward", "api"]);
    assert_eq!(code, Some(0), "{t}");
    let rows: Vec<&str> = t.lines().filter(|r| r.starts_with("hil/")).collect();
    assert_eq!(rows.len(), 1, "{t}");
    assert!(rows[0].contains("api/tcp"), "{t}");
    let (code, t) = run(&["--pod", "hil/proxy-0", "--forward", "down"]);
    assert_eq!(code, Some(2), "{t}");
    assert!(
        t.lines()
            .filter(|r| r.starts_with("hil/"))
            .all(|r| r.contains("down/tcp")),
        "{t}"
    );
    // Another namespace: nothing shown, nothing unwell; --json keeps the filter.
    let (code, t) = run(&["-n", "elsewhere"]);
    assert_eq!(code, Some(0), "{t}");
    assert!(!t.contains("hil/"), "{t}");
    let (code, t) = run(&["--namespace", "hil", "--forward", "api", "--json"]);
    assert_eq!(code, Some(0), "{t}");
    let j: Value = serde_json::from_str(&t).expect("--json is JSON");
    assert_eq!(
        j["attachments"][0]["forwards"].as_array().map(Vec::len),
        Some(1),
        "{j:#}"
    );
}

/// A tiny HTTP receiver in `ns` on `port`: records each request's
/// (request line, body) and answers 204; heartbeats (a path ending in
/// `/heartbeat`) apart from the reports. Stops on drop (bounded anyway).
/// One request's head, body (gunzip'd when it says `Content-Encoding:
/// gzip`, as edgelinkd's reports do) and the body's bytes on the wire.
fn read_request(c: &mut std::net::TcpStream) -> (String, String, usize) {
    let mut buf = Vec::new();
    let mut b = [0u8; 8192];
    loop {
        match again(|| c.read(&mut b)) {
            Ok(0) | Err(_) => return (String::new(), String::new(), 0),
            Ok(n) => buf.extend_from_slice(&b[..n]),
        }
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let h = String::from_utf8_lossy(&buf[..end]).into_owned();
        let field = |name: &str| {
            h.lines().find_map(|x| {
                let (k, v) = x.split_once(':')?;
                k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
            })
        };
        let len: usize = field("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let rest = &buf[end + 4..];
        if rest.len() < len {
            continue;
        }
        let raw = &rest[..len];
        let body = match field("content-encoding").as_deref() {
            Some("gzip") => {
                let mut out = String::new();
                flate2::read::GzDecoder::new(raw)
                    .read_to_string(&mut out)
                    .expect("a gzip'd body");
                out
            }
            _ => String::from_utf8_lossy(raw).into_owned(),
        };
        return (h, body, len);
    }
}

pub(crate) struct Receiver {
    pub(crate) got: Arc<Mutex<Vec<(String, String)>>>,
    pub(crate) beats: Arc<Mutex<Vec<String>>>,
    /// When set, heartbeats are answered 200 with this JSON (an
    /// operator's grants of virtual addresses).
    pub(crate) grants: Arc<Mutex<Option<String>>>,
    /// When set, gzip'd reports are answered as an operator before them
    /// answered them (400: not its JSON).
    pub(crate) refuse_gzip: Arc<AtomicBool>,
    /// Report body bytes received on the wire (gzip'd).
    pub(crate) wire_bytes: Arc<std::sync::atomic::AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    pub(crate) fn start(ns: &Netns, port: u16) -> Receiver {
        Receiver::start_answering(
            ns,
            port,
            b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
    }

    /// [`Receiver::start`], answering every request with `answer`.
    pub(crate) fn start_answering(ns: &Netns, port: u16, answer: &'static [u8]) -> Receiver {
        let l = in_netns(ns, || {
            std::net::TcpListener::bind(("127.0.0.1", port)).expect("bind the receiver")
        });
        l.set_nonblocking(true).unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let beats = Arc::new(Mutex::new(Vec::new()));
        let grants: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let refuse_gzip = Arc::new(AtomicBool::new(false));
        let (g, bt, st, gr) = (got.clone(), beats.clone(), stop.clone(), grants.clone());
        let rg = refuse_gzip.clone();
        let wire_bytes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let wb = wire_bytes.clone();
        let thread = std::thread::spawn(move || {
            let end = Instant::now() + Duration::from_secs(60);
            while !st.load(Ordering::Relaxed) && Instant::now() < end {
                let Ok((mut c, _)) = again(|| l.accept()) else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                let _ = c.set_nonblocking(false);
                let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
                let (head, body, wire) = read_request(&mut c);
                let path = head.split_whitespace().nth(1).unwrap_or("");
                let granting = gr.lock().unwrap().clone();
                let gzipped = head.to_lowercase().contains("\r\ncontent-encoding: gzip");
                if gzipped && rg.load(Ordering::Relaxed) {
                    let said = "report is not edgelinkd's status JSON: expected value at line 1 column 1\n";
                    let _ = c.write_all(format!(
                        "HTTP/1.1 400 Bad Request\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{said}",
                        said.len()
                    ).as_bytes());
                    g.lock().unwrap().push((head, String::new()));
                    continue;
                }
                match granting.filter(|_| path.ends_with("/heartbeat")) {
                    Some(json) => {
                        let _ = c.write_all(format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{json}",
                            json.len()
                        ).as_bytes());
                    }
                    None => {
                        let _ = c.write_all(answer);
                    }
                }
                if path.ends_with("/heartbeat") {
                    bt.lock().unwrap().push(body);
                } else if !head.is_empty() {
                    wb.fetch_add(wire, Ordering::Relaxed);
                    g.lock().unwrap().push((head, body));
                }
            }
        });
        Receiver {
            got,
            beats,
            grants,
            refuse_gzip,
            wire_bytes,
            stop,
            thread: Some(thread),
        }
    }

    /// Attachment counts of the status documents received so far.
    fn attachment_counts(&self) -> Vec<usize> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(_, b)| serde_json::from_str::<Value>(b).ok())
            .map(|j| j["attachments"].as_array().map_or(usize::MAX, Vec::len))
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn the_status_webhook_posts_the_status_when_an_attachment_appears_and_goes() {
    let mut l = DLab::idle(&["--status-webhook", "http://127.0.0.1:18080/hook"]);
    // The receiver is not up yet when the daemon starts: the first POST
    // fails and is retried (backoff from 1 s).
    l.start_daemon();
    assert!(
        wait_until(Duration::from_secs(10), || l
            .daemon()
            .log_text()
            .contains("status webhook failed")),
        "no failed POST logged at start"
    );
    let rx = Receiver::start(&l.lab.node, 18080);
    // Retried after 1 s, then 2, 4, 8 s (a slow start may miss one).
    assert!(
        wait_until(Duration::from_secs(20), || rx.attachment_counts().first()
            == Some(&0)),
        "the POST at start was not retried: {:?}",
        rx.got.lock().unwrap()
    );
    // The relay is not held up meanwhile.
    assert_eq!(l.get("/healthz").0, 200);
    l.add();
    assert!(
        wait_until(Duration::from_secs(5), || rx
            .attachment_counts()
            .contains(&1)),
        "no POST naming the new attachment: {:?}",
        rx.attachment_counts()
    );
    {
        let got = rx.got.lock().unwrap();
        let (head, body) = got
            .iter()
            .find(|(_, b)| b.contains(CID))
            .expect("a status naming the attachment");
        assert!(head.starts_with("POST /hook HTTP/1.1"), "{head}");
        assert!(
            head.to_lowercase()
                .contains("content-type: application/json"),
            "{head}"
        );
        assert!(
            head.to_lowercase().contains("content-encoding: gzip"),
            "a report is gzip'd: {head}"
        );
        let j: Value = serde_json::from_str(body).unwrap();
        assert_eq!(j["attachments"][0]["podName"], "proxy-0");
        assert!(j["attachments"][0]["forwards"]
            .as_array()
            .is_some_and(|f| !f.is_empty()));
    }
    l.call("DEL").ok_empty();
    assert!(
        wait_until(Duration::from_secs(5), || rx.attachment_counts().last()
            == Some(&0)
            && rx.attachment_counts().len() >= 3),
        "no POST after DEL: {:?}",
        rx.attachment_counts()
    );
}

/// The forward `name` in a received status document, if there.
fn posted_forward(body: &str, name: &str) -> Option<Value> {
    let j: Value = serde_json::from_str(body).ok()?;
    j["attachments"][0]["forwards"]
        .as_array()?
        .iter()
        .find(|f| f["name"] == name)
        .cloned()
}

/// edgelink-operator's DeviceReachable rests on this: with no heartbeat
/// (`--status-webhook-interval 0`), a forward's reachability that changes
/// is POSTed by itself, and every POST carries the token file's bearer
/// token (read at each POST: a rotated token is sent from the next one).
#[test]
fn the_status_webhook_posts_a_reachability_change_with_the_bearer_token() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let token_s = token.to_str().unwrap().to_string();
    let flags = [
        "--status-webhook",
        "http://127.0.0.1:18081/v1/status",
        "--status-webhook-interval",
        "0",
        "--status-webhook-token-file",
        &token_s,
        "--probe-interval",
        "1",
    ];
    let mut l = DLab::idle(&flags);
    let rx = Receiver::start(&l.lab.node, 18081);
    l.start_daemon();
    l.add();
    let api_is = |want: &str| {
        let want = want.to_string();
        move |got: &Vec<(String, String)>| {
            got.iter().any(|(_, b)| {
                posted_forward(b, "api")
                    .is_some_and(|f| f["reachability"]["state"] == want.as_str())
            })
        }
    };
    let reachable = api_is("reachable");
    assert!(
        wait_until(Duration::from_secs(10), || reachable(
            &rx.got.lock().unwrap()
        )),
        "no POST with api reachable: {:?}",
        rx.attachment_counts()
    );
    // The device goes away: only the probe notices, no attachment changes.
    std::fs::write(&token, "rotated\n").unwrap();
    let before = rx.got.lock().unwrap().len();
    l.lab.device.ip(&["link", "set", "dev0", "down"]);
    let unreachable = api_is("unreachable");
    assert!(
        wait_until(Duration::from_secs(20), || unreachable(
            &rx.got.lock().unwrap()
        )),
        "no POST with api unreachable after the device went down"
    );
    let got = rx.got.lock().unwrap();
    assert!(got.len() > before);
    for (i, (head, _)) in got.iter().enumerate() {
        let want = if i < before {
            "authorization: bearer s3cret"
        } else {
            "authorization: bearer rotated"
        };
        assert!(
            head.to_lowercase().contains(want),
            "POST {i} lacks {want:?}: {head}"
        );
    }
    drop(got);
    l.lab.device.ip(&["link", "set", "dev0", "up"]);
}

/// Counters move without a state change: the heartbeat carries them, and
/// tells the operator the node is alive.
#[test]
fn the_status_webhook_posts_at_least_every_interval_without_changes() {
    let mut l = DLab::idle(&[
        "--status-webhook",
        "http://127.0.0.1:18082/hook",
        "--status-webhook-interval",
        "1",
    ]);
    let rx = Receiver::start(&l.lab.node, 18082);
    l.start_daemon();
    l.add();
    l.wait_serving();
    // Let the start settle, then count over a quiet stretch.
    std::thread::sleep(Duration::from_secs(2));
    let n0 = rx.got.lock().unwrap().len();
    std::thread::sleep(Duration::from_secs(5));
    let n = rx.got.lock().unwrap().len() - n0;
    assert!(
        (3..=8).contains(&n),
        "{n} POSTs in 5 s at --status-webhook-interval 1"
    );
    // /metrics counts what was sent: at least the posts received, each
    // with a body (the received bodies' bytes on the wire at least).
    let got = rx.got.lock().unwrap().clone();
    let posts = l.metric_plain("edgelink_webhook_reports_total");
    let bytes = l.metric_plain("edgelink_webhook_report_bytes_total");
    let received = rx.wire_bytes.load(Ordering::Relaxed);
    assert!(
        posts >= got.len() as f64,
        "{posts} posts counted, {} received",
        got.len()
    );
    assert!(
        bytes >= received as f64,
        "{bytes} bytes counted, {received} received"
    );
}

/// An operator from before gzip'd reports answers one 400 (not its JSON):
/// edgelinkd says so once and posts that URL's reports whole (until it
/// tries gzip again, ten heartbeats later: the test below).
#[test]
fn a_receiver_that_refuses_gzip_gets_the_reports_whole() {
    let mut l = DLab::idle(&["--status-webhook", "http://127.0.0.1:18083/hook"]);
    let rx = Receiver::start(&l.lab.node, 18083);
    rx.refuse_gzip.store(true, Ordering::Relaxed);
    l.start_daemon();
    l.add();
    l.wait_serving();
    assert!(
        wait_until(Duration::from_secs(10), || rx
            .attachment_counts()
            .contains(&1)),
        "no whole report naming the attachment: {:?}",
        rx.got.lock().unwrap()
    );
    let got = rx.got.lock().unwrap().clone();
    let gzipped: Vec<bool> = got
        .iter()
        .map(|(h, _)| h.to_lowercase().contains("content-encoding: gzip"))
        .collect();
    assert_eq!(
        gzipped.iter().filter(|g| **g).count(),
        1,
        "one gzip'd report, refused, then whole ones: {gzipped:?}"
    );
    assert!(gzipped[0], "{gzipped:?}");
    let log = l.daemon().log_text();
    assert_eq!(
        log.matches("does not take gzip'd reports").count(),
        1,
        "{log}"
    );
    assert!(!log.contains("status webhook failed"), "{log}");
}

/// An operator upgraded after it refused a gzip'd report gets gzip again:
/// the daemon tries it after ten heartbeats (here 10 s).
#[test]
fn a_receiver_upgraded_to_take_gzip_gets_it_again() {
    let mut l = DLab::idle(&[
        "--status-webhook",
        "http://127.0.0.1:18084/hook",
        "--status-webhook-interval",
        "1",
    ]);
    let rx = Receiver::start(&l.lab.node, 18084);
    rx.refuse_gzip.store(true, Ordering::Relaxed);
    l.start_daemon();
    l.add();
    l.wait_serving();
    let gzipped = |rx: &Receiver| -> Vec<bool> {
        rx.got
            .lock()
            .unwrap()
            .iter()
            .map(|(h, _)| h.to_lowercase().contains("content-encoding: gzip"))
            .collect()
    };
    assert!(
        wait_until(Duration::from_secs(10), || gzipped(&rx)
            .iter()
            .filter(|g| !**g)
            .count()
            >= 2),
        "no whole reports: {:?}",
        gzipped(&rx)
    );
    // Upgraded: gzip'd reports taken from the next try on.
    rx.refuse_gzip.store(false, Ordering::Relaxed);
    assert!(
        wait_until(Duration::from_secs(20), || gzipped(&rx)
            .iter()
            .skip(1)
            .any(|g| *g)),
        "gzip never tried again: {:?}",
        gzipped(&rx)
    );
    // Taken: the reports after it stay gzip'd.
    let n = gzipped(&rx).len();
    assert!(wait_until(Duration::from_secs(5), || gzipped(&rx).len() >= n + 2));
    let after = gzipped(&rx);
    let first = after.iter().skip(1).position(|g| *g).unwrap() + 1;
    assert!(
        after[first..].iter().all(|g| *g),
        "whole again after gzip was taken: {after:?}"
    );
    let log = l.daemon().log_text();
    assert_eq!(
        log.matches("does not take gzip'd reports").count(),
        1,
        "{log}"
    );
}
