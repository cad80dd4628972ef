//! The built-in IPAM through the plugin: parallel ADD/DEL, sticky
//! addresses, requested addresses from every source, `exclude`, per-node
//! sub-ranges and the RFC 5227 ARP probe.

use edgelink_tests::*;
use serde_json::{json, Value};
use std::collections::BTreeSet;

const NET: &str = "plant-floor";

fn pod_args(ns: &str, name: &str) -> String {
    format!("IgnoreUnknown=true;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};K8S_POD_UID=uid-{name}")
}

/// The address (without prefix) the Result gave the pod interface.
fn addr_of(r: &Value) -> String {
    let a = r["ips"][0]["address"]
        .as_str()
        .unwrap_or_else(|| panic!("no address in {r}"));
    a.split('/').next().unwrap().to_string()
}

/// ADD `cid` in a new pod of `lab`; returns (pod, Result).
fn add(lab: &Lab, conf: &Value, cid: &str, args: &str) -> (Netns, Value) {
    let pod = lab.pod();
    let r = Call::new("ADD", cid, Some(&pod.path()), "net1")
        .args(args)
        .run(&lab.node, conf)
        .ok();
    (pod, r)
}

fn del(lab: &Lab, conf: &Value, cid: &str, pod: &Netns, args: &str) {
    Call::new("DEL", cid, Some(&pod.path()), "net1")
        .args(args)
        .run(&lab.node, conf)
        .ok_empty();
}

#[test]
fn parallel_adds_get_distinct_addresses_and_parallel_dels_release_all() {
    const N: usize = 32;
    let lab = Lab::new();
    let conf = lab.bridge_conf("1.0.0");
    let pods: Vec<Netns> = (0..N).map(|_| lab.pod()).collect();
    let cids: Vec<String> = (0..N).map(|i| format!("par-{i:02}")).collect();
    let paths: Vec<String> = pods.iter().map(Netns::path).collect();

    let outs = run_parallel(N, |i| {
        let args = pod_args("hil", &format!("proxy-{i}"));
        Call::new("ADD", &cids[i], Some(&paths[i]), "net1")
            .args(&args)
            .run(&lab.node, &conf)
    });
    let addrs: Vec<String> = outs.iter().map(|o| addr_of(&o.ok())).collect();
    let distinct: BTreeSet<&String> = addrs.iter().collect();
    assert_eq!(
        distinct.len(),
        N,
        "duplicate addresses handed out: {addrs:?}"
    );
    for a in &addrs {
        let last: u8 = a.rsplit('.').next().unwrap().parse().unwrap();
        assert!(
            a.starts_with("172.31.250.") && (100..=150).contains(&last),
            "{a} is outside the range"
        );
    }
    // The kernel and the store agree with the Results.
    for (pod, a) in pods.iter().zip(&addrs) {
        assert_eq!(pod.addrs("net1"), vec![format!("{a}/24")], "{}", pod.name);
    }
    let mut want: Vec<String> = addrs.clone();
    want.sort();
    assert_eq!(lab.reserved(NET), want);
    assert_eq!(lab.records().len(), N);
    assert_eq!(lab.host_veths().len(), N);

    let outs = run_parallel(N, |i| {
        let args = pod_args("hil", &format!("proxy-{i}"));
        Call::new("DEL", &cids[i], Some(&paths[i]), "net1")
            .args(&args)
            .run(&lab.node, &conf)
    });
    for o in &outs {
        o.ok_empty();
    }
    assert!(lab.reserved(NET).is_empty(), "{:?}", lab.reserved(NET));
    assert!(lab.records().is_empty(), "{:?}", lab.records());
    assert!(lab.host_veths().is_empty(), "{:?}", lab.host_veths());
    assert!(pods.iter().all(|p| !p.has_link("net1")));
}

