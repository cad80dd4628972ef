//! Third review (issue 20), items 6, 13, 24 and the read items 80, 83: memory and descriptor bounds, records from another boot or namespace, queued clients of a removed attachment.

use crate::lab::*;
use edgelink_tests::*;
use serde_json::Value;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

/// Replace the record file at `path` atomically by `edit` of its content.
fn rewrite(path: &Path, edit: impl FnOnce(&mut Value)) {
    let mut rec: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    edit(&mut rec);
    let tmp = path.with_file_name(".edit.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&rec).unwrap()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Listening TCP sockets on `port` in `ns`.
fn listeners(ns: &Netns, port: u16) -> String {
    let out = ns.exec(&["ss", "-Hltn", &format!("sport = :{port}")]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A process that lives in `ns` until dropped: its `/proc/<pid>/ns/net`
/// names `ns`, as a reused PID would name another pod's namespace.
struct Sleeper(std::process::Child);

impl Sleeper {
    fn new(ns: &Netns) -> Sleeper {
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", &ns.name, "sleep", "120"])
            .spawn()
            .expect("spawn sleep");
        Sleeper(child)
    }

    fn netns_path(&self) -> String {
        format!("/proc/{}/ns/net", self.0.id())
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Review item 13: ADD writes the boot and the namespace into the record.
/// The record's path made to name another namespace (as a
/// `/proc/<pid>/ns/net` whose PID now belongs to another process): the
/// daemon opens nothing there, and reclaims the pod (its address, its
/// record), whose namespace it can no longer reach.
#[test]
fn a_record_whose_path_names_another_namespace_now_is_not_served_there() {
    let l = DLab::with(Opts {
        fast_reconcile: true,
        ..Opts::default()
    });
    let path = l.record_path();
    let rec: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_eq!(rec["bootId"], boot.trim(), "{rec:#}");
    let ino = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(l.pod.path()).unwrap().ino()
    };
    assert_eq!(rec["netnsId"]["ino"], ino, "{rec:#}");

    let other = Sleeper::new(&l.client);
    // Wait for `ip netns exec` to have entered the namespace.
    let ino_of = |p: &str| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).map(|m| m.ino()).ok()
    };
    let client = l.client.path();
    assert!(
        wait_until(Duration::from_secs(5), || ino_of(&other.netns_path())
            == ino_of(&client)),
        "the sleeper never entered the client namespace"
    );
    rewrite(&path, |r| r["netns"] = Value::String(other.netns_path()));
    let reclaimed = wait_until(Duration::from_secs(10), || l.released());
    assert!(
        reclaimed,
        "not reclaimed; listening in the other namespace: {:?}; status: {:#}",
        listeners(&l.client, API),
        l.status()["attachments"]
    );
    assert_eq!(listeners(&l.client, API), "", "served in another namespace");
    l.wait_status(Duration::from_secs(5), "the reclaim counted", |s| {
        s["reclaimedTotal"] == 1 && s["attachments"].as_array().is_some_and(|a| a.is_empty())
    });
    // The pod's own listeners went with it.
    assert!(l.refused(API), "the pod's forward still listens");
}

/// Review item 13: a record of an earlier boot names a pod that is gone,
/// even where its path opens (here the pod's namespace itself, the worst
/// case): not served, reclaimed.
#[test]
fn a_record_of_another_boot_is_not_served_and_is_reclaimed() {
    let l = DLab::with(Opts {
        fast_reconcile: true,
        ..Opts::default()
    });
    let path = l.record_path();
    rewrite(&path, |r| {
        r["bootId"] = Value::String("00000000-0000-4000-8000-000000000000".into())
    });
    assert!(
        wait_until(Duration::from_secs(10), || l.released()),
        "a record of another boot was kept: {:#}",
        l.status()["attachments"]
    );
    l.wait_status(Duration::from_secs(5), "nothing served", |s| {
        s["attachments"].as_array().is_some_and(|a| a.is_empty()) && s["reclaimedTotal"] == 1
    });
    assert!(l.refused(API), "the forward still listens");
}

/// The rule for records written before `bootId` and `netnsId` existed:
/// served wherever their path points, as before (docs/architecture.md).
#[test]
fn a_record_without_boot_or_namespace_is_served_as_before() {
    let l = DLab::with(Opts {
        fast_reconcile: true,
        ..Opts::default()
    });
    let path = l.record_path();
    rewrite(&path, |r| {
        let o = r.as_object_mut().unwrap();
        o.remove("bootId");
        o.remove("netnsId");
    });
    // Several passes (--reconcile-interval 1).
    std::thread::sleep(Duration::from_millis(2500));
    assert!(path.exists(), "the old record was reclaimed");
    l.wait_serving();
    l.echo_once(b"old record\n");
    assert_eq!(l.status()["reclaimedTotal"], 0);
}

/// Bytes the kernel holds for the sockets of `ns` (all edgelinkd's in the
/// pod's namespace: both legs of every relayed connection): receive queue
/// plus send queue, from `ss -tm`'s `skmem:(r…,w…)`.
fn socket_memory(ns: &Netns) -> u64 {
    let out = ns.exec(&["ss", "-Htmn"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |part: &str, key: &str| -> u64 {
        part.split([',', '(', ')'])
            .find_map(|f| f.strip_prefix(key).and_then(|v| v.parse().ok()))
            .unwrap_or(0)
    };
    text.split_whitespace()
        .filter(|w| w.starts_with("skmem:"))
        .map(|w| field(w, "r") + field(w, "w"))
        .sum()
}

/// Review item 6: clients that send without ever reading, against a device
/// that answers everything (the echo): every direction of every connection
/// stuck with all it can hold. What the daemon pins stays under the bound
/// its caps give (docs/configuration.md, "Memory"): 4 socket buffers of
/// twice `--socket-buffer` per connection, plus pipes up to
/// `--pipe-budget`; the connections beyond the budget copy through a small
/// buffer, and a new connection is still relayed.
#[test]
fn clients_that_never_read_pin_no_more_than_the_caps_allow() {
    const CLIENTS: usize = 8;
    const BUFFER: u64 = 65536;
    const PIPE: u64 = 1 << 20;
    let l = DLab::with(Opts {
        flags: &[
            "--socket-buffer",
            "65536",
            "--pipe-budget",
            "2097152",
            "--pipe-size",
            "1048576",
        ],
        ..Default::default()
    });
    let chunk = vec![0x5au8; 64 * 1024];
    let mut conns = Vec::new();
    for _ in 0..CLIENTS {
        let mut s = l.connect(API).expect("connect to api");
        s.set_nonblocking(true).unwrap();
        // Push until nothing more is taken (64 MiB at most).
        let mut pushed = 0usize;
        let mut stuck = 0;
        while pushed < 64 << 20 && stuck < 50 {
            match s.write(&chunk) {
                Ok(n) => pushed += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    stuck += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("write: {e}"),
            }
        }
        conns.push(s);
    }
    // Until nothing moves (bounded).
    let moved = || {
        let f = l.forward("api");
        f["bytesToTarget"].as_u64().unwrap_or(0) + f["bytesToClient"].as_u64().unwrap_or(0)
    };
    let mut last = moved();
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(500));
        let now = moved();
        if now == last {
            break;
        }
        last = now;
    }
    let held = socket_memory(&l.pod);
    let pipes = l.metric_plain("edgelink_pipes_in_use") as u64;
    // Per socket the kernel admits one more segment past its limit: 64 KiB
    // of slack each.
    let sockets_bound = CLIENTS as u64 * 4 * (2 * BUFFER + 65536);
    let pipes_bound = 2;
    eprintln!(
        "{CLIENTS} clients: sockets hold {held} bytes (bound {sockets_bound}), {pipes} pipes in use (bound {pipes_bound} of {PIPE} bytes)"
    );
    assert!(
        held <= sockets_bound,
        "the daemon's sockets hold {held} bytes for {CLIENTS} clients that never read, above the bound {sockets_bound}"
    );
    assert!(
        pipes <= pipes_bound,
        "{pipes} pipes in use, budget {pipes_bound}"
    );
    assert!(
        held > 0,
        "nothing was held: the clients never filled anything"
    );
    // Another client is still served, its bytes copied if no pipe is left.
    l.echo_once(b"still served\n");
}

/// Read item (reliability.md 80): a worker that dies takes its listeners
/// with it, and only the forwards it served start again. The UDP forward
/// lives on another worker (port 5000 % 3 workers = worker 2; SIGUSR2
/// kills worker 0): its session, and the session's upstream socket, stay.
#[test]
fn a_dead_worker_leaves_the_udp_sessions_of_the_other_workers_alone() {
    let l = DLab::with(Opts {
        flags: &["--workers", "3", "--reconcile-interval", "0.2"],
        ..Default::default()
    });
    let u = UdpClient::new(&l.client, CLIENT_IP, pod_addr(UDP));
    assert_eq!(u.echo(b"before"), b"before");
    let upstream = || {
        let out = l.pod.exec(&["ss", "-Hun", "state", "established"]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let before = upstream();
    assert!(!before.is_empty(), "no upstream socket for the session");
    l.kill_worker_0();
    // A pass has run since (every 0.2 s): what it restarted, it restarted.
    std::thread::sleep(Duration::from_millis(600));
    let t = l.forward("telemetry");
    assert_eq!(t["udpSessions"], 1, "the session was dropped: {t:#}");
    assert_eq!(upstream(), before, "the session's upstream socket changed");
    assert_eq!(u.echo(b"after"), b"after");
    let t = l.forward("telemetry");
    assert_eq!(t["udpSessionsTotal"], 1, "a new session was made: {t:#}");
    // The TCP forwards lost an accept loop with the worker: started again,
    // on their one listener per address (IPv4 and IPv6) that the workers
    // share.
    assert!(wait_until(Duration::from_secs(5), || l
        .tcp_listeners_on(API)
        == 2));
    l.echo_once(b"tcp after\n");
}

/// Read item (reliability.md 83): a client waiting in a forward's queue
/// when its attachment is removed (its record gone) is reset, and the device never
/// sees it; before, it was admitted when the relayed connections ended
/// and dialed the device once.
#[test]
fn a_queued_client_of_a_removed_attachment_never_reaches_the_device() {
    let mut l = DLab::with(Opts {
        add: false,
        ..Default::default()
    });
    let observe = l.conf["forwards"]
        .as_array()
        .unwrap()
        .iter()
        .position(|f| f["name"] == "observe")
        .unwrap();
    l.conf["forwards"][observe]["maxConnections"] = serde_json::json!(1);
    l.add();
    l.wait_serving();
    let mut first = l.connect(OBSERVE).expect("connect to observe");
    first.write_all(b"first").unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || l.forward("observe")
            ["activeConnections"]
            == 1),
        "the first client was not relayed"
    );
    let mut queued = l.connect(OBSERVE).expect("connect to observe");
    queued.write_all(b"queued").unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || l.forward("observe")["queued"]
            == 1),
        "not queued: {:#}",
        l.forward("observe")
    );
    // The record goes (the daemon's side of a DEL; the plugin's DEL also
    // takes net1 away, and with it any path to the device to observe).
    std::fs::remove_file(l.record_path()).unwrap();
    // The relayed one ends with the attachment; the device notes it.
    assert!(
        wait_until(Duration::from_secs(10), || !l
            .seen
            .observed
            .lock()
            .unwrap()
            .is_empty()),
        "the relayed connection did not end"
    );
    queued
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(read_end(&mut queued), Ended::Reset);
    // Whatever the daemon did with the queued client is done by now.
    std::thread::sleep(Duration::from_millis(500));
    let seen = l.seen.observed.lock().unwrap().clone();
    assert_eq!(
        seen.len(),
        1,
        "the device saw the queued client of a removed attachment: {seen:?}"
    );
}
