//! Third review (issue 20), items 1, 10, 11: what a NAD author may make the plugin touch on the node (the state directory, uplinks and bridges, another namespace's store).

use edgelink_tests::*;
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

const NET: &str = "plant-floor";

/// What must be as it was after a refused ADD: no interface in the pod, no
/// veth, bridge or other link added on the node, no reservation, no record.
fn nothing_left(lab: &Lab, pod: &Netns, keep: &[&str]) {
    assert_eq!(pod.links(), vec!["lo".to_string()], "pod links");
    assert_eq!(
        lab.node_extra_links(keep),
        Vec::<String>::new(),
        "node links"
    );
    assert!(lab.reserved(NET).is_empty(), "{:?}", lab.reserved(NET));
    assert!(lab.records().is_empty(), "{:?}", lab.records());
}

// ---------------------------------------------------------------------------
// 1. The state directory is the node's: a config's stateDir never moves it.

/// A directory anyone may write (as a pod's emptyDir is on the node),
/// prepared by uid 65534 with links into root's files: the cursor of the
/// network's range set points at a root 0600 file, its `sticky/` at a
/// directory of root's files.
struct Trap {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    secret: PathBuf,
    chosen: PathBuf,
}

impl Trap {
    fn new() -> Trap {
        let tmp = tempfile::tempdir().unwrap();
        let secret = tmp.path().join("secret");
        std::fs::write(&secret, "root's own\n").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let chosen = tmp.path().join("chosen");
        std::fs::create_dir(&chosen).unwrap();
        std::fs::write(chosen.join("config"), "not json").unwrap();
        let dir = tmp.path().join("emptydir");
        let store = dir.join("ipam").join(NET);
        std::fs::create_dir_all(&store).unwrap();
        for d in [&dir, &dir.join("ipam"), &store] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        let link = |target: &Path, at: PathBuf| {
            std::os::unix::fs::symlink(target, &at).unwrap();
            std::os::unix::fs::lchown(&at, Some(65534), Some(65534)).unwrap();
        };
        link(&secret, store.join("last_reserved_ip.0"));
        link(&chosen, store.join("sticky"));
        Trap {
            _tmp: tmp,
            dir,
            secret,
            chosen,
        }
    }

    fn intact(&self) {
        assert_eq!(
            std::fs::read_to_string(&self.secret).unwrap(),
            "root's own\n"
        );
        assert!(
            self.chosen.join("config").exists(),
            "a file of root's deleted"
        );
    }
}

#[test]
fn a_config_state_dir_other_than_the_nodes_is_refused_and_nothing_is_written() {
    let lab = Lab::new();
    let trap = Trap::new();
    let node_dir = lab.state_dir();
    let evil = trap.dir.display().to_string();
    let pod = lab.pod();
    let p = pod.path();
    let mut conf = lab.bridge_conf("1.1.0");
    conf["stateDir"] = json!(evil);
    conf["cni.dev/valid-attachments"] = json!([]);
    let call = |command: &'static str| {
        let mut c = Call::new(command, "sd1", Some(&p), "net1")
            .args("K8S_POD_NAMESPACE=hil;K8S_POD_NAME=p1");
        c.extra_env.push((STATE_DIR_ENV, &node_dir));
        c
    };

    for command in ["ADD", "CHECK", "GC", "STATUS"] {
        let (code, msg) = call(command).run(&lab.node, &conf).err();
        assert_eq!(code, 7, "{command}: {msg}");
        assert!(
            msg.contains("stateDir") && msg.contains(&evil) && msg.contains(&node_dir),
            "{command}: {msg}"
        );
        trap.intact();
        nothing_left(&lab, &pod, &[]);
    }
    // DEL works in the node's directory whatever the config says.
    call("DEL").run(&lab.node, &conf).ok_empty();
    trap.intact();
    // The node's own directory, spelled out, is fine (as configs that
    // name the default /var/lib/edgelink keep working).
    conf["stateDir"] = json!(format!("{node_dir}/"));
    let r = call("ADD").run(&lab.node, &conf).ok();
    assert_eq!(r["ips"][0]["address"], "172.31.250.100/24");
    assert_eq!(lab.reserved(NET), vec!["172.31.250.100".to_string()]);
    call("DEL").run(&lab.node, &conf).ok_empty();
    trap.intact();
}

