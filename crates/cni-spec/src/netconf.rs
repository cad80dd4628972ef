//! The network configuration keys the spec defines (network level and
//! plugin level). A plugin's own keys stay in `raw` for it to parse.

use crate::error::{codes, CniError};
use crate::result::{CniResult, Dns};
use crate::version::CniVersion;
use serde_json::{Map, Value};

/// One entry of GC's `cni.dev/valid-attachments`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GcAttachment {
    pub container_id: String,
    pub ifname: String,
}

/// The spec-defined part of a plugin's stdin config.
#[derive(Debug, Clone)]
pub struct NetConf {
    pub cni_version: CniVersion,
    pub name: String,
    pub plugin_type: String,
    pub disable_check: bool,
    pub disable_gc: bool,
    pub prev_result: Option<CniResult>,
    /// `runtimeConfig`, an object (empty when absent).
    pub runtime_config: Map<String, Value>,
    /// `capabilities`, an object (empty when absent).
    pub capabilities: Map<String, Value>,
    /// `args`, an object (empty when absent).
    pub args: Map<String, Value>,
    pub dns: Option<Dns>,
    /// The whole object as received, for plugin keys and for delegation.
    pub raw: Value,
}

/// Best-effort read of `cniVersion` to stamp an error with the version the
/// caller speaks, even when the rest of the config is bad.
pub fn raw_version(stdin: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(stdin).ok()?;
    v.get("cniVersion")?.as_str().map(str::to_string)
}

fn invalid(msg: String) -> CniError {
    CniError::new(codes::INVALID_CONFIG, msg)
}

fn opt_bool(o: &Map<String, Value>, key: &str) -> Result<bool, CniError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) if s == "true" || s == "false" => Ok(s == "true"),
        Some(v) => Err(invalid(format!("{key}: {v} is not a boolean"))),
    }
}

fn opt_object(o: &Map<String, Value>, key: &str) -> Result<Map<String, Value>, CniError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(m)) => Ok(m.clone()),
        Some(v) => Err(invalid(format!("{key}: {v} is not an object"))),
    }
}

/// A network name as the spec allows it.
pub fn is_valid_network_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

