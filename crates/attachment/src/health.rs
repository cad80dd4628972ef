//! Device health: the probe an attachment's `health` key asks for, run by
//! the daemon from inside the pod's netns.

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

/// What a probe does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HealthKind {
    /// A connect, then close.
    #[default]
    Tcp,
    /// One echo request and its reply.
    Icmp,
    /// `GET path`, the status line read.
    Http,
    /// A payload sent, any datagram back.
    Udp,
    /// Modbus/TCP Read Holding Registers (function 3), quantity 1.
    Modbus,
}

impl HealthKind {
    /// Whether the probe is a TCP connection (and so counts under the
    /// target forward's `maxConnections`).
    pub fn is_tcp(&self) -> bool {
        matches!(
            self,
            HealthKind::Tcp | HealthKind::Http | HealthKind::Modbus
        )
    }
}

impl HealthKind {
    /// As the config spells it (`health.type`).
    pub fn as_str(&self) -> &'static str {
        match self {
            HealthKind::Tcp => "tcp",
            HealthKind::Icmp => "icmp",
            HealthKind::Http => "http",
            HealthKind::Udp => "udp",
            HealthKind::Modbus => "modbus",
        }
    }
}

impl fmt::Display for HealthKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a probe goes: `IP:port`, or an address alone (ICMP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum HealthTarget {
    Addr(SocketAddr),
    Host(IpAddr),
}

impl HealthTarget {
    pub fn ip(&self) -> IpAddr {
        match self {
            HealthTarget::Addr(a) => a.ip(),
            HealthTarget::Host(ip) => *ip,
        }
    }

    /// The address with its port (`None`: an address alone).
    pub fn addr(&self) -> Option<SocketAddr> {
        match self {
            HealthTarget::Addr(a) => Some(*a),
            HealthTarget::Host(_) => None,
        }
    }

    /// Whether the target lies inside one of `allowed`.
    pub fn allowed(&self, allowed: &[IpNetwork]) -> bool {
        allowed.iter().any(|n| n.contains(self.ip()))
    }
}

impl fmt::Display for HealthTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HealthTarget::Addr(a) => a.fmt(f),
            HealthTarget::Host(ip) => ip.fmt(f),
        }
    }
}

impl FromStr for HealthTarget {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Ok(a) = s.parse::<SocketAddr>() {
            return Ok(HealthTarget::Addr(a));
        }
        s.parse::<IpAddr>()
            .map(HealthTarget::Host)
            .map_err(|_| format!("{s:?} is not IP:port, [IPv6]:port or an IP address"))
    }
}

impl TryFrom<String> for HealthTarget {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<HealthTarget> for String {
    fn from(t: HealthTarget) -> String {
        t.to_string()
    }
}

/// An attachment's validated `health` (docs/configuration.md): every
/// default filled in by the plugin, so the daemon reads no config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Health {
    #[serde(rename = "type")]
    pub kind: HealthKind,
    pub target: HealthTarget,
    /// HTTP: the path asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// HTTP: the one status that is healthy; `None`: any 2xx or 3xx.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect_status: Option<u16>,
    /// UDP: the datagram sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    /// Modbus: the unit id asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit_id: Option<u8>,
    /// Modbus: the holding register read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub register: Option<u16>,
    pub interval_ms: u64,
    pub timeout_ms: u64,
    pub failure_threshold: u32,
    pub success_threshold: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_round_trip_as_strings() {
        for s in [
            "172.17.16.120:8080",
            "[fd00::1]:502",
            "172.17.16.120",
            "fd00::1",
        ] {
            let t: HealthTarget = s.parse().unwrap();
            assert_eq!(t.to_string(), s);
        }
        assert!("x:1".parse::<HealthTarget>().is_err());
        let t: HealthTarget = "10.0.0.1".parse().unwrap();
        assert!(t.allowed(&["10.0.0.0/24".parse().unwrap()]));
        assert!(!t.allowed(&["10.0.1.0/24".parse().unwrap()]));
    }

    #[test]
    fn a_spec_round_trips_with_absent_keys_left_out() {
        let text = r#"{"type":"modbus","target":"10.0.0.5:502","unitId":1,"register":0,"intervalMs":2000,"timeoutMs":1000,"failureThreshold":2,"successThreshold":2}"#;
        let h: Health = serde_json::from_str(text).unwrap();
        assert_eq!(h.kind, HealthKind::Modbus);
        assert_eq!(serde_json::to_string(&h).unwrap(), text);
    }
}
