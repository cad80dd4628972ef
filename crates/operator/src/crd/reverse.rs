//! The types of `Device.spec.reverse` (devices on the segment calling
//! cluster Services through the proxy pod) and of their status. Types and
//! schema only: how an entry becomes the plugin's `reverse` key is
//! `crate::reverse`'s.

use super::{cidr_list_schema, proxy_protocol_schema, Protocol, ProxyProtocol};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

/// `reverse[].idleTimeoutMs` at most, as the plugin's: a week.
pub const MAX_IDLE_TIMEOUT_MS: u32 = 604_800_000;

/// `host:port`: an IPv4 address or a DNS name, or `[IPv6]`, then a port
/// (the finer rules are the controller's, as the plugin's).
pub const TARGET_PATTERN: &str = r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_][-A-Za-z0-9_.]*):[0-9]{1,5}$";

fn service_port_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "The Service's port, by number or by name (default: the Service's only port of the entry's protocol).",
        "x-kubernetes-int-or-string": true
    })
}

/// One cluster destination a device may call: devices connect (TCP) or
/// send (UDP) to `port` on the proxy pod's segment address, and edgelinkd
/// relays to the target from the pod, through the cluster network.
/// Exactly one of `service` and `target`.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("oneOf" = [{"required": ["service"]}, {"required": ["target"]}]))]
#[schemars(transform = super::cel::reverse)]
pub struct DeviceReverse {
    /// The reverse forward's name: unique across `ports` and `reverse`.
    #[schemars(
        length(min = 1, max = 15),
        regex(pattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// tcp (default) or udp.
    #[serde(default)]
    pub protocol: Protocol,
    /// The port devices dial on the proxy pod's segment address.
    #[schemars(range(min = 1, max = 65535))]
    pub port: u32,
    /// A cluster Service: rendered as its ClusterIP and port (a headless
    /// Service as its DNS name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceRef>,
    /// `IP:port`, `[IPv6]:port` or `dns-name:port`, passed to the plugin
    /// as it is (a name is resolved in the proxy pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 3, max = 259), regex(pattern = TARGET_PATTERN))]
    pub target: Option<String>,
    /// The devices that may call (CIDRs; default: the segment's subnets).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "cidr_list_schema")]
    pub allowed_sources: Vec<String>,
    /// TCP connect timeout towards the target (plugin `connectTimeoutMs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 600000))]
    pub connect_timeout_ms: Option<u32>,
    /// TCP only: a connection idle this long is closed; 0 never (plugin
    /// `idleTimeoutMs`, 0 or 1000..604800000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_IDLE_TIMEOUT_MS))]
    pub idle_timeout_ms: Option<u32>,
    /// TCP only: connections to the target at once at most (plugin
    /// `maxConnections`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = super::MAX_CONNECTIONS))]
    pub max_connections: Option<u32>,
    /// TCP only: how long a device may wait under maxConnections (plugin
    /// `queueTimeoutMs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = super::MAX_QUEUE_TIMEOUT_MS))]
    pub queue_timeout_ms: Option<u32>,
    /// TCP only: connects to the target tried again (plugin `connectRetries`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = super::MAX_CONNECT_RETRIES))]
    pub connect_retries: Option<u32>,
    /// TCP only: a PROXY protocol header naming the device, v1 or v2
    /// (plugin `proxyProtocol`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "proxy_protocol_schema")]
    pub proxy_protocol: Option<ProxyProtocol>,
}

/// A Service in the cluster.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceRef {
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = "^[a-z]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Default: the Device's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "service_port_schema")]
    pub port: Option<IntOrString>,
}

/// A reverse entry as rendered and as edgelinkd last reported it.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReverseStatus {
    pub name: String,
    pub protocol: String,
    pub port: u32,
    /// What the NAD carries (`10.96.4.12:1883`); absent while the
    /// Service cannot be resolved (the entry is then left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// `namespace/name`, for an entry that names a Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// A target that is a name: the address edgelinkd resolved it to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_address: Option<String>,
    /// A target that is a name: why edgelinkd's last lookup failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolve_error: Option<String>,
    /// edgelinkd's listener on net1: listening, starting, failed, refused,
    /// stopped; `absent` when the proxy pod does not serve it (yet),
    /// `unresolved` when it is not rendered.
    pub listener: String,
    pub listening: bool,
    pub active_connections: u64,
    /// TCP connections, or UDP sessions.
    pub total_connections: u64,
    pub bytes_to_target: u64,
    pub bytes_from_target: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}