#[test]
fn links_in_the_nodes_store_are_never_followed() {
    let lab = Lab::new();
    let trap = Trap::new();
    let store = lab.state.path().join("ipam").join(NET);
    std::fs::create_dir_all(&store).unwrap();
    std::os::unix::fs::symlink(&trap.secret, store.join("last_reserved_ip.0")).unwrap();
    let pod = lab.pod();
    let p = pod.path();
    let conf = lab.bridge_conf("1.1.0");
    // The cursor is a hint: ADD goes on without writing through the link.
    let r = Call::new("ADD", "ln1", Some(&p), "net1")
        .run(&lab.node, &conf)
        .ok();
    assert_eq!(r["ips"][0]["address"], "172.31.250.100/24");
    trap.intact();
    Call::new("DEL", "ln1", Some(&p), "net1")
        .run(&lab.node, &conf)
        .ok_empty();
    // A store directory that is a link: refused (I/O, code 5), nothing
    // written or deleted there, nothing left.
    std::fs::remove_dir_all(store.join("sticky")).unwrap();
    std::os::unix::fs::symlink(&trap.chosen, store.join("sticky")).unwrap();
    let (code, msg) = Call::new("ADD", "ln2", Some(&p), "net1")
        .run(&lab.node, &conf)
        .err();
    assert_eq!(code, 5, "{msg}");
    assert!(
        msg.contains("sticky") && msg.contains("symbolic link"),
        "{msg}"
    );
    trap.intact();
    nothing_left(&lab, &pod, &["edge0"]);
}

// ---------------------------------------------------------------------------
// 10. Uplinks and existing bridges: only those the node policy lists.

/// The node's "primary" interface in the lab: an address and the default
/// route, as eth0 has them on a node.
fn primary(lab: &Lab) {
    lab.node.ip(&[
        "link",
        "add",
        "nodeeth0",
        "type",
        "veth",
        "peer",
        "name",
        "nodeeth0p",
    ]);
    lab.node
        .ip(&["addr", "add", "10.99.0.2/24", "dev", "nodeeth0"]);
    lab.node.ip(&["link", "set", "nodeeth0", "up"]);
    lab.node.ip(&["link", "set", "nodeeth0p", "up"]);
    lab.node.ip(&[
        "route",
        "add",
        "default",
        "via",
        "10.99.0.1",
        "dev",
        "nodeeth0",
    ]);
}

