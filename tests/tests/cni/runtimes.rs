//! The plugin driven the way real callers drive it (see
//! /work/shared/real-runtimes.md): containerd's double DEL, Multus's messy
//! CNI_ARGS and CNI_PATH, several NADs on one pod, DEL from Multus's cache
//! with a stripped config, podman's VERSION probe, a conflist chain, and
//! STATUS.

use crate::review3_segment::icmp_reachable;
use edgelink_tests::*;
use serde_json::{json, Value};

const NET: &str = "plant-floor";

/// What the lab must look like when every attachment is gone.
fn assert_all_released(lab: &Lab, pod: Option<&Netns>) {
    assert!(lab.reserved_all().is_empty(), "{:?}", lab.reserved_all());
    assert!(lab.records().is_empty(), "{:?}", lab.records());
    let extra: Vec<String> = lab
        .node_extra_links(&["edge0"])
        .into_iter()
        .filter(|l| l.starts_with("elk") || l.starts_with("elt"))
        .collect();
    assert!(extra.is_empty(), "node-side leftovers: {extra:?}");
    if let Some(p) = pod {
        assert_eq!(p.links_sorted(), vec!["lo"]);
    }
}

#[test]
fn containerd_sends_del_twice() {
    // One lab per mode: a bridge port cannot also carry macvlans.
    for i in 0..2 {
        let lab = Lab::new();
        let conf = if i == 0 {
            lab.bridge_conf("1.0.0")
        } else {
            lab.macvlan_conf("1.0.0")
        };
        let cid = format!("4f1d2c{i}");
        let args = format!(
            "K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID=5e1c-{i};IgnoreUnknown=1;\
             K8S_POD_NAMESPACE=hil;K8S_POD_NAME=plc-{i}"
        );
        let pod = lab.pod();
        let path = pod.path();
        let r = Call::new("ADD", &cid, Some(&path), "eth0")
            .args(&args)
            .run(&lab.node, &conf)
            .ok();
        let eth0 = r["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .position(|i| i["name"] == "eth0")
            .unwrap();
        assert_eq!(r["ips"][0]["interface"], eth0);
        assert_eq!(pod.addrs("eth0"), vec!["172.31.250.100/24"]);
        assert!(tcp_reachable(&pod, DEVICE_V4, 9));

        // StopPodSandbox: DEL with the netns and prevResult.
        Call::new("DEL", &cid, Some(&path), "eth0")
            .args(&args)
            .run(&lab.node, &with_prev(&conf, &r))
            .ok_empty();
        assert_all_released(&lab, Some(&pod));
        // The sandbox's netns goes, then RemovePodSandbox: DEL again with an
        // empty CNI_NETNS and no prevResult.
        drop(pod);
        Call::new("DEL", &cid, None, "eth0")
            .args(&args)
            .run(&lab.node, &conf)
            .ok_empty();
        assert_all_released(&lab, None);
    }

    // A sandbox whose stop never reached the plugin (containerd restarted):
    // the only DEL has no netns and no prevResult, and still frees it all.
    let lab = Lab::new();
    let pod = lab.pod();
    let conf = lab.bridge_conf("1.0.0");
    let r = Call::new("ADD", "c0nly1del", Some(&pod.path()), "eth0")
        .run(&lab.node, &conf)
        .ok();
    let host = r["interfaces"][1]["name"].as_str().unwrap().to_string();
    assert!(lab.node.has_link(&host));
    Call::new("DEL", "c0nly1del", None, "eth0")
        .run(&lab.node, &conf)
        .ok_empty();
    // The node-side veth went, and its pod end with it.
    assert!(!lab.node.has_link(&host));
    assert_all_released(&lab, Some(&pod));
}

/// A second cable from the node to the device: uplink1 <-> dev1, the
/// device at 172.31.251.10/24.
fn second_uplink(lab: &Lab) {
    lab.node.ip(&[
        "link",
        "add",
        "uplink1",
        "type",
        "veth",
        "peer",
        "name",
        "dev1",
        "netns",
        &lab.device.name,
    ]);
    lab.device
        .ip(&["addr", "add", "172.31.251.10/24", "dev", "dev1"]);
    lab.device.ip(&["link", "set", "dev1", "up"]);
    lab.node.ip(&["link", "set", "uplink1", "up"]);
}

#[test]
fn multus_three_nads_on_one_pod() {
    let lab = Lab::new();
    let _d = lab.daemon();
    second_uplink(&lab);
    let sd = lab.state_dir();
    let hl_dir = lab.state.path().join("host-local");

    // NAD 1: bridge edge0 on uplink0, built-in IPAM.
    let nad1 = lab.bridge_conf("1.0.0");
    // NAD 2: macvlan on uplink1, host-local IPAM found through a CNI_PATH
    // with repeated (and missing) entries.
    let nad2 = json!({
        "cniVersion": "1.0.0", "name": "lab-b", "type": "edgelink",
        "mode": "macvlan", "uplink": "uplink1", "macvlanMode": "bridge",
        "stateDir": sd,
        "ipam": {"type": "host-local", "dataDir": hl_dir,
                 "ranges": [[{"subnet": "172.31.251.0/24",
                              "rangeStart": "172.31.251.50", "rangeEnd": "172.31.251.60"}]]},
        "forwards": [{"name": "plc", "port": 502, "target": "172.31.251.10:502"}]
    });
    // NAD 3: a second bridge without uplink, the node as gateway.
    let nad3 = json!({
        "cniVersion": "0.3.1", "name": "isolated", "type": "edgelink",
        "mode": "bridge", "bridge": "edge1", "isGateway": true,
        "stateDir": sd,
        "ipam": {"ranges": [[{"subnet": "10.77.0.0/24", "gateway": "10.77.0.1"}]]}
    });

    let cid = "9b0e77aa01";
    let args = format!(
        "IgnoreUnknown=true;K8S_POD_NAMESPACE=hil;K8S_POD_NAME=proxy-0;\
         K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID=uid-7;IgnoreUnknown=1;\
         K8S_POD_NAMESPACE=hil;K8S_POD_NAME=proxy-0;K8S_POD_INFRA_CONTAINER_ID={cid};\
         K8S_POD_UID=uid-7"
    );
    let cni_path = "/nonexistent/bin:/usr/lib/cni:/nonexistent/bin:/usr/lib/cni:";
    let pod = lab.pod();
    let p = pod.path();
    let call = |cmd: &'static str, ifname: &'static str| {
        let mut c = Call::new(cmd, cid, Some(&p), ifname).args(&args);
        c.path = cni_path;
        c
    };

    let r1 = call("ADD", "net1").run(&lab.node, &nad1).ok();
    let r2 = call("ADD", "net2").run(&lab.node, &nad2).ok();
    let r3 = call("ADD", "net3").run(&lab.node, &nad3).ok();
    assert_eq!(r1["ips"][0]["address"], "172.31.250.100/24");
    assert_eq!(r2["ips"][0]["address"], "172.31.251.50/24");
    assert_eq!(r2["interfaces"].as_array().unwrap().len(), 1);
    assert_eq!(r2["ips"][0]["interface"], 0);
    assert_eq!(r3["ips"][0]["address"], "10.77.0.2/24");
    assert_eq!(r3["ips"][0]["version"], "4");
    assert_eq!(pod.links_sorted(), vec!["lo", "net1", "net2", "net3"]);
    assert!(lab.node.has_link("edge0") && lab.node.has_link("edge1"));
    assert_eq!(lab.node.master_of("uplink0").as_deref(), Some("edge0"));
    assert_eq!(lab.node.master_of("uplink1"), None);
    assert!(tcp_reachable(&pod, DEVICE_V4, 9));
    assert!(tcp_reachable(&pod, "172.31.251.10", 9));
    // The gateway on the node answers ICMP, nothing new else (isGateway's
    // guard, review3_segment.rs).
    assert!(icmp_reachable(&pod, "10.77.0.1"));
    assert!(!tcp_reachable(&pod, "10.77.0.1", 9));
    assert!(hl_dir.join("lab-b/172.31.251.50").exists());
    let mut recs = lab.records_sorted();
    recs.sort();
    assert_eq!(
        recs,
        vec![
            format!("{cid}_net1.json"),
            format!("{cid}_net2.json"),
            format!("{cid}_net3.json")
        ]
    );
    // The duplicated keys did not confuse the record.
    let rec: Value = serde_json::from_slice(
        &std::fs::read(
            lab.state
                .path()
                .join(format!("attachments/{cid}_net2.json")),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(rec["podNamespace"], "hil");
    assert_eq!(rec["podName"], "proxy-0");
    assert_eq!(rec["podUid"], "uid-7");
    assert_eq!(rec["network"], "lab-b");
    for (ifname, nad, r) in [
        ("net1", &nad1, &r1),
        ("net2", &nad2, &r2),
        ("net3", &nad3, &r3),
    ] {
        if nad["cniVersion"] != "0.3.1" {
            call("CHECK", ifname)
                .run(&lab.node, &with_prev(nad, r))
                .ok_empty();
        }
    }

    // Detach NAD 2 only (Multus deletes in reverse order, one by one).
    call("DEL", "net2")
        .run(&lab.node, &with_prev(&nad2, &r2))
        .ok_empty();
    assert_eq!(pod.links_sorted(), vec!["lo", "net1", "net3"]);
    assert!(!hl_dir.join("lab-b/172.31.251.50").exists());
    assert_eq!(
        lab.reserved_all(),
        vec!["isolated/10.77.0.2", "plant-floor/172.31.250.100"]
    );
    assert!(tcp_reachable(&pod, DEVICE_V4, 9));
    assert!(icmp_reachable(&pod, "10.77.0.1"));
    call("CHECK", "net1")
        .run(&lab.node, &with_prev(&nad1, &r1))
        .ok_empty();

    // Then NAD 1: NAD 3 still works.
    call("DEL", "net1")
        .run(&lab.node, &with_prev(&nad1, &r1))
        .ok_empty();
    assert_eq!(pod.links_sorted(), vec!["lo", "net3"]);
    assert_eq!(lab.reserved_all(), vec!["isolated/10.77.0.2"]);
    assert_eq!(lab.records(), vec![format!("{cid}_net3.json")]);
    assert!(icmp_reachable(&pod, "10.77.0.1"));

    call("DEL", "net3")
        .run(&lab.node, &with_prev(&nad3, &r3))
        .ok_empty();
    assert_all_released(&lab, Some(&pod));
    // Multus may repeat the whole DEL sequence (pod deleted while stopping).
    for (ifname, nad) in [("net2", &nad2), ("net1", &nad1), ("net3", &nad3)] {
        call("DEL", ifname).run(&lab.node, nad).ok_empty();
    }
}

#[test]
fn repeated_cni_args_keys_take_the_last_value() {
    let lab = Lab::new();
    let pod = lab.pod();
    let conf = lab.bridge_conf("1.0.0");
    // Unknown keys, empty segments, a segment without '=', and a key given
    // twice: ADD succeeds, the last value wins.
    let args = "IgnoreUnknown=1;;FOO=bar;K8S_POD_NAME=first;;novalue;\
                K8S_POD_NAMESPACE=hil;IgnoreUnknown=true;K8S_POD_NAME=second;";
    Call::new("ADD", "args1", Some(&pod.path()), "net1")
        .args(args)
        .run(&lab.node, &conf)
        .ok();
    let rec: Value = serde_json::from_slice(
        &std::fs::read(lab.state.path().join("attachments/args1_net1.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(rec["podName"], "second");
    assert_eq!(rec["podNamespace"], "hil");
    Call::new("DEL", "args1", Some(&pod.path()), "net1")
        .args(args)
        .run(&lab.node, &conf)
        .ok_empty();

    // Unknown keys without IgnoreUnknown are ignored too (documented).
    let pod2 = lab.pod();
    Call::new("ADD", "args2", Some(&pod2.path()), "net1")
        .args("K8S_POD_NAME=x;SOMETHING_NEW=1")
        .run(&lab.node, &conf)
        .ok();
    Call::new("DEL", "args2", None, "net1")
        .run(&lab.node, &conf)
        .ok_empty();
    assert_all_released(&lab, Some(&pod2));
    assert_all_released(&lab, Some(&pod));
}

#[test]
fn multus_del_from_cache_with_a_stripped_config() {
    // multus#755: the cached config Multus hands to DEL may have lost
    // everything but the basics. stateDir is kept: it locates the store.
    for i in 0..3 {
        // One lab per case: a bridge port cannot also carry macvlans.
        let lab = Lab::new();
        let sd = lab.state_dir();
        let (conf, stripped) = match i {
            0 => (
                lab.bridge_conf("1.0.0"),
                json!({"cniVersion": "1.0.0", "name": NET, "type": "edgelink", "stateDir": sd}),
            ),
            1 => (
                lab.macvlan_conf("0.3.1"),
                json!({"cniVersion": "0.3.1", "name": NET, "type": "edgelink", "stateDir": sd}),
            ),
            // Even without the network name (every network's store is searched).
            _ => (
                lab.bridge_conf("1.1.0"),
                json!({"cniVersion": "1.1.0", "type": "edgelink", "stateDir": sd}),
            ),
        };
        let pod = lab.pod();
        let cid = format!("strip{i}");
        let args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=hil;K8S_POD_NAME=proxy-0";
        let r = Call::new("ADD", &cid, Some(&pod.path()), "net1")
            .args(args)
            .run(&lab.node, &conf)
            .ok();
        assert_eq!(lab.reserved(NET).len(), 1);
        assert_eq!(lab.records().len(), 1);
        let addr = r["ips"][0]["address"].as_str().unwrap().to_string();

        Call::new("DEL", &cid, Some(&pod.path()), "net1")
            .args(args)
            .run(&lab.node, &stripped)
            .ok_empty();
        assert_all_released(&lab, Some(&pod));
        // The pod, recreated, gets its address back (sticky by namespace and
        // name): it really was released.
        let pod2 = lab.pod();
        let r2 = Call::new("ADD", &format!("{cid}b"), Some(&pod2.path()), "net1")
            .args(args)
            .run(&lab.node, &conf)
            .ok();
        assert_eq!(r2["ips"][0]["address"], addr.as_str());
        Call::new("DEL", &format!("{cid}b"), None, "net1")
            .run(&lab.node, &stripped)
            .ok_empty();
        assert_all_released(&lab, Some(&pod2));
    }

    // A stripped DEL also releases a delegated IPAM reservation: the record
    // remembers the full config.
    let lab = Lab::new();
    let sd = lab.state_dir();
    let mut conf = lab.bridge_conf("1.0.0");
    let hl = lab.state.path().join("host-local");
    conf["ipam"] = json!({"type": "host-local", "dataDir": hl,
        "ranges": [[{"subnet": "172.31.250.0/24", "rangeStart": "172.31.250.160",
                     "rangeEnd": "172.31.250.170"}]]});
    let pod = lab.pod();
    Call::new("ADD", "stripd", Some(&pod.path()), "net1")
        .run(&lab.node, &conf)
        .ok();
    assert!(hl.join(format!("{NET}/172.31.250.160")).exists());
    Call::new("DEL", "stripd", Some(&pod.path()), "net1")
        .run(
            &lab.node,
            &json!({"cniVersion": "1.0.0", "name": NET, "type": "edgelink", "stateDir": sd}),
        )
        .ok_empty();
    assert!(!hl.join(format!("{NET}/172.31.250.160")).exists());
    assert_all_released(&lab, Some(&pod));
}

#[test]
fn podman_version_probe() {
    let lab = Lab::new();
    let all = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
    // libcni's GetVersionInfo: dummy environment, the conflist's version.
    let dummy = || {
        let mut c = Call::new("VERSION", "dummy", Some("dummy"), "dummy");
        c.path = "dummy";
        c
    };
    for v in all {
        let out = dummy().run(&lab.node, &json!({"cniVersion": v}));
        let j = out.ok();
        assert_eq!(out.stdout.trim().lines().count(), 1, "{}", out.stdout);
        let supported: Vec<&str> = j["supportedVersions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        for w in all {
            assert!(supported.contains(&w), "{w} missing from {j}");
        }
        assert_eq!(j["cniVersion"], v, "{j}");
    }
    // No config at all (empty stdin), and a bare environment.
    for out in [
        dummy().run_raw(&lab.node, b""),
        Call::new("VERSION", "", None, "").run_unset(
            &lab.node,
            &[
                "CNI_CONTAINERID",
                "CNI_NETNS",
                "CNI_IFNAME",
                "CNI_ARGS",
                "CNI_PATH",
            ],
            b"",
        ),
    ] {
        let j = out.ok();
        assert_eq!(j["cniVersion"], "1.1.0", "{j}");
        assert_eq!(j["supportedVersions"].as_array().unwrap().len(), all.len());
    }
    // VERSION never touches the node or a state directory.
    assert!(lab.node_extra_links(&[]).is_empty());
    assert!(lab.reserved_all().is_empty());
}

#[test]
fn prev_result_of_a_conflist_chain_is_kept_and_rebased() {
    for i in 0..2 {
        let lab = Lab::new();
        let _d = lab.daemon();
        let conf = if i == 0 {
            lab.bridge_conf("1.0.0")
        } else {
            lab.macvlan_conf("1.0.0")
        };
        let pod = lab.pod();
        let cid = format!("chain{i}");
        // What a previous plugin in the conflist (the primary network) gave.
        let prev = json!({
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "mac": "0a:58:0a:f4:01:05", "sandbox": pod.path()}],
            "ips": [{"address": "10.244.1.5/24", "gateway": "10.244.1.1", "interface": 0}],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.244.1.1"}],
            "dns": {"nameservers": ["10.96.0.10"], "search": ["hil.svc.cluster.local"]}
        });
        let r = Call::new("ADD", &cid, Some(&pod.path()), "net1")
            .run(&lab.node, &with_prev(&conf, &prev))
            .ok();
        let ifs = r["interfaces"].as_array().unwrap();
        assert_eq!(ifs[0], prev["interfaces"][0], "{r}");
        let net1 = ifs.iter().position(|i| i["name"] == "net1").unwrap();
        assert_eq!(net1, ifs.len() - 1);
        assert_eq!(net1, if i == 0 { 3 } else { 1 });
        assert_eq!(ifs[net1]["sandbox"], pod.path());
        let ips = r["ips"].as_array().unwrap();
        assert_eq!(ips.len(), 2, "{r}");
        assert_eq!(ips[0], prev["ips"][0]);
        assert_eq!(ips[1]["address"], "172.31.250.100/24");
        assert_eq!(ips[1]["interface"], net1);
        let routes = r["routes"].as_array().unwrap();
        assert_eq!(routes[0], prev["routes"][0]);
        assert!(routes.contains(&json!({"dst": "172.30.0.0/16", "gw": "172.31.250.1"})));
        assert_eq!(r["dns"], prev["dns"]);
        // Only edgelink's interface was made.
        assert_eq!(pod.links_sorted(), vec!["lo", "net1"]);
        // The chained Result is what CHECK and DEL get back.
        Call::new("CHECK", &cid, Some(&pod.path()), "net1")
            .run(&lab.node, &with_prev(&conf, &r))
            .ok_empty();
        Call::new("DEL", &cid, Some(&pod.path()), "net1")
            .run(&lab.node, &with_prev(&conf, &r))
            .ok_empty();
        assert_all_released(&lab, Some(&pod));
    }
}

#[test]
fn status() {
    let lab = Lab::new();
    let bare = ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS"];
    let status = |conf: &Value| {
        Call::new("STATUS", "", None, "").run_unset(&lab.node, &bare, conf.to_string().as_bytes())
    };
    let node_before = lab.node.links_sorted();

    for conf in [lab.bridge_conf("1.1.0"), lab.macvlan_conf("1.1.0")] {
        status(&conf).ok_empty();
        // STATUS needs 1.1.0.
        let mut old = conf.clone();
        old["cniVersion"] = json!("1.0.0");
        let (code, msg) = status(&old).err();
        assert_eq!(code, 1, "{msg}");
        assert!(msg.contains("STATUS") && msg.contains("1.0.0"), "{msg}");
        // The uplink is missing: not ready, and named.
        let mut c = conf.clone();
        c["uplink"] = json!("uplink9");
        let (code, msg) = status(&c).err();
        assert_eq!(code, 50, "{msg}");
        assert!(msg.contains("uplink") && msg.contains("uplink9"), "{msg}");
    }
    // A state directory that cannot be created.
    let mut c = lab.bridge_conf("1.1.0");
    c["stateDir"] = json!("/proc/edgelink-status-test");
    let (code, msg) = status(&c).err();
    assert_eq!(code, 50, "{msg}");
    assert!(
        msg.contains("stateDir") && msg.contains("/proc/edgelink-status-test"),
        "{msg}"
    );
    // A delegated IPAM that is missing from CNI_PATH is not ready either.
    let mut c = lab.bridge_conf("1.1.0");
    c["ipam"] = json!({"type": "no-such-ipam", "ranges": [[{"subnet": "172.31.250.0/24"}]]});
    c.as_object_mut().unwrap().remove("forwards");
    let (code, msg) = status(&c).err();
    assert_eq!(code, 50, "{msg}");
    assert!(msg.contains("no-such-ipam"), "{msg}");

    // The uplink itself going away turns a ready network into a not-ready one.
    let conf = lab.macvlan_conf("1.1.0");
    status(&conf).ok_empty();
    lab.node.ip(&["link", "del", "uplink0"]);
    let (code, msg) = status(&conf).err();
    assert_eq!(code, 50, "{msg}");
    assert!(msg.contains("uplink0"), "{msg}");

    // STATUS changed nothing on the node.
    let now: Vec<String> = lab.node.links_sorted();
    let expected: Vec<String> = node_before.into_iter().filter(|l| l != "uplink0").collect();
    assert_eq!(now, expected);
    assert!(lab.reserved_all().is_empty());
    assert!(lab.records().is_empty());
}

#[test]
fn logs_go_to_stderr_or_log_file_never_to_stdout() {
    let lab = Lab::new();
    let pod = lab.pod();
    let p = pod.path();
    let mut conf = lab.bridge_conf("1.0.0");
    conf["logLevel"] = json!("debug");

    // stderr by default: stdout is exactly one JSON document.
    let out = Call::new("ADD", "log1", Some(&p), "net1").run(&lab.node, &conf);
    let r = out.ok();
    assert_eq!(out.stdout.trim().lines().count(), 1, "{}", out.stdout);
    assert!(out.stderr.contains("addresses reserved"), "{}", out.stderr);
    Call::new("DEL", "log1", Some(&p), "net1")
        .run(&lab.node, &with_prev(&conf, &r))
        .ok_empty();

    // logFile: stderr stays quiet, the file gets the stages and errors.
    // The file must lie in the allowed directory (EDGELINK_LOG_DIR).
    let log = lab.state.path().join("edgelink.log");
    let log_dir = lab.state_dir();
    fn in_dir<'a>(mut c: Call<'a>, dir: &'a str) -> Call<'a> {
        c.extra_env.push(("EDGELINK_LOG_DIR", dir));
        c
    }
    let with_dir = |c| in_dir(c, &log_dir);
    conf["logFile"] = json!(log.display().to_string());
    let out = with_dir(Call::new("ADD", "log2", Some(&p), "net1")).run(&lab.node, &conf);
    out.ok();
    assert!(out.stderr.trim().is_empty(), "{}", out.stderr);
    let mut bad = conf.clone();
    bad["mode"] = json!("nope");
    let (code, _) = with_dir(Call::new("ADD", "log3", Some(&p), "net2"))
        .run(&lab.node, &bad)
        .err();
    assert_eq!(code, 7);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("record written"), "{text}");
    assert!(text.contains("nope"), "{text}");
    with_dir(Call::new("DEL", "log2", Some(&p), "net1"))
        .run(&lab.node, &conf)
        .ok_empty();
}
