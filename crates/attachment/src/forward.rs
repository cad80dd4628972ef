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
        };
        assert!(f.target_allowed(&["172.17.16.0/24".parse().unwrap()]));
        assert!(!f.target_allowed(&["172.17.17.0/24".parse().unwrap()]));
        assert!(!f.target_allowed(&[]));
    }
}