#[test]
fn uplinks_and_bridges_the_node_does_not_allow_are_refused() {
    let lab = Lab::new();
    write_node_policy(lab.state.path(), r#"{"uplinks": ["uplink0"]}"#);
    primary(&lab);
    // A bridge of the node's own (the cluster's cni0, say), with an address.
    lab.node.ip(&["link", "add", "cni0", "type", "bridge"]);
    lab.node.ip(&["addr", "add", "10.88.0.1/16", "dev", "cni0"]);
    lab.node.ip(&["link", "set", "cni0", "up"]);
    let node_before = lab.node.ip(&["-4", "-o", "addr", "show"]);
    let routes_before = lab.node.ip(&["route", "show"]);
    let pod = lab.pod();
    let p = pod.path();
    let keep = ["nodeeth0", "nodeeth0p", "cni0"];
    let policy = lab.state.path().join("node-policy.json");
    let policy = policy.display().to_string();

    let mut takeover = lab.bridge_conf("1.0.0");
    takeover["uplink"] = json!("nodeeth0");
    takeover["moveUplinkAddresses"] = json!(true);
    let mut underlay = lab.macvlan_conf("1.0.0");
    underlay["uplink"] = json!("nodeeth0");
    let mut gateway = lab.bridge_conf("1.0.0");
    gateway["bridge"] = json!("cni0");
    gateway.as_object_mut().unwrap().remove("uplink");
    gateway["isGateway"] = json!(true);
    let cases: [(&str, &Value, &str); 3] = [
        (
            "the primary NIC enslaved, its address moved",
            &takeover,
            "\"nodeeth0\"",
        ),
        (
            "a macvlan on the node's underlay",
            &underlay,
            "\"nodeeth0\"",
        ),
        ("isGateway on the node's bridge", &gateway, "\"cni0\""),
    ];
    for (what, conf, name) in cases {
        let (code, msg) = Call::new("ADD", "pol1", Some(&p), "net1")
            .run(&lab.node, conf)
            .err();
        assert_eq!(code, 7, "{what}: {msg}");
        assert!(msg.contains(name) && msg.contains(&policy), "{what}: {msg}");
        nothing_left(&lab, &pod, &keep);
        assert_eq!(
            lab.node.ip(&["-4", "-o", "addr", "show"]),
            node_before,
            "{what}"
        );
        assert_eq!(lab.node.ip(&["route", "show"]), routes_before, "{what}");
        assert_eq!(lab.node.master_of("nodeeth0"), None, "{what}");
        Call::new("DEL", "pol1", Some(&p), "net1")
            .run(&lab.node, conf)
            .ok_empty();
    }

    // The listed uplink, and a bridge the plugin makes itself, are fine;
    // a later config may name that bridge (it is the plugin's own).
    let ok = lab.bridge_conf("1.0.0");
    Call::new("ADD", "pol2", Some(&p), "net1")
        .run(&lab.node, &ok)
        .ok();
    let pod2 = lab.pod();
    let mut own = lab.bridge_conf("1.0.0");
    own.as_object_mut().unwrap().remove("uplink");
    Call::new("ADD", "pol3", Some(&pod2.path()), "net1")
        .run(&lab.node, &own)
        .ok();
    assert_eq!(lab.node.master_of("uplink0").as_deref(), Some("edge0"));
    for (cid, pd) in [("pol2", &pod), ("pol3", &pod2)] {
        Call::new("DEL", cid, Some(&pd.path()), "net1")
            .run(&lab.node, &ok)
            .ok_empty();
    }
}

#[test]
fn a_node_policy_others_may_write_is_refused() {
    let lab = Lab::new();
    let file = lab.state.path().join("node-policy.json");
    let pod = lab.pod();
    let p = pod.path();
    let conf = lab.bridge_conf("1.0.0");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
    let (code, msg) = Call::new("ADD", "pf1", Some(&p), "net1")
        .run(&lab.node, &conf)
        .err();
    assert_eq!(code, 7, "{msg}");
    assert!(
        msg.contains("node-policy.json") && msg.contains("writable"),
        "{msg}"
    );
    nothing_left(&lab, &pod, &[]);
    std::fs::remove_file(&file).unwrap();
    let other = lab.state.path().join("elsewhere.json");
    std::fs::write(&other, LAB_POLICY).unwrap();
    std::os::unix::fs::symlink(&other, &file).unwrap();
    let (code, msg) = Call::new("ADD", "pf1", Some(&p), "net1")
        .run(&lab.node, &conf)
        .err();
    assert_eq!(code, 7, "{msg}");
    assert!(msg.contains("symbolic link"), "{msg}");
    nothing_left(&lab, &pod, &[]);
}

// ---------------------------------------------------------------------------
// 11. A network name is one namespace's store; one address per family.

#[test]
fn another_namespace_cannot_take_addresses_of_a_network_name() {
    let lab = Lab::new();
    let conf = lab.bridge_conf("1.0.0");
    let (a, b, c) = (lab.pod(), lab.pod(), lab.pod());
    let r = Call::new("ADD", "own1", Some(&a.path()), "net1")
        .args("K8S_POD_NAMESPACE=hil;K8S_POD_NAME=proxy-0")
        .run(&lab.node, &conf)
        .ok();
    assert_eq!(r["ips"][0]["address"], "172.31.250.100/24");

    // The same name from another namespace: refused, takes nothing.
    let (code, msg) = Call::new("ADD", "evil1", Some(&b.path()), "net1")
        .args("K8S_POD_NAMESPACE=evil;K8S_POD_NAME=x")
        .run(&lab.node, &conf)
        .err();
    assert_eq!(code, 7, "{msg}");
    for part in [NET, "\"hil\"", "\"evil\""] {
        assert!(msg.contains(part), "{part}: {msg}");
    }
    assert_eq!(lab.reserved(NET), vec!["172.31.250.100".to_string()]);
    assert_eq!(b.links(), vec!["lo".to_string()]);
    assert_eq!(lab.records(), vec!["own1_net1.json".to_string()]);

    // The owner's next pod is served.
    Call::new("ADD", "own2", Some(&c.path()), "net1")
        .args("K8S_POD_NAMESPACE=hil;K8S_POD_NAME=proxy-1")
        .run(&lab.node, &conf)
        .ok();
    // The node shares the name: then the other namespace is served too.
    write_node_policy(
        lab.state.path(),
        r#"{"uplinks": ["uplink0"], "sharedNetworks": ["plant-floor"]}"#,
    );
    Call::new("ADD", "evil1", Some(&b.path()), "net1")
        .args("K8S_POD_NAMESPACE=evil;K8S_POD_NAME=x")
        .run(&lab.node, &conf)
        .ok();
    assert_eq!(lab.reserved(NET).len(), 3);
    for (cid, pd) in [("own1", &a), ("own2", &c), ("evil1", &b)] {
        Call::new("DEL", cid, Some(&pd.path()), "net1")
            .run(&lab.node, &conf)
            .ok_empty();
    }
}

#[test]
fn one_pod_gets_one_address_per_family_whatever_the_range_sets() {
    let lab = Lab::new();
    let mut conf = lab.bridge_conf("1.0.0");
    let sets: Vec<Value> = (100..120)
        .map(|i| json!([{"subnet": format!("172.31.250.{i}/32")}]))
        .collect();
    conf["ipam"]["ranges"] = json!(sets);
    conf["allowedTargets"] = json!(["172.31.250.0/24"]);
    let pod = lab.pod();
    let (code, msg) = Call::new("ADD", "rs1", Some(&pod.path()), "net1")
        .run(&lab.node, &conf)
        .err();
    assert_eq!(code, 7, "{msg}");
    assert!(
        msg.contains("ipam.ranges[1]") && msg.contains("one range set per address family"),
        "{msg}"
    );
    nothing_left(&lab, &pod, &[]);
}
