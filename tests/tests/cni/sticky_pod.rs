//! The device-visible address across a proxy pod's replacement
//! (docs/expose-a-device.md, "The device-visible address"): the plugin
//! driven as the kubelet and Multus drive it when a StatefulSet's pod
//! `device01-01-0` is replaced. Sticky addresses key on namespace, pod name
//! and interface, so the replacement (same name, new container ID, new
//! netns) gets the same net1 address; a Deployment's replacement (new name)
//! does not.
//!
//! Orders covered: the normal one (the kubelet DELs the old sandbox before
//! the pod object goes, and the StatefulSet creates the new pod after);
//! after a reboot (the DEL comes with the old netns already gone); and a
//! forced deletion (the new pod's ADD before the old one's DEL), where the
//! address is never handed out twice and the new one is remembered.

use edgelink_tests::*;
use serde_json::Value;

const NET: &str = "plant-floor";
const POD: &str = "device01-01-0";

fn pod_args(name: &str, uid: &str) -> String {
    format!("IgnoreUnknown=true;K8S_POD_NAMESPACE=hil;K8S_POD_NAME={name};K8S_POD_UID={uid}")
}

fn addr_of(r: &Value) -> String {
    let a = r["ips"][0]["address"]
        .as_str()
        .unwrap_or_else(|| panic!("no address in {r}"));
    a.split('/').next().unwrap().to_string()
}

fn add_at(lab: &Lab, conf: &Value, cid: &str, netns: &str, args: &str) -> String {
    let r = Call::new("ADD", cid, Some(netns), "net1")
        .args(args)
        .run(&lab.node, conf)
        .ok();
    addr_of(&r)
}

fn add(lab: &Lab, conf: &Value, cid: &str, pod: &Netns, args: &str) -> String {
    add_at(lab, conf, cid, &pod.path(), args)
}

fn del_at(lab: &Lab, conf: &Value, cid: &str, netns: &str, args: &str) {
    Call::new("DEL", cid, Some(netns), "net1")
        .args(args)
        .run(&lab.node, conf)
        .ok_empty();
}

/// The record files that name `cid`.
fn records_of(lab: &Lab, cid: &str) -> Vec<String> {
    let dir = lab.state.path().join("attachments");
    lab.records()
        .into_iter()
        .filter(|f| {
            std::fs::read_to_string(dir.join(f)).is_ok_and(|t| t.contains(&format!("\"{cid}\"")))
        })
        .collect()
}

#[test]
fn a_replaced_statefulset_pod_gets_its_address_back_and_a_deployments_does_not() {
    let lab = Lab::new();
    let conf = lab.bridge_conf("1.0.0");

    // device01-01-0, first incarnation.
    let old = lab.pod();
    let x = add(&lab, &conf, "sts-a", &old, &pod_args(POD, "uid-1"));
    assert_eq!(old.addrs("net1"), vec![format!("{x}/24")]);

    // The kubelet stops the old sandbox: Multus DELs the attachment. Only
    // then is the pod object removed and the StatefulSet creates the pod
    // again.
    del_at(&lab, &conf, "sts-a", &old.path(), &pod_args(POD, "uid-1"));
    drop(old);
    assert!(lab.reserved(NET).is_empty(), "DEL released {x}");
    assert!(records_of(&lab, "sts-a").is_empty());

    // Meanwhile another pod is added: round-robin moves past x.
    let other = lab.pod();
    let o = add(&lab, &conf, "other", &other, &pod_args("web", "uid-w"));
    assert_ne!(o, x);

    // device01-01-0 again: new UID, new container ID, new netns. The runtime
    // may spell the netns path /run/netns/... (the DaemonSet mounts
    // /run/netns; /var/run leads there).
    let new = lab.pod();
    let run_path = new.path().replacen("/var/run/", "/run/", 1);
    let got = add_at(&lab, &conf, "sts-b", &run_path, &pod_args(POD, "uid-2"));
    assert_eq!(got, x, "the replacement of {POD} must get {x} back");
    assert_eq!(new.addrs("net1"), vec![format!("{x}/24")]);
    assert_eq!(records_of(&lab, "sts-b").len(), 1);
    let mut want = vec![x.clone(), o.clone()];
    want.sort();
    assert_eq!(lab.reserved(NET), want);

    // What a Deployment does: the replacement has a new name, and the
    // address its predecessor had goes to nobody in particular.
    let d1 = lab.pod();
    let y = add(
        &lab,
        &conf,
        "dep-a",
        &d1,
        &pod_args("device01-01-7c9f8-x2b4q", "uid-3"),
    );
    del_at(
        &lab,
        &conf,
        "dep-a",
        &d1.path(),
        &pod_args("device01-01-7c9f8-x2b4q", "uid-3"),
    );
    let d2 = lab.pod();
    let z = add(
        &lab,
        &conf,
        "dep-b",
        &d2,
        &pod_args("device01-01-7c9f8-p9lmn", "uid-4"),
    );
    assert_ne!(z, y, "a new pod name is a new sticky key");

    for (cid, p) in [("sts-b", &new), ("other", &other), ("dep-b", &d2)] {
        del_at(&lab, &conf, cid, &p.path(), "IgnoreUnknown=true");
    }
    assert!(lab.reserved(NET).is_empty());
}