#[test]
fn same_pod_gets_its_address_back_after_del() {
    let lab = Lab::new();
    let conf = lab.bridge_conf("1.0.0");
    let web = pod_args("hil", "web-0");
    let (p1, r1) = add(&lab, &conf, "sticky-1", &web);
    assert_eq!(addr_of(&r1), "172.31.250.100");
    let (p2, r2) = add(&lab, &conf, "other-1", &pod_args("hil", "db-0"));
    assert_eq!(addr_of(&r2), "172.31.250.101");
    del(&lab, &conf, "sticky-1", &p1, &web);
    assert_eq!(lab.reserved(NET), vec!["172.31.250.101"]);

    // The pod comes back with a new sandbox (new container ID): round-robin
    // would give .102, the pod gets .100 again.
    let (p3, r3) = add(&lab, &conf, "sticky-2", &web);
    assert_eq!(addr_of(&r3), "172.31.250.100");
    assert_eq!(p3.addrs("net1"), vec!["172.31.250.100/24"]);
    // A pod without history still gets the next round-robin address.
    let (p4, r4) = add(&lab, &conf, "other-2", &pod_args("hil", "new-0"));
    assert_eq!(addr_of(&r4), "172.31.250.102");

    // Without pod identity there is no stickiness.
    del(&lab, &conf, "sticky-2", &p3, &web);
    let (p5, r5) = add(&lab, &conf, "anon-1", "");
    assert_eq!(addr_of(&r5), "172.31.250.103");

    // A sticky address held by someone else is not taken away.
    let (p6, r6) = add(&lab, &conf, "thief", "IP=172.31.250.100");
    assert_eq!(addr_of(&r6), "172.31.250.100");
    let (p7, r7) = add(&lab, &conf, "sticky-3", &web);
    assert_eq!(addr_of(&r7), "172.31.250.104");

    for (cid, pod) in [
        ("other-1", &p2),
        ("other-2", &p4),
        ("anon-1", &p5),
        ("thief", &p6),
        ("sticky-3", &p7),
    ] {
        del(&lab, &conf, cid, pod, "");
    }
    assert!(lab.reserved(NET).is_empty());
}

#[test]
fn requested_addresses_from_every_source() {
    let lab = Lab::new();
    let base = lab.bridge_conf("1.0.0");

    // CNI_ARGS IP= (with a prefix, as Multus may send it).
    let (p1, r1) = add(
        &lab,
        &base,
        "req-args",
        "IgnoreUnknown=1;IP=172.31.250.140/24",
    );
    assert_eq!(addr_of(&r1), "172.31.250.140");
    assert_eq!(p1.addrs("net1"), vec!["172.31.250.140/24"]);

    // args.cni.ips (conventions).
    let mut c = base.clone();
    c["args"] = json!({"cni": {"ips": ["172.31.250.141"]}});
    let (_p2, r2) = add(&lab, &c, "req-cniargs", "");
    assert_eq!(addr_of(&r2), "172.31.250.141");

    // runtimeConfig.ips with the capability; it wins over CNI_ARGS IP=.
    let mut c = base.clone();
    c["capabilities"] = json!({"ips": true});
    c["runtimeConfig"] = json!({"ips": ["172.31.250.142/24"]});
    let (_p3, r3) = add(&lab, &c, "req-rc", "IP=172.31.250.143");
    assert_eq!(addr_of(&r3), "172.31.250.142");

    // runtimeConfig.ips without the capability is ignored: round-robin
    // goes on after the last reserved address (.143), not to .145.
    let mut c = base.clone();
    c["runtimeConfig"] = json!({"ips": ["172.31.250.145/24"]});
    let (p4, r4) = add(&lab, &c, "req-nocap", "");
    assert_eq!(addr_of(&r4), "172.31.250.143", "{r4}");
    assert_eq!(p4.addrs("net1"), vec!["172.31.250.143/24"]);

    // A requested address held by another container: 103, nothing left.
    let pod = lab.pod();
    let before = lab.reserved(NET);
    let (code, msg) = Call::new("ADD", "req-taken", Some(&pod.path()), "net1")
        .args("IP=172.31.250.140")
        .run(&lab.node, &base)
        .err();
    assert_eq!(code, 103, "{msg}");
    assert!(msg.contains("172.31.250.140"), "{msg}");
    assert_eq!(lab.reserved(NET), before);
    assert!(!pod.has_link("net1"));

    // Outside the range, or the gateway: 103 as well.
    for ip in ["172.31.250.200", "172.31.250.1", "10.1.2.3"] {
        let mut c = base.clone();
        c["args"] = json!({"cni": {"ips": [ip]}});
        let (code, msg) = Call::new("ADD", "req-out", Some(&pod.path()), "net1")
            .run(&lab.node, &c)
            .err();
        assert_eq!(code, 103, "{ip}: {msg}");
        assert!(!pod.has_link("net1"));
    }
    assert_eq!(lab.reserved(NET), before);
    assert_eq!(lab.records().len(), 4);
}

