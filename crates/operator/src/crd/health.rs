//! `Device.spec.health`: how edgelinkd on each of the Device's nodes probes
//! the device, from inside the proxy pod's network namespace (the path
//! clients' traffic takes). Rendered into the NAD as the plugin's `health`
//! key (`render::health::config`); every field has a default, so a Device
//! without `health` is probed too.

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

/// The probe types are the plugin's own (`health.type`): one list, so the
/// operator can never render one the plugin does not know.
pub use edgelink_attachment::HealthKind as ProbeType;

/// As `proxy_protocol_schema`: no `null` in the enum of an Option.
fn probe_type_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "description": "tcp (default), icmp, http, udp or modbus.",
        "enum": ["tcp", "icmp", "http", "udp", "modbus"]
    })
}

/// Defaults: a TCP connect to the first TCP port's device port (a
/// UDP-only device: ICMP echo) every 2 s, 1 s to answer, 2 failures in a
/// row to be unreachable and 2 successes to be reachable again.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = super::cel::health)]
pub struct DeviceHealth {
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "probe_type_schema")]
    pub type_: Option<ProbeType>,
    /// The device's port to probe (tcp, http, udp, modbus). Default: the
    /// targetPort of the first port of the probe's protocol (TCP for tcp,
    /// http and modbus).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<u32>,
    /// http only (default `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024), regex(pattern = "^/[!-~]*$"))]
    pub path: Option<String>,
    /// http only: the status the device must answer (default any 2xx or 3xx).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 100, max = 599))]
    pub expect_status: Option<u32>,
    /// udp only, required: the datagram sent (UTF-8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub payload: Option<String>,
    /// modbus only: the unit id (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 255))]
    pub unit_id: Option<u32>,
    /// modbus only: the holding register read (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 65535))]
    pub register: Option<u32>,
    /// Seconds between probes from one node (default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub interval_seconds: Option<u32>,
    /// Seconds a probe may take (default 1; at most intervalSeconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 60))]
    pub timeout_seconds: Option<u32>,
    /// Failures in a row before a node counts as not reaching the device (default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub failure_threshold: Option<u32>,
    /// Successes in a row before it counts as reaching it again (default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub success_threshold: Option<u32>,
}

pub const DEFAULT_INTERVAL_SECONDS: u32 = 2;
pub const DEFAULT_TIMEOUT_SECONDS: u32 = 1;
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 2;
pub const DEFAULT_SUCCESS_THRESHOLD: u32 = 2;

impl DeviceHealth {
    /// The keys given that `type_` does not take, as the plugin names them.
    pub fn foreign_keys(&self, t: ProbeType) -> Vec<&'static str> {
        let given = [
            ("port", self.port.is_some(), t != ProbeType::Icmp),
            ("path", self.path.is_some(), t == ProbeType::Http),
            (
                "expectStatus",
                self.expect_status.is_some(),
                t == ProbeType::Http,
            ),
            ("payload", self.payload.is_some(), t == ProbeType::Udp),
            ("unitId", self.unit_id.is_some(), t == ProbeType::Modbus),
            ("register", self.register.is_some(), t == ProbeType::Modbus),
        ];
        given
            .into_iter()
            .filter(|(_, set, takes)| *set && !takes)
            .map(|(k, _, _)| k)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The schema's enum is exactly the plugin's probe types.
    #[test]
    fn the_schema_lists_every_probe_type_the_plugin_takes() {
        let schema = probe_type_schema(&mut SchemaGenerator::default());
        let listed: Vec<ProbeType> = schema
            .get("enum")
            .and_then(|e| e.as_array())
            .expect("an enum")
            .iter()
            .map(|v| serde_json::from_value(v.clone()).expect("a probe type"))
            .collect();
        let all = [
            ProbeType::Tcp,
            ProbeType::Icmp,
            ProbeType::Http,
            ProbeType::Udp,
            ProbeType::Modbus,
        ];
        assert_eq!(listed, all);
        for t in all {
            assert_eq!(serde_json::to_value(t).unwrap(), t.as_str());
        }
    }
}