#[test]
fn after_a_reboot_the_del_of_the_old_sandbox_frees_the_address_for_the_new_one() {
    let lab = Lab::new();
    let conf = lab.bridge_conf("1.0.0");
    let old = lab.pod();
    let path = old.path();
    let x = add(&lab, &conf, "boot-a", &old, &pod_args(POD, "uid-1"));

    // Reboot: /run is empty again, the old netns is gone, the store on
    // /var/lib is not. The kubelet stops the old sandbox first: its DEL
    // comes with a netns that no longer exists, and still releases.
    drop(old);
    assert!(!std::path::Path::new(&path).exists());
    assert_eq!(lab.reserved(NET), vec![x.clone()]);
    del_at(&lab, &conf, "boot-a", &path, &pod_args(POD, "uid-1"));
    assert!(lab.reserved(NET).is_empty());
    assert!(records_of(&lab, "boot-a").is_empty());

    // Same pod object (same UID) after a reboot, new sandbox.
    let new = lab.pod();
    assert_eq!(add(&lab, &conf, "boot-b", &new, &pod_args(POD, "uid-1")), x);
    del_at(&lab, &conf, "boot-b", &new.path(), &pod_args(POD, "uid-1"));
}

#[test]
fn a_forced_deletion_never_duplicates_the_address_and_the_new_one_is_remembered() {
    let lab = Lab::new();
    let conf = lab.bridge_conf("1.0.0");
    let old = lab.pod();
    let x = add(&lab, &conf, "force-a", &old, &pod_args(POD, "uid-1"));

    // `kubectl delete pod --force --grace-period=0`: the StatefulSet
    // creates device01-01-0 again while the old sandbox still holds x.
    let new = lab.pod();
    let y = add(&lab, &conf, "force-b", &new, &pod_args(POD, "uid-2"));
    assert_ne!(y, x, "{x} is still in use by the old sandbox");
    assert_eq!(old.addrs("net1"), vec![format!("{x}/24")]);
    assert_eq!(new.addrs("net1"), vec![format!("{y}/24")]);

    // The old sandbox's DEL comes late: x is free, y stays with the pod.
    del_at(&lab, &conf, "force-a", &old.path(), &pod_args(POD, "uid-1"));
    assert_eq!(lab.reserved(NET), vec![y.clone()]);

    // From now on the pod's address is y: the next replacement gets y.
    del_at(&lab, &conf, "force-b", &new.path(), &pod_args(POD, "uid-2"));
    drop(new);
    let third = lab.pod();
    assert_eq!(
        add(&lab, &conf, "force-c", &third, &pod_args(POD, "uid-3")),
        y
    );
    del_at(
        &lab,
        &conf,
        "force-c",
        &third.path(),
        &pod_args(POD, "uid-3"),
    );
}