#[test]
fn excluded_addresses_are_never_handed_out() {
    let lab = Lab::new();
    let mut conf = lab.bridge_conf("1.0.0");
    conf["ipam"]["exclude"] = json!(["172.31.250.100/30", "172.31.250.105/32"]);
    let mut got = Vec::new();
    let mut pods = Vec::new();
    for i in 0..3 {
        let (p, r) = add(&lab, &conf, &format!("ex-{i}"), "");
        got.push(addr_of(&r));
        pods.push(p);
    }
    assert_eq!(got, ["172.31.250.104", "172.31.250.106", "172.31.250.107"]);
    // Asking for an excluded address is refused.
    let pod = lab.pod();
    let (code, msg) = Call::new("ADD", "ex-req", Some(&pod.path()), "net1")
        .args("IP=172.31.250.101")
        .run(&lab.node, &conf)
        .err();
    assert_eq!(code, 103, "{msg}");
    // A bad exclude is a config error naming the field.
    conf["ipam"]["exclude"] = json!(["172.31.250.300/32"]);
    let (code, msg) = Call::new("ADD", "ex-bad", Some(&pod.path()), "net1")
        .run(&lab.node, &conf)
        .err();
    assert_eq!(code, 7, "{msg}");
    assert!(msg.contains("ipam.exclude[0]"), "{msg}");
}

/// Two ranges of one subnet, one per node.
fn per_node_conf(lab: &Lab, node: Option<&str>) -> Value {
    let mut c = lab.bridge_conf("1.0.0");
    c["ipam"]["ranges"] = json!([[
        {"subnet": "172.31.250.0/24", "rangeStart": "172.31.250.100",
         "rangeEnd": "172.31.250.109", "gateway": "172.31.250.1", "node": "kedge1"},
        {"subnet": "172.31.250.0/24", "rangeStart": "172.31.250.110",
         "rangeEnd": "172.31.250.119", "gateway": "172.31.250.1", "node": "kedge2"}
    ]]);
    match node {
        Some(n) => c["ipam"]["nodeName"] = json!(n),
        None => {
            c["ipam"].as_object_mut().unwrap().remove("nodeName");
        }
    }
    c
}

fn last_octet(a: &str) -> u8 {
    a.rsplit('.').next().unwrap().parse().unwrap()
}

#[test]
fn per_node_ranges_are_disjoint_and_overlaps_are_refused() {
    let lab1 = Lab::new();
    let lab2 = Lab::new();
    let c1 = per_node_conf(&lab1, Some("kedge1"));
    let c2 = per_node_conf(&lab2, Some("kedge2"));
    let mut a1 = Vec::new();
    let mut a2 = Vec::new();
    let mut keep = Vec::new();
    for i in 0..4 {
        let (p, r) = add(&lab1, &c1, &format!("n1-{i}"), "");
        a1.push(addr_of(&r));
        keep.push(p);
        let (p, r) = add(&lab2, &c2, &format!("n2-{i}"), "");
        a2.push(addr_of(&r));
        keep.push(p);
    }
    assert!(
        a1.iter().all(|a| (100..=109).contains(&last_octet(a))),
        "{a1:?}"
    );
    assert!(
        a2.iter().all(|a| (110..=119).contains(&last_octet(a))),
        "{a2:?}"
    );
    assert_eq!(lab1.reserved(NET), a1);
    assert_eq!(lab2.reserved(NET), a2);

    // Node name from <stateDir>/node-name when ipam.nodeName is absent.
    let lab3 = Lab::new();
    std::fs::write(lab3.state.path().join("node-name"), "kedge2\n").unwrap();
    let c3 = per_node_conf(&lab3, None);
    let (_p3, r3) = add(&lab3, &c3, "n3-0", "");
    assert_eq!(addr_of(&r3), "172.31.250.110");
    // ipam.nodeName wins over the file.
    let c3b = per_node_conf(&lab3, Some("kedge1"));
    let (_p3b, r3b) = add(&lab3, &c3b, "n3-1", "");
    assert_eq!(addr_of(&r3b), "172.31.250.100");

    // A node no range applies to: 7, naming the node.
    let pod = lab1.pod();
    let c9 = per_node_conf(&lab1, Some("kedge9"));
    let (code, msg) = Call::new("ADD", "n9", Some(&pod.path()), "net1")
        .run(&lab1.node, &c9)
        .err();
    assert_eq!(code, 7, "{msg}");
    assert!(msg.contains("kedge9"), "{msg}");

    // Overlapping per-node ranges are refused on every node, before
    // anything is touched.
    let mut bad = per_node_conf(&lab1, Some("kedge1"));
    bad["ipam"]["ranges"][0][1]["rangeStart"] = json!("172.31.250.105");
    let links = lab1.node.links_sorted();
    let (code, msg) = Call::new("ADD", "ovl", Some(&pod.path()), "net1")
        .run(&lab1.node, &bad)
        .err();
    assert_eq!(code, 7, "{msg}");
    assert!(msg.contains("overlaps"), "{msg}");
    assert_eq!(lab1.node.links_sorted(), links);
    assert!(!pod.has_link("net1"));
    bad["ipam"]["nodeName"] = json!("kedge2");
    let (code, _) = Call::new("ADD", "ovl", Some(&pod.path()), "net1")
        .run(&lab2.node, &bad)
        .err();
    assert_eq!(code, 7);
    assert_eq!(lab1.reserved(NET), a1);
}

