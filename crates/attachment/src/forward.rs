//! Forwards: a port in the pod relayed to a device.

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::SocketAddr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Tcp,
    Udp,
}

/// How a forward's traffic crosses the pod: edgelinkd's relay (the
/// default), or nftables NAT installed by edgelinkd in the pod's netns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ForwardPath {
    #[default]
    Relay,
    Kernel,
}

impl ForwardPath {
    pub fn is_relay(&self) -> bool {
        *self == ForwardPath::Relay
    }
}

impl fmt::Display for ForwardPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ForwardPath::Relay => "relay",
            ForwardPath::Kernel => "kernel",
        })
    }
}

/// The PROXY protocol header sent to the target before the client's first
/// byte (HAProxy's specification): text `v1` or binary `v2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyProtocol {
    V1,
    V2,
}

impl fmt::Display for ProxyProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProxyProtocol::V1 => "v1",
            ProxyProtocol::V2 => "v2",
        })
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        })
    }
}

/// One declared forward.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Forward {
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
    pub target: SocketAddr,
    pub connect_timeout_ms: u64,
    /// TCP: a connection with no byte either way for this long is closed
    /// (0: never). `None`: the daemon's `--tcp-idle-timeout`. Records
    /// written before the key existed have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
    /// TCP: connections to the target at once at most; beyond it new
    /// clients wait in a first-in first-out queue. `None`: the daemon's
    /// `--forward-max-connections`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
    /// TCP: how long a client may wait in that queue before it is closed
    /// (milliseconds). `None`: the daemon's `--queue-timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_timeout_ms: Option<u64>,
    /// TCP: connects retried (with backoff) after a timeout or a refusal.
    /// `None`: the daemon's `--connect-retries`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_retries: Option<u32>,
    /// TCP: a PROXY protocol header sent to the target first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_protocol: Option<ProxyProtocol>,
    /// The relay (default) or the kernel's NAT.
    #[serde(default, skip_serializing_if = "ForwardPath::is_relay")]
    pub path: ForwardPath,
    /// TCP, relay: the forward speaks Modbus/TCP and carries every
    /// client's requests over at most `maxConnections` (default 1)
    /// connections to the device (edgelink-modbus). `None`: a plain relay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modbus: Option<ModbusMux>,
}

/// A Modbus/TCP forward's multiplexing (`"appProtocol": "modbus-tcp"`,
/// `"multiplex": true`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModbusMux {
    /// Requests outstanding per connection to the device.
    pub max_in_flight: u32,
    /// How long a request's response may take before its client is
    /// answered with exception 0x0B.
    pub response_timeout_ms: u64,
}

impl ModbusMux {
    pub const DEFAULT_MAX_IN_FLIGHT: u32 = 1;
    pub const MAX_IN_FLIGHT: u32 = 16;
    pub const DEFAULT_RESPONSE_TIMEOUT_MS: u64 = 1000;
    pub const MAX_RESPONSE_TIMEOUT_MS: u64 = 600_000;
}

impl Forward {
    /// Whether the target lies inside one of `allowed`.
    pub fn target_allowed(&self, allowed: &[IpNetwork]) -> bool {
        allowed.iter().any(|n| n.contains(self.target.ip()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_must_be_inside_an_allowed_network() {
        let f = Forward {
            name: "api".into(),
            protocol: Protocol::Tcp,
            port: 8080,
            target: "172.17.16.120:8080".parse().unwrap(),
            connect_timeout_ms: 5000,
            idle_timeout_ms: None,
            max_connections: None,
            queue_timeout_ms: None,
            connect_retries: None,
            proxy_protocol: None,
            path: ForwardPath::Relay,
            modbus: None,
        };
        assert!(f.target_allowed(&["172.17.16.0/24".parse().unwrap()]));
        assert!(!f.target_allowed(&["172.17.17.0/24".parse().unwrap()]));
        assert!(!f.target_allowed(&[]));
    }

    #[test]
    fn a_record_without_the_bounds_still_parses_and_new_ones_round_trip() {
        let old = r#"{"name":"api","protocol":"tcp","port":8080,"target":"172.17.16.120:8080","connectTimeoutMs":5000}"#;
        let f: Forward = serde_json::from_str(old).unwrap();
        assert_eq!(f.idle_timeout_ms, None);
        assert_eq!(f.max_connections, None);
        // Absent stays absent: an old daemon reading a new plugin's record
        // of a forward without the keys sees the same bytes.
        assert_eq!(serde_json::to_string(&f).unwrap(), old);
        assert_eq!(f.path, ForwardPath::Relay);
        let new = Forward {
            idle_timeout_ms: Some(0),
            max_connections: Some(3),
            queue_timeout_ms: Some(250),
            connect_retries: Some(2),
            proxy_protocol: Some(ProxyProtocol::V2),
            path: ForwardPath::Kernel,
            ..f
        };
        let text = serde_json::to_string(&new).unwrap();
        assert!(text.contains(r#""idleTimeoutMs":0"#), "{text}");
        assert!(text.contains(r#""maxConnections":3"#), "{text}");
        assert!(text.contains(r#""queueTimeoutMs":250"#), "{text}");
        assert!(text.contains(r#""connectRetries":2"#), "{text}");
        assert!(text.contains(r#""proxyProtocol":"v2""#), "{text}");
        assert!(text.contains(r#""path":"kernel""#), "{text}");
        assert_eq!(serde_json::from_str::<Forward>(&text).unwrap(), new);
    }
}
