//! The daemon's lifecycle: kill -9 and restart, DEL, a pod netns deleted
//! without DEL, SIGTERM with a grace period, the plugin's CHECK.

use crate::lab::*;
use crate::udp::udp_clients;
use edgelink_tests::*;
use serde_json::Value;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// (name, protocol, port, target, listener) of every forward.
fn listeners(s: &Value) -> Vec<(String, String, u64, String, String)> {
    let mut v: Vec<_> = s["attachments"][0]["forwards"]
        .as_array()
        .map(|f| {
            f.iter()
                .map(|f| {
                    (
                        f["name"].as_str().unwrap_or_default().to_string(),
                        f["protocol"].as_str().unwrap_or_default().to_string(),
                        f["port"].as_u64().unwrap_or_default(),
                        f["target"].as_str().unwrap_or_default().to_string(),
                        f["listener"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn killed_with_kill_9_and_started_again_it_serves_the_same_forwards() {
    let mut l = DLab::new();
    let before = listeners(&l.status());
    assert_eq!(before.len(), forwards().as_array().unwrap().len());
    l.echo_once(b"before the kill\n");
    assert!(udp_clients(&l, 1, 2).is_empty());

    l.daemon().kill9();
    // Its listeners died with it.
    assert!(l.refused(API), "port {API} still open after kill -9");
    // The record outlives the daemon.
    assert_eq!(l.lab.records().len(), 1);

    let t = Instant::now();
    l.start_daemon();
    let s = l.wait_serving();
    eprintln!(
        "serving again {:.0} ms after the restart",
        t.elapsed().as_secs_f64() * 1e3
    );
    assert_eq!(listeners(&s), before);
    l.echo_once(b"after the restart\n");
    let mut d = l.connect(DRAIN).unwrap();
    d.write_all(b"12345").unwrap();
    d.shutdown(std::net::Shutdown::Write).unwrap();
    let mut a = String::new();
    d.read_to_string(&mut a).unwrap();
    assert_eq!(a, "5\n");
    let errors = udp_clients(&l, 3, 3);
    assert!(errors.is_empty(), "{errors:?}");
    // The same reservation and record, nothing reclaimed.
    assert_eq!(l.lab.reserved(NET), vec![l.net1_ip()]);
    assert_eq!(l.status()["reclaimedTotal"], 0);
}

#[test]
fn del_closes_the_listeners_without_waiting_for_a_pass() {
    let l = DLab::new();
    l.echo_once(b"before DEL\n");
    let mut open = l.connect(API).unwrap();
    assert_eq!(echo(&mut open, b"open across DEL\n"), b"open across DEL\n");
    l.call("DEL").ok_empty();
    let t = Instant::now();
    // The periodic pass is 30 s away (the lab's default interval): only
    // DEL's own nudge can close them within the deadline.
    let closed = wait_until(Duration::from_secs(10), || {
        [API, DRAIN, SPEAK, SINK, CLOSED, DOWN]
            .iter()
            .all(|p| l.refused(*p))
    });
    assert!(closed, "listeners still open 10 s after DEL");
    eprintln!(
        "listeners closed {:.0} ms after DEL",
        t.elapsed().as_secs_f64() * 1e3
    );
    let s = l.wait_status(Duration::from_secs(5), "attachment gone", |s| {
        s["attachments"].as_array().is_some_and(|a| a.is_empty())
    });
    assert_eq!(s["reclaimedTotal"], 0, "DEL is not a reclaim");
    // UDP: the port is closed too (ICMP port unreachable, or silence).
    let got = l.cl.run(async {
        let s = tokio::net::UdpSocket::bind("0.0.0.0:0").await.unwrap();
        s.connect(pod_addr(UDP)).await.unwrap();
        s.send(b"anyone?").await.unwrap();
        let mut b = [0u8; 64];
        tokio::time::timeout(Duration::from_millis(300), s.recv(&mut b)).await
    });
    assert!(!matches!(got, Ok(Ok(_))), "a UDP reply after DEL: {got:?}");
    assert!(l.released());
    // A connection open at DEL ended with the attachment.
    open.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let end = read_end(&mut open);
    assert!(matches!(end, Ended::Eof | Ended::Reset), "{end:?}");
}

#[test]
fn a_pod_netns_deleted_without_del_is_reclaimed_and_its_address_released() {
    // About the periodic pass: a deleted netns changes no record.
    let mut l = DLab::with(Opts {
        fast_reconcile: true,
        ..Opts::default()
    });
    assert_eq!(l.lab.reserved(NET), vec![l.net1_ip()]);
    assert_eq!(l.lab.host_veths().len(), 1);
    // Traffic first: a finished TCP connection and a live UDP session.
    l.echo_once(b"hello\n");
    assert!(udp_clients(&l, 1, 1).is_empty());

    sh(&["ip", "netns", "del", &l.pod.name]);
    let t = Instant::now();
    // The daemon runs with --reconcile-interval 1.
    assert!(
        wait_until(Duration::from_secs(4), || l.released()),
        "not reclaimed within 4 s: records {:?}, reserved {:?}",
        l.lab.records(),
        l.lab.reserved(NET)
    );
    eprintln!(
        "reclaimed {:.0} ms after the netns was deleted",
        t.elapsed().as_secs_f64() * 1e3
    );
    let s = l.wait_status(Duration::from_secs(5), "attachment gone", |s| {
        s["attachments"].as_array().is_some_and(|a| a.is_empty())
    });
    assert_eq!(s["reclaimedTotal"], 1);
    // The daemon lets go of the namespace: it is destroyed, and with it the
    // pod's veth and its node-side peer.
    assert!(
        wait_until(Duration::from_secs(5), || l.lab.host_veths().is_empty()),
        "the node-side veth is still there: the deleted netns is kept alive ({:?})",
        l.lab.host_veths()
    );
    assert!(l.daemon().running());
    let (code, _) = l.get("/healthz");
    assert_eq!(code, 200);
}

#[test]
fn a_pod_netns_deleted_with_connections_open_is_let_go() {
    // About the periodic pass: a deleted netns changes no record.
    let l = DLab::with(Opts {
        fast_reconcile: true,
        ..Opts::default()
    });
    // An idle connection that nobody closes, and a UDP session.
    let mut open = l.connect(API).unwrap();
    assert_eq!(
        echo(&mut open, b"idle from now on\n"),
        b"idle from now on\n"
    );
    assert!(udp_clients(&l, 1, 1).is_empty());
    sh(&["ip", "netns", "del", &l.pod.name]);
    assert!(
        wait_until(Duration::from_secs(15), || l.released()),
        "not reclaimed"
    );
    // Reclaimed means nothing of the pod is held: the namespace goes away
    // (its veths with it) even though the client never closed.
    assert!(
        wait_until(Duration::from_secs(5), || l.lab.host_veths().is_empty()),
        "the deleted pod netns is kept alive by its relayed connections ({:?})",
        l.lab.host_veths()
    );
    // The client saw its connection end.
    open.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let end = read_end(&mut open);
    assert!(matches!(end, Ended::Eof | Ended::Reset), "{end:?}");
}

#[test]
fn sigterm_keeps_open_connections_for_the_grace_period_refuses_new_ones_and_exits_0() {
    let mut l = DLab::with(Opts {
        // Long enough that "exited early" can only mean "the last
        // connection closed", however slow the machine.
        flags: &["--grace-period", "60"],
        ..Default::default()
    });
    let mut open = l.connect(API).unwrap();
    assert_eq!(echo(&mut open, b"before\n"), b"before\n");
    l.daemon().signal(nix::sys::signal::Signal::SIGTERM);
    let t = Instant::now();
    assert!(
        wait_until(Duration::from_secs(15), || l.refused(API)),
        "new connections still accepted 15 s after SIGTERM"
    );
    // Draining: not ready, still live, still reporting.
    assert_eq!(l.status()["draining"], true);
    assert_eq!(l.get("/healthz").0, 503);
    assert_eq!(l.get("/livez").0, 200);
    // The open connection keeps working.
    for i in 0..3 {
        let msg = format!("during the grace period {i}\n");
        assert_eq!(echo(&mut open, msg.as_bytes()), msg.as_bytes());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(l.daemon().running(), "exited while a connection was open");
    drop(open);
    let st = l
        .daemon()
        .wait_exit(Duration::from_secs(30))
        .expect("no exit after the last connection closed");
    assert!(st.success(), "{st}");
    assert!(
        t.elapsed() < Duration::from_secs(60),
        "waited the whole grace period"
    );
    assert!(!l.lab.state.path().join("edgelinkd.sock").exists());

    // A connection that never ends is cut when the grace period is over.
    l.flags = vec!["--grace-period".into(), "1".into()];
    l.start_daemon();
    l.wait_serving();
    let mut open = l.connect(API).unwrap();
    assert_eq!(echo(&mut open, b"x\n"), b"x\n");
    let t = Instant::now();
    l.daemon().signal(nix::sys::signal::Signal::SIGTERM);
    let st = l
        .daemon()
        .wait_exit(Duration::from_secs(30))
        .expect("no exit after the grace period");
    assert!(st.success(), "{st}");
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "exited after {took:?}, before the grace period"
    );
}

#[test]
fn check_needs_the_daemon_when_the_attachment_has_forwards() {
    // About the periodic pass: it retries the failed listener.
    let mut l = DLab::with(Opts {
        fast_reconcile: true,
        ..Opts::default()
    });
    l.call("CHECK").ok_empty();

    l.daemon().kill9();
    let (code, msg) = l.call("CHECK").err();
    assert_eq!(code, 104, "{msg}");
    assert!(msg.contains("edgelinkd"), "{msg}");

    // A forward whose port is taken in the pod is not served: CHECK names it.
    let squat = in_netns(&l.pod, || {
        std::net::TcpListener::bind(("0.0.0.0", API)).expect("bind in the pod")
    });
    l.start_daemon();
    l.wait_status(Duration::from_secs(5), "api failed", |s| {
        forward_of(s, "api")["listener"] == "failed"
    });
    let (code, msg) = l.call("CHECK").err();
    assert_eq!(code, 104, "{msg}");
    assert!(msg.contains("api"), "{msg}");
    drop(squat);

    // The failed listener is retried on the next pass: no restart needed.
    l.wait_serving();
    l.call("CHECK").ok_empty();
}

/// With the daemon running, DEL strips the pod's interface of its
/// addresses, marks it retired and hands it to the daemon, which deletes it
/// (and the veth's node end with it) in the background; an ADD of the same
/// name right after waits for it.
#[test]
fn del_hands_the_pod_interface_to_the_daemon_which_deletes_it() {
    let mut l = DLab::new();
    let node_ends = |l: &DLab| -> Vec<String> {
        l.lab
            .node
            .links()
            .into_iter()
            .filter(|n| n.starts_with("elk"))
            .collect()
    };
    assert_eq!(node_ends(&l).len(), 1, "{:?}", l.lab.node.links());
    l.call("DEL").ok_empty();
    // No address answers any more, at once: IPAM may hand it out again.
    if l.pod.has_link("net1") {
        assert_eq!(l.pod.addrs("net1"), Vec::<String>::new());
    }
    let gone = wait_until(Duration::from_secs(5), || {
        l.pod.links_sorted() == vec!["eth0", "lo"] && node_ends(&l).is_empty()
    });
    assert!(
        gone,
        "pod {:?}, node {:?} 5 s after DEL",
        l.pod.links(),
        l.lab.node.links()
    );
    // The count follows the kernel's answer by a moment.
    l.wait_status(Duration::from_secs(5), "the deletion counted", |s| {
        s["retiredLinksDeletedTotal"] == 1
    });
    assert_eq!(l.metric_plain("edgelink_retired_links_deleted_total"), 1.0);
    assert!(l.released());
    // DEL again: nothing left to do, nothing handed over.
    l.call("DEL").ok_empty();
    assert_eq!(l.status()["retiredLinksDeletedTotal"], 1);

    // DEL then ADD of the same name at once: ADD waits for the retired
    // interface instead of failing with 101.
    l.add();
    l.wait_serving();
    l.call("DEL").ok_empty();
    l.add();
    l.wait_serving();
    assert!(l.pod.has_link("net1"));
    l.echo_once(b"after DEL and ADD\n");
}

/// The daemon deletes retired links only: `reap` of anything else is
/// refused and the link stays.
#[test]
fn reap_refuses_links_that_are_not_retired() {
    let l = DLab::new();
    let sock = l.lab.state.path().join("edgelinkd.sock");
    let index: String = l
        .pod
        .ip(&["-o", "link", "show", "dev", "net1"])
        .split(':')
        .next()
        .unwrap()
        .trim()
        .to_string();
    for (line, why) in [
        (
            format!("reap {index} net1 {}", l.pod.path()),
            "is not a retired link",
        ),
        (
            format!("reap {index} eth0 {}", l.pod.path()),
            "is not a retired link",
        ),
        (format!("reap 999999 net1 {}", l.pod.path()), "no link"),
        (
            format!("reap x net1 {}", l.pod.path()),
            "not an interface index",
        ),
        (
            format!("reap {index} net1 relative/path"),
            "not an absolute path",
        ),
        ("reap".to_string(), "expected"),
    ] {
        let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        s.write_all(format!("{line}\n").as_bytes()).unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        assert!(
            reply.starts_with("error") && reply.contains(why),
            "{line}: {reply}"
        );
    }
    assert!(l.pod.has_link("net1"));
    l.echo_once(b"still served\n");
}

/// A record whose netns is a `/proc/<pid>/ns/net` path (cri-dockerd gives
/// those) written in another PID namespace than the daemon's: an unopenable
/// path there says nothing about the pod, so it is not reclaimed. The same
/// record from the daemon's own PID namespace is.
#[test]
fn a_proc_netns_path_of_another_pid_namespace_is_not_reclaimed() {
    // About the periodic pass: it must keep the record pass after pass.
    let mut l = DLab::with(Opts {
        fast_reconcile: true,
        ..Opts::default()
    });
    let path = l.record_path();
    let mut rec: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert!(rec["pidNamespace"].as_u64().is_some(), "{rec:#}");
    // A PID that does not exist (above pid_max), as a daemon without
    // hostPID would see a pod's.
    rec["netns"] = Value::String("/proc/99999999/ns/net".into());
    rec["pidNamespace"] = Value::from(1u64);
    let tmp = path.with_file_name(".edit.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&rec).unwrap()).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    l.wait_status(Duration::from_secs(5), "the rewritten record taken", |s| {
        s["attachments"].as_array().is_some_and(|a| a.is_empty())
    });
    // Several passes (--reconcile-interval 1): kept, address kept.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(path.exists(), "the record was reclaimed");
    assert_eq!(l.lab.reserved(NET), vec![l.net1_ip()]);
    assert_eq!(l.status()["reclaimedTotal"], 0);

    // Written in the daemon's own PID namespace: the pod is gone.
    rec.as_object_mut().unwrap().remove("pidNamespace");
    rec["pidNamespace"] = Value::from(own_pid_namespace());
    std::fs::write(&tmp, serde_json::to_vec_pretty(&rec).unwrap()).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    assert!(
        wait_until(Duration::from_secs(4), || l.released()),
        "not reclaimed: records {:?}",
        l.lab.records()
    );
    // Counted once the reclaim is done, which may be a moment after the
    // files are gone.
    l.wait_status(Duration::from_secs(5), "the reclaim counted", |s| {
        s["reclaimedTotal"] == 1
    });
    assert!(l.daemon().running());
}

fn own_pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").unwrap().ino()
}

/// A daemon killed with -9 leaves its socket file behind: DEL finds nobody
/// to hand the interface to and deletes it itself, at once.
#[test]
fn del_with_the_daemon_killed_deletes_the_interface_itself() {
    let mut l = DLab::new();
    l.daemon().kill9();
    assert!(l.lab.state.path().join("edgelinkd.sock").exists());
    l.call("DEL").ok_empty();
    assert_eq!(l.pod.links_sorted(), vec!["eth0", "lo"]);
    assert!(l.lab.host_veths().is_empty(), "{:?}", l.lab.host_veths());
    assert!(l.released());
}
