//! The three objects a Device owns, made from the Device, its EdgeNetwork
//! and the node it is pinned to: the NetworkAttachmentDefinition (net1 on
//! the segment and the forwards), the proxy pod's StatefulSet and the
//! Service. Pure functions: the controller applies what they return.

use crate::crd::{
    Device, EdgeNetwork, Mode, NetworkAttachmentDefinition, NetworkAttachmentDefinitionSpec,
};
use crate::reverse::Resolved;
pub use crate::target::target;
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec, StatefulSetUpdateStrategy};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, NodeAffinity, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements,
    SeccompProfile, SecurityContext, Service, ServicePort, ServiceSpec, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::net::IpAddr;

pub const MANAGER: &str = "edgelink-operator";
/// The label that ties a proxy pod and a Service to their Device.
pub const DEVICE_LABEL: &str = "edgelink.io/device";
/// The proxy pod's template carries the NAD config's digest: a changed
/// config (ports, network) replaces the pod, whose forwards come from the
/// config at ADD.
pub const CONFIG_HASH_ANNOTATION: &str = "edgelink.io/config-hash";
pub const NETWORKS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/networks";
/// The interface the segment gets in the proxy pod.
pub const SEGMENT_IFNAME: &str = "net1";

/// Settings of the operator that shape every proxy pod.
#[derive(Debug, Clone)]
pub struct ProxyPodSettings {
    /// The proxy pod's only container: holds the network namespace.
    pub image: String,
    /// The node label edgelinkd's DaemonSet runs on (`edgelink.io/edge=true`);
    /// `None`: do not require it.
    pub edge_label: Option<(String, String)>,
}

impl Default for ProxyPodSettings {
    fn default() -> Self {
        ProxyPodSettings {
            image: "registry.k8s.io/pause:3.9".into(),
            edge_label: Some(("edgelink.io/edge".into(), "true".into())),
        }
    }
}

/// Everything that is made for one Device.
#[derive(Debug, Clone)]
pub struct Rendered {
    pub nad: NetworkAttachmentDefinition,
    pub statefulset: StatefulSet,
    pub service: Service,
}

/// The name of the proxy pod (the StatefulSet's only one).
pub fn pod_name(device: &str) -> String {
    format!("{device}-0")
}

fn name_ns(d: &Device) -> (String, String) {
    (
        d.metadata.name.clone().unwrap_or_default(),
        d.metadata.namespace.clone().unwrap_or_default(),
    )
}

pub fn labels(device: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), device.to_string()),
        (
            "app.kubernetes.io/component".to_string(),
            "device-proxy".to_string(),
        ),
        (
            "app.kubernetes.io/managed-by".to_string(),
            MANAGER.to_string(),
        ),
        (DEVICE_LABEL.to_string(), device.to_string()),
    ])
}

fn selector(device: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(DEVICE_LABEL.to_string(), device.to_string())])
}

