//! The status webhook's URL from a file that edgelinkd reads while it runs
//! (issue 21): the DaemonSet mounts edgelink-operator's ConfigMap there, so
//! a URL patched in after edgelinkd started is taken without a restart
//! (with the URL in the environment, every Device stayed `REACHABLE
//! Unknown` until a second restart); and a failed POST says why.

use crate::lab::*;
use crate::visibility::Receiver;
use edgelink_tests::*;
use std::time::Duration;

fn posts(r: &Receiver) -> usize {
    r.got.lock().unwrap().len()
}

#[test]
fn a_url_written_into_the_file_while_the_daemon_runs_is_taken_and_a_new_one_followed() {
    let dir = tempfile::tempdir().unwrap();
    let url_file = dir.path().join("url");
    let f = url_file.to_str().unwrap().to_string();
    let flags = [
        "--status-webhook-file",
        &f,
        "--status-webhook-interval",
        "1",
    ];
    let mut l = DLab::idle(&flags);
    let a = Receiver::start(&l.lab.node, 18090);
    let b = Receiver::start(&l.lab.node, 18091);
    l.start_daemon();
    // No file yet (no operator): nothing posted, said once.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(posts(&a) + posts(&b), 0);
    let log = l.daemon().log_text();
    assert_eq!(log.matches("names no URL").count(), 1, "{log}");

    std::fs::write(&url_file, "http://127.0.0.1:18090/v1/status\n").unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || posts(&a) > 0),
        "the URL written into the file was not taken: {}",
        l.daemon().log_text()
    );
    // As a ConfigMap volume updates: a new file renamed over the old.
    let new = dir.path().join("url.new");
    std::fs::write(&new, "http://127.0.0.1:18091/v1/status\n").unwrap();
    std::fs::rename(&new, &url_file).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || posts(&b) > 0),
        "the new URL was not followed: {}",
        l.daemon().log_text()
    );
    let n = posts(&a);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(posts(&a), n, "the old URL still gets posts");
    assert!(posts(&b) >= 2, "the heartbeat goes to the new URL");
    let log = l.daemon().log_text();
    assert!(
        log.contains("posting to this URL url=http://127.0.0.1:18091/v1/status"),
        "{log}"
    );
}

#[test]
fn a_failed_post_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let url_file = dir.path().join("url");
    let f = url_file.to_str().unwrap().to_string();
    let flags = ["--status-webhook-file", &f];
    let mut l = DLab::idle(&flags);
    let denied = Receiver::start_answering(
        &l.lab.node,
        18093,
        b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 14\r\nConnection: close\r\n\r\ntoken rejected",
    );
    l.start_daemon();
    let cases = [
        // A name only cluster DNS knows, on a node without it: resolved in
        // the test's node namespace, which has no route anywhere.
        (
            "http://edgelink-operator-webhook.edgelink-system.svc.invalid:8080/v1/status",
            "cannot resolve edgelink-operator-webhook.edgelink-system.svc.invalid",
        ),
        (
            "http://127.0.0.1:18092/v1/status",
            "127.0.0.1:18092 refused the connection",
        ),
        (
            "http://127.0.0.1:18093/v1/status",
            "127.0.0.1:18093 answered 401 (the token was refused): \"token rejected\"",
        ),
    ];
    for (url, why) in cases {
        std::fs::write(&url_file, format!("{url}\n")).unwrap();
        assert!(
            wait_until(Duration::from_secs(15), || l
                .daemon()
                .log_text()
                .contains(why)),
            "{url}: the log does not say {why:?}: {}",
            l.daemon().log_text()
        );
    }
    assert!(posts(&denied) > 0);
    // The relay is not held up meanwhile.
    assert_eq!(l.get("/healthz").0, 200);
}

/// The heartbeat beside the webhook (issue 24): `/v1/heartbeat` with the
/// node and the interval, as often as asked, and none with 0.
#[test]
fn the_heartbeat_goes_beside_the_webhook_as_often_as_asked() {
    let flags = [
        "--status-webhook",
        "http://127.0.0.1:18094/v1/status",
        "--status-webhook-heartbeat",
        "200ms",
        "--node-name",
        "kedge7",
    ];
    let mut l = DLab::idle(&flags);
    let r = Receiver::start(&l.lab.node, 18094);
    l.start_daemon();
    let beats = || r.beats.lock().unwrap().clone();
    assert!(
        wait_until(Duration::from_secs(10), || beats().len() >= 5),
        "no heartbeats: {:?} {}",
        beats(),
        l.daemon().log_text()
    );
    let b: serde_json::Value = serde_json::from_str(&beats()[0]).unwrap();
    assert_eq!(
        b,
        serde_json::json!({"node": "kedge7", "intervalMs": 200, "holding": [], "access": ""})
    );
    assert!(posts(&r) >= 1, "the report still goes to /v1/status");
    let log = l.daemon().log_text();
    assert!(
        log.contains("beating every 200ms to /v1/heartbeat"),
        "{log}"
    );

    let off = [
        "--status-webhook",
        "http://127.0.0.1:18095/v1/status",
        "--status-webhook-heartbeat",
        "0",
    ];
    let mut l2 = DLab::idle(&off);
    let r2 = Receiver::start(&l2.lab.node, 18095);
    l2.start_daemon();
    assert!(wait_until(Duration::from_secs(10), || posts(&r2) >= 1));
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        r2.beats.lock().unwrap().is_empty(),
        "--status-webhook-heartbeat 0 sends none"
    );
}
