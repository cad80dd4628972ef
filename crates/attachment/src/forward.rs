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
    /// TCP: connections relayed at once at most; beyond it new ones are
    /// reset as soon as accepted. `None`: no cap of its own (the daemon's
    /// `--max-connections` still applies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
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
        let new = Forward {
            idle_timeout_ms: Some(0),
            max_connections: Some(3),
            ..f
        };
        let text = serde_json::to_string(&new).unwrap();
        assert!(text.contains(r#""idleTimeoutMs":0"#), "{text}");
        assert!(text.contains(r#""maxConnections":3"#), "{text}");
        assert_eq!(serde_json::from_str::<Forward>(&text).unwrap(), new);
    }
}
