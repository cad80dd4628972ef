//! Bad input: every failure gives the documented code (docs/configuration.md),
//! a message naming what is wrong, and leaves nothing behind — no link in the
//! node or the pod, no reservation, no record. The DEL a runtime sends after
//! every failed ADD succeeds and leaves the same state.

use edgelink_tests::*;
use serde_json::{json, Value};

const NET: &str = "plant-floor";

/// Everything a failed ADD could leave behind.
#[derive(Debug, PartialEq, Eq)]
struct State {
    node_links: Vec<String>,
    pod_links: Vec<Vec<String>>,
    reserved: Vec<String>,
    records: Vec<String>,
    uplink_master: Option<String>,
    uplink_addrs: Vec<String>,
}

fn state(lab: &Lab, pods: &[&Netns]) -> State {
    State {
        node_links: lab.node.links_sorted(),
        pod_links: pods.iter().map(|p| p.links_sorted()).collect(),
        reserved: lab.reserved_all(),
        records: lab.records_sorted(),
        uplink_master: lab.node.master_of("uplink0"),
        uplink_addrs: lab.node.addrs("uplink0"),
    }
}

/// Check a failure: exit status, code, every needle in the message, and an
/// unchanged state.
fn expect_err(
    out: &CniOutput,
    code: u64,
    needles: &[&str],
    lab: &Lab,
    pods: &[&Netns],
    before: &State,
) -> String {
    let (c, msg) = out.err();
    assert_eq!(c, code, "wrong code for: {msg}\nstderr: {}", out.stderr);
    for n in needles {
        assert!(msg.contains(n), "message does not name {n:?}: {msg}");
    }
    assert!(
        out.stdout.trim().lines().count() == 1,
        "stdout must hold exactly the error JSON: {:?}",
        out.stdout
    );
    assert_eq!(
        &state(lab, pods),
        before,
        "a failed ADD left something behind"
    );
    msg
}

/// The DEL a runtime sends after the failed ADD: succeeds, changes nothing.
fn del_after(
    lab: &Lab,
    pods: &[&Netns],
    before: &State,
    cid: &str,
    netns: Option<&str>,
    conf: &Value,
) {
    Call::new("DEL", cid, netns, "net1")
        .run(&lab.node, conf)
        .ok_empty();
    assert_eq!(
        &state(lab, pods),
        before,
        "DEL after a failed ADD changed the state"
    );
}

#[test]
fn environment_errors_are_code_4() {
    let lab = Lab::new();
    let pod = lab.pod();
    let pods = [&pod];
    let conf = lab.bridge_conf("1.0.0");
    let body = conf.to_string();
    let p = pod.path();
    let before = state(&lab, &pods);

    for (var, needle) in [
        ("CNI_COMMAND", "CNI_COMMAND"),
        ("CNI_CONTAINERID", "CNI_CONTAINERID"),
        ("CNI_IFNAME", "CNI_IFNAME"),
        ("CNI_NETNS", "CNI_NETNS"),
    ] {
        // Unset altogether...
        let out = Call::new("ADD", "env1", Some(&p), "net1").run_unset(
            &lab.node,
            &[var],
            body.as_bytes(),
        );
        expect_err(&out, 4, &[needle], &lab, &pods, &before);
        // ...and set but empty.
        let mut call = Call::new("ADD", "env1", Some(&p), "net1");
        match var {
            "CNI_COMMAND" => call.command = "",
            "CNI_CONTAINERID" => call.container_id = "",
            "CNI_IFNAME" => call.ifname = "",
            _ => call.netns = None,
        }
        let out = call.run(&lab.node, &conf);
        expect_err(&out, 4, &[needle], &lab, &pods, &before);
        del_after(&lab, &pods, &before, "env1", Some(&p), &conf);
    }

    // An unknown command is named.
    let out = Call::new("ATTACH", "env2", Some(&p), "net1").run(&lab.node, &conf);
    expect_err(&out, 4, &["CNI_COMMAND", "ATTACH"], &lab, &pods, &before);
    let out = Call::new("add", "env2", Some(&p), "net1").run(&lab.node, &conf);
    expect_err(&out, 4, &["CNI_COMMAND", "\"add\""], &lab, &pods, &before);
    del_after(&lab, &pods, &before, "env2", Some(&p), &conf);

    // Invalid interface names: too long, with '/', with ':' (alias syntax).
    for bad in ["averyverylongname", "net/1", "net1:0", ".."] {
        let out = Call::new("ADD", "env3", Some(&p), bad).run(&lab.node, &conf);
        let msg = expect_err(&out, 4, &["CNI_IFNAME", bad], &lab, &pods, &before);
        assert!(!msg.is_empty());
        // DEL with the same bad name is refused the same way (it cannot name
        // anything edgelink made), not a crash.
        let (code, msg) = Call::new("DEL", "env3", Some(&p), bad)
            .run(&lab.node, &conf)
            .err();
        assert_eq!(code, 4, "{msg}");
    }
    del_after(&lab, &pods, &before, "env3", Some(&p), &conf);

    // A container ID that could escape the state directory.
    let out = Call::new("ADD", "../../etc", Some(&p), "net1").run(&lab.node, &conf);
    expect_err(
        &out,
        4,
        &["CNI_CONTAINERID", "../../etc"],
        &lab,
        &pods,
        &before,
    );
    assert!(!std::path::Path::new("/etc_net1.json").exists());
}

