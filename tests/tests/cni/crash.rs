//! The plugin killed with SIGKILL in the middle of ADD (the
//! `EDGELINK_DEBUG_STALL` hook holds it at "link" or "ipam"): DEL and GC,
//! as a runtime runs them afterwards, leave nothing behind, a live
//! attachment survives GC, and a retried ADD succeeds.

use edgelink_tests::*;
use serde_json::Value;
use std::time::Duration;

const NET: &str = "plant-floor";
const STALL_WAIT: Duration = Duration::from_secs(20);

/// Start ADD for `cid` in `pod`, stalled at `point`; wait until it says so,
/// check the half-made state, then SIGKILL it.
fn crash_add(lab: &Lab, conf: &Value, cid: &str, pod: &Netns, point: &str) {
    let path = pod.path();
    let mut call = Call::new("ADD", cid, Some(&path), "net1");
    call.extra_env.push(("EDGELINK_DEBUG_STALL", point));
    let reserved_before = lab.reserved(NET).len();
    let running = Running::start(&call, &lab.node, conf);
    assert!(
        running.wait_stderr(&format!("stalled at {point}"), STALL_WAIT),
        "ADD never stalled at {point}; stderr: {}",
        running.stderr()
    );
    // `ip netns exec` execs: the pid we hold is the plugin itself (comm is
    // the binary's name, cut to 15 bytes).
    let bin = plugin_bin();
    let name = bin.file_name().unwrap().to_string_lossy();
    assert_eq!(running.comm(), name.chars().take(15).collect::<String>());
    // Half-made: the pod interface exists; at "ipam" an address is reserved.
    assert!(pod.has_link("net1"), "no net1 while stalled at {point}");
    let want = reserved_before + usize::from(point == "ipam");
    assert_eq!(lab.reserved(NET).len(), want, "stalled at {point}");
    let sig = running.kill9();
    assert_eq!(sig, Some(libc::SIGKILL));
    // Killed before the record was written.
    assert!(!lab.records().iter().any(|r| r.starts_with(cid)));
}

/// A live attachment whose state GC must keep.
struct Live {
    pod: Netns,
    result: Value,
    host: String,
}

fn live(lab: &Lab, conf: &Value) -> Live {
    let pod = lab.pod();
    let result = Call::new("ADD", "live", Some(&pod.path()), "net1")
        .run(&lab.node, conf)
        .ok();
    let host = result["interfaces"][1]["name"]
        .as_str()
        .unwrap()
        .to_string();
    Live { pod, result, host }
}

fn assert_live_intact(lab: &Lab, conf: &Value, l: &Live) {
    let addr = l.result["ips"][0]["address"].as_str().unwrap();
    assert_eq!(l.pod.addrs("net1"), vec![addr.to_string()]);
    assert_eq!(
        lab.reserved(NET),
        vec![addr.split('/').next().unwrap().to_string()]
    );
    assert_eq!(lab.records(), vec!["live_net1.json".to_string()]);
    assert_eq!(lab.host_veths(), vec![l.host.clone()]);
    assert!(tcp_reachable(&l.pod, DEVICE_V4, 9));
    Call::new("CHECK", "live", Some(&l.pod.path()), "net1")
        .run(&lab.node, &with_prev(conf, &l.result))
        .ok_empty();
}

/// The node daemon, but one whose own IPAM GC never takes the leaked
/// reservation: `gc` backdates the store by an hour, past the daemon's
/// `--ipam-gc-grace` (120 s), and a daemon pass woken by that (inotify)
/// could release the reservation before the plugin's GC runs; the plugin's
/// GC would then not know the node-side veth that reservation names (a CI
/// run failed that way). These tests are about the plugin's GC.
fn daemon(lab: &Lab) -> Edgelinkd {
    Edgelinkd::start(
        &lab.node,
        lab.state.path(),
        lab.state.path().join("edgelinkd.log"),
        &["--probe-interval", "0", "--ipam-gc-grace", "86400"],
    )
}

fn gc(lab: &Lab, conf: &Value) {
    // The killed ADD is long past GC's grace for an ADD in flight.
    lab.age_state();
    Call::new("GC", "", None, "")
        .run(&lab.node, &Lab::gc_conf(conf, &[("live", "net1")]))
        .ok_empty();
}

