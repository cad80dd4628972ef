//! The custom resources, group `edgelink.io`, version `v1alpha1`: their Rust
//! types are the source of the CRDs (`edgelink-operator crds`, stored in
//! daemonset/operator/crds.yaml). Every rule the plugin enforces on the fields
//! that end up in a NetworkAttachmentDefinition is in the OpenAPI schema, so
//! `kubectl apply` refuses bad input with the apiserver's own message; what
//! a structural schema cannot say (cross-field rules, overlaps, a node's
//! range) is checked by the controller (`validate.rs`) and reported in
//! status.
//!
//! What of that needs nothing but the object is a CEL rule too (`cel`):
//! crds.yaml needs Kubernetes 1.31 or later. Kubernetes 1.20 is the floor:
//! crds-1.20.yaml (`crds --without-cel`), for 1.20 to 1.30, is the same
//! CRDs without the rules, only structural schemas with `pattern`,
//! `format`, `minimum`/`maximum`, `enum`, `oneOf` and list maps.

use kube::CustomResource;
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

mod access;
mod cel;
mod health;
mod lease;
mod reverse;
mod status;
pub use access::{ClientPeer, DeviceAccess, MAX_PEERS};
pub use health::{
    DeviceHealth, ProbeType, DEFAULT_FAILURE_THRESHOLD, DEFAULT_INTERVAL_SECONDS,
    DEFAULT_SUCCESS_THRESHOLD, DEFAULT_TIMEOUT_SECONDS,
};
pub use lease::{
    DeviceLease, DeviceLeaseSpec, DeviceLeaseStatus, LeaseHolder, LeaseState, MAX_DURATION_SECONDS,
};
pub use reverse::{DeviceReverse, ReverseStatus, ServiceRef, MAX_IDLE_TIMEOUT_MS};
pub use status::{DeviceStatus, NodeStatus, PortStatus};

/// IPv4 or IPv6 CIDR (`format: cidr` is validated by the apiserver too).
pub const CIDR_PATTERN: &str = r"^[0-9a-fA-F:.]+/[0-9]{1,3}$";
/// The longest IP address as text (IPv6 ending in an IPv4 address): a
/// bound for the CEL rules' cost.
pub const IP_MAX_LENGTH: u32 = 45;
/// The longest CIDR: an address and `/128`.
pub const CIDR_MAX_LENGTH: u32 = IP_MAX_LENGTH + 4;

fn ip_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "description": "An IPv4 or IPv6 address.",
        "maxLength": IP_MAX_LENGTH,
        "anyOf": [{"format": "ipv4"}, {"format": "ipv6"}]
    })
}

/// schemars puts `null` into the enum of an `Option` of an enum, which
/// the apiserver refuses: an absent field says None.
fn macvlan_mode_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "description": "Macvlan mode only: bridge, private, vepa or passthru (default bridge).",
        "enum": ["bridge", "private", "vepa", "passthru"]
    })
}

/// As [`macvlan_mode_schema`]: no `null` in the enum.
pub(crate) fn proxy_protocol_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "description": "PROXY protocol version: v1 or v2.",
        "enum": ["v1", "v2"]
    })
}

fn forward_path_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "description": "relay or kernel (default relay).",
        "enum": ["relay", "kernel"]
    })
}

fn cidr_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "description": "An IPv4 or IPv6 CIDR (a bare address is not accepted: give /32 or /128).",
        "format": "cidr",
        "maxLength": CIDR_MAX_LENGTH,
        "pattern": CIDR_PATTERN
    })
}

pub(crate) fn cidr_list_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "items": {"type": "string", "format": "cidr", "maxLength": CIDR_MAX_LENGTH, "pattern": CIDR_PATTERN}
    })
}

/// Up to two addresses (`spec.virtualAddresses`), a set.
fn ip_list_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": 2,
        "x-kubernetes-list-type": "set",
        "items": {"type": "string", "maxLength": IP_MAX_LENGTH, "anyOf": [{"format": "ipv4"}, {"format": "ipv6"}]}
    })
}