#[test]
fn stdin_errors() {
    let lab = Lab::new();
    let pod = lab.pod();
    let pods = [&pod];
    let p = pod.path();
    let good = lab.bridge_conf("1.0.0");
    let before = state(&lab, &pods);
    let add = |stdin: &[u8]| Call::new("ADD", "in1", Some(&p), "net1").run_raw(&lab.node, stdin);

    // Not JSON at all; truncated JSON; empty stdin.
    for body in [&b"{not json"[..], &good.to_string().as_bytes()[..40], b""] {
        let out = add(body);
        expect_err(&out, 6, &["not valid JSON"], &lab, &pods, &before);
        // A DEL with the same garbage cannot be decoded either: code 6 too.
        let out = Call::new("DEL", "in1", Some(&p), "net1").run_raw(&lab.node, body);
        assert_eq!(out.err().0, 6);
    }
    // JSON, but not an object.
    for body in [
        json!([good.clone()]),
        json!("edgelink"),
        json!(42),
        json!(null),
    ] {
        let out = add(body.to_string().as_bytes());
        expect_err(&out, 6, &["not a JSON object"], &lab, &pods, &before);
    }
    del_after(&lab, &pods, &before, "in1", Some(&p), &good);

    // Versions the plugin does not speak: code 1, naming the version, and
    // the error JSON is stamped with the version the caller spoke.
    for v in ["0.2.0", "9.9.9", "0.1.0", "1.0"] {
        let mut c = good.clone();
        c["cniVersion"] = json!(v);
        let out = add(c.to_string().as_bytes());
        expect_err(&out, 1, &[v], &lab, &pods, &before);
        assert_eq!(out.json()["cniVersion"], v, "{}", out.stdout);
        // DEL refuses the version the same way.
        let out = Call::new("DEL", "in1", Some(&p), "net1").run(&lab.node, &c);
        assert_eq!(out.err().0, 1);
    }
    let mut c = good.clone();
    c.as_object_mut().unwrap().remove("cniVersion");
    expect_err(
        &add(c.to_string().as_bytes()),
        7,
        &["cniVersion"],
        &lab,
        &pods,
        &before,
    );
    del_after(&lab, &pods, &before, "in1", Some(&p), &good);

    // Missing or invalid name / type.
    let mut c = good.clone();
    c.as_object_mut().unwrap().remove("name");
    expect_err(
        &add(c.to_string().as_bytes()),
        7,
        &["name"],
        &lab,
        &pods,
        &before,
    );
    // The runtime's DEL with the same (nameless) config still succeeds.
    del_after(&lab, &pods, &before, "in1", Some(&p), &c);
    c["name"] = json!("bad name!");
    expect_err(
        &add(c.to_string().as_bytes()),
        7,
        &["name", "bad name!"],
        &lab,
        &pods,
        &before,
    );
    del_after(&lab, &pods, &before, "in1", Some(&p), &c);
    let mut c = good.clone();
    c["type"] = json!("bridge");
    expect_err(
        &add(c.to_string().as_bytes()),
        7,
        &["type", "bridge"],
        &lab,
        &pods,
        &before,
    );
    del_after(&lab, &pods, &before, "in1", Some(&p), &c);

    // An undecodable prevResult is a decode failure.
    let mut c = good.clone();
    c["prevResult"] = json!({"ips": [{"address": "not-an-ip"}]});
    expect_err(
        &add(c.to_string().as_bytes()),
        6,
        &["prevResult"],
        &lab,
        &pods,
        &before,
    );
    del_after(&lab, &pods, &before, "in1", Some(&p), &good);
}

