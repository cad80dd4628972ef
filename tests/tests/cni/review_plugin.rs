//! Regression tests for the plugin defects found in review (issue 9, items
//! 1, 4, 5 and 6): a delegated IPAM name or a `logFile` that points
//! elsewhere, GC without its list, and ADDs that failed half-way leaving
//! something behind.

use edgelink_tests::*;
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

const NET: &str = "plant-floor";

/// A shell script at `path` that touches `marker` when run.
fn marker_script(path: &Path, marker: &Path) {
    std::fs::write(
        path,
        format!(
            "#!/bin/sh\ntouch '{}'\necho '{{\"cniVersion\":\"1.1.0\"}}'\n",
            marker.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

// ---------------------------------------------------------------------------
// 1. ipam.type is a plain plugin name in every command.

#[test]
fn no_command_executes_an_ipam_type_that_is_a_path() {
    let lab = Lab::new();
    let pod = lab.pod();
    let p = pod.path();
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let marker = tmp.path().join("marker");
    let script = tmp.path().join("x.sh");
    marker_script(&script, &marker);
    // The same script inside CNI_PATH too, so a name that is only a name
    // (the control) does run.
    marker_script(&bin.join("x.sh"), &marker);
    let cni_path = bin.display().to_string();
    let abs = script.display().to_string();

    for bad in [abs.as_str(), "../x.sh", "./x.sh", "bin/../x.sh", ".."] {
        let conf = json!({
            "cniVersion": "1.1.0", "name": NET, "type": "edgelink",
            "mode": "bridge", "bridge": "edge0", "uplink": "uplink0",
            "stateDir": lab.state_dir(),
            "ipam": {"type": bad},
            "cni.dev/valid-attachments": [],
        });
        for command in ["DEL", "ADD", "CHECK", "STATUS", "GC"] {
            let mut call = Call::new(command, "evil", Some(&p), "net1");
            call.path = &cni_path;
            let (code, msg) = call.run(&lab.node, &conf).err();
            assert_eq!(code, 7, "{command} {bad}: {msg}");
            assert!(msg.contains("ipam.type"), "{command} {bad}: {msg}");
            assert!(
                !marker.exists(),
                "{command} with ipam.type {bad:?} executed {}",
                script.display()
            );
        }
        assert!(!pod.has_link("net1"), "{bad}");
        assert!(lab.records().is_empty(), "{bad}");
    }

    // The control: a plain name found in CNI_PATH is executed by DEL.
    let conf = json!({
        "cniVersion": "1.1.0", "name": NET, "type": "edgelink",
        "stateDir": lab.state_dir(), "ipam": {"type": "x.sh"},
    });
    let mut call = Call::new("DEL", "evil", Some(&p), "net1");
    call.path = &cni_path;
    call.run(&lab.node, &conf).ok_empty();
    assert!(marker.exists(), "the control did not run the delegate");
}

// ---------------------------------------------------------------------------
// 1. logFile: only a file directly inside the allowed directory, never
//    through a symbolic link; a bad value is code 7 and creates nothing.

struct Logs {
    tmp: tempfile::TempDir,
    dir: PathBuf,
    dir_s: String,
}

impl Logs {
    fn new() -> Logs {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("logs");
        std::fs::create_dir(&dir).unwrap();
        let dir_s = dir.display().to_string();
        Logs { tmp, dir, dir_s }
    }

    fn call<'a>(&'a self, command: &'a str, cid: &'a str, pod: &'a str) -> Call<'a> {
        let mut c = Call::new(command, cid, Some(pod), "net1");
        c.extra_env.push(("EDGELINK_LOG_DIR", &self.dir_s));
        c
    }
}

#[test]
fn log_file_outside_the_allowed_directory_is_refused_and_nothing_is_created() {
    let lab = Lab::new();
    let pod = lab.pod();
    let p = pod.path();
    let logs = Logs::new();
    let outside = logs.tmp.path().join("outside.log");
    let escape_target = logs.tmp.path().join("escape.log");
    let link_target = logs.tmp.path().join("target.log");
    let existing = logs.tmp.path().join("existing.log");
    std::fs::write(&existing, "precious\n").unwrap();
    std::os::unix::fs::symlink(&link_target, logs.dir.join("dangling.log")).unwrap();
    std::os::unix::fs::symlink(&existing, logs.dir.join("existing.log")).unwrap();
    std::fs::create_dir(logs.dir.join("sub")).unwrap();
    let relative = format!("elk-relative-{}.log", std::process::id());
    let cwd = std::env::current_dir().unwrap();

    let cases: Vec<(String, &str)> = vec![
        (relative.clone(), "absolute"),
        (outside.display().to_string(), "directly inside"),
        (format!("{}/../escape.log", logs.dir_s), "'..'"),
        (format!("{}/dangling.log", logs.dir_s), "symbolic link"),
        (format!("{}/existing.log", logs.dir_s), "symbolic link"),
        (format!("{}/sub/x.log", logs.dir_s), "directly inside"),
        ("/etc/cron.d/edgelink".to_string(), "directly inside"),
    ];
    for (value, needle) in &cases {
        let mut conf = lab.bridge_conf("1.1.0");
        conf["logFile"] = json!(value);
        conf["logLevel"] = json!("debug");
        conf["cni.dev/valid-attachments"] = json!([]);
        for command in ["ADD", "CHECK", "STATUS", "GC", "DEL"] {
            let (code, msg) = logs.call(command, "lf", &p).run(&lab.node, &conf).err();
            assert_eq!(code, 7, "{command} {value}: {msg}");
            assert!(
                msg.contains("logFile") && msg.contains(needle),
                "{command} {value}: {msg}"
            );
        }
        assert!(!pod.has_link("net1"), "{value}");
        assert!(lab.reserved(NET).is_empty(), "{value}");
    }
    assert!(!cwd.join(&relative).exists());
    assert!(!outside.exists());
    assert!(!escape_target.exists());
    assert!(!link_target.exists(), "a dangling symlink was followed");
    assert_eq!(std::fs::read_to_string(&existing).unwrap(), "precious\n");
    assert!(!Path::new("/etc/cron.d/edgelink").exists());
    assert!(!logs.dir.join("sub/x.log").exists());

    // A good value: the file is created inside the directory and gets the logs.
    let good = logs.dir.join("edgelink.log");
    let mut conf = lab.bridge_conf("1.1.0");
    conf["logFile"] = json!(good.display().to_string());
    conf["logLevel"] = json!("debug");
    let out = logs.call("ADD", "lf", &p).run(&lab.node, &conf);
    out.ok();
    assert!(out.stderr.trim().is_empty(), "{}", out.stderr);
    let text = std::fs::read_to_string(&good).unwrap();
    assert!(text.contains("record written"), "{text}");
    let meta = std::fs::symlink_metadata(&good).unwrap();
    assert!(meta.file_type().is_file());

    // DEL with a bad logFile still tears the attachment down, and says why
    // it failed.
    let mut bad = conf.clone();
    bad["logFile"] = json!(outside.display().to_string());
    let (code, msg) = logs.call("DEL", "lf", &p).run(&lab.node, &bad).err();
    assert_eq!(code, 7, "{msg}");
    assert!(!pod.has_link("net1"));
    assert!(lab.reserved(NET).is_empty());
    assert!(lab.records().is_empty());
    assert!(!outside.exists());
}

// ---------------------------------------------------------------------------
// 4. GC: a request without the list is refused; an ADD in flight is safe.

/// One bridge attachment made by ADD.
struct Att {
    cid: &'static str,
    pod: Netns,
    ip: String,
}

fn add_att(lab: &Lab, conf: &Value, cid: &'static str) -> Att {
    let pod = lab.pod();
    let r = Call::new("ADD", cid, Some(&pod.path()), "net1")
        .run(&lab.node, conf)
        .ok();
    let ip = r["ips"][0]["address"].as_str().unwrap().to_string();
    Att { cid, pod, ip }
}

impl Att {
    fn bare_ip(&self) -> String {
        self.ip.split('/').next().unwrap().to_string()
    }
}

/// Exactly `atts` are attached: reservations, records, node-side veths and
/// the pods' interfaces with their addresses.
fn assert_attached(lab: &Lab, atts: &[&Att]) {
    let mut ips: Vec<String> = atts.iter().map(|a| a.bare_ip()).collect();
    ips.sort();
    assert_eq!(lab.reserved(NET), ips);
    assert_eq!(lab.records().len(), atts.len(), "{:?}", lab.records());
    assert_eq!(lab.host_veths().len(), atts.len(), "{:?}", lab.host_veths());
    for a in atts {
        assert_eq!(a.pod.addrs("net1"), vec![a.ip.clone()], "{}", a.cid);
    }
}

#[test]
fn gc_without_valid_attachments_is_refused_and_touches_nothing() {
    let lab = Lab::new();
    let conf = lab.bridge_conf("1.1.0");
    let a = add_att(&lab, &conf, "gcr-a");
    let b = add_att(&lab, &conf, "gcr-b");
    // Long past any grace: only the missing list may protect them.
    lab.age_state();
    assert_attached(&lab, &[&a, &b]);

    for key in [
        None,
        Some("cni.dev/valid-attachments"),
        Some("cni.dev/attachments"),
    ] {
        let mut gc = conf.clone();
        if let Some(k) = key {
            // A key that is present but not a list is malformed too.
            gc[k] = json!({"containerID": "gcr-a", "ifname": "net1"});
        }
        let (code, msg) = Call::new("GC", "", None, "").run(&lab.node, &gc).err();
        assert_eq!(code, 7, "{key:?}: {msg}");
        assert!(
            msg.contains("valid-attachments") || msg.contains(key.unwrap_or("-")),
            "{msg}"
        );
        assert_attached(&lab, &[&a, &b]);
        assert!(tcp_reachable(&a.pod, DEVICE_V4, 9));
        assert!(tcp_reachable(&b.pod, DEVICE_V4, 9));
    }

    // An empty list is a real answer: both go.
    Call::new("GC", "", None, "")
        .run(&lab.node, &Lab::gc_conf(&conf, &[]))
        .ok_empty();
    assert!(lab.reserved(NET).is_empty());
    assert!(lab.records().is_empty());
    assert!(lab.host_veths().is_empty());
}

#[test]
fn gc_keeps_an_add_in_flight_and_collects_an_old_attachment() {
    let lab = Lab::new();
    let conf = lab.bridge_conf("1.1.0");
    let old = add_att(&lab, &conf, "gcg-old");
    lab.age_state();
    // Just made: its ADD may still be in flight as far as the runtime knows.
    let young = add_att(&lab, &conf, "gcg-young");
    assert_attached(&lab, &[&old, &young]);

    Call::new("GC", "", None, "")
        .run(&lab.node, &Lab::gc_conf(&conf, &[]))
        .ok_empty();
    assert_attached(&lab, &[&young]);
    assert!(tcp_reachable(&young.pod, DEVICE_V4, 9));

    // Once old, the same GC collects it.
    lab.age_state();
    Call::new("GC", "", None, "")
        .run(&lab.node, &Lab::gc_conf(&conf, &[]))
        .ok_empty();
    assert!(lab.reserved(NET).is_empty());
    assert!(lab.records().is_empty());
    assert!(lab.host_veths().is_empty());
}

// ---------------------------------------------------------------------------
// 6. A macvlan ADD that fails after the macvlan exists removes it.

#[test]
fn macvlan_add_failing_after_creation_leaves_nothing_and_a_retry_succeeds() {
    let lab = Lab::new();
    let pod = lab.pod();
    let p = pod.path();
    // The uplink's own MAC: the kernel creates the macvlan, then refuses to
    // bring it up (EADDRINUSE), after the rename to CNI_IFNAME.
    let mut conf = lab.macvlan_conf("1.1.0");
    conf["mac"] = json!(lab.node.mac("uplink0"));
    let node_before = lab.node.links_sorted();

    for attempt in 0..2 {
        let out = Call::new("ADD", "mv-fail", Some(&p), "net1").run(&lab.node, &conf);
        let (code, msg) = out.err();
        // Not CNI_IFNAME, not the temporary name: only lo.
        assert_eq!(
            pod.links(),
            vec!["lo".to_string()],
            "attempt {attempt}: {msg}"
        );
        assert!(lab.reserved(NET).is_empty());
        assert!(lab.records().is_empty());
        assert_eq!(lab.node.links_sorted(), node_before);
        assert_eq!(code, 100, "attempt {attempt}: {msg}");
        assert!(
            msg.contains("set net1 up") && msg.contains("MAC address is already used"),
            "attempt {attempt}: {msg}"
        );
    }

    // The retry with good input succeeds (no 101 on a leftover).
    let mut good = conf.clone();
    good.as_object_mut().unwrap().remove("mac");
    let r = Call::new("ADD", "mv-fail", Some(&p), "net1")
        .run(&lab.node, &good)
        .ok();
    let ip = r["ips"][0]["address"].as_str().unwrap().to_string();
    assert_eq!(pod.addrs("net1"), vec![ip]);
    assert!(pod.link_details("net1").contains("macvlan"));
    Call::new("DEL", "mv-fail", Some(&p), "net1")
        .run(&lab.node, &good)
        .ok_empty();
    assert_eq!(pod.links(), vec!["lo".to_string()]);
}

// ---------------------------------------------------------------------------
// 5. moveUplinkAddresses: a failed enslave puts everything back.

/// The flags of a link (`BROADCAST,MULTICAST,UP,...`) without the volatile
/// LOWER_UP/NO-CARRIER.
fn link_flags(ns: &Netns, dev: &str) -> Vec<String> {
    let out = ns.ip(&["-o", "link", "show", "dev", dev]);
    let inner = out
        .split('<')
        .nth(1)
        .and_then(|s| s.split('>').next())
        .unwrap_or_default();
    let mut f: Vec<String> = inner
        .split(',')
        .filter(|f| !matches!(*f, "LOWER_UP" | "NO-CARRIER"))
        .map(str::to_string)
        .collect();
    f.sort();
    f
}

/// The node's IPv4 and IPv6 routes, main table, as `ip route` prints them
/// (without the volatile `linkdown` flag).
fn routes(ns: &Netns) -> Vec<String> {
    let mut v: Vec<String> = ["-4", "-6"]
        .iter()
        .flat_map(|fam| {
            ns.ip(&[fam, "route", "show"])
                .lines()
                .map(|l| l.replace(" linkdown", "").trim().to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    v.sort();
    v
}

#[test]
fn move_uplink_addresses_failing_to_enslave_puts_everything_back() {
    let lab = Lab::new();
    let pod = lab.pod();
    let node = &lab.node;
    node.ip(&["addr", "add", "172.31.250.2/24", "dev", "uplink0"]);
    node.ip(&["addr", "add", "fd00:e1::2/64", "dev", "uplink0", "nodad"]);
    node.ip(&[
        "route",
        "add",
        "10.231.0.0/16",
        "via",
        "172.31.250.10",
        "dev",
        "uplink0",
    ]);
    // A macvlan child makes the kernel refuse the uplink as a bridge port
    // (EBUSY), after the addresses were copied onto the bridge.
    node.ip(&[
        "link", "add", "link", "uplink0", "name", "mvchild", "type", "macvlan", "mode", "bridge",
    ]);
    // The bridge exists already, down.
    node.ip(&["link", "add", "edge0", "type", "bridge"]);

    let links_before = node.links_sorted();
    let routes_before = routes(node);
    let bridge_flags_before = link_flags(node, "edge0");
    assert!(!bridge_flags_before.iter().any(|f| f == "UP"));
    let uplink_flags_before = link_flags(node, "uplink0");

    let mut conf = lab.bridge_conf("1.1.0");
    conf["moveUplinkAddresses"] = json!(true);
    let (code, msg) = Call::new("ADD", "mv-undo", Some(&pod.path()), "net1")
        .run(node, &conf)
        .err();

    assert_eq!(
        node.addrs("uplink0"),
        vec!["172.31.250.2/24".to_string(), "fd00:e1::2/64".to_string()],
        "{msg}"
    );
    assert!(node.addrs("edge0").is_empty(), "{:?}", node.addrs("edge0"));
    assert_eq!(routes(node), routes_before);
    assert_eq!(link_flags(node, "edge0"), bridge_flags_before);
    assert_eq!(link_flags(node, "uplink0"), uplink_flags_before);
    assert_eq!(node.master_of("uplink0"), None);
    assert_eq!(node.links_sorted(), links_before);
    assert_eq!(pod.links(), vec!["lo".to_string()]);
    assert!(lab.reserved(NET).is_empty());
    assert!(lab.records().is_empty());
    // The node still reaches the device through the uplink.
    assert!(tcp_reachable(node, DEVICE_V4, 9));

    assert_eq!(code, 100, "{msg}");
    assert!(
        msg.contains("enslave uplink uplink0 to bridge edge0") && msg.contains("busy"),
        "{msg}"
    );

    // Without the macvlan the uplink is enslaved, its addresses and the
    // gateway route moved; then IPAM refuses the requested address. The
    // rollback puts all of it back, and the bridge down as it was.
    node.ip(&["link", "del", "mvchild"]);
    let links_before = node.links_sorted();
    let (code, msg) = Call::new("ADD", "mv-undo", Some(&pod.path()), "net1")
        .args("IP=172.31.250.99")
        .run(node, &conf)
        .err();
    assert_eq!(
        node.addrs("uplink0"),
        vec!["172.31.250.2/24".to_string(), "fd00:e1::2/64".to_string()],
        "{msg}"
    );
    assert!(node.addrs("edge0").is_empty(), "{:?}", node.addrs("edge0"));
    assert_eq!(routes(node), routes_before, "{msg}");
    assert_eq!(link_flags(node, "edge0"), bridge_flags_before);
    assert_eq!(node.master_of("uplink0"), None);
    assert_eq!(node.links_sorted(), links_before);
    assert_eq!(pod.links(), vec!["lo".to_string()]);
    assert!(lab.reserved(NET).is_empty());
    assert!(tcp_reachable(node, DEVICE_V4, 9));
    assert!(msg.contains("172.31.250.99"), "{code} {msg}");
}
