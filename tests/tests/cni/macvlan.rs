//! mode "macvlan": a macvlan child of the lab's uplink0 (a veth cabled to
//! the device) inside the pod. ADD / CHECK / DEL, every macvlan mode, MAC
//! and MTU requests, and DEL when the uplink or the pod's netns is gone.

use edgelink_tests::*;
use serde_json::{json, Value};

const NET: &str = "plant-floor";

fn dual_stack(conf: &mut Value) {
    conf["ipam"]["ranges"] = json!([
        [{"subnet": "172.31.250.0/24", "rangeStart": "172.31.250.100",
          "rangeEnd": "172.31.250.150", "gateway": "172.31.250.1"}],
        [{"subnet": "fd00:e1::/64", "rangeStart": "fd00:e1::100", "rangeEnd": "fd00:e1::1ff"}]
    ]);
}

/// The Result of a macvlan ADD: exactly one interface, in the sandbox, with
/// the MAC the kernel gave it; every IP points at it.
fn check_result(r: &Value, pod: &Netns) {
    let ifs = r["interfaces"].as_array().expect("interfaces");
    assert_eq!(ifs.len(), 1, "{r}");
    assert_eq!(ifs[0]["name"], "net1");
    assert_eq!(ifs[0]["sandbox"], pod.path());
    assert_eq!(
        ifs[0]["mac"].as_str().unwrap().to_lowercase(),
        pod.mac("net1")
    );
    let ips = r["ips"].as_array().expect("ips");
    assert!(!ips.is_empty(), "{r}");
    for ip in ips {
        assert_eq!(ip["interface"], 0, "{r}");
    }
}

