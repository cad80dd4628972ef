//! Every example under cni-conf/ passes the plugin's validation.

use crate::config::Config;
use edgelink_cni_spec::{Env, NetConf};
use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;

fn add_env() -> Env {
    let m: HashMap<&str, &str> = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "c1"),
        ("CNI_IFNAME", "net1"),
        ("CNI_NETNS", "/run/netns/x"),
    ]
    .into_iter()
    .collect();
    Env::from_lookup(|k| m.get(k).map(|v| v.to_string())).unwrap()
}

/// The plugin configs in a file: itself, or each of a conflist's plugins
/// with the list's name and cniVersion copied in (as runtimes do).
fn plugin_configs(v: &Value) -> Vec<Value> {
    match v.get("plugins").and_then(Value::as_array) {
        Some(list) => list
            .iter()
            .map(|p| {
                let mut p = p.clone();
                p["name"] = v["name"].clone();
                p["cniVersion"] = v["cniVersion"].clone();
                p
            })
            .collect(),
        None => vec![v.clone()],
    }
}

#[test]
fn every_example_config_is_valid() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../cni-conf");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for mut conf in plugin_configs(&v) {
            // Per-node ranges: validate as the first node named.
            if conf["ipam"].is_object() && conf["ipam"].get("nodeName").is_none() {
                conf["ipam"]["nodeName"] = Value::String("kedge1".into());
            }
            let net = NetConf::parse(conf.to_string().as_bytes())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            Config::parse(net, &add_env())
                .unwrap_or_else(|e| panic!("{}: {}", path.display(), e.into_cni()));
            seen += 1;
        }
    }
    assert!(
        seen >= 6,
        "only {seen} example configs found in {}",
        dir.display()
    );
}