#[test]
fn config_errors_are_code_7_and_name_field_and_value() {
    let lab = Lab::new();
    let pod = lab.pod();
    let pods = [&pod];
    let p = pod.path();
    let before = state(&lab, &pods);
    let base = lab.bridge_conf("1.0.0");

    type Edit = fn(&mut Value);
    let cases: Vec<(&str, Edit, Vec<&str>)> = vec![
        (
            "unknown mode",
            |c| c["mode"] = json!("ipvlan"),
            vec!["mode", "ipvlan"],
        ),
        (
            "overlapping ranges",
            |c| {
                c["ipam"]["ranges"] = json!([
                    [{"subnet": "172.31.250.0/24", "rangeStart": "172.31.250.100", "rangeEnd": "172.31.250.150"}],
                    [{"subnet": "172.31.250.0/24", "rangeStart": "172.31.250.140", "rangeEnd": "172.31.250.160"}]
                ])
            },
            vec!["ipam.ranges[1][0]", "overlaps", "ipam.ranges[0][0]"],
        ),
        (
            "rangeStart outside the subnet",
            |c| c["ipam"]["ranges"][0][0]["rangeStart"] = json!("10.0.0.5"),
            vec![
                "ipam.ranges[0][0].rangeStart",
                "10.0.0.5",
                "172.31.250.0/24",
            ],
        ),
        (
            "rangeEnd before rangeStart",
            |c| c["ipam"]["ranges"][0][0]["rangeEnd"] = json!("172.31.250.50"),
            vec!["rangeEnd", "172.31.250.50"],
        ),
        (
            "missing uplink",
            |c| c["uplink"] = json!("nosuch0"),
            vec!["uplink", "nosuch0"],
        ),
        (
            "target outside the subnets",
            |c| c["forwards"][1]["target"] = json!("10.9.9.9:5000"),
            vec!["forwards[1].target", "10.9.9.9:5000"],
        ),
        (
            "target outside explicit allowedTargets",
            |c| c["allowedTargets"] = json!(["172.31.250.128/25"]),
            vec!["forwards[0].target", "172.31.250.10:8080", "allowedTargets"],
        ),
        (
            "mtu above the uplink's",
            |c| c["mtu"] = json!(9000),
            vec!["mtu", "9000", "1500", "uplink0"],
        ),
        (
            "bad runtimeConfig.mac",
            |c| {
                c["capabilities"] = json!({"mac": true});
                c["runtimeConfig"] = json!({"mac": "02:00:zz:00:00:01"});
            },
            vec!["runtimeConfig.mac", "02:00:zz:00:00:01"],
        ),
        (
            "multicast runtimeConfig.mac",
            |c| {
                c["capabilities"] = json!({"mac": true});
                c["runtimeConfig"] = json!({"mac": "01:00:5e:00:00:01"});
            },
            vec!["runtimeConfig.mac", "01:00:5e:00:00:01", "multicast"],
        ),
        (
            "bad mac key",
            |c| c["mac"] = json!("nonsense"),
            vec!["mac", "nonsense"],
        ),
        (
            "macvlan without uplink",
            |c| {
                c["mode"] = json!("macvlan");
                c.as_object_mut().unwrap().remove("uplink");
                c.as_object_mut().unwrap().remove("bridge");
            },
            vec!["uplink", "macvlan"],
        ),
        (
            "macvlan with a missing uplink",
            |c| {
                c["mode"] = json!("macvlan");
                c.as_object_mut().unwrap().remove("bridge");
                c["uplink"] = json!("gone0");
            },
            vec!["uplink", "gone0"],
        ),
        (
            "unknown macvlanMode",
            |c| {
                c["mode"] = json!("macvlan");
                c.as_object_mut().unwrap().remove("bridge");
                c["macvlanMode"] = json!("source");
            },
            vec!["macvlanMode", "source"],
        ),
        (
            "bridge name too long",
            |c| c["bridge"] = json!("edge0-much-too-long"),
            vec!["bridge", "edge0-much-too-long"],
        ),
        (
            "forward name not a port name",
            |c| c["forwards"][0]["name"] = json!("API_Port"),
            vec!["forwards[0].name", "API_Port"],
        ),
    ];
    for (what, edit, needles) in cases {
        let mut c = base.clone();
        edit(&mut c);
        let out = Call::new("ADD", "cfg1", Some(&p), "net1").run(&lab.node, &c);
        let (code, msg) = out.err();
        assert_eq!(code, 7, "{what}: {msg}");
        for n in &needles {
            assert!(
                msg.contains(n),
                "{what}: message does not name {n:?}: {msg}"
            );
        }
        assert_eq!(state(&lab, &pods), before, "{what}: left something behind");
        // The runtime's DEL carries the same config.
        del_after(&lab, &pods, &before, "cfg1", Some(&p), &c);
    }
    // The bad MAC from CNI_ARGS is named as such.
    let out = Call::new("ADD", "cfg2", Some(&p), "net1")
        .args("IgnoreUnknown=1;MAC=02:00:00:00:00")
        .run(&lab.node, &base);
    expect_err(
        &out,
        7,
        &["CNI_ARGS MAC", "02:00:00:00:00"],
        &lab,
        &pods,
        &before,
    );
    del_after(&lab, &pods, &before, "cfg2", Some(&p), &base);
    assert!(!lab.node.has_link("edge0"));
}

