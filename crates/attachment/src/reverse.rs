//! Reverse forwards: a port on the pod's edgelink interface that devices
//! dial, relayed into the cluster (to an address or a DNS name) as the pod.

use crate::forward::{Forward, ForwardPath, Protocol, ProxyProtocol};
use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::str::FromStr;

/// Where a reverse forward goes: an address, or a name the daemon
/// resolves with the pod's resolver.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    Addr(SocketAddr),
    Name { host: String, port: u16 },
}

/// Why a `target` string is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("has no port (IP:port, [IPv6]:port or name:port)")]
    NoPort,
    #[error("has port {0:?}, not one in 1..=65535")]
    BadPort(String),
    #[error("is not a unicast address")]
    NotUnicast,
    #[error("has {0:?}, neither an IP address nor a DNS name (letters, digits, '-', '.' and '_'; labels of 1..=63, at most 253 in all)")]
    BadHost(String),
}

impl Target {
    pub fn port(&self) -> u16 {
        match self {
            Target::Addr(a) => a.port(),
            Target::Name { port, .. } => *port,
        }
    }

    /// The address, when the target is one.
    pub fn addr(&self) -> Option<SocketAddr> {
        match self {
            Target::Addr(a) => Some(*a),
            Target::Name { .. } => None,
        }
    }
}

impl FromStr for Target {
    type Err = TargetError;

    fn from_str(s: &str) -> Result<Target, TargetError> {
        if let Ok(a) = s.parse::<SocketAddr>() {
            if a.port() == 0 {
                return Err(TargetError::BadPort("0".into()));
            }
            if a.ip().is_unspecified() || a.ip().is_multicast() || a.ip() == Ipv4Addr::BROADCAST {
                return Err(TargetError::NotUnicast);
            }
            return Ok(Target::Addr(a));
        }
        let Some((host, port)) = s.rsplit_once(':') else {
            return Err(TargetError::NoPort);
        };
        let port = match port.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => return Err(TargetError::BadPort(port.into())),
        };
        if host.parse::<IpAddr>().is_ok() || host.starts_with('[') {
            // An IPv6 address must be bracketed; a bracketed host that did
            // not parse above is not one.
            return Err(TargetError::BadHost(host.into()));
        }
        if !valid_dns_name(host) {
            return Err(TargetError::BadHost(host.into()));
        }
        Ok(Target::Name {
            host: host.to_string(),
            port,
        })
    }
}

