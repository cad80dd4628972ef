//! mode "bridge", IPv4 and IPv6, the whole ADD / CHECK / DEL cycle.

use edgelink_tests::*;
use serde_json::json;

const MULTUS_ARGS: &str = "IgnoreUnknown=true;K8S_POD_NAMESPACE=hil;K8S_POD_NAME=proxy-0;\
K8S_POD_INFRA_CONTAINER_ID=c0ffee;K8S_POD_UID=9a1c-77;IgnoreUnknown=1";

#[test]
fn add_check_del_ipv4_with_multus_args() {
    let lab = Lab::new();
    let _d = lab.daemon();
    let pod = lab.pod();
    let conf = lab.bridge_conf("1.0.0");
    let add = Call::new("ADD", "cid-a", Some(&pod.path()), "net1")
        .args(MULTUS_ARGS)
        .run(&lab.node, &conf);
    let r = add.ok();
    assert_eq!(r["cniVersion"], "1.0.0");
    // bridge, node-side veth, pod interface: Multus reads sandbox/mac/index.
    let ifs = r["interfaces"].as_array().unwrap();
    assert_eq!(ifs.len(), 3);
    assert_eq!(ifs[0]["name"], "edge0");
    assert!(ifs[0].get("sandbox").is_none());
    assert_eq!(ifs[2]["name"], "net1");
    assert_eq!(ifs[2]["sandbox"], pod.path());
    assert!(ifs
        .iter()
        .all(|i| i["mac"].as_str().is_some_and(|m| m.len() == 17)));
    assert_eq!(r["ips"][0]["address"], "172.31.250.100/24");
    assert_eq!(r["ips"][0]["gateway"], "172.31.250.1");
    assert_eq!(r["ips"][0]["interface"], 2);
    assert!(r["ips"][0].get("version").is_none());
    assert_eq!(
        r["routes"][0],
        json!({"dst": "172.30.0.0/16", "gw": "172.31.250.1"})
    );

    // The kernel agrees with the Result.
    assert_eq!(pod.addrs("net1"), vec!["172.31.250.100/24"]);
    let mac = pod.ip(&["-o", "link", "show", "net1"]);
    assert!(mac.contains(ifs[2]["mac"].as_str().unwrap()));
    assert!(pod
        .ip(&["route"])
        .contains("172.30.0.0/16 via 172.31.250.1 dev net1"));
    let host = ifs[1]["name"].as_str().unwrap();
    assert!(lab
        .node
        .ip(&["-o", "link", "show", host])
        .contains("master edge0"));
    assert!(lab
        .node
        .ip(&["-o", "link", "show", "uplink0"])
        .contains("master edge0"));
    assert!(lab
        .node
        .ip(&["-d", "link", "show", host])
        .contains("state forwarding"));

    // The pod reaches the device through the bridge and the uplink.
    assert!(tcp_reachable(&pod, DEVICE_V4, 9));

    // Reservation and record exist; the record names pod and forwards.
    assert_eq!(lab.reserved("plant-floor"), vec!["172.31.250.100"]);
    let rec: serde_json::Value = serde_json::from_slice(
        &std::fs::read(lab.state.path().join("attachments/cid-a_net1.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(rec["podNamespace"], "hil");
    assert_eq!(rec["podName"], "proxy-0");
    assert_eq!(rec["podUid"], "9a1c-77");
    assert_eq!(rec["netns"], pod.path());
    assert_eq!(rec["forwards"][0]["target"], "172.31.250.10:8080");
    assert_eq!(rec["allowedTargets"], json!(["172.31.250.0/24"]));
    assert_eq!(rec["interface"]["ips"], json!(["172.31.250.100/24"]));

    let prev = with_prev(&conf, &r);
    Call::new("CHECK", "cid-a", Some(&pod.path()), "net1")
        .args(MULTUS_ARGS)
        .run(&lab.node, &prev)
        .ok_empty();

    Call::new("DEL", "cid-a", Some(&pod.path()), "net1")
        .args(MULTUS_ARGS)
        .run(&lab.node, &prev)
        .ok_empty();
    assert!(!pod.has_link("net1"));
    assert!(!lab.node.has_link(host));
    assert!(lab.reserved("plant-floor").is_empty());
    assert!(lab.records().is_empty());

    // CHECK after DEL reports what is missing.
    let (code, msg) = Call::new("CHECK", "cid-a", Some(&pod.path()), "net1")
        .run(&lab.node, &prev)
        .err();
    assert_eq!(code, 104, "{msg}");
    assert!(msg.contains("net1"), "{msg}");

    // DEL again: still fine, with or without netns and prevResult.
    Call::new("DEL", "cid-a", Some(&pod.path()), "net1")
        .run(&lab.node, &prev)
        .ok_empty();
    Call::new("DEL", "cid-a", None, "net1")
        .run(&lab.node, &conf)
        .ok_empty();
}

#[test]
fn dual_stack_and_old_result_versions() {
    let lab = Lab::new();
    let mut conf = lab.bridge_conf("0.3.1");
    conf["ipam"]["ranges"] = json!([
        [{"subnet": "172.31.250.0/24", "rangeStart": "172.31.250.100", "rangeEnd": "172.31.250.150"}],
        [{"subnet": "fd00:e1::/64", "rangeStart": "fd00:e1::100", "rangeEnd": "fd00:e1::1ff"}]
    ]);
    conf["ipam"]["routes"] = json!([]);
    for (i, v) in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
        .iter()
        .enumerate()
    {
        let pod = lab.pod();
        conf["cniVersion"] = json!(v);
        let cid = format!("ds{i}");
        let r = Call::new("ADD", &cid, Some(&pod.path()), "net1")
            .run(&lab.node, &conf)
            .ok();
        assert_eq!(r["cniVersion"], *v);
        let ips = r["ips"].as_array().unwrap();
        assert_eq!(ips.len(), 2, "{r}");
        assert!(ips[1]["address"].as_str().unwrap().starts_with("fd00:e1::"));
        if v.starts_with("0.") {
            assert_eq!(ips[0]["version"], "4");
            assert_eq!(ips[1]["version"], "6");
        } else {
            assert!(ips[0].get("version").is_none());
        }
        if *v == "1.1.0" {
            assert!(r["interfaces"][2]["mtu"].as_u64().is_some());
        } else {
            assert!(r["interfaces"][2].get("mtu").is_none());
        }
        // IPv6 is usable at once (no DAD wait) and reaches the device.
        let a = pod.addrs("net1");
        assert_eq!(a.len(), 2, "{a:?}");
        assert!(tcp_reachable(&pod, DEVICE_V6, 9));
        Call::new("DEL", &cid, Some(&pod.path()), "net1")
            .run(&lab.node, &conf)
            .ok_empty();
    }
    assert!(lab.reserved("plant-floor").is_empty());
}