impl NetConf {
    /// Parse stdin. Bad JSON is code 6, an unsupported version code 1,
    /// missing or malformed spec keys code 7.
    pub fn parse(stdin: &[u8]) -> Result<NetConf, CniError> {
        let raw: Value = serde_json::from_slice(stdin).map_err(|e| {
            CniError::new(
                codes::DECODE_FAILURE,
                format!("the network configuration on stdin is not valid JSON: {e}"),
            )
        })?;
        let Value::Object(o) = &raw else {
            return Err(CniError::new(
                codes::DECODE_FAILURE,
                "the network configuration on stdin is not a JSON object",
            ));
        };
        let version_str = match o.get("cniVersion") {
            Some(Value::String(s)) => s.clone(),
            None => return Err(invalid("cniVersion is missing".into())),
            Some(v) => return Err(invalid(format!("cniVersion: {v} is not a string"))),
        };
        let cni_version = version_str
            .parse::<CniVersion>()
            .map_err(|e| CniError::new(codes::INCOMPATIBLE_VERSION, e.to_string()))?;
        let name = match o.get("name") {
            Some(Value::String(s)) if is_valid_network_name(s) => s.clone(),
            Some(Value::String(s)) => {
                return Err(invalid(format!(
                    "name: {s:?} is not a valid network name ([A-Za-z0-9][A-Za-z0-9_.-]*)"
                )))
            }
            None => return Err(invalid("name is missing".into())),
            Some(v) => return Err(invalid(format!("name: {v} is not a string"))),
        };
        let plugin_type = match o.get("type") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            _ => return Err(invalid("type is missing".into())),
        };
        let prev_result =
            match o.get("prevResult") {
                None | Some(Value::Null) => None,
                Some(v) => Some(CniResult::from_json(v).map_err(|e| {
                    CniError::new(codes::DECODE_FAILURE, format!("prevResult: {e}"))
                })?),
            };
        let dns = match o.get("dns") {
            None | Some(Value::Null) => None,
            Some(v) => {
                let d: Dns = serde_json::from_value(v.clone())
                    .map_err(|e| invalid(format!("dns: {v} is not a DNS object: {e}")))?;
                (!d.is_empty()).then_some(d)
            }
        };
        Ok(NetConf {
            cni_version,
            name,
            plugin_type,
            disable_check: opt_bool(o, "disableCheck")?,
            disable_gc: opt_bool(o, "disableGC")?,
            prev_result,
            runtime_config: opt_object(o, "runtimeConfig")?,
            capabilities: opt_object(o, "capabilities")?,
            args: opt_object(o, "args")?,
            dns,
            raw: raw.clone(),
        })
    }

    /// Whether the config declares a capability (e.g. `ips`, `mac`).
    pub fn has_capability(&self, cap: &str) -> bool {
        self.capabilities.get(cap).and_then(Value::as_bool) == Some(true)
    }

    /// GC's list of attachments to keep: `cni.dev/valid-attachments`, or the
    /// legacy `cni.dev/attachments`. `None` when neither key is present.
    pub fn valid_attachments(&self) -> Result<Option<Vec<GcAttachment>>, CniError> {
        let key = ["cni.dev/valid-attachments", "cni.dev/attachments"]
            .into_iter()
            .find(|k| self.raw.get(*k).is_some());
        let Some(key) = key else { return Ok(None) };
        let Some(list) = self.raw[key].as_array() else {
            return Err(invalid(format!("{key}: {} is not an array", self.raw[key])));
        };
        let mut out = Vec::with_capacity(list.len());
        for (i, item) in list.iter().enumerate() {
            let cid = item.get("containerID").and_then(Value::as_str);
            let ifname = item.get("ifname").and_then(Value::as_str);
            match (cid, ifname) {
                (Some(c), Some(f)) => out.push(GcAttachment {
                    container_id: c.to_string(),
                    ifname: f.to_string(),
                }),
                _ => {
                    return Err(invalid(format!(
                        "{key}[{i}]: {item} needs string keys containerID and ifname"
                    )))
                }
            }
        }
        Ok(Some(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<NetConf, CniError> {
        NetConf::parse(v.to_string().as_bytes())
    }

    #[test]
    fn parses_spec_keys_and_keeps_unknown_ones() {
        let c = parse(json!({
            "cniVersion": "1.1.0", "name": "plant-floor", "type": "edgelink",
            "disableCheck": true, "capabilities": {"ips": true},
            "runtimeConfig": {"ips": ["172.17.16.9/24"]}, "somethingNew": 1,
            "prevResult": {"cniVersion": "1.1.0", "interfaces": [{"name": "eth0"}]}
        }))
        .unwrap();
        assert_eq!(c.cni_version, CniVersion::V1_1_0);
        assert!(c.disable_check && !c.disable_gc);
        assert!(c.has_capability("ips") && !c.has_capability("mac"));
        assert_eq!(c.prev_result.unwrap().interfaces[0].name, "eth0");
        assert_eq!(c.raw["somethingNew"], 1);
    }

    #[test]
    fn error_codes_for_bad_configs() {
        assert_eq!(NetConf::parse(b"{not json").unwrap_err().code, 6);
        assert_eq!(NetConf::parse(b"[1]").unwrap_err().code, 6);
        let e = parse(json!({"cniVersion": "0.2.0", "name": "n", "type": "edgelink"})).unwrap_err();
        assert_eq!(e.code, 1);
        let e = parse(json!({"name": "n", "type": "edgelink"})).unwrap_err();
        assert_eq!((e.code, e.msg.contains("cniVersion")), (7, true));
        let e = parse(json!({"cniVersion": "1.0.0", "name": "bad name", "type": "x"})).unwrap_err();
        assert!(e.msg.contains("\"bad name\""), "{e}");
        let e = parse(
            json!({"cniVersion": "1.0.0", "name": "n", "type": "x", "prevResult": {"ips": 3}}),
        )
        .unwrap_err();
        assert_eq!(e.code, 6);
        let e = parse(json!({"cniVersion": "1.0.0", "name": "n", "type": "x", "disableCheck": 3}))
            .unwrap_err();
        assert!(e.msg.contains("disableCheck"));
    }

    /// A delegated IPAM gets the numbers of its config exactly as the
    /// runtime sent them (found with the `record` fuzz target: serde_json's
    /// default float parsing was off by one unit in the last place).
    #[test]
    fn numbers_reach_the_delegate_unchanged() {
        let c = NetConf::parse(
            br#"{"cniVersion": "1.0.0", "name": "n", "type": "edgelink",
                "ipam": {"type": "dhcp", "leaseRatio": 1.0715660391465826e-75}}"#,
        )
        .unwrap();
        assert_eq!(
            c.raw["ipam"]["leaseRatio"].as_f64(),
            Some(1.0715660391465826e-75)
        );
        assert!(c.raw.to_string().contains("1.0715660391465826e-75"));
    }

    #[test]
    fn gc_lists_both_keys() {
        let c = parse(json!({"cniVersion": "1.1.0", "name": "n", "type": "x",
            "cni.dev/valid-attachments": [{"containerID": "a", "ifname": "net1"}]}))
        .unwrap();
        assert_eq!(c.valid_attachments().unwrap().unwrap().len(), 1);
        let c = parse(json!({"cniVersion": "1.1.0", "name": "n", "type": "x",
            "cni.dev/attachments": [{"containerID": "a", "ifname": "net1"}, {"containerID": "b", "ifname": "net1"}]}))
        .unwrap();
        assert_eq!(c.valid_attachments().unwrap().unwrap().len(), 2);
        let c = parse(json!({"cniVersion": "1.1.0", "name": "n", "type": "x"})).unwrap();
        assert!(c.valid_attachments().unwrap().is_none());
        let c = parse(json!({"cniVersion": "1.1.0", "name": "n", "type": "x",
            "cni.dev/valid-attachments": [{"containerID": 1}]}))
        .unwrap();
        assert_eq!(c.valid_attachments().unwrap_err().code, 7);
    }
}
