//! The ADD Result, held in its newest (1.1.0) shape and converted down to
//! whatever version the caller configured.
//!
//! Conversion rules: 0.3.x and 0.4.0 carry `ips[].version` ("4"/"6"); fields
//! added in 1.1.0 (interface `mtu`/`socketPath`/`pciID`, route
//! `mtu`/`advmss`/`priority`/`table`/`scope`) are dropped below 1.1.0.

use crate::version::CniVersion;
use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::net::IpAddr;

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Interface {
    pub name: String,
    #[serde(default)]
    pub mac: Option<String>,
    #[serde(default)]
    pub mtu: Option<u32>,
    /// The netns path for interfaces inside the container; absent for host-side ones.
    #[serde(default)]
    pub sandbox: Option<String>,
    #[serde(default, rename = "socketPath")]
    pub socket_path: Option<String>,
    #[serde(default, rename = "pciID")]
    pub pci_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct IpConfig {
    /// Address with the subnet's prefix length, e.g. 172.17.16.200/24.
    pub address: IpNetwork,
    #[serde(default)]
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces`.
    #[serde(default)]
    pub interface: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Route {
    pub dst: IpNetwork,
    #[serde(default)]
    pub gw: Option<IpAddr>,
    #[serde(default)]
    pub mtu: Option<u32>,
    #[serde(default)]
    pub advmss: Option<u32>,
    #[serde(default)]
    pub priority: Option<u32>,
    #[serde(default)]
    pub table: Option<u32>,
    #[serde(default)]
    pub scope: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
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

impl Dns {
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.is_none()
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

/// A Result of any supported version, in the newest shape.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct CniResult {
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    #[serde(default)]
    pub ips: Vec<IpConfig>,
    #[serde(default)]
    pub routes: Vec<Route>,
    #[serde(default)]
    pub dns: Option<Dns>,
}

/// A Result (e.g. `prevResult`) could not be decoded.
#[derive(Debug, thiserror::Error)]
#[error("cannot decode result: {0}")]
pub struct DecodeError(#[from] serde_json::Error);

impl CniResult {
    /// Decode a Result of any supported version (`ips[].version` is ignored).
    pub fn from_json(v: &Value) -> Result<CniResult, DecodeError> {
        let mut r: CniResult = serde_json::from_value(v.clone())?;
        if r.dns.as_ref().is_some_and(Dns::is_empty) {
            r.dns = None;
        }
        Ok(r)
    }

    /// Append another result's interfaces, IPs and routes, re-basing its
    /// interface indexes.
    pub fn append(&mut self, other: CniResult) {
        let base = self.interfaces.len();
        self.interfaces.extend(other.interfaces);
        self.ips.extend(other.ips.into_iter().map(|mut ip| {
            ip.interface = ip.interface.map(|i| i + base);
            ip
        }));
        self.routes.extend(other.routes);
        if other.dns.is_some() {
            self.dns = other.dns;
        }
    }

    /// Encode as the given version.
    pub fn to_json(&self, version: CniVersion) -> Value {
        let new = version.result_has_1_1_fields();
        let interfaces: Vec<Value> = self
            .interfaces
            .iter()
            .map(|i| {
                let mut o = Map::new();
                o.insert("name".into(), json!(i.name));
                put(&mut o, "mac", i.mac.as_ref().map(|m| json!(m)));
                if new {
                    put(&mut o, "mtu", i.mtu.map(|m| json!(m)));
                }
                put(&mut o, "sandbox", i.sandbox.as_ref().map(|s| json!(s)));
                if new {
                    put(
                        &mut o,
                        "socketPath",
                        i.socket_path.as_ref().map(|s| json!(s)),
                    );
                    put(&mut o, "pciID", i.pci_id.as_ref().map(|s| json!(s)));
                }
                Value::Object(o)
            })
            .collect();
        let ips: Vec<Value> = self
            .ips
            .iter()
            .map(|ip| {
                let mut o = Map::new();
                if version.result_has_ip_version() {
                    let v = if ip.address.is_ipv4() { "4" } else { "6" };
                    o.insert("version".into(), json!(v));
                }
                o.insert("address".into(), json!(ip.address.to_string()));
                put(&mut o, "gateway", ip.gateway.map(|g| json!(g.to_string())));
                put(&mut o, "interface", ip.interface.map(|i| json!(i)));
                Value::Object(o)
            })
            .collect();
        let routes: Vec<Value> = self
            .routes
            .iter()
            .map(|r| {
                let mut o = Map::new();
                o.insert("dst".into(), json!(r.dst.to_string()));
                put(&mut o, "gw", r.gw.map(|g| json!(g.to_string())));
                if new {
                    put(&mut o, "mtu", r.mtu.map(|v| json!(v)));
                    put(&mut o, "advmss", r.advmss.map(|v| json!(v)));
                    put(&mut o, "priority", r.priority.map(|v| json!(v)));
                    put(&mut o, "table", r.table.map(|v| json!(v)));
                    put(&mut o, "scope", r.scope.map(|v| json!(v)));
                }
                Value::Object(o)
            })
            .collect();
        let mut o = Map::new();
        o.insert("cniVersion".into(), json!(version.as_str()));
        if !interfaces.is_empty() {
            o.insert("interfaces".into(), Value::Array(interfaces));
        }
        if !ips.is_empty() {
            o.insert("ips".into(), Value::Array(ips));
        }
        if !routes.is_empty() {
            o.insert("routes".into(), Value::Array(routes));
        }
        match &self.dns {
            Some(d) if !d.is_empty() => {
                o.insert("dns".into(), json!(d));
            }
            // 0.x and 1.0 results always carried a dns object.
            _ => {
                o.insert("dns".into(), json!({}));
            }
        }
        Value::Object(o)
    }
}

fn put(o: &mut Map<String, Value>, k: &str, v: Option<Value>) {
    if let Some(v) = v {
        o.insert(k.into(), v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CniResult {
        CniResult {
            interfaces: vec![
                Interface {
                    name: "edge0".into(),
                    mac: Some("02:00:00:00:00:01".into()),
                    mtu: Some(1500),
                    ..Default::default()
                },
                Interface {
                    name: "net1".into(),
                    mac: Some("02:00:00:00:00:02".into()),
                    mtu: Some(1500),
                    sandbox: Some("/run/netns/pod".into()),
                    ..Default::default()
                },
            ],
            ips: vec![
                IpConfig {
                    address: "172.17.16.200/24".parse().unwrap(),
                    gateway: Some("172.17.16.1".parse().unwrap()),
                    interface: Some(1),
                },
                IpConfig {
                    address: "fd00::5/64".parse().unwrap(),
                    gateway: None,
                    interface: Some(1),
                },
            ],
            routes: vec![Route {
                dst: "172.17.0.0/16".parse().unwrap(),
                gw: None,
                mtu: Some(1400),
                advmss: None,
                priority: Some(10),
                table: None,
                scope: None,
            }],
            dns: None,
        }
    }

    #[test]
    fn old_versions_carry_ip_version_and_drop_1_1_fields() {
        for v in [CniVersion::V0_3_0, CniVersion::V0_3_1, CniVersion::V0_4_0] {
            let j = sample().to_json(v);
            assert_eq!(j["cniVersion"], v.as_str());
            assert_eq!(j["ips"][0]["version"], "4");
            assert_eq!(j["ips"][1]["version"], "6");
            assert!(j["interfaces"][1].get("mtu").is_none());
            assert!(j["routes"][0].get("mtu").is_none());
            assert!(j["routes"][0].get("priority").is_none());
            assert_eq!(j["ips"][0]["interface"], 1);
        }
    }

    #[test]
    fn v1_has_no_ip_version_and_1_1_keeps_new_fields() {
        let j = sample().to_json(CniVersion::V1_0_0);
        assert!(j["ips"][0].get("version").is_none());
        assert!(j["interfaces"][0].get("mtu").is_none());
        let j = sample().to_json(CniVersion::V1_1_0);
        assert_eq!(j["interfaces"][1]["mtu"], 1500);
        assert_eq!(j["routes"][0]["mtu"], 1400);
        assert_eq!(j["routes"][0]["priority"], 10);
        assert_eq!(j["interfaces"][1]["sandbox"], "/run/netns/pod");
        assert!(j["interfaces"][0].get("sandbox").is_none());
    }

    #[test]
    fn decodes_every_version_and_round_trips() {
        for v in CniVersion::ALL {
            let j = sample().to_json(v);
            let back = CniResult::from_json(&j).unwrap();
            assert_eq!(back.ips, sample().ips);
            assert_eq!(back.interfaces.len(), 2);
        }
        let full = CniResult::from_json(&sample().to_json(CniVersion::V1_1_0)).unwrap();
        assert_eq!(full, sample());
    }

    #[test]
    fn append_rebases_interface_indexes() {
        let mut prev = CniResult {
            interfaces: vec![Interface {
                name: "eth0".into(),
                sandbox: Some("/x".into()),
                ..Default::default()
            }],
            ips: vec![IpConfig {
                address: "10.0.0.5/24".parse().unwrap(),
                gateway: None,
                interface: Some(0),
            }],
            ..Default::default()
        };
        prev.append(sample());
        assert_eq!(prev.interfaces.len(), 3);
        assert_eq!(prev.ips[0].interface, Some(0));
        assert_eq!(prev.ips[1].interface, Some(2));
    }

    #[test]
    fn rejects_garbage() {
        assert!(CniResult::from_json(&json!({"ips": [{"address": "nope"}]})).is_err());
        assert!(CniResult::from_json(&json!({"interfaces": 5})).is_err());
    }
}