/// A device on an edge node's private segment, exposed to the cluster as a
/// Service of the same name. The operator makes its NetworkAttachmentDefinition,
/// its proxy pod (a one-pod StatefulSet pinned to the node) and its Service.
// clippy takes the repeated `type_ = "string"` of printcolumn(...) for a
// duplicated attribute; each belongs to its own column.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "edgelink.io",
    version = "v1alpha1",
    kind = "Device",
    namespaced,
    status = "DeviceStatus",
    shortname = "dev",
    category = "edgelink",
    doc = "A device on an edge node's private segment, exposed as a Service of the same name.",
    validation = cel::device_name(),
    validation = cel::reverse_not_self(),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "the Service has a ready proxy whose forwards all listen"
    ),
    printcolumn(
        name = "Reachable",
        type_ = "string",
        json_path = ".status.reachableNodes",
        description = "nodes that reach the device, of the Device's nodes"
    ),
    printcolumn(
        name = "Nodes",
        type_ = "string",
        json_path = ".status.nodeList",
        description = "the edge nodes of the proxy pods"
    ),
    printcolumn(
        name = "Last-Seen",
        type_ = "date",
        json_path = ".status.lastSeen",
        description = "the latest successful probe of the device"
    ),
    printcolumn(
        name = "Address",
        type_ = "string",
        json_path = ".spec.address",
        description = "the device's address on its segment"
    ),
    printcolumn(
        name = "Ports",
        type_ = "string",
        json_path = ".status.portList",
        description = "port/protocol of each port"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("oneOf" = [{"required": ["nodeName"]}, {"required": ["nodes"]}, {"required": ["nodeSelector"]}]))]
#[schemars(transform = cel::device_spec)]
pub struct DeviceSpec {
    /// The edge node cabled to the device's segment. Exactly one of
    /// nodeName, nodes and nodeSelector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub node_name: Option<String>,
    /// The edge nodes cabled to the device's segment: one proxy pod on
    /// each, all behind the Device's Service.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(min = 1, max = MAX_NODES), extend("x-kubernetes-list-type" = "set"))]
    #[schemars(inner(length(min = 1, max = 253)))]
    pub nodes: Vec<String>,
    /// Labels that select the Device's nodes (at most 16; the controller
    /// reports NoNodeSelected when none is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// How edgelinkd on each node probes the device; a node whose probes
    /// fail leaves the Service's endpoints until they pass again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<DeviceHealth>,
    /// The device's address on the segment; the proxy pod may reach only it.
    #[schemars(schema_with = "ip_schema", transform = cel::unicast)]
    pub address: String,
    /// The EdgeNetwork (cluster-scoped) of the segment.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub network: String,
    /// The ports clients reach at `<device>.<namespace>.svc:<port>`.
    #[schemars(length(min = 1, max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    #[schemars(transform = cel::unique_ports)]
    pub ports: Vec<DevicePort>,
    /// Cluster Services (or `host:port` targets) the device may call: the
    /// proxy pod listens on its segment address (net1) for each and
    /// relays to the target through the cluster network. Never part of
    /// the Device's Service.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    #[schemars(transform = cel::unique_ports)]
    pub reverse: Vec<DeviceReverse>,
    /// The address devices dial for the reverse entries whichever node
    /// serves them (one IPv4 and/or one IPv6, in the segment's subnets,
    /// outside every node's range): held by one proxy pod at a time,
    /// moved to another node's when its node is lost or cannot reach the
    /// device, and announced there (gratuitous ARP, unsolicited NA).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "ip_list_schema", transform = cel::virtual_addresses)]
    pub virtual_addresses: Vec<String>,
    /// Let `reverse[].allowedSources` lie outside the segment's subnets
    /// (plugin `allowForeignSources`; default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_foreign_sources: Option<bool>,
    /// Who may use the device (`allowedClients`); absent: every client.
    /// edgelinkd checks each connection of the relay path; a NetworkPolicy
    /// of the same peers covers the kernel path where the cluster's
    /// network enforces it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<DeviceAccess>,
}