#[test]
fn add_check_del_dual_stack() {
    let lab = Lab::new();
    let _d = lab.daemon();
    let pod = lab.pod();
    let mut conf = lab.macvlan_conf("1.1.0");
    dual_stack(&mut conf);
    let r = Call::new("ADD", "mv1", Some(&pod.path()), "net1")
        .args("IgnoreUnknown=1;K8S_POD_NAMESPACE=hil;K8S_POD_NAME=plc-0")
        .run(&lab.node, &conf)
        .ok();
    check_result(&r, &pod);
    assert_eq!(r["cniVersion"], "1.1.0");
    assert_eq!(r["ips"][0]["address"], "172.31.250.100/24");
    assert_eq!(r["ips"][0]["gateway"], "172.31.250.1");
    assert_eq!(r["ips"][1]["address"], "fd00:e1::100/64");
    assert_eq!(r["interfaces"][0]["mtu"], 1500);

    // The kernel agrees: a macvlan of mode bridge, up, with both addresses.
    let d = pod.link_details("net1");
    assert!(d.contains("macvlan mode bridge"), "{d}");
    assert!(d.contains(",UP"), "{d}");
    assert_eq!(
        pod.addrs("net1"),
        vec!["172.31.250.100/24", "fd00:e1::100/64"]
    );
    assert!(pod
        .ip(&["route"])
        .contains("172.30.0.0/16 via 172.31.250.1 dev net1"));
    // Nothing on the node side: no bridge, no veth, no temporary name.
    assert!(
        lab.node_extra_links(&[]).is_empty(),
        "{:?}",
        lab.node.links()
    );
    assert_eq!(pod.links_sorted(), vec!["lo", "net1"]);

    assert!(tcp_reachable(&pod, DEVICE_V4, 9));
    assert!(tcp_reachable(&pod, DEVICE_V6, 9));

    assert_eq!(lab.reserved(NET), vec!["172.31.250.100", "fd00:e1::100"]);
    let rec: Value = serde_json::from_slice(
        &std::fs::read(lab.state.path().join("attachments/mv1_net1.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(rec["mode"], "macvlan");
    assert_eq!(rec["podName"], "plc-0");
    assert_eq!(rec["interface"]["mac"], r["interfaces"][0]["mac"]);
    assert_eq!(
        rec["interface"]["ips"],
        json!(["172.31.250.100/24", "fd00:e1::100/64"])
    );

    let prev = with_prev(&conf, &r);
    Call::new("CHECK", "mv1", Some(&pod.path()), "net1")
        .run(&lab.node, &prev)
        .ok_empty();

    // CHECK notices a changed MAC and a missing address.
    let mac = pod.mac("net1");
    pod.ip(&["link", "set", "net1", "address", "02:de:ad:be:ef:01"]);
    let (code, msg) = Call::new("CHECK", "mv1", Some(&pod.path()), "net1")
        .run(&lab.node, &prev)
        .err();
    assert_eq!(code, 104, "{msg}");
    assert!(
        msg.contains("02:de:ad:be:ef:01") && msg.contains(&mac),
        "{msg}"
    );
    pod.ip(&["link", "set", "net1", "address", &mac]);
    pod.ip(&["addr", "del", "fd00:e1::100/64", "dev", "net1"]);
    let (code, msg) = Call::new("CHECK", "mv1", Some(&pod.path()), "net1")
        .run(&lab.node, &prev)
        .err();
    assert_eq!(code, 104, "{msg}");
    assert!(msg.contains("fd00:e1::100"), "{msg}");

    Call::new("DEL", "mv1", Some(&pod.path()), "net1")
        .run(&lab.node, &prev)
        .ok_empty();
    assert_eq!(pod.links_sorted(), vec!["lo"]);
    assert!(lab.reserved(NET).is_empty());
    assert!(lab.records().is_empty());
    // uplink0 is untouched by the whole cycle.
    assert!(lab.node.has_link("uplink0"));
    assert_eq!(lab.node.master_of("uplink0"), None);
    // A repeated DEL is fine.
    Call::new("DEL", "mv1", Some(&pod.path()), "net1")
        .run(&lab.node, &prev)
        .ok_empty();
}

#[test]
fn every_macvlan_mode() {
    let lab = Lab::new();
    let _d = lab.daemon();
    for mode in ["bridge", "private", "vepa"] {
        let mut conf = lab.macvlan_conf("1.0.0");
        conf["macvlanMode"] = json!(mode);
        let pods = [lab.pod(), lab.pod()];
        let mut results = Vec::new();
        for (i, pod) in pods.iter().enumerate() {
            let r = Call::new("ADD", &format!("{mode}{i}"), Some(&pod.path()), "net1")
                .run(&lab.node, &conf)
                .ok();
            check_result(&r, pod);
            let d = pod.link_details("net1");
            assert!(d.contains(&format!("macvlan mode {mode}")), "{mode}: {d}");
            assert!(tcp_reachable(pod, DEVICE_V4, 9), "{mode}");
            Call::new("CHECK", &format!("{mode}{i}"), Some(&pod.path()), "net1")
                .run(&lab.node, &with_prev(&conf, &r))
                .ok_empty();
            results.push(r);
        }
        // Two children of one uplink talk to each other only in bridge
        // mode: private isolates them, vepa sends their frames out to the
        // device (which does not reflect them).
        let other = results[1]["ips"][0]["address"].as_str().unwrap();
        let other = other.split('/').next().unwrap();
        assert_eq!(
            tcp_reachable(&pods[0], other, 9),
            mode == "bridge",
            "{mode}: pod to pod"
        );
        for (i, pod) in pods.iter().enumerate() {
            Call::new("DEL", &format!("{mode}{i}"), Some(&pod.path()), "net1")
                .run(&lab.node, &conf)
                .ok_empty();
            assert_eq!(pod.links_sorted(), vec!["lo"]);
        }
        assert!(lab.reserved(NET).is_empty(), "{mode}");
        assert!(lab.records().is_empty(), "{mode}");
    }
}

#[test]
fn passthru_allows_one_child() {
    let lab = Lab::new();
    let _d = lab.daemon();
    let mut conf = lab.macvlan_conf("1.0.0");
    conf["macvlanMode"] = json!("passthru");
    let p1 = lab.pod();
    let p2 = lab.pod();
    let r = Call::new("ADD", "pt1", Some(&p1.path()), "net1")
        .run(&lab.node, &conf)
        .ok();
    check_result(&r, &p1);
    let d = p1.link_details("net1");
    assert!(d.contains("macvlan mode passthru"), "{d}");
    assert!(tcp_reachable(&p1, DEVICE_V4, 9));
    Call::new("CHECK", "pt1", Some(&p1.path()), "net1")
        .run(&lab.node, &with_prev(&conf, &r))
        .ok_empty();

    // A second passthru child of the same uplink: the kernel refuses, and
    // the failed ADD leaves nothing behind.
    let node_before = lab.node.links_sorted();
    let out = Call::new("ADD", "pt2", Some(&p2.path()), "net1").run(&lab.node, &conf);
    let (code, msg) = out.err();
    assert_eq!(code, 100, "{msg}");
    assert!(msg.contains("uplink0") && msg.contains("Passthru"), "{msg}");
    assert_eq!(p2.links_sorted(), vec!["lo"]);
    assert_eq!(lab.node.links_sorted(), node_before);
    assert_eq!(lab.reserved(NET), vec!["172.31.250.100"]);
    assert_eq!(lab.records(), vec!["pt1_net1.json"]);
    Call::new("DEL", "pt2", Some(&p2.path()), "net1")
        .run(&lab.node, &conf)
        .ok_empty();
    // pt1 is untouched by the failed ADD and its DEL.
    assert!(tcp_reachable(&p1, DEVICE_V4, 9));
    assert_eq!(lab.reserved(NET), vec!["172.31.250.100"]);

    // Once the first child is gone, the second ADD succeeds.
    Call::new("DEL", "pt1", Some(&p1.path()), "net1")
        .run(&lab.node, &conf)
        .ok_empty();
    let r2 = Call::new("ADD", "pt2", Some(&p2.path()), "net1")
        .run(&lab.node, &conf)
        .ok();
    check_result(&r2, &p2);
    assert!(tcp_reachable(&p2, DEVICE_V4, 9));
    Call::new("DEL", "pt2", Some(&p2.path()), "net1")
        .run(&lab.node, &conf)
        .ok_empty();
    assert!(lab.reserved(NET).is_empty());
    assert!(lab.records().is_empty());
}

#[test]
fn requested_mac_from_cni_args_and_runtime_config() {
    let lab = Lab::new();
    let _d = lab.daemon();
    let conf = lab.macvlan_conf("1.0.0");

    // CNI_ARGS MAC= (Multus and podman pass it there).
    let pod = lab.pod();
    let r = Call::new("ADD", "mac1", Some(&pod.path()), "net1")
        .args("IgnoreUnknown=1;MAC=02:aa:bb:cc:dd:01")
        .run(&lab.node, &conf)
        .ok();
    check_result(&r, &pod);
    assert_eq!(pod.mac("net1"), "02:aa:bb:cc:dd:01");
    assert_eq!(r["interfaces"][0]["mac"], "02:aa:bb:cc:dd:01");
    assert!(tcp_reachable(&pod, DEVICE_V4, 9));
    // The device learnt the pod's requested MAC.
    let neigh = lab.device.ip(&["neigh", "show", "dev", "dev0"]);
    assert!(neigh.contains("02:aa:bb:cc:dd:01"), "{neigh}");
    Call::new("DEL", "mac1", Some(&pod.path()), "net1")
        .run(&lab.node, &conf)
        .ok_empty();

    // runtimeConfig.mac, honoured with the capability and winning over
    // CNI_ARGS and the config's own `mac`.
    let mut c = conf.clone();
    c["capabilities"] = json!({"mac": true});
    c["runtimeConfig"] = json!({"mac": "02:aa:bb:cc:dd:02"});
    c["mac"] = json!("02:aa:bb:cc:dd:03");
    let pod = lab.pod();
    let r = Call::new("ADD", "mac2", Some(&pod.path()), "net1")
        .args("IgnoreUnknown=1;MAC=02:aa:bb:cc:dd:04")
        .run(&lab.node, &c)
        .ok();
    assert_eq!(pod.mac("net1"), "02:aa:bb:cc:dd:02");
    assert_eq!(r["interfaces"][0]["mac"], "02:aa:bb:cc:dd:02");
    Call::new("CHECK", "mac2", Some(&pod.path()), "net1")
        .run(&lab.node, &with_prev(&c, &r))
        .ok_empty();
    Call::new("DEL", "mac2", Some(&pod.path()), "net1")
        .run(&lab.node, &c)
        .ok_empty();

    // Without the capability, runtimeConfig.mac is not ours to honour: the
    // config's `mac` applies.
    c["capabilities"] = json!({});
    let pod = lab.pod();
    Call::new("ADD", "mac3", Some(&pod.path()), "net1")
        .run(&lab.node, &c)
        .ok();
    assert_eq!(pod.mac("net1"), "02:aa:bb:cc:dd:03");
    Call::new("DEL", "mac3", Some(&pod.path()), "net1")
        .run(&lab.node, &c)
        .ok_empty();
    assert!(lab.reserved(NET).is_empty());
    assert!(lab.records().is_empty());
}

#[test]
fn mtu_is_honoured() {
    let lab = Lab::new();
    let _d = lab.daemon();
    lab.node.ip(&["link", "set", "uplink0", "mtu", "9000"]);
    lab.device.ip(&["link", "set", "dev0", "mtu", "9000"]);

    // Explicit mtu below the uplink's.
    let mut conf = lab.macvlan_conf("1.1.0");
    conf["mtu"] = json!(1400);
    let pod = lab.pod();
    let r = Call::new("ADD", "mtu1", Some(&pod.path()), "net1")
        .run(&lab.node, &conf)
        .ok();
    assert_eq!(pod.mtu("net1"), 1400);
    assert_eq!(r["interfaces"][0]["mtu"], 1400);
    assert!(tcp_reachable(&pod, DEVICE_V4, 9));
    Call::new("CHECK", "mtu1", Some(&pod.path()), "net1")
        .run(&lab.node, &with_prev(&conf, &r))
        .ok_empty();
    // CHECK notices a changed MTU.
    pod.ip(&["link", "set", "net1", "mtu", "1300"]);
    let (code, msg) = Call::new("CHECK", "mtu1", Some(&pod.path()), "net1")
        .run(&lab.node, &with_prev(&conf, &r))
        .err();
    assert_eq!(code, 104, "{msg}");
    assert!(msg.contains("1300") && msg.contains("1400"), "{msg}");
    Call::new("DEL", "mtu1", Some(&pod.path()), "net1")
        .run(&lab.node, &conf)
        .ok_empty();

    // Equal to the uplink's is fine; without `mtu` the uplink's applies.
    for (mtu, want) in [(Some(9000), 9000), (None, 9000)] {
        let mut c = lab.macvlan_conf("1.1.0");
        if let Some(m) = mtu {
            c["mtu"] = json!(m);
        }
        let pod = lab.pod();
        let r = Call::new("ADD", "mtu2", Some(&pod.path()), "net1")
            .run(&lab.node, &c)
            .ok();
        assert_eq!(pod.mtu("net1"), want);
        assert_eq!(r["interfaces"][0]["mtu"], want);
        Call::new("DEL", "mtu2", Some(&pod.path()), "net1")
            .run(&lab.node, &c)
            .ok_empty();
    }

    // Above the uplink's: code 7, nothing made.
    let mut c = lab.macvlan_conf("1.1.0");
    c["mtu"] = json!(9001);
    let pod = lab.pod();
    let (code, msg) = Call::new("ADD", "mtu3", Some(&pod.path()), "net1")
        .run(&lab.node, &c)
        .err();
    assert_eq!(code, 7, "{msg}");
    assert!(
        msg.contains("mtu") && msg.contains("9001") && msg.contains("9000"),
        "{msg}"
    );
    assert_eq!(pod.links_sorted(), vec!["lo"]);
    Call::new("DEL", "mtu3", Some(&pod.path()), "net1")
        .run(&lab.node, &c)
        .ok_empty();
    assert!(lab.reserved(NET).is_empty());
    assert!(lab.records().is_empty());
}

#[test]
fn del_after_the_uplink_was_deleted() {
    // plugins#953/#830: the master NIC disappeared, DEL must still succeed
    // (from the config alone) and release everything.
    let lab = Lab::new();
    let pod = lab.pod();
    let mut conf = lab.macvlan_conf("1.0.0");
    dual_stack(&mut conf);
    let r = Call::new("ADD", "gone1", Some(&pod.path()), "net1")
        .run(&lab.node, &conf)
        .ok();
    assert_eq!(lab.reserved(NET).len(), 2);
    lab.node.ip(&["link", "del", "uplink0"]);
    assert!(!lab.node.has_link("uplink0"));
    // The kernel took the macvlan child with its lower device.
    assert!(!pod.has_link("net1"));

    // With prevResult and netns, then again without either (containerd's
    // second DEL): both succeed.
    Call::new("DEL", "gone1", Some(&pod.path()), "net1")
        .run(&lab.node, &with_prev(&conf, &r))
        .ok_empty();
    assert!(lab.reserved(NET).is_empty());
    assert!(lab.records().is_empty());
    Call::new("DEL", "gone1", None, "net1")
        .run(&lab.node, &conf)
        .ok_empty();

    // The uplink comes back (a new link of the same name): ADD works again.
    // It vanishes once more: CHECK reports the missing interface, and DEL
    // from the config alone still releases everything.
    lab.node.ip(&[
        "link", "add", "uplink0", "type", "veth", "peer", "name", "spare0",
    ]);
    lab.node.ip(&["link", "set", "uplink0", "up"]);
    let pod2 = lab.pod();
    let r2 = Call::new("ADD", "gone2", Some(&pod2.path()), "net1")
        .run(&lab.node, &conf)
        .ok();
    check_result(&r2, &pod2);
    lab.node.ip(&["link", "del", "uplink0"]);
    let (code, msg) = Call::new("CHECK", "gone2", Some(&pod2.path()), "net1")
        .run(&lab.node, &with_prev(&conf, &r2))
        .err();
    assert_eq!(code, 104, "{msg}");
    assert!(msg.contains("net1"), "{msg}");
    Call::new("DEL", "gone2", Some(&pod2.path()), "net1")
        .run(&lab.node, &conf)
        .ok_empty();
    assert!(lab.reserved(NET).is_empty());
    assert!(lab.records().is_empty());
    assert_eq!(pod2.links_sorted(), vec!["lo"]);
    assert!(
        lab.node_extra_links(&[]).is_empty(),
        "{:?}",
        lab.node.links()
    );
}

#[test]
fn del_after_the_pod_netns_was_deleted() {
    let lab = Lab::new();
    let mut conf = lab.macvlan_conf("1.0.0");
    dual_stack(&mut conf);
    let pod = lab.pod();
    let path = pod.path();
    let r = Call::new("ADD", "nsgone", Some(&path), "net1")
        .args("IgnoreUnknown=1;K8S_POD_NAMESPACE=hil;K8S_POD_NAME=plc-1")
        .run(&lab.node, &conf)
        .ok();
    assert_eq!(lab.reserved(NET).len(), 2);
    assert_eq!(lab.records(), vec!["nsgone_net1.json"]);
    let node_before = lab.node.links_sorted();
    drop(pod);
    assert!(!std::path::Path::new(&path).exists());

    // The runtime still passes the old path (Multus from its cache).
    Call::new("DEL", "nsgone", Some(&path), "net1")
        .run(&lab.node, &with_prev(&conf, &r))
        .ok_empty();
    assert!(lab.reserved(NET).is_empty());
    assert!(lab.records().is_empty());
    assert_eq!(lab.node.links_sorted(), node_before);
    assert!(lab.node.has_link("uplink0"));
    Call::new("DEL", "nsgone", None, "net1")
        .run(&lab.node, &conf)
        .ok_empty();
}

#[test]
fn del_without_netns_still_removes_the_macvlan() {
    // containerd's RemovePodSandbox DEL (empty CNI_NETNS, no prevResult) can
    // be the only DEL a sandbox gets (the stop never reached the plugin).
    // Releasing the address while the macvlan keeps it in a live netns
    // would hand out a duplicate: DEL finds the netns in the record.
    let lab = Lab::new();
    let pod = lab.pod();
    let conf = lab.macvlan_conf("1.0.0");
    Call::new("ADD", "nonetns", Some(&pod.path()), "net1")
        .run(&lab.node, &conf)
        .ok();
    Call::new("DEL", "nonetns", None, "net1")
        .run(&lab.node, &conf)
        .ok_empty();
    assert_eq!(pod.links_sorted(), vec!["lo"]);
    assert!(lab.reserved(NET).is_empty());
    assert!(lab.records().is_empty());
    // Again, now without a record: nothing to do, still fine.
    Call::new("DEL", "nonetns", None, "net1")
        .run(&lab.node, &conf)
        .ok_empty();
}
