//! GC, STATUS, CHECK options and delegated IPAM (host-local, static)
//! through the plugin.

use edgelink_tests::*;
use serde_json::{json, Value};
use std::path::PathBuf;

const NET: &str = "plant-floor";

struct Att {
    cid: String,
    pod: Netns,
    result: Value,
}

fn add(lab: &Lab, conf: &Value, cid: &str) -> Att {
    let pod = lab.pod();
    let result = Call::new("ADD", cid, Some(&pod.path()), "net1")
        .run(&lab.node, conf)
        .ok();
    Att {
        cid: cid.to_string(),
        pod,
        result,
    }
}

impl Att {
    fn ip(&self) -> String {
        let a = self.result["ips"][0]["address"].as_str().unwrap();
        a.split('/').next().unwrap().to_string()
    }
    fn host(&self) -> String {
        self.result["interfaces"][1]["name"]
            .as_str()
            .unwrap()
            .to_string()
    }
    fn record(&self) -> String {
        format!("{}_net1.json", self.cid)
    }
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// Everything of `atts` is in place: address in the pod, reservation,
/// record, node-side veth; and nothing else is.
fn assert_exactly(lab: &Lab, atts: &[&Att]) {
    assert_eq!(
        lab.reserved(NET),
        sorted(atts.iter().map(|a| a.ip()).collect())
    );
    assert_eq!(
        sorted(lab.records()),
        sorted(atts.iter().map(|a| a.record()).collect())
    );
    assert_eq!(
        lab.host_veths(),
        sorted(atts.iter().map(|a| a.host()).collect())
    );
    for a in atts {
        assert_eq!(a.pod.addrs("net1"), vec![format!("{}/24", a.ip())]);
    }
}

fn gc(lab: &Lab, conf: &Value) -> CniOutput {
    // The attachments are past GC's grace for an ADD in flight.
    lab.age_state();
    Call::new("GC", "", None, "").run(&lab.node, conf)
}

#[test]
fn gc_releases_what_is_not_listed_and_keeps_what_is() {
    let lab = Lab::new();
    let _d = lab.daemon();
    let conf = lab.bridge_conf("1.1.0");
    let a = add(&lab, &conf, "gc-a");
    let b = add(&lab, &conf, "gc-b");
    let c = add(&lab, &conf, "gc-c");
    assert_exactly(&lab, &[&a, &b, &c]);

    // GC on a 1.0.0 config: incompatible version, nothing touched.
    let mut old = Lab::gc_conf(&conf, &[]);
    old["cniVersion"] = json!("1.0.0");
    let (code, msg) = gc(&lab, &old).err();
    assert_eq!(code, 1, "{msg}");
    assert_exactly(&lab, &[&a, &b, &c]);

    // disableGC: nothing happens even with an empty list.
    let mut off = Lab::gc_conf(&conf, &[]);
    off["disableGC"] = json!(true);
    gc(&lab, &off).ok_empty();
    assert_exactly(&lab, &[&a, &b, &c]);

    // GC for another network leaves this one alone.
    let mut other = Lab::gc_conf(&conf, &[]);
    other["name"] = json!("other-net");
    gc(&lab, &other).ok_empty();
    assert_exactly(&lab, &[&a, &b, &c]);

    // Keep a and c: b's reservation, record and veth go.
    gc(
        &lab,
        &Lab::gc_conf(&conf, &[("gc-a", "net1"), ("gc-c", "net1")]),
    )
    .ok_empty();
    assert_exactly(&lab, &[&a, &c]);
    assert!(!b.pod.has_link("net1"), "b's veth pair survived GC");
    assert!(tcp_reachable(&a.pod, DEVICE_V4, 9));
    // An interface name that does not match is not the same attachment.
    gc(
        &lab,
        &Lab::gc_conf(&conf, &[("gc-a", "net1"), ("gc-c", "net2")]),
    )
    .ok_empty();
    assert_exactly(&lab, &[&a]);

    // The legacy key cni.dev/attachments.
    let d = add(&lab, &conf, "gc-d");
    let mut legacy = conf.clone();
    legacy["cni.dev/attachments"] = json!([
        {"containerID": "gc-a", "ifname": "net1"},
        {"containerID": "gc-d", "ifname": "net1"}
    ]);
    gc(&lab, &legacy).ok_empty();
    assert_exactly(&lab, &[&a, &d]);
    legacy["cni.dev/attachments"] = json!([{"containerID": "gc-d", "ifname": "net1"}]);
    gc(&lab, &legacy).ok_empty();
    assert_exactly(&lab, &[&d]);

    // The kept attachment is still whole: CHECK passes, DEL works.
    Call::new("CHECK", "gc-d", Some(&d.pod.path()), "net1")
        .run(&lab.node, &with_prev(&conf, &d.result))
        .ok_empty();
    Call::new("DEL", "gc-d", Some(&d.pod.path()), "net1")
        .run(&lab.node, &conf)
        .ok_empty();
    assert_exactly(&lab, &[]);

    // A malformed list is a config error.
    let mut bad = conf.clone();
    bad["cni.dev/valid-attachments"] = json!([{"containerID": "x"}]);
    let (code, msg) = gc(&lab, &bad).err();
    assert_eq!(code, 7, "{msg}");
}

#[test]
fn status_reports_readiness() {
    let lab = Lab::new();
    let conf = lab.bridge_conf("1.1.0");
    Call::new("STATUS", "", None, "")
        .run(&lab.node, &conf)
        .ok_empty();
    // Only from 1.1.0 on.
    let (code, msg) = Call::new("STATUS", "", None, "")
        .run(&lab.node, &lab.bridge_conf("1.0.0"))
        .err();
    assert_eq!(code, 1, "{msg}");
    // The uplink is missing: not available (50).
    let mut gone = conf.clone();
    gone["uplink"] = json!("nosuch0");
    let (code, msg) = Call::new("STATUS", "", None, "")
        .run(&lab.node, &gone)
        .err();
    assert_eq!(code, 50, "{msg}");
    assert!(msg.contains("nosuch0"), "{msg}");
    // STATUS changes nothing on the node.
    assert!(lab.node_extra_links(&[]).is_empty());
}

#[test]
fn check_options_and_versions() {
    let lab = Lab::new();
    let conf = lab.bridge_conf("1.0.0");
    let a = add(&lab, &conf, "chk");
    let prev = with_prev(&conf, &a.result);

    // CHECK needs 0.4.0 or later.
    let mut old = prev.clone();
    old["cniVersion"] = json!("0.3.1");
    let (code, msg) = Call::new("CHECK", "chk", Some(&a.pod.path()), "net1")
        .run(&lab.node, &old)
        .err();
    assert_eq!(code, 1, "{msg}");

    // The interface disappears behind the plugin's back.
    a.pod.ip(&["link", "del", "net1"]);
    let (code, msg) = Call::new("CHECK", "chk", Some(&a.pod.path()), "net1")
        .run(&lab.node, &prev)
        .err();
    assert_eq!(code, 104, "{msg}");
    assert!(msg.contains("net1"), "{msg}");
    // disableCheck: CHECK succeeds all the same.
    let mut off = prev.clone();
    off["disableCheck"] = json!(true);
    Call::new("CHECK", "chk", Some(&a.pod.path()), "net1")
        .run(&lab.node, &off)
        .ok_empty();

    Call::new("DEL", "chk", Some(&a.pod.path()), "net1")
        .run(&lab.node, &conf)
        .ok_empty();
    assert_exactly(&lab, &[]);
}

fn host_local_dir(lab: &Lab) -> PathBuf {
    lab.state.path().join("host-local")
}

/// Addresses host-local holds for network `NET`.
fn host_local_ips(lab: &Lab) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(host_local_dir(lab).join(NET)) else {
        return Vec::new();
    };
    sorted(
        rd.filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
            .collect(),
    )
}