#[derive(
    Deserialize,
    Serialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    #[default]
    Tcp,
    Udp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
    /// As a Service port spells it.
    pub fn service(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        }
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = cel::port)]
pub struct DevicePort {
    /// The Service port's and the forward's name.
    #[schemars(
        length(min = 1, max = 15),
        regex(pattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    pub protocol: Protocol,
    /// The Service's port, and the port the proxy pod listens on.
    #[schemars(range(min = 1, max = 65535))]
    pub port: u32,
    /// The device's port (default: port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub target_port: Option<u32>,
    /// The Service port's appProtocol (http, https, h2c, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub app_protocol: Option<String>,
    /// TCP connect timeout towards the device (plugin `connectTimeoutMs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 600000))]
    pub connect_timeout_ms: Option<u32>,
    /// TCP, relay only: at most this many connections to the device at
    /// once, over all the Device's nodes (each node's proxy admits an equal
    /// share); later clients wait in a queue, first come first served
    /// (plugin `maxConnections`; default edgelinkd's
    /// --forward-max-connections, no bound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_CONNECTIONS))]
    pub max_connections: Option<u32>,
    /// TCP, relay only: how long a client may wait for a place under
    /// maxConnections (plugin `queueTimeoutMs`; default edgelinkd's
    /// --queue-timeout, 30 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_QUEUE_TIMEOUT_MS))]
    pub queue_timeout_ms: Option<u32>,
    /// TCP, relay only: connects to the device tried again after a timeout
    /// or a refusal (plugin `connectRetries`; default edgelinkd's
    /// --connect-retries, 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_CONNECT_RETRIES))]
    pub connect_retries: Option<u32>,
    /// TCP, relay only: send the device a PROXY protocol header with the
    /// client's address, v1 (text) or v2 (binary) (plugin `proxyProtocol`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "proxy_protocol_schema")]
    pub proxy_protocol: Option<ProxyProtocol>,
    /// relay (edgelinkd relays each connection or datagram) or kernel
    /// (nftables DNAT in the proxy pod's namespace, without the relay-only
    /// maxConnections, queueTimeoutMs, connectRetries and proxyProtocol)
    /// (plugin `path`; default relay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "forward_path_schema")]
    pub path: Option<ForwardPath>,
}

/// Nodes of one Device at most (`nodes`, or what `nodeSelector` selects).
pub const MAX_NODES: u32 = 16;
/// `ports[].maxConnections` at most, as the plugin's.
pub const MAX_CONNECTIONS: u32 = 1_000_000;
/// `ports[].queueTimeoutMs` at most, as the plugin's: ten minutes.
pub const MAX_QUEUE_TIMEOUT_MS: u32 = 600_000;
/// `ports[].connectRetries` at most, as the plugin's.
pub const MAX_CONNECT_RETRIES: u32 = 10;

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProxyProtocol {
    V1,
    V2,
}

impl ProxyProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyProtocol::V1 => "v1",
            ProxyProtocol::V2 => "v2",
        }
    }
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ForwardPath {
    #[default]
    Relay,
    Kernel,
}

impl ForwardPath {
    pub fn as_str(self) -> &'static str {
        match self {
            ForwardPath::Relay => "relay",
            ForwardPath::Kernel => "kernel",
        }
    }
}

impl DevicePort {
    pub fn target_port(&self) -> u32 {
        self.target_port.unwrap_or(self.port)
    }
}

/// A private segment behind edge nodes: the plugin settings every Device on
/// it shares (the bridge NAD a hand-written setup references by name).
#[allow(clippy::duplicated_attributes)] // printcolumn(...), as above
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "edgelink.io",
    version = "v1alpha1",
    kind = "EdgeNetwork",
    shortname = "en",
    category = "edgelink",
    doc = "A private segment behind edge nodes: the plugin settings its Devices share.",
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.mode"),
    printcolumn(name = "Uplink", type_ = "string", json_path = ".spec.uplink"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = cel::network_spec)]