#[test]
fn uplink_with_addresses_is_refused_and_left_alone() {
    let lab = Lab::new();
    let pod = lab.pod();
    let pods = [&pod];
    let p = pod.path();
    lab.node
        .ip(&["addr", "add", "172.31.250.2/24", "dev", "uplink0"]);
    let routes_before = lab.node.ip(&["route", "show"]);
    let before = state(&lab, &pods);
    assert_eq!(before.uplink_addrs, vec!["172.31.250.2/24"]);
    let conf = lab.bridge_conf("1.0.0");
    let out = Call::new("ADD", "up1", Some(&p), "net1").run(&lab.node, &conf);
    // The failed ADD created edge0 before it looked at the uplink's
    // addresses: the rollback must have removed it again.
    let msg = expect_err(
        &out,
        7,
        &[
            "uplink",
            "uplink0",
            "172.31.250.2/24",
            "moveUplinkAddresses",
        ],
        &lab,
        &pods,
        &before,
    );
    assert!(!lab.node.has_link("edge0"), "{msg}");
    assert_eq!(lab.node.master_of("uplink0"), None);
    assert_eq!(lab.node.addrs("uplink0"), vec!["172.31.250.2/24"]);
    assert_eq!(lab.node.ip(&["route", "show"]), routes_before);
    // The node still reaches the device over its uplink.
    assert!(tcp_reachable(&lab.node, DEVICE_V4, 9));
    del_after(&lab, &pods, &before, "up1", Some(&p), &conf);
    assert_eq!(lab.node.addrs("uplink0"), vec!["172.31.250.2/24"]);
}

#[test]
fn failure_after_the_bridge_was_created_removes_it() {
    // A requested address outside the ranges fails only in IPAM, after
    // edge0 was created, uplink0 enslaved and the veth made: all undone.
    let lab = Lab::new();
    let pod = lab.pod();
    let pods = [&pod];
    let p = pod.path();
    let conf = lab.bridge_conf("1.0.0");
    let before = state(&lab, &pods);
    let out = Call::new("ADD", "late1", Some(&p), "net1")
        .args("IgnoreUnknown=1;IP=172.31.250.200")
        .run(&lab.node, &conf);
    expect_err(&out, 103, &["172.31.250.200"], &lab, &pods, &before);
    assert!(!lab.node.has_link("edge0"));
    assert_eq!(lab.node.master_of("uplink0"), None);
    del_after(&lab, &pods, &before, "late1", Some(&p), &conf);
}

#[test]
fn exhausted_pool_keeps_earlier_attachments() {
    let lab = Lab::new();
    let _d = lab.daemon();
    let pods: Vec<Netns> = (0..3).map(|_| lab.pod()).collect();
    let refs: Vec<&Netns> = pods.iter().collect();
    let mut conf = lab.bridge_conf("1.0.0");
    conf["ipam"]["ranges"] = json!([[{"subnet": "172.31.250.0/24",
        "rangeStart": "172.31.250.100", "rangeEnd": "172.31.250.101",
        "gateway": "172.31.250.1"}]]);
    let mut results = Vec::new();
    for (i, pod) in pods.iter().take(2).enumerate() {
        let r = Call::new("ADD", &format!("ex{i}"), Some(&pod.path()), "net1")
            .run(&lab.node, &conf)
            .ok();
        results.push(r);
    }
    assert_eq!(lab.reserved(NET), vec!["172.31.250.100", "172.31.250.101"]);
    let before = state(&lab, &refs);
    let macs: Vec<String> = pods[..2].iter().map(|p| p.mac("net1")).collect();

    let p3 = pods[2].path();
    let out = Call::new("ADD", "ex2", Some(&p3), "net1").run(&lab.node, &conf);
    expect_err(
        &out,
        102,
        &[NET, "172.31.250.100-172.31.250.101"],
        &lab,
        &refs,
        &before,
    );
    del_after(&lab, &refs, &before, "ex2", Some(&p3), &conf);

    // The two earlier attachments are intact and still work.
    for (i, pod) in pods.iter().take(2).enumerate() {
        assert_eq!(pod.mac("net1"), macs[i]);
        assert_eq!(
            pod.addrs("net1"),
            vec![results[i]["ips"][0]["address"]
                .as_str()
                .unwrap()
                .to_string()]
        );
        assert!(tcp_reachable(pod, DEVICE_V4, 9));
        Call::new("CHECK", &format!("ex{i}"), Some(&pod.path()), "net1")
            .run(&lab.node, &with_prev(&conf, &results[i]))
            .ok_empty();
    }

    // Freeing one address makes the third ADD succeed.
    Call::new("DEL", "ex0", Some(&pods[0].path()), "net1")
        .run(&lab.node, &conf)
        .ok_empty();
    let r = Call::new("ADD", "ex2", Some(&p3), "net1")
        .run(&lab.node, &conf)
        .ok();
    assert_eq!(r["ips"][0]["address"], "172.31.250.100/24");
}

