//! `edgelink validate` and the unknown-key warning (issue 21): a misspelt
//! key made a bridge with no uplink, an isolated pod and a passing CHECK,
//! without a word.

use edgelink_tests::*;
use serde_json::json;
use std::io::Write;
use std::process::{Command, Stdio};

/// `edgelink validate ARGS` with `stdin`, in `ns` with the node's state
/// directory `state`; (exit status, stdout).
fn validate(ns: &Netns, state: &str, args: &[&str], stdin: &str) -> (i32, String) {
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .arg(plugin_bin())
        .arg("validate")
        .args(args)
        .env(STATE_DIR_ENV, state)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn nad(name: &str, conf: &serde_json::Value) -> String {
    format!(
        "apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\n\
         metadata:\n  name: {name}\n  namespace: hil\nspec:\n  config: '{}'\n",
        conf
    )
}

#[test]
fn every_shipped_example_validates() {
    let lab = Lab::new();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../cni-conf");
    let mut files: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            n.ends_with(".json") || n.starts_with("nad-")
        })
        .map(|p| p.display().to_string())
        .collect();
    files.sort();
    assert!(files.len() >= 10, "{files:?}");
    let mut args = vec!["--offline"];
    args.extend(files.iter().map(String::as_str));
    let (code, out) = validate(&lab.node, &lab.state_dir(), &args, "");
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out.lines().filter(|l| l.ends_with(": OK")).count(),
        files.len(),
        "{out}"
    );
}

#[test]
fn a_nad_with_misspelt_and_bad_keys_gets_every_problem_listed() {
    let lab = Lab::new();
    let mut conf = lab.bridge_conf("1.0.0");
    let o = conf.as_object_mut().unwrap();
    o.remove("stateDir");
    let uplink = o.remove("uplink").unwrap();
    o.insert("uplnk".into(), uplink);
    conf["forwards"] = json!([
        {"name": "api", "protocol": "tcp", "port": 8080, "target": format!("{DEVICE_V4}:8080")},
        {"name": "dup", "protocol": "tcp", "port": 8080, "target": format!("{DEVICE_V4}:8081")},
        {"name": "noport", "target": format!("{DEVICE_V4}:8082"), "protocl": "udp"}
    ]);
    let text = format!(
        "{}---\n{}",
        nad("plant-floor", &conf),
        nad("good", &lab.bridge_conf("1.0.0"))
    );
    let (code, out) = validate(&lab.node, &lab.state_dir(), &["--offline", "-"], &text);
    assert_eq!(code, 1, "{out}");
    let want = [
        "<stdin>: NetworkAttachmentDefinition hil/plant-floor: 4 problems",
        "  - uplnk: is not a key edgelink knows (did you mean \"uplink\"?); ignored",
        "  - forwards[2].protocl: is not a key edgelink knows (did you mean \"protocol\"?); ignored",
        "  - forwards[1].port: 8080 (tcp) is used by forwards[0] (\"api\") too",
        "  - forwards[2].port: is missing",
        "<stdin>: NetworkAttachmentDefinition hil/good: OK",
    ];
    assert_eq!(out.lines().collect::<Vec<_>>(), want, "{out}");
    // Nothing on the node: validate only reads.
    assert!(lab.node_extra_links(&[]).is_empty());
    assert!(!lab.state.path().join("ipam").exists());
}

#[test]
fn on_the_node_it_checks_the_policy_the_uplink_and_the_mtu() {
    let lab = Lab::new();
    let conf = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut c = lab.bridge_conf("1.0.0");
        f(&mut c);
        c.to_string()
    };
    // The lab's node: uplink0 allowed and present.
    let (code, out) = validate(&lab.node, &lab.state_dir(), &[], &conf(&|_| {}));
    assert_eq!(code, 0, "{out}");

    let cases: Vec<(String, &str)> = vec![
        (
            conf(&|c| c["uplink"] = json!("eth9")),
            "on this node: uplink: \"eth9\" is not an uplink this node allows",
        ),
        (
            conf(&|c| c["uplink"] = json!("uplink1")),
            "on this node: uplink: \"uplink1\" does not exist in the node's network namespace",
        ),
        (
            conf(&|c| c["mtu"] = json!(9000)),
            "on this node: mtu: 9000 exceeds the MTU 1500 of uplink \"uplink0\"",
        ),
    ];
    for (c, want) in &cases {
        let (code, out) = validate(&lab.node, &lab.state_dir(), &[], c);
        assert_eq!(code, 1, "{out}");
        assert!(out.contains(want), "wanted {want:?}: {out}");
        // --offline leaves the node out.
        let (code, out) = validate(&lab.node, &lab.state_dir(), &["--offline"], c);
        assert_eq!(code, 0, "{out}");
    }
    // A bridge on the node that the policy does not list.
    lab.node.ip(&["link", "add", "br9", "type", "bridge"]);
    let (code, out) = validate(
        &lab.node,
        &lab.state_dir(),
        &[],
        &conf(&|c| c["bridge"] = json!("br9")),
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "on this node: bridge: \"br9\" exists on the node and is not a bridge this node allows"
        ),
        "{out}"
    );
}

#[test]
fn bad_input_and_usage_are_named() {
    let lab = Lab::new();
    let (code, out) = validate(&lab.node, &lab.state_dir(), &[], "{\"name\": ");
    assert_eq!(code, 1);
    assert!(out.starts_with("<stdin>: is not valid JSON"), "{out}");
    let (code, out) = validate(
        &lab.node,
        &lab.state_dir(),
        &[],
        "kind: Namespace\nmetadata: {name: hil}\n",
    );
    assert_eq!(code, 1);
    assert!(out.contains("no edgelink configuration found"), "{out}");
    let (code, out) = validate(&lab.node, &lab.state_dir(), &["--strict"], "");
    assert_eq!(code, 2);
    assert!(out.contains("unknown option \"--strict\""), "{out}");
}

#[test]
fn add_warns_of_each_unknown_key_and_still_succeeds() {
    let lab = Lab::new();
    let pod = lab.pod();
    let mut conf = lab.bridge_conf("1.0.0");
    conf["uplnk"] = json!("uplink0");
    conf["forwards"][0]["conectTimeoutMs"] = json!(100);
    let add = Call::new("ADD", "cid-warn", Some(&pod.path()), "net1").run(&lab.node, &conf);
    add.ok();
    for w in [
        "uplnk: is not a key edgelink knows (did you mean \"uplink\"?); ignored",
        "forwards[0].conectTimeoutMs: is not a key edgelink knows (did you mean \"connectTimeoutMs\"?); ignored",
    ] {
        assert!(add.stderr.contains("WARN") && add.stderr.contains(w), "{w}: {}", add.stderr);
    }
    Call::new("DEL", "cid-warn", Some(&pod.path()), "net1")
        .run(&lab.node, &conf)
        .ok_empty();
}
