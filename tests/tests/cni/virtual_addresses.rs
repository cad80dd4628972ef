//! `virtualAddresses` through the plugin: recorded for the daemon (which
//! holds them; the plugin never adds them to the interface), and a bad one
//! refused with code 7 leaving nothing behind, whether the built-in IPAM
//! refuses it before anything is touched or a delegated IPAM's result
//! does after its ADD.

use edgelink_attachment::RecordStore;
use edgelink_tests::*;
use serde_json::{json, Value};
use std::net::IpAddr;

const NET: &str = "plant-floor";

/// The lab's bridge config, dual-stack, with one reverse forward and
/// `vips` as its virtual addresses.
fn conf(lab: &Lab, vips: Value) -> Value {
    let mut c = lab.bridge_conf("1.1.0");
    c["ipam"]["ranges"] = json!([
        [{"subnet": "172.31.250.0/24", "rangeStart": "172.31.250.100",
          "rangeEnd": "172.31.250.150", "gateway": "172.31.250.1"}],
        [{"subnet": "fd00:e1::/64", "rangeStart": "fd00:e1::100", "rangeEnd": "fd00:e1::1ff"}]
    ]);
    c["reverse"] = json!([
        {"name": "mqtt", "protocol": "tcp", "port": 1883, "target": "10.96.0.20:1883"}
    ]);
    c["virtualAddresses"] = vips;
    c
}

/// Nothing of attachment (`cid`, net1) is left: no interface in `pod`,
/// no reservation, no record, no node-side veth.
fn assert_nothing_left(lab: &Lab, pod: &Netns, cid: &str) {
    assert_eq!(pod.links_sorted(), vec!["lo"]);
    assert!(lab.reserved_all().is_empty(), "{:?}", lab.reserved_all());
    assert!(lab.records().is_empty(), "{:?}", lab.records());
    assert!(RecordStore::new(lab.state.path())
        .read(cid, "net1")
        .unwrap()
        .is_none());
    assert!(lab.host_veths().is_empty(), "{:?}", lab.host_veths());
}

#[test]
fn add_records_the_virtual_addresses_and_one_in_the_range_leaves_nothing() {
    let lab = Lab::new();
    let vips = ["172.31.250.60", "fd00:e1::60"];
    let good = conf(&lab, json!(vips));
    let pod = lab.pod();
    let r = Call::new("ADD", "vip-a", Some(&pod.path()), "net1")
        .run(&lab.node, &good)
        .ok();
    let rec = RecordStore::new(lab.state.path())
        .read("vip-a", "net1")
        .unwrap()
        .expect("a record");
    let want: Vec<IpAddr> = vips.iter().map(|s| s.parse().unwrap()).collect();
    assert_eq!(rec.virtual_addresses, want);
    // On disk under the documented key, as the daemon reads it.
    let raw: Value = serde_json::from_slice(
        &std::fs::read(RecordStore::new(lab.state.path()).path("vip-a", "net1")).unwrap(),
    )
    .unwrap();
    assert_eq!(raw["virtualAddresses"], json!(vips));
    // The plugin only records them: the pod has its IPAM addresses only.
    let addrs = pod.addrs("net1");
    assert_eq!(addrs.len(), 2, "{addrs:?}");
    assert!(
        addrs
            .iter()
            .all(|a| !a.starts_with("172.31.250.60/") && !a.starts_with("fd00:e1::60/")),
        "{addrs:?}"
    );
    Call::new("DEL", "vip-a", Some(&pod.path()), "net1")
        .run(&lab.node, &with_prev(&good, &r))
        .ok_empty();
    assert_nothing_left(&lab, &pod, "vip-a");

    // Inside rangeStart..rangeEnd: a pod could be given it.
    let bad = conf(&lab, json!(["172.31.250.120", "fd00:e1::60"]));
    let (code, msg) = Call::new("ADD", "vip-b", Some(&pod.path()), "net1")
        .run(&lab.node, &bad)
        .err();
    assert_eq!(code, 7, "{msg}");
    assert!(
        msg.starts_with("virtualAddresses[0]: \"172.31.250.120\" is inside the built-in IPAM's range 172.31.250.100-172.31.250.150"),
        "{msg}"
    );
    assert_nothing_left(&lab, &pod, "vip-b");
    // A DEL after the failed ADD (as runtimes send one) is fine.
    Call::new("DEL", "vip-b", Some(&pod.path()), "net1")
        .run(&lab.node, &bad)
        .ok_empty();
    assert_nothing_left(&lab, &pod, "vip-b");
}

#[test]
fn a_virtual_address_a_delegated_ipam_uses_is_refused_after_its_add_and_released() {
    let lab = Lab::new();
    let dir = lab.state.path().join("host-local");
    let mut c = conf(&lab, json!(["172.31.250.1"]));
    // host-local speaks CNI up to 1.0.0.
    c["cniVersion"] = json!("1.0.0");
    c["ipam"] = json!({
        "type": "host-local",
        "ranges": [[{"subnet": "172.31.250.0/24", "rangeStart": "172.31.250.160",
                     "rangeEnd": "172.31.250.160", "gateway": "172.31.250.1"}]],
        "dataDir": dir.display().to_string()
    });
    // One address only: every attempt is given it.
    let pod = lab.pod();
    let held = || -> Vec<String> {
        std::fs::read_dir(dir.join(NET))
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.parse::<IpAddr>().is_ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    for (vip, why) in [
        ("172.31.250.1", "is a gateway of the IPAM result"),
        (
            "172.31.250.160",
            "is the interface's own address (172.31.250.160/24)",
        ),
    ] {
        c["virtualAddresses"] = json!([vip]);
        let (code, msg) = Call::new("ADD", "vip-hl", Some(&pod.path()), "net1")
            .run(&lab.node, &c)
            .err();
        assert_eq!(code, 7, "{msg}");
        assert!(
            msg.starts_with(&format!("virtualAddresses[0]: \"{vip}\" {why}")),
            "{msg}"
        );
        assert!(held().is_empty(), "{:?}", held());
        assert_nothing_left(&lab, &pod, "vip-hl");
    }
    // Elsewhere in the delegate's subnet: recorded.
    c["virtualAddresses"] = json!(["172.31.250.60"]);
    let r = Call::new("ADD", "vip-hl", Some(&pod.path()), "net1")
        .run(&lab.node, &c)
        .ok();
    let rec = RecordStore::new(lab.state.path())
        .read("vip-hl", "net1")
        .unwrap()
        .expect("a record");
    assert_eq!(
        rec.virtual_addresses,
        vec!["172.31.250.60".parse::<IpAddr>().unwrap()]
    );
    Call::new("DEL", "vip-hl", Some(&pod.path()), "net1")
        .run(&lab.node, &with_prev(&c, &r))
        .ok_empty();
    assert!(held().is_empty(), "{:?}", held());
    assert_nothing_left(&lab, &pod, "vip-hl");
}
