//! A Device's proxy pods: one StatefulSet of one pod per node, pinned to
//! it, with the readiness gate the operator sets from the node's device
//! health.
//!
//! Names: a Device on one node keeps the names it always had (StatefulSet
//! `<device>`, pod `<device>-0`), so an upgrade of the operator does not
//! move a running proxy. On several nodes each proxy is `<device>-<node>`
//! (pod `<device>-<node>-0`); a node name that is not a DNS label, or too
//! long for the pair to stay within 61 characters, gives `<device>-n` and
//! 8 hex digits of a hash of both names instead. Going from one node to
//! several (or back) replaces the proxy on the node that stays, once.

use super::{labels, meta, name_ns, ProxyPodSettings, CONFIG_HASH_ANNOTATION, NETWORKS_ANNOTATION};
use crate::crd::{Device, ForwardPath, Protocol};
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec, StatefulSetUpdateStrategy};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, NodeAffinity, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, PodReadinessGate, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SeccompProfile, SecurityContext, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::json;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// The pod condition the operator sets from the device's health: on a
/// proxy pod, its node reaches the device; on a pod that names devices in
/// [`REQUIRES_DEVICES_ANNOTATION`], every one of them is reached from some
/// node. With it among the pod's readiness gates, the pod is Ready (in
/// its Services' endpoints) only while it is True.
pub const READINESS_GATE: &str = "edgelink.io/device-reachable";
/// A client pod's list of the Devices it needs (`device01-01,device01-02`,
/// or `namespace/name` for a Device of another namespace).
pub const REQUIRES_DEVICES_ANNOTATION: &str = "edgelink.io/requires-devices";
/// The label that tells the proxies of one Device apart: its StatefulSet's name.
pub const PROXY_LABEL: &str = "edgelink.io/proxy";
/// The node label of a proxy pod.
pub const NODE_LABEL: &str = "edgelink.io/node";

/// The longest proxy name: the Device name's bound (its pod `<name>-0`
/// and the StatefulSet's revision label stay within 63 characters).
const MAX_NAME: usize = 61;

/// The StatefulSet of `device`'s proxy on `node`, the Device being on
/// `several` nodes or one.
pub fn proxy_name(device: &str, node: &str, several: bool) -> String {
    if !several {
        return device.to_string();
    }
    let label = !node.is_empty()
        && node.len() <= 63
        && node
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && !node.starts_with('-')
        && !node.ends_with('-');
    if label && device.len() + 1 + node.len() <= MAX_NAME {
        return format!("{device}-{node}");
    }
    let digest = Sha256::digest(format!("{device}/{node}").as_bytes());
    let hash: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    let keep = device.len().min(MAX_NAME - 10);
    format!("{}-n{hash}", device[..keep].trim_end_matches('-'))
}

/// The pod of a proxy (its StatefulSet's only one).
pub fn pod_name(proxy: &str) -> String {
    format!("{proxy}-0")
}

/// The StatefulSet of `d`'s proxy `name` on `node`. `several`: the Device
/// has more than one node, and each StatefulSet selects its own pod.
pub(super) fn statefulset(
    d: &Device,
    node: &str,
    name: &str,
    several: bool,
    hash: &str,
    settings: &ProxyPodSettings,
) -> StatefulSet {
    let (device, _) = name_ns(d);
    let mut pod_labels = labels(&device);
    pod_labels.insert(PROXY_LABEL.into(), name.to_string());
    if node.len() <= 63 {
        pod_labels.insert(NODE_LABEL.into(), node.to_string());
    }
    let mut select = BTreeMap::from([(super::DEVICE_LABEL.to_string(), device.clone())]);
    if several {
        select.insert(PROXY_LABEL.into(), name.to_string());
    }
    let networks = json!([{ "name": device, "interface": super::SEGMENT_IFNAME }]).to_string();
    let mut m = meta(d);
    m.name = Some(name.to_string());
    StatefulSet {
        metadata: m,
        spec: Some(StatefulSetSpec {
            replicas: Some(1),
            service_name: Some(device.clone()),
            selector: LabelSelector {
                match_labels: Some(select),
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
                spec: Some(pod_spec(d, node, settings)),
            },
            ..Default::default()
        }),
        status: None,
    }
}

fn pod_spec(d: &Device, node: &str, settings: &ProxyPodSettings) -> PodSpec {
    PodSpec {
        affinity: Some(affinity(node, settings)),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        termination_grace_period_seconds: Some(5),
        readiness_gates: Some(vec![PodReadinessGate {
            condition_type: READINESS_GATE.into(),
        }]),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(65535),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            }),
            ..Default::default()
        }),
        containers: vec![container(d, settings)],
        ..Default::default()
    }
}

fn affinity(node: &str, settings: &ProxyPodSettings) -> Affinity {
    let match_expressions = settings.edge_label.as_ref().map(|(k, v)| {
        vec![NodeSelectorRequirement {
            key: k.clone(),
            operator: "In".into(),
            values: Some(vec![v.clone()]),
        }]
    });
    Affinity {
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
    }
}

/// The pause container, probed for readiness once edgelinkd listens in the
/// pod: the first relayed TCP port (a UDP listener cannot be probed from
/// the kubelet). A kernel-path port has no listener: the probe's
/// connection is DNATed to the device, so only when every TCP port is on
/// the kernel path is the first of them probed. Whether the device
/// answers is the readiness gate's business, not this probe's.
fn container(d: &Device, settings: &ProxyPodSettings) -> Container {
    let tcp = || d.spec.ports.iter().filter(|p| p.protocol == Protocol::Tcp);
    let readiness_probe = tcp()
        .find(|p| p.path != Some(ForwardPath::Kernel))
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
    Container {
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
    }
}