fn del(lab: &Lab, conf: &Value, cid: &str, pod: &Netns) {
    Call::new("DEL", cid, Some(&pod.path()), "net1")
        .run(&lab.node, conf)
        .ok_empty();
}

#[test]
fn killed_add_then_del_then_gc_leaves_nothing() {
    for point in ["link", "ipam"] {
        let lab = Lab::new();
        let _d = daemon(&lab);
        let conf = lab.bridge_conf("1.1.0");
        let l = live(&lab, &conf);
        let pod = lab.pod();
        crash_add(&lab, &conf, "crashed", &pod, point);
        // What the crash left: a second node-side veth; at "ipam" also a
        // second reservation.
        assert_eq!(lab.host_veths().len(), 2, "{point}");
        assert_eq!(
            lab.reserved(NET).len(),
            if point == "ipam" { 2 } else { 1 },
            "{point}"
        );

        del(&lab, &conf, "crashed", &pod);
        gc(&lab, &conf);
        assert!(!pod.has_link("net1"), "{point}");
        assert_live_intact(&lab, &conf, &l);
        // The node has the bridge, the live veth, nothing else.
        let mut extra = lab.node_extra_links(&["edge0"]);
        extra.sort();
        assert_eq!(extra, vec![l.host.clone()], "{point}");
    }
}

#[test]
fn killed_add_then_gc_then_del_leaves_nothing() {
    for point in ["link", "ipam"] {
        let lab = Lab::new();
        let _d = daemon(&lab);
        let conf = lab.bridge_conf("1.1.0");
        let l = live(&lab, &conf);
        let pod = lab.pod();
        crash_add(&lab, &conf, "crashed", &pod, point);

        // GC alone already frees the leaked address (Multus never forwards
        // GC, but a runtime for the default network does).
        gc(&lab, &conf);
        let addr = l.result["ips"][0]["address"].as_str().unwrap();
        assert_eq!(
            lab.reserved(NET),
            vec![addr.split('/').next().unwrap().to_string()],
            "{point}"
        );
        assert_eq!(lab.records(), vec!["live_net1.json".to_string()]);
        if point == "ipam" {
            // GC found the leaked reservation, and with it the node-side
            // veth named after (container ID, ifname).
            assert_eq!(lab.host_veths(), vec![l.host.clone()], "{point}");
            assert!(!pod.has_link("net1"), "{point}");
        }

        del(&lab, &conf, "crashed", &pod);
        assert!(!pod.has_link("net1"), "{point}");
        assert_live_intact(&lab, &conf, &l);
        assert_eq!(lab.node_extra_links(&["edge0"]), vec![l.host.clone()]);
        // Another DEL and GC change nothing.
        del(&lab, &conf, "crashed", &pod);
        gc(&lab, &conf);
        assert_live_intact(&lab, &conf, &l);
    }
}

#[test]
fn killed_add_then_del_without_netns_releases_the_address() {
    // The pod's netns is gone by the time DEL comes (its interfaces went
    // with it); the address and the node-side veth must still go.
    let lab = Lab::new();
    let conf = lab.bridge_conf("1.0.0");
    let pod = lab.pod();
    crash_add(&lab, &conf, "gone", &pod, "ipam");
    assert_eq!(lab.reserved(NET).len(), 1);
    drop(pod);
    assert!(
        wait_until(Duration::from_secs(5), || lab.host_veths().is_empty()),
        "node-side veth outlived the pod netns: {:?}",
        lab.host_veths()
    );
    Call::new("DEL", "gone", None, "net1")
        .run(&lab.node, &conf)
        .ok_empty();
    assert!(lab.reserved(NET).is_empty());
    assert!(lab.records().is_empty());
    assert!(lab.node_extra_links(&["edge0"]).is_empty());
}