#[test]
fn requested_ip_already_taken_is_103() {
    let lab = Lab::new();
    let _d = lab.daemon();
    let p1 = lab.pod();
    let p2 = lab.pod();
    let pods = [&p1, &p2];
    let conf = lab.bridge_conf("1.0.0");
    let r1 = Call::new("ADD", "rq1", Some(&p1.path()), "net1")
        .run(&lab.node, &conf)
        .ok();
    assert_eq!(r1["ips"][0]["address"], "172.31.250.100/24");
    let before = state(&lab, &pods);
    let mac1 = p1.mac("net1");

    for args in [
        "IgnoreUnknown=1;IP=172.31.250.100",
        "IgnoreUnknown=1;IP=172.31.250.100/24",
    ] {
        let out = Call::new("ADD", "rq2", Some(&p2.path()), "net1")
            .args(args)
            .run(&lab.node, &conf);
        expect_err(&out, 103, &["172.31.250.100", "rq1"], &lab, &pods, &before);
        // The runtime's DEL for the failed container must not release the
        // address the other container holds.
        del_after(&lab, &pods, &before, "rq2", Some(&p2.path()), &conf);
    }
    // The same through runtimeConfig.ips.
    let mut c = conf.clone();
    c["capabilities"] = json!({"ips": true});
    c["runtimeConfig"] = json!({"ips": ["172.31.250.100/24"]});
    let out = Call::new("ADD", "rq2", Some(&p2.path()), "net1").run(&lab.node, &c);
    expect_err(&out, 103, &["172.31.250.100"], &lab, &pods, &before);
    del_after(&lab, &pods, &before, "rq2", Some(&p2.path()), &c);

    assert_eq!(lab.reserved(NET), vec!["172.31.250.100"]);
    assert_eq!(p1.mac("net1"), mac1);
    assert_eq!(p1.addrs("net1"), vec!["172.31.250.100/24"]);
    Call::new("CHECK", "rq1", Some(&p1.path()), "net1")
        .run(&lab.node, &with_prev(&conf, &r1))
        .ok_empty();
}

#[test]
fn netns_that_is_not_a_netns_or_does_not_exist() {
    let lab = Lab::new();
    let pod = lab.pod();
    let pods = [&pod];
    let conf = lab.bridge_conf("1.0.0");
    let before = state(&lab, &pods);

    let out = Call::new("ADD", "ns1", Some("/etc/hostname"), "net1").run(&lab.node, &conf);
    expect_err(
        &out,
        4,
        &["CNI_NETNS", "/etc/hostname", "not a network namespace"],
        &lab,
        &pods,
        &before,
    );
    del_after(&lab, &pods, &before, "ns1", Some("/etc/hostname"), &conf);
    assert!(std::path::Path::new("/etc/hostname").exists());

    // /proc/self/ns/mnt is a namespace, but not a network namespace.
    let out = Call::new("ADD", "ns1", Some("/proc/self/ns/mnt"), "net1").run(&lab.node, &conf);
    expect_err(
        &out,
        4,
        &["CNI_NETNS", "/proc/self/ns/mnt"],
        &lab,
        &pods,
        &before,
    );

    let gone = format!("/var/run/netns/elkt-gone-{}", std::process::id());
    let out = Call::new("ADD", "ns2", Some(&gone), "net1").run(&lab.node, &conf);
    expect_err(
        &out,
        3,
        &["CNI_NETNS", &gone, "does not exist"],
        &lab,
        &pods,
        &before,
    );
    del_after(&lab, &pods, &before, "ns2", Some(&gone), &conf);

    // CHECK on a vanished netns is code 3 as well.
    let mut c = lab.bridge_conf("1.0.0");
    c["prevResult"] = json!({"cniVersion": "1.0.0", "interfaces": [], "ips": []});
    let out = Call::new("CHECK", "ns2", Some(&gone), "net1").run(&lab.node, &c);
    expect_err(&out, 3, &[&gone], &lab, &pods, &before);
}