/// The owner reference every object of `d` carries (controller: true).
pub fn owner(d: &Device) -> OwnerReference {
    OwnerReference {
        api_version: Device::api_version(&()).into_owned(),
        kind: Device::kind(&()).into_owned(),
        name: d.metadata.name.clone().unwrap_or_default(),
        uid: d.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn meta(d: &Device) -> ObjectMeta {
    let (name, ns) = name_ns(d);
    ObjectMeta {
        name: Some(name.clone()),
        namespace: Some(ns),
        labels: Some(labels(&name)),
        owner_references: Some(vec![owner(d)]),
        ..Default::default()
    }
}

fn host_cidr(address: &str) -> String {
    match address.parse::<IpAddr>() {
        Ok(IpAddr::V6(a)) => format!("{a}/128"),
        Ok(a) => format!("{a}/32"),
        Err(_) => address.to_string(),
    }
}

/// The CNI configuration of `d`'s NAD, for the proxy pod on `node`: the
/// network's interface settings, only `node`'s ranges (IPv4 and IPv6
/// apart, one range set each), the forwards of `d.spec.ports`, and the
/// device's address as the only allowed target; and the reverse entries
/// of `d.spec.reverse` whose target is resolved (`reverse`; the key is
/// left out when none is, so a Device without any keeps its config).
pub fn cni_config(d: &Device, net: &EdgeNetwork, node: &str, reverse: &[Resolved]) -> Value {
    let s = &net.spec;
    let cni_name = s
        .cni_name
        .clone()
        .unwrap_or_else(|| net.metadata.name.clone().unwrap_or_default());
    let mut c = json!({
        "cniVersion": "1.0.0",
        "name": cni_name,
        "type": "edgelink",
    });
    let o = c.as_object_mut().expect("an object");
    match s.mode {
        Mode::Bridge => {
            o.insert("mode".into(), json!("bridge"));
            if let Some(b) = &s.bridge {
                o.insert("bridge".into(), json!(b));
            }
            if let Some(m) = s.move_uplink_addresses {
                o.insert("moveUplinkAddresses".into(), json!(m));
            }
            if let Some(v) = s.vlan {
                o.insert("vlan".into(), json!(v));
            }
        }
        Mode::Macvlan => {
            o.insert("mode".into(), json!("macvlan"));
            if let Some(m) = s.macvlan_mode {
                o.insert(
                    "macvlanMode".into(),
                    serde_json::to_value(m).expect("an enum"),
                );
            }
        }
    }
    if let Some(u) = &s.uplink {
        o.insert("uplink".into(), json!(u));
    }
    if let Some(m) = s.mtu {
        o.insert("mtu".into(), json!(m));
    }
    let (mut v4, mut v6) = (Vec::new(), Vec::new());
    for r in s.ipam.ranges.iter().filter(|r| r.node == node) {
        let mut e = json!({"subnet": r.subnet, "node": r.node});
        let eo = e.as_object_mut().expect("an object");
        for (k, v) in [
            ("rangeStart", &r.range_start),
            ("rangeEnd", &r.range_end),
            ("gateway", &r.gateway),
        ] {
            if let Some(v) = v {
                eo.insert(k.into(), json!(v));
            }
        }
        if r.subnet.contains(':') {
            v6.push(e);
        } else {
            v4.push(e);
        }
    }
    let sets: Vec<Value> = [v4, v6]
        .into_iter()
        .filter(|s| !s.is_empty())
        .map(Value::Array)
        .collect();
    let mut ipam = json!({ "ranges": sets });
    if !s.ipam.exclude.is_empty() {
        ipam["exclude"] = json!(s.ipam.exclude);
    }
    if !s.ipam.routes.is_empty() {
        ipam["routes"] = serde_json::to_value(&s.ipam.routes).expect("routes serialise");
    }
    o.insert("ipam".into(), ipam);
    let forwards: Vec<Value> = d
        .spec
        .ports
        .iter()
        .map(|p| {
            let mut f = json!({
                "name": p.name,
                "protocol": p.protocol.as_str(),
                "port": p.port,
                "target": target(&d.spec.address, p.target_port()),
            });
            let fo = f.as_object_mut().expect("an object");
            for (k, v) in [
                ("connectTimeoutMs", p.connect_timeout_ms),
                ("maxConnections", p.max_connections),
                ("queueTimeoutMs", p.queue_timeout_ms),
                ("connectRetries", p.connect_retries),
            ] {
                if let Some(v) = v {
                    fo.insert(k.into(), json!(v));
                }
            }
            if let Some(pp) = p.proxy_protocol {
                fo.insert("proxyProtocol".into(), json!(pp.as_str()));
            }
            if let Some(path) = p.path {
                fo.insert("path".into(), json!(path.as_str()));
            }
            f
        })
        .collect();
    o.insert("forwards".into(), Value::Array(forwards));
    o.insert("allowedTargets".into(), json!([host_cidr(&d.spec.address)]));
    let reverse = crate::reverse::plugin_entries(d, reverse);
    if !reverse.is_empty() {
        o.insert("reverse".into(), Value::Array(reverse));
    }
    if d.spec.allow_foreign_sources == Some(true) {
        o.insert("allowForeignSources".into(), json!(true));
    }
    c
}

/// The hex SHA-256 of the NAD's config (short: 16 digits).
pub fn config_hash(config: &str) -> String {
    let digest = Sha256::digest(config.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// `reverse`: the targets of `d`'s reverse entries (`crate::reverse::resolve`).
pub fn render(
    d: &Device,
    net: &EdgeNetwork,
    node: &str,
    settings: &ProxyPodSettings,
    reverse: &[Resolved],
) -> Rendered {
    let config =
        serde_json::to_string_pretty(&cni_config(d, net, node, reverse)).expect("JSON serialises");
    let hash = config_hash(&config);
    let nad = NetworkAttachmentDefinition {
        metadata: meta(d),
        spec: NetworkAttachmentDefinitionSpec { config },
    };
    Rendered {
        statefulset: statefulset(d, node, &hash, settings),
        service: service(d),
        nad,
    }
}

fn statefulset(d: &Device, node: &str, hash: &str, settings: &ProxyPodSettings) -> StatefulSet {
    let (name, _) = name_ns(d);
    let mut pod_labels = labels(&name);
    pod_labels.insert("edgelink.io/node".into(), node.to_string());
    let networks = json!([{ "name": name, "interface": SEGMENT_IFNAME }]).to_string();
    let mut match_expressions = None;
    if let Some((k, v)) = &settings.edge_label {
        match_expressions = Some(vec![NodeSelectorRequirement {
            key: k.clone(),
            operator: "In".into(),
            values: Some(vec![v.clone()]),
        }]);
    }
    let affinity = Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: "metadata.name".into(),
                        operator: "In".into(),
                        values: Some(vec![node.to_string()]),
                    }]),
                    match_expressions,
                }],
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    // Ready once edgelinkd listens in the pod: the first relayed TCP port
    // (a UDP listener cannot be probed from the kubelet). A kernel-path
    // port has no listener: the probe's connection is DNATed to the
    // device, so only when every TCP port is on the kernel path is the
    // first of them probed (ready once the table is installed and the
    // device accepts).
    let tcp = || {
        d.spec
            .ports
            .iter()
            .filter(|p| p.protocol == crate::crd::Protocol::Tcp)
    };
    let readiness_probe = tcp()
        .find(|p| p.path != Some(crate::crd::ForwardPath::Kernel))
        .or_else(|| tcp().next())
        .map(|p| Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(p.port as i32),
                host: None,
            }),
            period_seconds: Some(10),
            timeout_seconds: Some(2),
            ..Default::default()
        });
    let container = Container {
        name: "pause".into(),
        image: Some(settings.image.clone()),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            ..Default::default()
        }),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("1m".into())),
                ("memory".to_string(), Quantity("4Mi".into())),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".to_string(),
                Quantity("16Mi".into()),
            )])),
            ..Default::default()
        }),
        readiness_probe,
        ..Default::default()
    };
    StatefulSet {
        metadata: meta(d),
        spec: Some(StatefulSetSpec {
            replicas: Some(1),
            service_name: Some(name.clone()),
            selector: LabelSelector {
                match_labels: Some(selector(&name)),
                match_expressions: None,
            },
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: None,
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(BTreeMap::from([
                        (NETWORKS_ANNOTATION.to_string(), networks),
                        (CONFIG_HASH_ANNOTATION.to_string(), hash.to_string()),
                    ])),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    affinity: Some(affinity),
                    automount_service_account_token: Some(false),
                    enable_service_links: Some(false),
                    termination_grace_period_seconds: Some(5),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(65535),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".into(),
                            localhost_profile: None,
                        }),
                        ..Default::default()
                    }),
                    containers: vec![container],
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    }
}