#[test]
fn retried_add_after_a_killed_add_succeeds() {
    for point in ["link", "ipam"] {
        let lab = Lab::new();
        let _d = daemon(&lab);
        let conf = lab.bridge_conf("1.0.0");
        let pod = lab.pod();
        crash_add(&lab, &conf, "retry", &pod, point);
        let leaked = lab.reserved(NET);

        // The runtime retries ADD for the same container and ifname.
        let out = Call::new("ADD", "retry", Some(&pod.path()), "net1").run(&lab.node, &conf);
        let r = out.ok();
        let addr = r["ips"][0]["address"].as_str().unwrap().to_string();
        let ip = addr.split('/').next().unwrap().to_string();
        if point == "ipam" {
            // The reservation made before the crash is reused, not doubled.
            assert_eq!(leaked, vec![ip.clone()]);
        }
        assert_eq!(lab.reserved(NET), vec![ip], "{point}");
        assert_eq!(pod.addrs("net1"), vec![addr], "{point}");
        assert_eq!(lab.host_veths().len(), 1, "{point}");
        assert_eq!(lab.records(), vec!["retry_net1.json".to_string()]);
        assert!(tcp_reachable(&pod, DEVICE_V4, 9), "{point}");
        Call::new("CHECK", "retry", Some(&pod.path()), "net1")
            .run(&lab.node, &with_prev(&conf, &r))
            .ok_empty();

        del(&lab, &conf, "retry", &pod);
        assert!(lab.reserved(NET).is_empty());
        assert!(lab.records().is_empty());
        assert!(lab.host_veths().is_empty());
    }
}

#[test]
fn a_stalled_add_does_not_block_other_adds() {
    let lab = Lab::new();
    let conf = lab.bridge_conf("1.0.0");
    let stalled_pod = lab.pod();
    let path = stalled_pod.path();
    let mut call = Call::new("ADD", "stuck", Some(&path), "net1");
    call.extra_env.push(("EDGELINK_DEBUG_STALL", "ipam"));
    let running = Running::start(&call, &lab.node, &conf);
    assert!(
        running.wait_stderr("stalled at ipam", STALL_WAIT),
        "{}",
        running.stderr()
    );
    // The stalled ADD holds an address but no lock: another pod's ADD goes
    // through at once and gets a different address.
    let pod = lab.pod();
    let started = std::time::Instant::now();
    let r = Call::new("ADD", "free", Some(&pod.path()), "net1")
        .run(&lab.node, &conf)
        .ok();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(r["ips"][0]["address"], "172.31.250.101/24");
    assert_eq!(lab.reserved(NET), vec!["172.31.250.100", "172.31.250.101"]);
    assert_eq!(running.kill9(), Some(libc::SIGKILL));
    del(&lab, &conf, "stuck", &stalled_pod);
    del(&lab, &conf, "free", &pod);
    assert!(lab.reserved(NET).is_empty());
    assert!(lab.host_veths().is_empty());
}

#[test]
fn killed_macvlan_add_then_del_leaves_nothing_and_a_retry_succeeds() {
    for point in ["link", "ipam"] {
        let lab = Lab::new();
        let conf = lab.macvlan_conf("1.1.0");
        let pod = lab.pod();
        crash_add(&lab, &conf, "mv-crash", &pod, point);
        assert!(pod.link_details("net1").contains("macvlan"), "{point}");

        del(&lab, &conf, "mv-crash", &pod);
        lab.age_state();
        Call::new("GC", "", None, "")
            .run(&lab.node, &Lab::gc_conf(&conf, &[]))
            .ok_empty();
        // Only lo is left in the pod (no net1, no temporary name).
        assert_eq!(pod.links(), vec!["lo".to_string()], "{point}");
        assert!(lab.reserved(NET).is_empty(), "{point}");
        assert!(lab.records().is_empty(), "{point}");
        assert!(lab.node_extra_links(&[]).is_empty(), "{point}");

        // The runtime's retry after its DEL.
        let r = Call::new("ADD", "mv-crash", Some(&pod.path()), "net1")
            .run(&lab.node, &conf)
            .ok();
        // Round-robin moves past the address the killed ADD had reserved.
        let want = if point == "ipam" {
            "172.31.250.101/24"
        } else {
            "172.31.250.100/24"
        };
        assert_eq!(r["ips"][0]["address"], want, "{point}");
        assert_eq!(pod.addrs("net1"), vec![want.to_string()], "{point}");
        assert!(tcp_reachable(&pod, DEVICE_V4, 9), "{point}");
        del(&lab, &conf, "mv-crash", &pod);
        assert!(lab.reserved(NET).is_empty());
    }
}