#[test]
fn ifname_already_in_the_pod_is_101_and_untouched() {
    let lab = Lab::new();
    let pod = lab.pod();
    let pods = [&pod];
    let p = pod.path();
    // Like a primary network's eth0: a veth whose peer is not edgelink's.
    pod.ip(&[
        "link", "add", "net1", "type", "veth", "peer", "name", "other1",
    ]);
    pod.ip(&["link", "set", "net1", "address", "02:11:22:33:44:55"]);
    pod.ip(&["addr", "add", "10.99.0.1/24", "dev", "net1"]);
    pod.ip(&["link", "set", "net1", "up"]);
    let before = state(&lab, &pods);
    for conf in [lab.bridge_conf("1.0.0"), lab.macvlan_conf("1.0.0")] {
        let out = Call::new("ADD", "dup1", Some(&p), "net1").run(&lab.node, &conf);
        expect_err(&out, 101, &["net1", &p], &lab, &pods, &before);
        assert_eq!(pod.mac("net1"), "02:11:22:33:44:55");
        assert_eq!(pod.addrs("net1"), vec!["10.99.0.1/24"]);
        assert!(!lab.node.has_link("edge0"));
        // The runtime's DEL for the failed ADD must not take away an
        // interface edgelink did not make.
        del_after(&lab, &pods, &before, "dup1", Some(&p), &conf);
        assert_eq!(pod.mac("net1"), "02:11:22:33:44:55");
        assert_eq!(pod.addrs("net1"), vec!["10.99.0.1/24"]);
    }
}