fn host_local_conf(lab: &Lab) -> Value {
    let mut c = lab.bridge_conf("1.0.0");
    c["ipam"] = json!({
        "type": "host-local",
        "ranges": [[{"subnet": "172.31.250.0/24", "rangeStart": "172.31.250.160",
                     "rangeEnd": "172.31.250.162", "gateway": "172.31.250.1"}]],
        "routes": [{"dst": "172.30.0.0/16"}],
        "dataDir": host_local_dir(lab).display().to_string()
    });
    c
}

#[test]
fn delegated_host_local_add_check_del() {
    let lab = Lab::new();
    let _d = lab.daemon();
    let conf = host_local_conf(&lab);
    let a = add(&lab, &conf, "hl-a");
    assert_eq!(a.result["ips"][0]["address"], "172.31.250.160/24");
    assert_eq!(a.result["ips"][0]["gateway"], "172.31.250.1");
    assert_eq!(a.result["ips"][0]["interface"], 2);
    assert_eq!(a.pod.addrs("net1"), vec!["172.31.250.160/24"]);
    // host-local's route has no gw: like the reference plugins, the
    // gateway of the address of its family is used.
    let routes = a.pod.ip(&["route"]);
    assert!(
        routes.contains("172.30.0.0/16 via 172.31.250.1 dev net1"),
        "{routes}\nResult: {}",
        a.result
    );
    assert_eq!(
        a.result["routes"][0],
        json!({"dst": "172.30.0.0/16", "gw": "172.31.250.1"})
    );
    assert!(tcp_reachable(&a.pod, DEVICE_V4, 9));
    assert_eq!(host_local_ips(&lab), vec!["172.31.250.160"]);
    let owner =
        std::fs::read_to_string(host_local_dir(&lab).join(NET).join("172.31.250.160")).unwrap();
    assert!(owner.starts_with("hl-a"), "{owner:?}");
    // The built-in store is not used.
    assert!(lab.reserved(NET).is_empty());
    // Forwards are checked against the delegated addresses: recorded.
    let rec: Value = serde_json::from_slice(
        &std::fs::read(lab.state.path().join("attachments/hl-a_net1.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(rec["allowedTargets"], json!(["172.31.250.0/24"]));

    let prev = with_prev(&conf, &a.result);
    Call::new("CHECK", "hl-a", Some(&a.pod.path()), "net1")
        .run(&lab.node, &prev)
        .ok_empty();
    // CHECK is forwarded to host-local: without its reservation it fails.
    std::fs::rename(
        host_local_dir(&lab).join(NET).join("172.31.250.160"),
        lab.state.path().join("hidden"),
    )
    .unwrap();
    let (code, msg) = Call::new("CHECK", "hl-a", Some(&a.pod.path()), "net1")
        .run(&lab.node, &prev)
        .err();
    assert_eq!(code, 105, "{msg}");
    std::fs::rename(
        lab.state.path().join("hidden"),
        host_local_dir(&lab).join(NET).join("172.31.250.160"),
    )
    .unwrap();

    Call::new("DEL", "hl-a", Some(&a.pod.path()), "net1")
        .run(&lab.node, &prev)
        .ok_empty();
    assert!(host_local_ips(&lab).is_empty());
    assert!(lab.records().is_empty());
    assert!(lab.host_veths().is_empty());
    assert!(!a.pod.has_link("net1"));
    // DEL again is fine (host-local's DEL is idempotent too).
    Call::new("DEL", "hl-a", None, "net1")
        .run(&lab.node, &conf)
        .ok_empty();
}

#[test]
fn delegated_failure_after_ipam_add_releases_the_delegated_address() {
    let lab = Lab::new();
    let mut conf = host_local_conf(&lab);
    // The delegate hands out 172.31.250.x: a target elsewhere is refused
    // only after its ADD, which must then be undone with its DEL.
    conf["forwards"][0]["target"] = json!("10.99.0.5:8080");
    let pod = lab.pod();
    let (code, msg) = Call::new("ADD", "hl-bad", Some(&pod.path()), "net1")
        .run(&lab.node, &conf)
        .err();
    assert_eq!(code, 7, "{msg}");
    assert!(
        msg.contains("forwards[0].target") && msg.contains("10.99.0.5:8080"),
        "{msg}"
    );
    assert!(
        host_local_ips(&lab).is_empty(),
        "{:?}",
        host_local_ips(&lab)
    );
    assert!(lab.records().is_empty());
    assert!(lab.host_veths().is_empty());
    assert!(!pod.has_link("net1"));

    // The delegate itself failing (pool exhausted): 105 with its message,
    // and the attempt leaves nothing behind.
    let conf = host_local_conf(&lab);
    let held: Vec<Att> = (0..3)
        .map(|i| add(&lab, &conf, &format!("hl-{i}")))
        .collect();
    assert_eq!(host_local_ips(&lab).len(), 3);
    let (code, msg) = Call::new("ADD", "hl-full", Some(&pod.path()), "net1")
        .run(&lab.node, &conf)
        .err();
    assert_eq!(code, 105, "{msg}");
    assert!(msg.contains("host-local"), "{msg}");
    assert!(!pod.has_link("net1"));
    assert_eq!(lab.host_veths().len(), 3);
    assert_eq!(lab.records().len(), 3);
    for a in &held {
        Call::new("DEL", &a.cid, Some(&a.pod.path()), "net1")
            .run(&lab.node, &conf)
            .ok_empty();
    }
    assert!(host_local_ips(&lab).is_empty());

    // A delegate that is not in CNI_PATH: 7 naming it.
    let mut missing = conf.clone();
    missing["ipam"]["type"] = json!("no-such-ipam");
    let (code, msg) = Call::new("ADD", "hl-none", Some(&pod.path()), "net1")
        .run(&lab.node, &missing)
        .err();
    assert_eq!(code, 7, "{msg}");
    assert!(msg.contains("no-such-ipam"), "{msg}");
    assert!(!pod.has_link("net1"));
    assert!(lab.host_veths().is_empty());
}

#[test]
fn del_with_a_stripped_config_releases_the_delegated_address() {
    let lab = Lab::new();
    let conf = host_local_conf(&lab);
    let a = add(&lab, &conf, "hl-strip");
    assert_eq!(host_local_ips(&lab), vec!["172.31.250.160"]);
    // What a runtime that lost the config (multus#755) sends: no ipam.
    let stripped = json!({
        "cniVersion": "1.0.0",
        "name": NET,
        "type": "edgelink",
        "stateDir": lab.state_dir()
    });
    Call::new("DEL", "hl-strip", Some(&a.pod.path()), "net1")
        .run(&lab.node, &stripped)
        .ok_empty();
    assert!(
        host_local_ips(&lab).is_empty(),
        "{:?}",
        host_local_ips(&lab)
    );
    assert!(lab.records().is_empty());
    assert!(lab.host_veths().is_empty());
    assert!(!a.pod.has_link("net1"));
}

#[test]
fn delegated_static_add_check_del() {
    let lab = Lab::new();
    let _d = lab.daemon();
    let mut conf = lab.bridge_conf("1.0.0");
    conf["ipam"] = json!({
        "type": "static",
        "addresses": [{"address": "172.31.250.180/24", "gateway": "172.31.250.1"}],
        "routes": [{"dst": "172.30.0.0/16", "gw": "172.31.250.1"}]
    });
    let a = add(&lab, &conf, "st-a");
    assert_eq!(a.result["ips"][0]["address"], "172.31.250.180/24");
    assert_eq!(a.result["ips"][0]["interface"], 2);
    assert_eq!(a.pod.addrs("net1"), vec!["172.31.250.180/24"]);
    assert!(a
        .pod
        .ip(&["route"])
        .contains("172.30.0.0/16 via 172.31.250.1 dev net1"));
    assert!(tcp_reachable(&a.pod, DEVICE_V4, 9));
    assert!(lab.reserved(NET).is_empty());
    let prev = with_prev(&conf, &a.result);
    Call::new("CHECK", "st-a", Some(&a.pod.path()), "net1")
        .run(&lab.node, &prev)
        .ok_empty();
    Call::new("DEL", "st-a", Some(&a.pod.path()), "net1")
        .run(&lab.node, &prev)
        .ok_empty();
    assert!(!a.pod.has_link("net1"));
    assert!(lab.records().is_empty());
    assert!(lab.host_veths().is_empty());
}