#[test]
fn arp_probe_skips_an_address_a_device_answers_for() {
    for (enabled, want) in [(true, "172.31.250.101"), (false, "172.31.250.100")] {
        let lab = Lab::new();
        // A device already uses the first address of the range.
        lab.device
            .ip(&["addr", "add", "172.31.250.100/24", "dev", "dev0"]);
        let mut conf = lab.bridge_conf("1.0.0");
        // A generous timeout: the answer must not be missed on a loaded machine.
        conf["ipam"]["probe"] = json!({"enabled": enabled, "timeoutMs": 1000});
        let (pod, r) = add(&lab, &conf, "probe-1", "");
        assert_eq!(addr_of(&r), want, "probe enabled={enabled}: {r}");
        assert_eq!(pod.addrs("net1"), vec![format!("{want}/24")]);
        assert_eq!(lab.reserved(NET), vec![want]);
        if enabled {
            // The skipped address was not reserved, and the next ADD
            // moves on past it too.
            let (_p2, r2) = add(&lab, &conf, "probe-2", "");
            assert_eq!(addr_of(&r2), "172.31.250.102");
        }
    }
}

#[test]
fn bad_probe_config_is_refused() {
    let lab = Lab::new();
    let pod = lab.pod();
    let mut conf = lab.bridge_conf("1.0.0");
    conf["ipam"]["probe"] = json!({"enabled": true, "timeoutMs": 0});
    let (code, msg) = Call::new("ADD", "pb", Some(&pod.path()), "net1")
        .run(&lab.node, &conf)
        .err();
    assert_eq!(code, 7, "{msg}");
    assert!(msg.contains("ipam.probe.timeoutMs"), "{msg}");
    assert!(lab.node_extra_links(&[]).is_empty());
}

#[test]
fn exhausted_pool_is_102_and_dual_stack_requests() {
    let lab = Lab::new();
    let mut conf = lab.bridge_conf("1.0.0");
    conf["ipam"]["ranges"] = json!([
        [{"subnet": "172.31.250.0/24", "rangeStart": "172.31.250.100", "rangeEnd": "172.31.250.101"}],
        [{"subnet": "fd00:e1::/64", "rangeStart": "fd00:e1::100", "rangeEnd": "fd00:e1::1ff"}]
    ]);
    conf["ipam"]["routes"] = json!([]);
    // One address of each family, both requested through CNI_ARGS IP=a,b.
    let (p1, r1) = add(&lab, &conf, "ds-1", "IP=172.31.250.101,fd00:e1::150");
    let ips: Vec<&str> = r1["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["address"].as_str().unwrap())
        .collect();
    assert_eq!(ips, ["172.31.250.101/24", "fd00:e1::150/64"]);
    assert_eq!(
        p1.addrs("net1"),
        vec!["172.31.250.101/24", "fd00:e1::150/64"]
    );
    // Round-robin goes on after the last reserved address of each set (the
    // requested fd00:e1::150 included).
    let (_p2, r2) = add(&lab, &conf, "ds-2", "");
    assert_eq!(r2["ips"][0]["address"], "172.31.250.100/24");
    assert_eq!(r2["ips"][1]["address"], "fd00:e1::151/64");
    assert_eq!(
        lab.reserved(NET),
        vec![
            "172.31.250.100",
            "172.31.250.101",
            "fd00:e1::150",
            "fd00:e1::151"
        ]
    );

    // The IPv4 set is full: 102, and the IPv6 address it would have had is
    // not kept either (all or nothing).
    let pod = lab.pod();
    let (code, msg) = Call::new("ADD", "ds-3", Some(&pod.path()), "net1")
        .run(&lab.node, &conf)
        .err();
    assert_eq!(code, 102, "{msg}");
    assert!(msg.contains("172.31.250.100"), "{msg}");
    assert_eq!(lab.reserved(NET).len(), 4);
    assert!(!pod.has_link("net1"));
    assert_eq!(lab.records().len(), 2);

    // Freeing one makes room again.
    del(&lab, &conf, "ds-1", &p1, "");
    let (_p4, r4) = add(&lab, &conf, "ds-4", "");
    assert_eq!(r4["ips"][0]["address"], "172.31.250.101/24");
}