/// An interface of the name that a DEL retired (its alias says so) and no
/// daemon deleted: ADD waits 2 s for it, then deletes it and goes on.
#[test]
fn a_retired_interface_of_the_same_name_is_replaced_after_2_s() {
    let lab = Lab::new();
    let pod = lab.pod();
    pod.ip(&[
        "link", "add", "net1", "type", "veth", "peer", "name", "other1",
    ]);
    pod.ip(&[
        "link",
        "set",
        "net1",
        "alias",
        edgelink_attachment::RETIRED_ALIAS,
    ]);
    let t = std::time::Instant::now();
    let r = Call::new("ADD", "re1", Some(&pod.path()), "net1")
        .run(&lab.node, &lab.bridge_conf("1.0.0"))
        .ok();
    assert!(
        t.elapsed() >= std::time::Duration::from_secs(2),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(r["ips"][0]["address"], "172.31.250.100/24");
    // The new net1 is edgelink's veth; the old pair is gone.
    assert!(!pod.has_link("other1"), "{:?}", pod.links());
    assert!(!pod.link_details("net1").contains("retired"));
    // Any other interface of the name still fails with 101 (above).
}

#[test]
fn macvlan_on_an_uplink_that_is_a_bridge_port_is_7() {
    // A bridge NAD enslaved uplink0 to edge0; a macvlan NAD on the same
    // uplink is a configuration conflict (the kernel would answer EBUSY).
    let lab = Lab::new();
    let p1 = lab.pod();
    let p2 = lab.pod();
    let pods = [&p1, &p2];
    Call::new("ADD", "br1", Some(&p1.path()), "net1")
        .run(&lab.node, &lab.bridge_conf("1.0.0"))
        .ok();
    assert_eq!(lab.node.master_of("uplink0").as_deref(), Some("edge0"));
    let before = state(&lab, &pods);
    let mut conf = lab.macvlan_conf("1.0.0");
    conf["name"] = json!("other-net");
    let out = Call::new("ADD", "mv1", Some(&p2.path()), "net1").run(&lab.node, &conf);
    expect_err(
        &out,
        7,
        &["uplink", "uplink0", "edge0"],
        &lab,
        &pods,
        &before,
    );
    del_after(&lab, &pods, &before, "mv1", Some(&p2.path()), &conf);
    assert!(tcp_reachable(&p1, DEVICE_V4, 9));
}

#[test]
fn a_second_add_for_a_live_attachment_is_101_and_changes_nothing() {
    // The same container ID and ifname again, after an ADD that completed
    // (not a retry after a crash): the live attachment stays as it is.
    for macvlan in [false, true] {
        let lab = Lab::new();
        let _d = lab.daemon();
        let pod = lab.pod();
        let pods = [&pod];
        let p = pod.path();
        let conf = if macvlan {
            lab.macvlan_conf("1.0.0")
        } else {
            lab.bridge_conf("1.0.0")
        };
        let r = Call::new("ADD", "twice", Some(&p), "net1")
            .run(&lab.node, &conf)
            .ok();
        let mac = pod.mac("net1");
        let before = state(&lab, &pods);
        let out = Call::new("ADD", "twice", Some(&p), "net1").run(&lab.node, &conf);
        expect_err(&out, 101, &["net1"], &lab, &pods, &before);
        assert_eq!(pod.mac("net1"), mac);
        assert!(tcp_reachable(&pod, DEVICE_V4, 9));
        Call::new("CHECK", "twice", Some(&p), "net1")
            .run(&lab.node, &with_prev(&conf, &r))
            .ok_empty();
        Call::new("DEL", "twice", Some(&p), "net1")
            .run(&lab.node, &conf)
            .ok_empty();
    }
}

#[test]
fn forward_bounds_out_of_range_are_code_7_naming_the_forward() {
    let lab = Lab::new();
    let pod = lab.pod();
    let pods = [&pod];
    let p = pod.path();
    let before = state(&lab, &pods);
    let base = lab.bridge_conf("1.0.0");
    assert_eq!(base["forwards"][0]["protocol"], "tcp");
    let name = base["forwards"][0]["name"].as_str().unwrap().to_string();
    for (key, value, needle) in [
        ("idleTimeoutMs", json!(500), "1000..=604800000"),
        ("idleTimeoutMs", json!("1h"), "1000..=604800000"),
        ("maxConnections", json!(0), "1..=1000000"),
    ] {
        let mut c = base.clone();
        c["forwards"][0][key] = value.clone();
        let out = Call::new("ADD", "fb1", Some(&p), "net1").run(&lab.node, &c);
        let (code, msg) = out.err();
        assert_eq!(code, 7, "{key}={value}: {msg}");
        for n in [
            &format!("forwards[0].{key}"),
            &format!("\"{name}\""),
            needle,
        ] {
            assert!(msg.contains(n), "{key}={value}: does not name {n:?}: {msg}");
        }
        assert_eq!(
            state(&lab, &pods),
            before,
            "{key}={value}: left something behind"
        );
        del_after(&lab, &pods, &before, "fb1", Some(&p), &c);
    }
    // In range, the record carries them for the daemon.
    let mut c = base.clone();
    c["forwards"][0]["idleTimeoutMs"] = json!(0);
    c["forwards"][0]["maxConnections"] = json!(3);
    Call::new("ADD", "fb2", Some(&p), "net1")
        .run(&lab.node, &c)
        .ok();
    // Found by content: the record's file name is the store's business.
    let rec: Value = std::fs::read_dir(lab.state.path().join("attachments"))
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path()).ok())
        .filter_map(|b| serde_json::from_slice::<Value>(&b).ok())
        .find(|r| r["containerId"] == "fb2")
        .expect("the record of fb2");
    assert_eq!(rec["forwards"][0]["idleTimeoutMs"], 0, "{rec:#}");
    assert_eq!(rec["forwards"][0]["maxConnections"], 3, "{rec:#}");
    assert!(rec["forwards"][1].get("idleTimeoutMs").is_none(), "{rec:#}");
    Call::new("DEL", "fb2", Some(&p), "net1")
        .run(&lab.node, &c)
        .ok_empty();
}

/// Clears the immutable flag of what it holds when dropped, so the
/// temporary directory can be removed even when the test fails.
struct Immutable(Vec<std::path::PathBuf>);

impl Immutable {
    fn set(&mut self, p: &std::path::Path) {
        let out = std::process::Command::new("chattr")
            .arg("+i")
            .arg(p)
            .output()
            .expect("chattr");
        assert!(
            out.status.success(),
            "chattr +i {}: {}",
            p.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        self.0.push(p.to_path_buf());
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::process::Command::new("chattr")
                .arg("-i")
                .arg(p)
                .status();
        }
    }
}