/// A DNS name as resolvers take it: dot-separated labels of letters,
/// digits, `-` and `_` (SRV-style service labels), optionally absolute
/// (a final dot). Not all digits: that would be an IPv4 address typo.
fn valid_dns_name(host: &str) -> bool {
    let name = host.strip_suffix('.').unwrap_or(host);
    !name.is_empty()
        && name.len() <= 253
        && !name.chars().all(|c| c.is_ascii_digit() || c == '.')
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Addr(a) => write!(f, "{a}"),
            Target::Name { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

impl Serialize for Target {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Target {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Target, D::Error> {
        let s = String::deserialize(d)?;
        s.parse()
            .map_err(|e| serde::de::Error::custom(format!("target {s:?} {e}")))
    }
}

/// One declared reverse forward.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reverse {
    pub name: String,
    pub protocol: Protocol,
    /// The port devices dial on the pod's edgelink interface address(es).
    pub port: u16,
    pub target: Target,
    /// Who may connect (explicit, or the interface's subnets by default).
    pub allowed_sources: Vec<IpNetwork>,
    pub connect_timeout_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_retries: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_protocol: Option<ProxyProtocol>,
}

impl Reverse {
    /// Whether `peer` may use this reverse forward.
    pub fn source_allowed(&self, peer: IpAddr) -> bool {
        let peer = match peer {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(peer),
            v4 => v4,
        };
        self.allowed_sources.iter().any(|n| n.contains(peer))
    }

    /// The same relay settings as a [`Forward`], which the daemon's data
    /// path serves. Its `target` is the address when there is one, else
    /// the unspecified address with the port (the daemon follows the name).
    pub fn as_forward(&self) -> Forward {
        Forward {
            name: self.name.clone(),
            protocol: self.protocol,
            port: self.port,
            target: self.target.addr().unwrap_or(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                self.target.port(),
            )),
            connect_timeout_ms: self.connect_timeout_ms,
            idle_timeout_ms: self.idle_timeout_ms,
            max_connections: self.max_connections,
            queue_timeout_ms: self.queue_timeout_ms,
            connect_retries: self.connect_retries,
            proxy_protocol: self.proxy_protocol,
            path: ForwardPath::Relay,
            modbus: None,
        }
    }
}

/// The CNI `dns` dictionary (the runtime's `runtimeConfig.dns`, or the
/// network config's own `dns`): what the pod's resolv.conf would say.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_as_addresses_or_names_and_print_back() {
        for (s, want) in [
            (
                "10.96.0.15:1883",
                Target::Addr("10.96.0.15:1883".parse().unwrap()),
            ),
            (
                "[fd00::15]:80",
                Target::Addr("[fd00::15]:80".parse().unwrap()),
            ),
            (
                "mqtt.hil.svc.cluster.local:1883",
                Target::Name {
                    host: "mqtt.hil.svc.cluster.local".into(),
                    port: 1883,
                },
            ),
            (
                "_mqtt.broker.:8883",
                Target::Name {
                    host: "_mqtt.broker.".into(),
                    port: 8883,
                },
            ),
        ] {
            let t: Target = s.parse().unwrap();
            assert_eq!(t, want, "{s}");
            assert_eq!(t.to_string(), s);
            let json = serde_json::to_string(&t).unwrap();
            assert_eq!(serde_json::from_str::<Target>(&json).unwrap(), t);
        }
    }

    #[test]
    fn bad_targets_say_what_is_wrong() {
        for (s, want) in [
            ("mqtt", TargetError::NoPort),
            ("mqtt:0", TargetError::BadPort("0".into())),
            ("mqtt:70000", TargetError::BadPort("70000".into())),
            ("10.0.0.1:0", TargetError::BadPort("0".into())),
            ("0.0.0.0:80", TargetError::NotUnicast),
            ("224.0.0.1:80", TargetError::NotUnicast),
            ("fd00::1:80", TargetError::BadHost("fd00::1".into())),
            ("[fd00::zz]:80", TargetError::BadHost("[fd00::zz]".into())),
            ("10.0.0:80", TargetError::BadHost("10.0.0".into())),
            ("bad host:80", TargetError::BadHost("bad host".into())),
            ("-x.local:80", TargetError::BadHost("-x.local".into())),
            ("a..b:80", TargetError::BadHost("a..b".into())),
        ] {
            assert_eq!(s.parse::<Target>(), Err(want), "{s}");
        }
    }

    #[test]
    fn sources_are_matched_also_as_ipv4_mapped_addresses() {
        let r = Reverse {
            name: "mqtt".into(),
            protocol: Protocol::Tcp,
            port: 1883,
            target: "mqtt.hil:1883".parse().unwrap(),
            allowed_sources: vec!["172.17.16.0/24".parse().unwrap()],
            connect_timeout_ms: 5000,
            idle_timeout_ms: None,
            max_connections: None,
            queue_timeout_ms: None,
            connect_retries: None,
            proxy_protocol: None,
        };
        assert!(r.source_allowed("172.17.16.9".parse().unwrap()));
        assert!(r.source_allowed("::ffff:172.17.16.9".parse().unwrap()));
        assert!(!r.source_allowed("172.17.17.9".parse().unwrap()));
        let f = r.as_forward();
        assert_eq!(f.target, "0.0.0.0:1883".parse().unwrap());
        assert_eq!(f.path, ForwardPath::Relay);
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.contains(r#""target":"mqtt.hil:1883""#), "{text}");
        assert!(
            text.contains(r#""allowedSources":["172.17.16.0/24"]"#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<Reverse>(&text).unwrap(), r);
    }
}
