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

/// Every `.yaml` / `.yml` file under `dirs` (relative to the repository),
/// recursively, sorted.
fn yaml_files(dirs: &[&str]) -> Vec<PathBuf> {
    fn walk(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in rd {
            let path = entry.unwrap().path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if path.is_dir() && !name.starts_with('.') {
                walk(&path, out);
            } else if name.ends_with(".yaml") || name.ends_with(".yml") {
                out.push(path);
            }
        }
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut out = Vec::new();
    for d in dirs {
        walk(&root.join(d), &mut out);
    }
    out.sort();
    out
}

/// The documents of a YAML file, as JSON values.
fn yaml_documents(path: &std::path::Path) -> Vec<Value> {
    use serde::Deserialize;
    let text = std::fs::read_to_string(path).unwrap();
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

/// The nodes a config's per-node ranges name (none: one validation).
fn nodes_named(conf: &Value) -> Vec<String> {
    let mut nodes: Vec<String> = conf["ipam"]["ranges"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_array)
        .flatten()
        .filter_map(|r| r["node"].as_str().map(str::to_string))
        .collect();
    nodes.sort();
    nodes.dedup();
    nodes
}

/// (name, protocol, port) of a NAD config's forwards, or of a Service's
/// ports, lower-case protocols.
type Ports = std::collections::BTreeSet<(String, String, u64)>;

fn forward_ports(conf: &Value) -> Ports {
    conf["forwards"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|f| {
            let name = f["name"].as_str().unwrap_or_default().to_string();
            let proto = f["protocol"].as_str().unwrap_or_default().to_lowercase();
            (name, proto, f["port"].as_u64().unwrap_or_default())
        })
        .collect()
}

#[test]
fn every_yaml_file_parses_and_every_nad_config_is_valid() {
    let files = yaml_files(&["cni-conf", "daemonset", "vagrant"]);
    assert!(files.len() >= 10, "only {} YAML files found", files.len());
    let mut nads = 0;
    // Forwards of every NAD, by namespace/name.
    let mut forwards: HashMap<String, Ports> = HashMap::new();
    let mut services = Vec::new();
    for path in &files {
        let docs = yaml_documents(path);
        assert!(!docs.is_empty(), "{}: no document", path.display());
        for doc in docs {
            let kind = doc["kind"].as_str().unwrap_or_default();
            let id = format!(
                "{}/{}",
                doc["metadata"]["namespace"].as_str().unwrap_or("default"),
                doc["metadata"]["name"].as_str().unwrap_or_default()
            );
            match kind {
                "NetworkAttachmentDefinition" => {
                    let text = doc["spec"]["config"]
                        .as_str()
                        .unwrap_or_else(|| panic!("{}: {id}: no spec.config", path.display()));
                    let conf: Value = serde_json::from_str(text).unwrap_or_else(|e| {
                        panic!("{}: {id}: spec.config is not JSON: {e}", path.display())
                    });
                    let mut nodes = nodes_named(&conf);
                    if nodes.is_empty() {
                        nodes.push("kedge1".into());
                    }
                    for node in nodes {
                        let mut conf = conf.clone();
                        if conf["ipam"].is_object() {
                            conf["ipam"]["nodeName"] = Value::String(node.clone());
                        }
                        let net = NetConf::parse(conf.to_string().as_bytes())
                            .unwrap_or_else(|e| panic!("{}: {id}: {e}", path.display()));
                        Config::parse(net, &add_env()).unwrap_or_else(|e| {
                            panic!("{}: {id} on {node}: {}", path.display(), e.into_cni())
                        });
                    }
                    forwards.insert(id, forward_ports(&conf));
                    nads += 1;
                }
                // A Service with a selector fronts pods: here, proxy pods.
                // (edgelink-operator's webhook Service has none.)
                "Service" if doc["spec"]["selector"].is_object() => {
                    services.push((path.clone(), id, doc))
                }
                _ => {}
            }
        }
    }
    assert!(nads >= 5, "only {nads} NetworkAttachmentDefinitions found");
    // A Service in front of a proxy pod has exactly the forwards' ports:
    // one NAD in its namespace must match it port for port.
    for (path, id, svc) in services {
        let ports: Ports = svc["spec"]["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                let name = p["name"].as_str().unwrap_or_default().to_string();
                let proto = p["protocol"].as_str().unwrap_or("TCP").to_lowercase();
                assert_eq!(
                    p.get("targetPort").unwrap_or(&p["port"]),
                    &p["port"],
                    "{}: {id}: targetPort must be the forward's port",
                    path.display()
                );
                (name, proto, p["port"].as_u64().unwrap_or_default())
            })
            .collect();
        let ns = id.split('/').next().unwrap();
        assert!(
            forwards
                .iter()
                .any(|(nad, f)| nad.starts_with(&format!("{ns}/")) && *f == ports),
            "{}: Service {id} ports {ports:?} match the forwards of no NAD in {ns}",
            path.display()
        );
    }
}

/// The DaemonSet keeps the records where the plugin writes them by default.
#[test]
fn the_daemonset_mounts_the_plugins_state_dir() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let ds = yaml_documents(&root.join("daemonset/daemonset.yaml"))
        .into_iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("a DaemonSet in daemonset/daemonset.yaml");
    let host_paths: Vec<&str> = ds["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["hostPath"]["path"].as_str())
        .collect();
    assert!(
        host_paths.contains(&crate::config::DEFAULT_STATE_DIR),
        "no hostPath volume for the plugin's state dir {}: {host_paths:?}",
        crate::config::DEFAULT_STATE_DIR
    );
}

/// What edgelink-operator writes into a Device's NAD passes the plugin's
/// own validation: the example Device (cni-conf/device01-01.yaml) on its
/// EdgeNetwork, on each node the network has ranges for.
#[test]
fn the_operators_nad_of_the_example_device_is_a_valid_config() {
    use edgelink_operator::crd::{Device, EdgeNetwork};
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    let device: Device = serde_norway::from_str(&read("cni-conf/device01-01.yaml")).unwrap();
    let net: EdgeNetwork =
        serde_norway::from_str(&read("cni-conf/edgenetwork-plant-floor.yaml")).unwrap();
    // One NAD for a Device on both nodes: each node takes its own range.
    let both = ["kedge1".to_string(), "kedge2".to_string()];
    for node in ["kedge1", "kedge2"] {
        let mut conf = edgelink_operator::render::cni_config(&device, &net, &both, &[]);
        conf["ipam"]["nodeName"] = Value::String(node.into());
        let parsed = NetConf::parse(conf.to_string().as_bytes()).unwrap();
        Config::parse(parsed, &add_env())
            .unwrap_or_else(|e| panic!("on {node}: {}: {conf}", e.into_cni()));
        assert_eq!(forward_ports(&conf).len(), 3, "{conf}");
    }
}

/// Each probe type the operator renders from `Device.spec.health` (and
/// its defaults) is a health the plugin takes, with the same target.
#[test]
fn the_operators_health_of_each_type_is_a_valid_config() {
    use edgelink_operator::crd::{DeviceHealth, ProbeType};
    let cases = [
        (DeviceHealth::default(), "172.17.16.120:8080"),
        (
            DeviceHealth {
                type_: Some(ProbeType::Icmp),
                ..Default::default()
            },
            "172.17.16.120",
        ),
        (
            DeviceHealth {
                type_: Some(ProbeType::Http),
                port: Some(80),
                path: Some("/healthz".into()),
                expect_status: Some(200),
                interval_seconds: Some(1),
                timeout_seconds: Some(1),
                ..Default::default()
            },
            "172.17.16.120:80",
        ),
        (
            DeviceHealth {
                type_: Some(ProbeType::Udp),
                payload: Some("ping\n".into()),
                ..Default::default()
            },
            "172.17.16.120:5000",
        ),
        (
            DeviceHealth {
                type_: Some(ProbeType::Modbus),
                port: Some(8080),
                unit_id: Some(7),
                register: Some(40),
                failure_threshold: Some(1),
                success_threshold: Some(3),
                ..Default::default()
            },
            "172.17.16.120:8080",
        ),
    ];
    for (h, target) in cases {
        let mut d = device_with_every_port_key();
        d.spec.health = Some(h.clone());
        let c = parse_operators_nad(&d).unwrap_or_else(|e| panic!("{h:?}: {}", e.into_cni()));
        let got = c.health.expect("a health");
        assert_eq!(got.target.to_string(), target, "{h:?}");
    }
}

/// The example Device with every forward key edgelink-operator passes on:
/// api relayed with a bound, a queue timeout, retries and PROXY v2; telemetry
/// (UDP) on the kernel path; http with PROXY v1.
fn device_with_every_port_key() -> edgelink_operator::crd::Device {
    use edgelink_operator::crd::{ForwardPath, ProxyProtocol};
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = std::fs::read_to_string(root.join("cni-conf/device01-01.yaml")).unwrap();
    let mut d: edgelink_operator::crd::Device = serde_norway::from_str(&text).unwrap();
    let api = &mut d.spec.ports[0];
    api.max_connections = Some(64);
    api.queue_timeout_ms = Some(5000);
    api.connect_retries = Some(3);
    api.proxy_protocol = Some(ProxyProtocol::V2);
    api.path = Some(ForwardPath::Relay);
    d.spec.ports[1].path = Some(ForwardPath::Kernel);
    d.spec.ports[2].proxy_protocol = Some(ProxyProtocol::V1);
    d
}

/// The plugin's Config of the NAD the operator renders for `d` on kedge1.
fn parse_operators_nad(
    d: &edgelink_operator::crd::Device,
) -> Result<Config, crate::error::PluginError> {
    parse_operators_nad_with(d, &[])
}

/// The same, with the reverse entries' targets as the controller resolved
/// them.
fn parse_operators_nad_with(
    d: &edgelink_operator::crd::Device,
    reverse: &[edgelink_operator::reverse::Resolved],
) -> Result<Config, crate::error::PluginError> {
    use edgelink_operator::crd::EdgeNetwork;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = std::fs::read_to_string(root.join("cni-conf/edgenetwork-plant-floor.yaml")).unwrap();
    let net: EdgeNetwork = serde_norway::from_str(&text).unwrap();
    let mut conf = edgelink_operator::render::cni_config(d, &net, &["kedge1".to_string()], reverse);
    conf["ipam"]["nodeName"] = Value::String("kedge1".into());
    Config::parse(NetConf::parse(conf.to_string().as_bytes())?, &add_env())
}

/// A Device using every port key the operator has renders a NAD the plugin
/// accepts, and each key reaches the record's forward as it was given.
#[test]
fn the_operators_nad_with_every_port_key_is_a_valid_config() {
    use edgelink_attachment::{ForwardPath, ProxyProtocol};
    let d = device_with_every_port_key();
    assert_eq!(edgelink_operator::validate::device(&d), Ok(()));
    let cfg = parse_operators_nad(&d).unwrap_or_else(|e| panic!("{}", e.into_cni()));
    let [api, telemetry, http] = &cfg.forwards[..] else {
        panic!("{:?}", cfg.forwards);
    };
    assert_eq!(
        (
            api.max_connections,
            api.queue_timeout_ms,
            api.connect_retries,
            api.proxy_protocol,
            api.path
        ),
        (
            Some(64),
            Some(5000),
            Some(3),
            Some(ProxyProtocol::V2),
            ForwardPath::Relay
        )
    );
    assert_eq!(telemetry.path, ForwardPath::Kernel);
    assert_eq!(
        (http.proxy_protocol, http.path, http.connect_timeout_ms),
        (Some(ProxyProtocol::V1), ForwardPath::Relay, 2000)
    );
}

/// A Device's reverse entries, a Service (as the controller resolves it:
/// its ClusterIP) and a name target, render into a NAD the plugin accepts,
/// each entry as it was given.
#[test]
fn the_operators_nad_with_reverse_entries_is_a_valid_config() {
    use edgelink_operator::crd::DeviceReverse;
    use edgelink_operator::reverse::Resolved;
    let mut d = device_with_every_port_key();
    let entry = |v: serde_json::Value| -> DeviceReverse { serde_json::from_value(v).unwrap() };
    d.spec.reverse = vec![
        entry(serde_json::json!({"name": "mqtt", "port": 1883,
            "service": {"name": "mqtt", "port": 1883}, "connectRetries": 1})),
        entry(
            serde_json::json!({"name": "mock", "protocol": "udp", "port": 9000,
            "target": "mock.hil.svc.cluster.local:9000",
            "allowedSources": ["172.17.16.120/32"]}),
        ),
    ];
    assert_eq!(edgelink_operator::validate::device(&d), Ok(()));
    let resolved = vec![
        Resolved {
            name: "mqtt".into(),
            service: Some("hil/mqtt".into()),
            target: Ok("10.96.4.12:1883".into()),
        },
        Resolved {
            name: "mock".into(),
            service: None,
            target: Ok("mock.hil.svc.cluster.local:9000".into()),
        },
    ];
    let cfg =
        parse_operators_nad_with(&d, &resolved).unwrap_or_else(|e| panic!("{}", e.into_cni()));
    let [mqtt, mock] = &cfg.reverse[..] else {
        panic!("{:?}", cfg.reverse);
    };
    assert_eq!(
        (mqtt.port, mqtt.target.to_string(), mqtt.connect_retries),
        (1883, "10.96.4.12:1883".to_string(), Some(1))
    );
    assert_eq!(mock.target.to_string(), "mock.hil.svc.cluster.local:9000");
    assert_eq!(
        mock.allowed_sources,
        vec!["172.17.16.120/32".parse().unwrap()]
    );
}

/// The operator's schema bounds are the plugin's, and what its controller
/// refuses in a Device's ports is what the plugin would refuse at ADD (and
/// nothing it would accept).
#[test]
fn the_operator_refuses_the_port_keys_the_plugin_refuses() {
    use crate::config::{MAX_CONNECTIONS, MAX_CONNECT_RETRIES, MAX_QUEUE_TIMEOUT_MS};
    use edgelink_operator::crd::{self, ForwardPath, ProxyProtocol};
    assert_eq!(u64::from(crd::MAX_CONNECTIONS), MAX_CONNECTIONS);
    assert_eq!(u64::from(crd::MAX_QUEUE_TIMEOUT_MS), MAX_QUEUE_TIMEOUT_MS);
    assert_eq!(u64::from(crd::MAX_CONNECT_RETRIES), MAX_CONNECT_RETRIES);
    type Edit = fn(&mut crd::DevicePort);
    let keys: [(&str, Edit); 4] = [
        ("maxConnections", |p| p.max_connections = Some(8)),
        ("queueTimeoutMs", |p| p.queue_timeout_ms = Some(1000)),
        ("connectRetries", |p| p.connect_retries = Some(1)),
        ("proxyProtocol", |p| {
            p.proxy_protocol = Some(ProxyProtocol::V1)
        }),
    ];
    // Port 0 is api (TCP), port 1 telemetry (UDP).
    for (key, set) in keys {
        for (port, path, valid) in [
            (0, None, true),
            (0, Some(ForwardPath::Relay), true),
            (0, Some(ForwardPath::Kernel), false),
            (1, None, false),
            (1, Some(ForwardPath::Kernel), false),
        ] {
            let mut d = device_with_every_port_key();
            for p in &mut d.spec.ports {
                (p.max_connections, p.queue_timeout_ms, p.connect_retries) = (None, None, None);
                (p.proxy_protocol, p.path) = (None, None);
            }
            set(&mut d.spec.ports[port]);
            d.spec.ports[port].path = path;
            let case = format!("{key} on ports[{port}] with path {path:?}");
            let operator = edgelink_operator::validate::device(&d);
            let plugin = parse_operators_nad(&d);
            assert_eq!(operator.is_ok(), valid, "operator: {case}: {operator:?}");
            assert_eq!(
                plugin.is_ok(),
                valid,
                "plugin: {case}: {:?}",
                plugin.err().map(|e| e.into_cni())
            );
        }
    }
}
