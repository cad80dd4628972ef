//! Promises the docs make about the daemon that no other test held it to:
//! the IPAM GC grace, target probes, the ready socket pool, the status
//! endpoint's connection timeout, exit code 1 on a failed start, and the
//! reclaim of an attachment whose IPAM is delegated (without `--cni-path`
//! the delegate's own reservation is left to its GC; with it, the daemon
//! runs the delegate's DEL and keeps the record while that fails).
//!
//! Each test passes the flags it depends on itself (the lab's defaults may
//! change), and waits for conditions with generous deadlines.

use crate::lab::*;
use edgelink_tests::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The daemon lab with the daemon started with exactly `flags` (none of the
/// lab's defaults), the pod ADDed (if `add`) and served.
fn lab_with(flags: &[&str], add: bool) -> DLab {
    let mut l = DLab::with(Opts {
        daemon: false,
        add: false,
        ..Default::default()
    });
    l.daemon = Some(Edgelinkd::start(
        &l.lab.node,
        l.lab.state.path(),
        l.logs.path().join("edgelinkd-promises.log"),
        flags,
    ));
    if add {
        l.add();
        l.wait_serving();
    }
    l
}

/// Record files under `attachments/` whose record names `cid` (whatever the
/// file naming scheme is).
fn record_files_of(lab: &Lab, cid: &str) -> Vec<PathBuf> {
    let dir = lab.state.path().join("attachments");
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter(|p| {
            std::fs::read_to_string(p)
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .is_some_and(|v| v["containerId"] == cid)
        })
        .collect()
}

/// Set a file's modification time `age` into the past.
fn age_file(path: &Path, age: Duration) {
    let f = std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    f.set_modified(SystemTime::now() - age)
        .unwrap_or_else(|e| panic!("set mtime of {}: {e}", path.display()));
}

/// Wait until the daemon has finished `n` more reconcile passes
/// (`lastReconcileAt` has a one-second resolution: each counted pass is one
/// in a later second).
fn wait_passes(l: &DLab, n: u64) {
    let mut last = l.status()["lastReconcileAt"].as_u64().unwrap_or(0);
    for i in 0..n {
        let s = l.wait_status(
            Duration::from_secs(15),
            &format!("reconcile pass {} of {n}", i + 1),
            |s| s["lastReconcileAt"].as_u64().unwrap_or(0) > last,
        );
        last = s["lastReconcileAt"].as_u64().unwrap_or(0);
    }
}

#[test]
fn a_reservation_without_a_record_is_released_only_after_the_ipam_gc_grace() {
    // GC runs with a pass once per reconcile interval; 1 s makes it happen.
    // The grace is long (120 s): the test ages the reservation's file
    // instead of waiting for it, so no wall-clock race decides the outcome.
    let l = lab_with(
        &[
            "--reconcile-interval",
            "1",
            "--ipam-gc-grace",
            "120",
            "--probe-interval",
            "0",
        ],
        true,
    );
    let kept_ip = l.net1_ip();

    // A second pod's ADD whose record is then lost: what an ADD killed
    // between reserving and writing its record leaves.
    let pod2 = l.lab.pod();
    let mut conf2 = l.conf.clone();
    conf2["forwards"] = json!([]);
    let r2 = Call::new("ADD", "orphan-cid", Some(&pod2.path()), "net1")
        .run(&l.lab.node, &conf2)
        .ok();
    let orphan_ip = r2["ips"][0]["address"]
        .as_str()
        .expect("ADD gave an address")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let mut both = vec![kept_ip.clone(), orphan_ip.clone()];
    both.sort();
    assert_eq!(l.lab.reserved(NET), both);
    let recs = record_files_of(&l.lab, "orphan-cid");
    assert_eq!(recs.len(), 1, "the orphan's record: {recs:?}");
    std::fs::remove_file(&recs[0]).unwrap();

    // Young: several passes keep it.
    wait_passes(&l, 3);
    assert_eq!(
        l.lab.reserved(NET),
        both,
        "a reservation younger than --ipam-gc-grace was released"
    );

    // Older than the grace: released; the one with a record is kept however
    // old it is.
    let ipam = l.lab.state.path().join("ipam").join(NET);
    for ip in &both {
        age_file(&ipam.join(ip), Duration::from_secs(600));
    }
    assert!(
        wait_until(Duration::from_secs(20), || l.lab.reserved(NET)
            == vec![kept_ip.clone()]),
        "the orphan reservation {orphan_ip} was not released: {:?}",
        l.lab.reserved(NET)
    );
    wait_passes(&l, 2);
    assert_eq!(l.lab.reserved(NET), vec![kept_ip]);
    // The served pod goes on.
    l.echo_once(b"still served\n");
    assert_eq!(l.status()["reclaimedTotal"], 0);
}

#[test]
fn probes_mark_a_live_target_reachable_and_a_dead_one_unreachable() {
    let l = lab_with(&["--probe-interval", "1"], true);
    let state = |s: &Value, name: &str| forward_of(s, name)["reachability"]["state"].clone();
    // No connection was made: only the probes can tell.
    let s = l.wait_status(
        Duration::from_secs(30),
        "api reachable, closed and down unreachable",
        |s| {
            state(s, "api") == "reachable"
                && state(s, "closed") == "unreachable"
                && state(s, "down") == "unreachable"
        },
    );
    for f in ["closed", "down"] {
        let r = &forward_of(&s, f)["reachability"];
        assert!(
            r["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{f}: no error: {r}"
        );
        assert!(r["checkedAt"].as_u64().unwrap_or(0) > 0, "{f}: {r}");
    }
    assert_eq!(forward_of(&s, "api")["totalConnections"], 0);
    assert_eq!(l.metric("edgelink_target_reachable", "api"), 1.0);
    assert_eq!(l.metric("edgelink_target_reachable", "down"), 0.0);

    // Probes keep going: the device goes away, then comes back.
    l.lab.device.ip(&["link", "set", "dev0", "down"]);
    l.wait_status(Duration::from_secs(30), "api unreachable", |s| {
        state(s, "api") == "unreachable"
    });
    l.lab.device.ip(&["link", "set", "dev0", "up"]);
    l.wait_status(Duration::from_secs(30), "api reachable again", |s| {
        state(s, "api") == "reachable"
    });
}

#[test]
fn with_probes_off_reachability_stays_unknown() {
    let l = lab_with(
        &["--probe-interval", "0", "--reconcile-interval", "1"],
        true,
    );
    wait_passes(&l, 2);
    let s = l.status();
    for f in ["api", "closed", "down"] {
        assert_eq!(
            forward_of(&s, f)["reachability"]["state"],
            "unknown",
            "{f}: {s:#}"
        );
    }
}

#[test]
fn a_socket_pool_hands_out_ready_sockets_and_connections_work() {
    let l = lab_with(&["--socket-pool", "4", "--probe-interval", "0"], true);
    assert_eq!(l.metric_plain("edgelink_socket_pool_taken_total"), 0.0);
    for i in 0..8 {
        l.echo_once(format!("pooled {i}\n").as_bytes());
    }
    // The pool was filled when the attachment started, before its
    // listeners: at least the first connection took a ready socket.
    let taken = l.metric_plain("edgelink_socket_pool_taken_total");
    assert!(
        (1.0..=8.0).contains(&taken),
        "{taken} sockets taken from the pool for 8 connections"
    );
    // Failed connects with pooled sockets are counted as usual.
    let before = l.forward("closed")["connectErrors"].as_u64().unwrap();
    // The relay resets the client once the connect fails: whether that
    // comes before or after the handshake is the kernel's business.
    if let Ok(mut c) = l.connect(CLOSED) {
        let end = read_end(&mut c);
        assert!(matches!(end, Ended::Eof | Ended::Reset), "{end:?}");
    }
    l.wait_status(Duration::from_secs(10), "connect error counted", |s| {
        forward_of(s, "closed")["connectErrors"].as_u64() == Some(before + 1)
    });
    assert_eq!(l.forward("api")["totalConnections"], 8);
}

#[test]
fn without_a_socket_pool_nothing_is_taken_from_one() {
    let l = lab_with(&["--socket-pool", "0", "--probe-interval", "0"], true);
    for i in 0..3 {
        l.echo_once(format!("on demand {i}\n").as_bytes());
    }
    assert_eq!(l.metric_plain("edgelink_socket_pool_taken_total"), 0.0);
}

/// Connect to the status endpoint, make one keep-alive request, read its
/// answer, then wait for the daemon to close the connection; returns
/// whether it did within `within`.
fn status_conn_closed_within(l: &DLab, within: Duration) -> bool {
    let addr = "127.0.0.1:9310".parse().unwrap();
    let mut s = connect_in(&l.lab.node, addr, Duration::from_secs(5)).expect("connect /status");
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    s.set_read_timeout(Some(within)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match again(|| s.read(&mut buf)) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(_) => return false, // still open when the read timed out
        }
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 "), "no answer: {text:?}");
    true
}

#[test]
fn the_status_endpoint_closes_a_connection_after_its_timeout() {
    let l = lab_with(
        &["--status-conn-timeout", "1", "--probe-interval", "0"],
        false,
    );
    // A keep-alive connection stays open after its answer, until the
    // timeout ends it (1 s; 20 s is slack for a loaded machine, far below
    // the default 30 s).
    assert!(
        status_conn_closed_within(&l, Duration::from_secs(20)),
        "a status connection was still open 20 s after it was made"
    );
    // The endpoint serves on.
    assert_eq!(l.get("/healthz").0, 200);
    // A connection that sends nothing is closed too.
    let addr = "127.0.0.1:9310".parse().unwrap();
    let mut s = connect_in(&l.lab.node, addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let end = read_end(&mut s);
    assert!(matches!(end, Ended::Eof | Ended::Reset), "{end:?}");
}

#[test]
fn a_status_conn_timeout_below_a_tenth_of_a_second_is_refused() {
    let ns = Netns::new("flags");
    let state = tempfile::tempdir().unwrap();
    let sd = state.path().display().to_string();
    let bin = daemon_bin().display().to_string();
    for v in ["0", "0.05", "soon"] {
        let out = ns.exec(&[&bin, "run", "--state-dir", &sd, "--status-conn-timeout", v]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{v}: {err}");
        assert!(err.contains("--status-conn-timeout"), "{v}: {err}");
    }
}

/// Run `edgelinkd run ARGS` in `ns` and wait (bounded) for it to end.
fn run_to_exit(ns: &Netns, args: &[&str]) -> std::process::Output {
    let child = std::process::Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .arg(daemon_bin())
        .arg("run")
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn edgelinkd");
    ChildGuard::new(child)
        .wait_output(Duration::from_secs(20))
        .expect("edgelinkd did not exit within 20 s")
}

#[test]
fn exits_1_when_the_status_address_is_taken() {
    let ns = Netns::new("taken");
    let state = tempfile::tempdir().unwrap();
    let sd = state.path().join("state").display().to_string();
    let holder = in_netns(&ns, || std::net::TcpListener::bind("127.0.0.1:9310"))
        .expect("hold 127.0.0.1:9310 in the test namespace");
    let out = run_to_exit(
        &ns,
        &[
            "--state-dir",
            &sd,
            "--status-addr",
            "127.0.0.1:9310",
            "--probe-interval",
            "0",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--status-addr 127.0.0.1:9310"), "{err}");
    assert!(
        !Path::new(&sd).join("edgelinkd.sock").exists(),
        "a control socket was left behind"
    );
    drop(holder);
}

#[test]
fn exits_1_when_the_state_dir_cannot_be_made() {
    let ns = Netns::new("nostate");
    let tmp = tempfile::tempdir().unwrap();
    // Under a regular file: ENOTDIR whoever runs it (root included).
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let sd = file.join("state").display().to_string();
    let out = run_to_exit(&ns, &["--state-dir", &sd, "--probe-interval", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("state dir {sd}")), "{err}");
    // Nothing was bound: the status address is free in that namespace.
    let free = in_netns(&ns, || std::net::TcpListener::bind("127.0.0.1:9310"));
    assert!(free.is_ok(), "{free:?}");
}

/// docs/architecture.md (Reconciliation): a pod with delegated IPAM that
/// goes without a DEL is reclaimed like any other (listeners closed, the
/// namespace let go, the record removed), and only the built-in IPAM's
/// reservation is released by the daemon: the delegate's stays for its own
/// GC. The daemon runs no host binary (it has no CNI_PATH), so what it
/// reclaims never depends on what a NetworkAttachmentDefinition names.
#[test]
fn a_pod_with_delegated_ipam_is_reclaimed_and_the_delegates_reservation_is_left_to_its_gc() {
    // Reclaim happens on the periodic pass.
    let (l, hl) = host_local_lab(&[]);
    l.echo_once(b"through delegated IPAM\n");

    sh(&["ip", "netns", "del", &l.pod.name]);
    let s = l.wait_status(Duration::from_secs(20), "attachment reclaimed", |s| {
        s["attachments"].as_array().is_some_and(|a| a.is_empty()) && s["reclaimedTotal"] == 1
    });
    assert_eq!(s["reclaimedTotal"], 1);
    assert!(
        wait_until(Duration::from_secs(10), || l.lab.records().is_empty()),
        "the record is still there: {:?}",
        l.lab.records()
    );
    // The daemon let go of the namespace (its listeners are closed).
    assert!(
        wait_until(Duration::from_secs(10), || l.lab.host_veths().is_empty()),
        "the node-side veth is still there: {:?}",
        l.lab.host_veths()
    );
    // As documented: the delegate's reservation is its own GC's to release.
    assert_eq!(ip_files(&hl), vec!["172.31.250.170"]);
}

/// A lab whose pod got its address from host-local (data in the lab's
/// state directory), served by a daemon started with `flags` and a 1 s
/// reconcile pass. Returns the lab and host-local's directory of the
/// network.
fn host_local_lab(flags: &[&str]) -> (DLab, PathBuf) {
    assert!(
        Path::new("/usr/lib/cni/host-local").exists(),
        "/usr/lib/cni/host-local is missing (scripts/install-deps.sh test)"
    );
    let mut all = vec!["--reconcile-interval", "1", "--probe-interval", "0"];
    all.extend_from_slice(flags);
    let mut l = lab_with(&all, false);
    let hl = l.lab.state.path().join("host-local");
    l.conf["ipam"] = json!({
        "type": "host-local",
        "ranges": [[{"subnet": "172.31.250.0/24", "rangeStart": "172.31.250.170",
                     "rangeEnd": "172.31.250.172", "gateway": "172.31.250.1"}]],
        "routes": [{"dst": "172.30.0.0/16"}],
        "dataDir": hl.display().to_string()
    });
    l.add();
    l.wait_serving();
    assert_eq!(l.net1_ip(), "172.31.250.170");
    assert_eq!(ip_files(&hl.join(NET)), vec!["172.31.250.170"]);
    assert!(l.lab.reserved(NET).is_empty(), "built-in IPAM was used");
    (l, hl.join(NET))
}

fn daemon_log(l: &DLab) -> String {
    std::fs::read_to_string(l.logs.path().join("edgelinkd-promises.log")).unwrap_or_default()
}

#[test]
fn with_cni_path_a_reclaimed_pods_delegated_ipam_releases_its_address() {
    let (l, reserved) = host_local_lab(&["--cni-path", "/usr/lib/cni"]);
    sh(&["ip", "netns", "del", &l.pod.name]);
    let s = l.wait_status(Duration::from_secs(20), "attachment reclaimed", |s| {
        s["attachments"].as_array().is_some_and(|a| a.is_empty()) && s["reclaimedTotal"] == 1
    });
    assert_eq!(s["reclaimedTotal"], 1);
    assert!(
        wait_until(Duration::from_secs(10), || l.lab.records().is_empty()),
        "the record is still there: {:?}",
        l.lab.records()
    );
    // host-local's reservation file for the address is gone.
    assert!(
        ip_files(&reserved).is_empty(),
        "host-local still holds {:?}",
        ip_files(&reserved)
    );
    let log = daemon_log(&l);
    assert!(
        log.contains("the delegated IPAM released the reservation"),
        "{log}"
    );
}

#[test]
fn a_delegate_missing_from_cni_path_keeps_the_record_and_is_retried_until_it_is_there() {
    let bin = tempfile::tempdir().unwrap();
    let bin_s = bin.path().display().to_string();
    let (l, reserved) = host_local_lab(&["--cni-path", &bin_s]);
    let records = l.lab.records();
    sh(&["ip", "netns", "del", &l.pod.name]);
    // The listeners are closed at once; the failure is logged, naming the
    // plugin and where it was looked for.
    l.wait_status(Duration::from_secs(20), "listeners closed", |s| {
        s["attachments"].as_array().is_some_and(|a| a.is_empty())
    });
    assert!(
        wait_until(Duration::from_secs(20), || daemon_log(&l)
            .contains("cannot release the delegated IPAM's reservation")),
        "{}",
        daemon_log(&l)
    );
    let log = daemon_log(&l);
    let line = log
        .lines()
        .find(|x| x.contains("cannot release the delegated IPAM's reservation"))
        .unwrap();
    assert!(
        line.contains("host-local") && line.contains("not found") && line.contains(&bin_s),
        "{line}"
    );
    // Kept: the record (the only configuration that can release the
    // address) and the reservation; nothing counted as reclaimed.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(l.lab.records(), records);
    assert_eq!(ip_files(&reserved), vec!["172.31.250.170"]);
    assert_eq!(l.status()["reclaimedTotal"], 0);

    // The plugin appears: the next pass releases the address and reclaims.
    std::os::unix::fs::symlink("/usr/lib/cni/host-local", bin.path().join("host-local")).unwrap();
    l.wait_status(Duration::from_secs(20), "reclaimed", |s| {
        s["reclaimedTotal"] == 1
    });
    assert!(
        wait_until(Duration::from_secs(10), || l.lab.records().is_empty()),
        "the record is still there: {:?}",
        l.lab.records()
    );
    assert!(ip_files(&reserved).is_empty(), "{:?}", ip_files(&reserved));
}
