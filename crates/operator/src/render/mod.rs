//! The objects a Device owns, made from the Device, its EdgeNetwork and
//! the nodes it is on: the NetworkAttachmentDefinition (net1 on the
//! segment, the forwards and the health probe), one proxy pod's
//! StatefulSet per node (`proxy`) and the Service in front of them all.
//! Pure functions: the controller applies what they return.

use crate::crd::{
    Device, EdgeNetwork, Mode, NetworkAttachmentDefinition, NetworkAttachmentDefinitionSpec,
};
use crate::reverse::Resolved;
pub use crate::target::target;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
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
    /// One per node, in the order of the Device's nodes.
    pub proxies: Vec<Proxy>,
    pub service: Service,
}

/// The proxy of a Device on one node.
#[derive(Debug, Clone)]
pub struct Proxy {
    pub node: String,
    /// The StatefulSet's name (`proxy::proxy_name`).
    pub name: String,
    pub statefulset: StatefulSet,
}

impl Proxy {
    pub fn pod(&self) -> String {
        pod_name(&self.name)
    }
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

/// The CNI configuration of `d`'s NAD, for its proxy pods on `nodes`: the
/// network's interface settings, only the ranges of `nodes` (IPv4 and IPv6
/// apart, one range set each; each range names its node, and the plugin
/// takes its own node's), the forwards of `d.spec.ports`, the health
/// probe (`health::config`), and the
/// device's address as the only allowed target; and the reverse entries
/// of `d.spec.reverse` whose target is resolved (`reverse`; the key is
/// left out when none is, so a Device without any keeps its config).
pub fn cni_config(d: &Device, net: &EdgeNetwork, nodes: &[String], reverse: &[Resolved]) -> Value {
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
    for r in s.ipam.ranges.iter().filter(|r| nodes.contains(&r.node)) {
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
                (
                    "maxConnections",
                    p.max_connections.map(|m| share(m, nodes.len())),
                ),
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
    o.insert("health".into(), health::config(d));
    let reverse = crate::reverse::plugin_entries(d, reverse);
    if !reverse.is_empty() {
        o.insert("reverse".into(), Value::Array(reverse));
        // The plugin refuses virtual addresses without reverse entries
        // (none is rendered while no target resolves).
        if !d.spec.virtual_addresses.is_empty() {
            o.insert("virtualAddresses".into(), json!(d.spec.virtual_addresses));
        }
    }
    if d.spec.allow_foreign_sources == Some(true) {
        o.insert("allowForeignSources".into(), json!(true));
    }
    c
}

/// A port's `maxConnections` is the device's total: each of `nodes`
/// proxies admits its share, so the device never sees more than the total
/// (the remainder is left unused; `validate::connections_split` refuses a
/// total below the number of nodes).
pub fn share(total: u32, nodes: usize) -> u32 {
    (total / nodes.max(1) as u32).max(1)
}

/// The hex SHA-256 of the NAD's config (short: 16 digits).
pub fn config_hash(config: &str) -> String {
    let digest = Sha256::digest(config.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// `reverse`: the targets of `d`'s reverse entries (`crate::reverse::resolve`);
/// `nodes`: the Device's nodes (at least one).
pub fn render(
    d: &Device,
    net: &EdgeNetwork,
    nodes: &[String],
    settings: &ProxyPodSettings,
    reverse: &[Resolved],
) -> Rendered {
    let config =
        serde_json::to_string_pretty(&cni_config(d, net, nodes, reverse)).expect("JSON serialises");
    let hash = config_hash(&config);
    let nad = NetworkAttachmentDefinition {
        metadata: meta(d),
        spec: NetworkAttachmentDefinitionSpec { config },
    };
    let (device, _) = name_ns(d);
    let several = nodes.len() > 1;
    let proxies = nodes
        .iter()
        .map(|node| {
            let name = proxy_name(&device, node, several);
            Proxy {
                statefulset: proxy::statefulset(d, node, &name, several, &hash, settings),
                node: node.clone(),
                name,
            }
        })
        .collect();
    Rendered {
        proxies,
        service: service(d),
        nad,
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

mod health;
mod policy;
mod proxy;
pub use policy::network_policy;
pub use proxy::{
    pod_name, proxy_name, NODE_LABEL, PROXY_LABEL, READINESS_GATE, REQUIRES_DEVICES_ANNOTATION,
};

#[cfg(test)]
mod tests;