pub struct EdgeNetworkSpec {
    /// The CNI network name, which keys each node's IPAM store (default:
    /// the EdgeNetwork's name). Keep it when a hand-written NAD already
    /// allocates on the segment, so both share one store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    )]
    pub cni_name: Option<String>,
    #[serde(default)]
    pub mode: Mode,
    /// Bridge mode: the node's Linux bridge (default edge0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[^/:\s]{1,15}$"))]
    pub bridge: Option<String>,
    /// The node's NIC on the segment: the bridge's port, or the macvlan master
    /// (required with mode macvlan).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[^/:\s]{1,15}$"))]
    pub uplink: Option<String>,
    /// Macvlan mode only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "macvlan_mode_schema")]
    pub macvlan_mode: Option<MacvlanMode>,
    /// Bridge mode only: move the uplink's addresses to the bridge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub move_uplink_addresses: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 68, max = 65535))]
    pub mtu: Option<u32>,
    /// Bridge mode only: VLAN filtering, the pod port untagged in this VLAN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4094))]
    pub vlan: Option<u32>,
    pub ipam: EdgeIpam,
    /// Where devices may be (CIDRs). A Device's address must lie inside;
    /// default: the subnets of the node's ranges. Each proxy pod may reach
    /// only its own device's address whatever this says.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "cidr_list_schema")]
    pub allowed_targets: Vec<String>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Bridge,
    Macvlan,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MacvlanMode {
    Bridge,
    Private,
    Vepa,
    Passthru,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EdgeIpam {
    /// The addresses proxy pods get on the segment, per node: a node's
    /// Devices take their proxy's address from that node's ranges.
    #[schemars(length(min = 1, max = 256))]
    pub ranges: Vec<NodeRange>,
    /// Never handed out (CIDRs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "cidr_list_schema")]
    pub exclude: Vec<String>,
    /// Routes in the proxy pod through net1.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = cel::node_range)]
pub struct NodeRange {
    /// The node these addresses are for.
    #[schemars(length(min = 1, max = 253))]
    pub node: String,
    #[schemars(schema_with = "cidr_schema")]
    pub subnet: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "ip_schema")]
    pub range_start: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "ip_schema")]
    pub range_end: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "ip_schema")]
    pub gateway: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    #[schemars(schema_with = "cidr_schema")]
    pub dst: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "ip_schema")]
    pub gw: Option<String>,
}

/// The NetworkAttachmentDefinition of Multus (`k8s.cni.cncf.io/v1`), as
/// far as the operator writes it. Its CRD is Multus's, never installed by us.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "k8s.cni.cncf.io",
    version = "v1",
    kind = "NetworkAttachmentDefinition",
    plural = "network-attachment-definitions",
    namespaced
)]
pub struct NetworkAttachmentDefinitionSpec {
    /// The CNI configuration, JSON in a string.
    pub config: String,
}

/// The CRDs (Device, EdgeNetwork, DeviceLease) as one multi-document YAML, as stored in
/// daemonset/operator/crds.yaml: with the CEL rules, for Kubernetes 1.31
/// and later.
pub fn crds_yaml() -> String {
    yaml(
        "# Generated by `edgelink-operator crds` from crates/operator/src/crd/:\n\
         # do not edit. A test (crates/operator/tests/crds.rs) keeps it current.\n\
         # Kubernetes 1.31 or later (CEL rules); 1.20 to 1.30: crds-1.20.yaml.\n",
        |_| {},
    )
}

/// As [`crds_yaml`] without the CEL rules, as stored in
/// daemonset/operator/crds-1.20.yaml: for Kubernetes 1.20 to 1.30, where
/// the controller alone reports what the rules refuse.
pub fn crds_yaml_without_cel() -> String {
    yaml(
        "# Generated by `edgelink-operator crds --without-cel` from crates/operator/src/crd/:\n\
         # do not edit. A test (crates/operator/tests/crds.rs) keeps it current.\n\
         # Kubernetes 1.20 to 1.30: crds.yaml without its CEL rules (x-kubernetes-validations).\n",
        cel::strip,
    )
}

fn yaml(header: &str, edit: fn(&mut serde_json::Value)) -> String {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::CustomResourceExt;
    let mut out = String::from(header);
    for crd in [Device::crd(), EdgeNetwork::crd(), DeviceLease::crd()] {
        let mut v = serde_json::to_value(&crd).expect("a CRD serialises");
        drop_unsigned_formats(&mut v);
        edit(&mut v);
        // Back to the type, for its order of fields.
        let crd: CustomResourceDefinition = serde_json::from_value(v).expect("still a CRD");
        out.push_str("---\n");
        out.push_str(&serde_norway::to_string(&crd).expect("a CRD serialises"));
    }
    out
}

/// schemars gives `u32` and `u64` fields `format: uint32`/`uint64`, which
/// the apiserver does not know: 1.36 warns "unrecognized format" at every
/// apply. Their `minimum` (0, or the field's range) says the same.
fn drop_unsigned_formats(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            if m.get("format")
                .and_then(|f| f.as_str())
                .is_some_and(|f| f.starts_with("uint"))
            {
                m.remove("format");
            }
            m.values_mut().for_each(drop_unsigned_formats);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(drop_unsigned_formats),
        _ => {}
    }
}