/// One port per `d.spec.ports` entry; reverse entries are for devices on
/// the segment only and never get one.
fn service(d: &Device) -> Service {
    let (name, _) = name_ns(d);
    let ports = d
        .spec
        .ports
        .iter()
        .map(|p| ServicePort {
            name: Some(p.name.clone()),
            protocol: Some(p.protocol.service().into()),
            port: p.port as i32,
            target_port: Some(IntOrString::Int(p.port as i32)),
            app_protocol: p.app_protocol.clone(),
            ..Default::default()
        })
        .collect();
    Service {
        metadata: meta(d),
        spec: Some(ServiceSpec {
            selector: Some(selector(&name)),
            ports: Some(ports),
            ..Default::default()
        }),
        status: None,
    }
}

/// `8080/tcp,5000/udp`: the PORTS column of `kubectl get devices`.
pub fn port_list(d: &Device) -> String {
    d.spec
        .ports
        .iter()
        .map(|p| format!("{}/{}", p.port, p.protocol.as_str()))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{device, network};

    #[test]
    fn the_nad_holds_the_nodes_ranges_the_forwards_and_only_the_device_as_target() {
        let r = render(
            &device(),
            &network(),
            "kedge1",
            &ProxyPodSettings::default(),
            &[],
        );
        let c: Value = serde_json::from_str(&r.nad.spec.config).unwrap();
        assert_eq!(c["name"], "plant-floor");
        assert_eq!(c["type"], "edgelink");
        assert_eq!(
            (
                c["mode"].as_str(),
                c["bridge"].as_str(),
                c["uplink"].as_str()
            ),
            (Some("bridge"), Some("edge0"), Some("eth1"))
        );
        assert_eq!(
            c["ipam"]["ranges"],
            json!([[{"subnet": "172.17.16.0/24", "rangeStart": "172.17.16.200", "rangeEnd": "172.17.16.224", "node": "kedge1"}]])
        );
        assert_eq!(
            c["forwards"],
            json!([
                {"name": "api", "protocol": "tcp", "port": 8080, "target": "172.17.16.120:8080"},
                {"name": "telemetry", "protocol": "udp", "port": 5000, "target": "172.17.16.120:5000"},
                {"name": "http", "protocol": "tcp", "port": 80, "target": "172.17.16.120:80", "connectTimeoutMs": 2000}
            ])
        );
        assert_eq!(c["allowedTargets"], json!(["172.17.16.120/32"]));
        assert_eq!(r.nad.metadata.namespace.as_deref(), Some("hil"));
    }

    #[test]
    fn the_relay_keys_and_the_path_go_into_the_forwards_as_the_plugin_spells_them() {
        use crate::crd::{ForwardPath, ProxyProtocol};
        let mut d = device();
        let api = &mut d.spec.ports[0];
        api.max_connections = Some(64);
        api.queue_timeout_ms = Some(5000);
        api.connect_retries = Some(3);
        api.proxy_protocol = Some(ProxyProtocol::V2);
        api.path = Some(ForwardPath::Relay);
        d.spec.ports[1].path = Some(ForwardPath::Kernel);
        d.spec.ports[2].proxy_protocol = Some(ProxyProtocol::V1);
        let r = render(&d, &network(), "kedge1", &ProxyPodSettings::default(), &[]);
        let c: Value = serde_json::from_str(&r.nad.spec.config).unwrap();
        assert_eq!(
            c["forwards"],
            json!([
                {"name": "api", "protocol": "tcp", "port": 8080, "target": "172.17.16.120:8080",
                 "maxConnections": 64, "queueTimeoutMs": 5000, "connectRetries": 3,
                 "proxyProtocol": "v2", "path": "relay"},
                {"name": "telemetry", "protocol": "udp", "port": 5000, "target": "172.17.16.120:5000", "path": "kernel"},
                {"name": "http", "protocol": "tcp", "port": 80, "target": "172.17.16.120:80", "connectTimeoutMs": 2000,
                 "proxyProtocol": "v1"}
            ])
        );
        // A new key replaces the pod, whose forwards are fixed at ADD.
        assert_ne!(
            config_hash(&r.nad.spec.config),
            config_hash(
                &render(
                    &device(),
                    &network(),
                    "kedge1",
                    &ProxyPodSettings::default(),
                    &[]
                )
                .nad
                .spec
                .config
            )
        );
    }

    #[test]
    fn every_object_is_owned_by_the_device_and_labelled() {
        let d = device();
        let r = render(&d, &network(), "kedge1", &ProxyPodSettings::default(), &[]);
        for m in [
            &r.nad.metadata,
            &r.statefulset.metadata,
            &r.service.metadata,
        ] {
            assert_eq!(m.name.as_deref(), Some("device01-01"));
            let o = &m.owner_references.as_ref().unwrap()[0];
            assert_eq!(
                (o.kind.as_str(), o.name.as_str(), o.uid.as_str()),
                ("Device", "device01-01", "5f1c-uid")
            );
            assert_eq!(o.api_version, "edgelink.io/v1alpha1");
            assert_eq!(o.controller, Some(true));
            assert_eq!(
                m.labels.as_ref().unwrap()["app.kubernetes.io/managed-by"],
                MANAGER
            );
        }
    }

    #[test]
    fn the_proxy_pod_is_pinned_annotated_probed_and_unprivileged() {
        let r = render(
            &device(),
            &network(),
            "kedge1",
            &ProxyPodSettings::default(),
            &[],
        );
        let s = r.statefulset.spec.unwrap();
        assert_eq!(s.replicas, Some(1));
        let t = s.template;
        let ann = t.metadata.as_ref().unwrap().annotations.as_ref().unwrap();
        assert_eq!(
            ann[NETWORKS_ANNOTATION],
            r#"[{"interface":"net1","name":"device01-01"}]"#
        );
        assert_eq!(ann[CONFIG_HASH_ANNOTATION], config_hash(&r.nad.spec.config));
        let labels = t.metadata.as_ref().unwrap().labels.as_ref().unwrap();
        for (k, v) in s.selector.match_labels.unwrap() {
            assert_eq!(labels[&k], v, "the selector must match the pod's labels");
        }
        let p = t.spec.unwrap();
        let term = &p
            .affinity
            .unwrap()
            .node_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap()
            .node_selector_terms[0];
        let f = &term.match_fields.as_ref().unwrap()[0];
        assert_eq!(
            (f.key.as_str(), f.values.as_ref().unwrap()[0].as_str()),
            ("metadata.name", "kedge1")
        );
        assert_eq!(
            term.match_expressions.as_ref().unwrap()[0].key,
            "edgelink.io/edge"
        );
        let c = &p.containers[0];
        assert_eq!(c.image.as_deref(), Some("registry.k8s.io/pause:3.9"));
        assert_eq!(
            c.readiness_probe
                .as_ref()
                .unwrap()
                .tcp_socket
                .as_ref()
                .unwrap()
                .port,
            IntOrString::Int(8080)
        );
        assert_eq!(
            c.security_context
                .as_ref()
                .unwrap()
                .allow_privilege_escalation,
            Some(false)
        );
        assert_eq!(p.automount_service_account_token, Some(false));
    }

    #[test]
    fn a_udp_only_device_has_no_probe_and_ipv6_targets_are_bracketed() {
        let mut d = device();
        d.spec.address = "fd00:17::120".into();
        d.spec
            .ports
            .retain(|p| p.protocol == crate::crd::Protocol::Udp);
        d.spec.ports[0].target_port = Some(5001);
        let r = render(&d, &network(), "kedge1", &ProxyPodSettings::default(), &[]);
        assert!(r
            .statefulset
            .spec
            .unwrap()
            .template
            .spec
            .unwrap()
            .containers[0]
            .readiness_probe
            .is_none());
        let c: Value = serde_json::from_str(&r.nad.spec.config).unwrap();
        assert_eq!(c["forwards"][0]["target"], "[fd00:17::120]:5001");
        assert_eq!(c["allowedTargets"], json!(["fd00:17::120/128"]));
    }

    #[test]
    fn the_probe_prefers_a_relayed_tcp_port_to_a_kernel_path_one() {
        use crate::crd::ForwardPath;
        let probe_port = |d: &Device| {
            render(d, &network(), "kedge1", &ProxyPodSettings::default(), &[])
                .statefulset
                .spec
                .unwrap()
                .template
                .spec
                .unwrap()
                .containers[0]
                .readiness_probe
                .as_ref()
                .map(|p| p.tcp_socket.as_ref().unwrap().port.clone())
        };
        let mut d = device();
        d.spec.ports[0].path = Some(ForwardPath::Kernel);
        assert_eq!(probe_port(&d), Some(IntOrString::Int(80)));
        d.spec.ports[2].path = Some(ForwardPath::Kernel);
        assert_eq!(probe_port(&d), Some(IntOrString::Int(8080)));
    }

    #[test]
    fn the_service_has_one_port_per_device_port() {
        let r = render(
            &device(),
            &network(),
            "kedge1",
            &ProxyPodSettings::default(),
            &[],
        );
        let s = r.service.spec.unwrap();
        assert_eq!(s.selector.unwrap()[DEVICE_LABEL], "device01-01");
        let ports: Vec<_> = s
            .ports
            .unwrap()
            .into_iter()
            .map(|p| {
                (
                    p.name.unwrap(),
                    p.protocol.unwrap(),
                    p.port,
                    p.target_port.unwrap(),
                    p.app_protocol,
                )
            })
            .collect();
        assert_eq!(
            ports,
            [
                (
                    "api".to_string(),
                    "TCP".to_string(),
                    8080,
                    IntOrString::Int(8080),
                    None
                ),
                (
                    "telemetry".into(),
                    "UDP".into(),
                    5000,
                    IntOrString::Int(5000),
                    None
                ),
                (
                    "http".into(),
                    "TCP".into(),
                    80,
                    IntOrString::Int(80),
                    Some("http".to_string())
                ),
            ]
        );
        assert_eq!(port_list(&device()), "8080/tcp,5000/udp,80/tcp");
    }

    #[test]
    fn a_port_edit_changes_the_config_hash_and_so_replaces_the_pod() {
        let n = network();
        let a = render(&device(), &n, "kedge1", &ProxyPodSettings::default(), &[]);
        let mut d = device();
        d.spec.ports[0].port = 8081;
        let b = render(&d, &n, "kedge1", &ProxyPodSettings::default(), &[]);
        let hash = |r: &Rendered| {
            r.statefulset
                .spec
                .clone()
                .unwrap()
                .template
                .metadata
                .unwrap()
                .annotations
                .unwrap()[CONFIG_HASH_ANNOTATION]
                .clone()
        };
        assert_ne!(hash(&a), hash(&b));
        assert_eq!(
            hash(&a),
            hash(&render(
                &device(),
                &n,
                "kedge1",
                &ProxyPodSettings::default(),
                &[]
            ))
        );
    }
}