/// A `logFile` that cannot be opened for writing (its directory cannot be
/// made, is a symbolic link, is immutable; the file is a directory, a FIFO,
/// immutable; a relative path) is code 7 naming the value and why, for ADD
/// and DEL alike, and nothing is left behind: no link, no reservation, no
/// record, no file. It used to fall back to stderr, where a runtime throws
/// the logs away.
#[test]
fn a_log_file_that_cannot_be_written_is_code_7_naming_the_path() {
    let lab = Lab::new();
    let pod = lab.pod();
    let pods = [&pod];
    let p = pod.path();
    let before = state(&lab, &pods);
    let tmp = tempfile::tempdir().unwrap();
    let mut immutable = Immutable(Vec::new());
    let dir = |name: &str| {
        let d = tmp.path().join(name);
        std::fs::create_dir(&d).unwrap();
        d
    };

    // (allowed directory, logFile, what the message says)
    let mut cases: Vec<(std::path::PathBuf, String, &str)> = Vec::new();
    let d = dir("a-directory");
    std::fs::create_dir(d.join("edgelink.log")).unwrap();
    cases.push((
        d.clone(),
        format!("{}/edgelink.log", d.display()),
        "is a directory",
    ));
    let d = dir("a-fifo");
    let fifo = d.join("edgelink.log");
    sh(&["mkfifo", fifo.to_str().unwrap()]);
    cases.push((d.clone(), fifo.display().to_string(), "not a regular file"));
    let d = dir("immutable-file");
    std::fs::write(d.join("edgelink.log"), "kept\n").unwrap();
    immutable.set(&d.join("edgelink.log"));
    cases.push((
        d.clone(),
        format!("{}/edgelink.log", d.display()),
        "not writable",
    ));
    let d = dir("immutable-dir");
    immutable.set(&d);
    cases.push((
        d.clone(),
        format!("{}/edgelink.log", d.display()),
        "not writable",
    ));
    // The directory cannot be made: a file stands where a parent should be.
    std::fs::write(tmp.path().join("a-file"), "").unwrap();
    let d = tmp.path().join("a-file/logs");
    cases.push((
        d.clone(),
        format!("{}/edgelink.log", d.display()),
        "cannot be created",
    ));
    // The directory is a symbolic link (to a good directory).
    let real = dir("real");
    let link = tmp.path().join("linked");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    cases.push((
        link.clone(),
        format!("{}/edgelink.log", link.display()),
        "symbolic link",
    ));
    let d = dir("relative");
    cases.push((d, "edgelink.log".to_string(), "not an absolute path"));

    for (i, (log_dir, value, needle)) in cases.iter().enumerate() {
        let log_dir_s = log_dir.display().to_string();
        let mut conf = lab.bridge_conf("1.0.0");
        conf["logFile"] = json!(value);
        conf["logLevel"] = json!("debug");
        let cid = format!("logfile{i}");
        for command in ["ADD", "DEL"] {
            let mut call = Call::new(command, &cid, Some(&p), "net1");
            call.extra_env.push(("EDGELINK_LOG_DIR", &log_dir_s));
            let out = call.run(&lab.node, &conf);
            let msg = expect_err(
                &out,
                7,
                &["logFile", value.as_str(), needle],
                &lab,
                &pods,
                &before,
            );
            // The reason is on stderr too, for a runtime that logs it.
            assert!(out.stderr.contains("logFile"), "{command} {value}: {msg}");
        }
    }
    // Nothing was created anywhere.
    assert!(!tmp.path().join("a-file/logs").exists());
    assert!(!tmp.path().join("immutable-dir/edgelink.log").exists());
    assert!(!real.join("edgelink.log").exists());
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("immutable-file/edgelink.log")).unwrap(),
        "kept\n"
    );
    drop(immutable);
    // The same configuration with a good directory works.
    let good = dir("good");
    let good_s = good.display().to_string();
    let mut conf = lab.bridge_conf("1.0.0");
    conf["logFile"] = json!(format!("{good_s}/edgelink.log"));
    let mut call = Call::new("ADD", "logfile-good", Some(&p), "net1");
    call.extra_env.push(("EDGELINK_LOG_DIR", &good_s));
    call.run(&lab.node, &conf).ok();
    let mut call = Call::new("DEL", "logfile-good", Some(&p), "net1");
    call.extra_env.push(("EDGELINK_LOG_DIR", &good_s));
    call.run(&lab.node, &conf).ok_empty();
    assert!(good.join("edgelink.log").is_file());
    // (DEL leaves the bridge and its uplink port, as always.)
    let after = state(&lab, &pods);
    assert_eq!(
        (after.pod_links, after.reserved, after.records),
        (before.pod_links, before.reserved, before.records)
    );
}
