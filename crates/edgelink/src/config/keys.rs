//! The keys edgelink's configuration knows, and the ones it does not.
//!
//! CNI asks a plugin to ignore keys it does not know (a runtime or a
//! conflist may add its own), so an unknown key is never an error. But a
//! misspelt key (`"uplnk"`) silently gives a different network (a bridge
//! with no uplink, an isolated pod), so each unknown key of edgelink's own
//! objects is reported, with the known key it most likely meant: a warning
//! in the plugin's log at every command, and a problem in `edgelink
//! validate`.

use serde_json::{Map, Value};
use std::fmt;

/// The CNI specification's network configuration keys, and what runtimes
/// and conventions put beside them.
const CNI: &[&str] = &[
    "cniVersion",
    "cniVersions",
    "name",
    "type",
    "disableCheck",
    "disableGC",
    "capabilities",
    "runtimeConfig",
    "args",
    "ipMasq",
    "ipam",
    "dns",
    "prevResult",
    "cni.dev/valid-attachments",
    "cni.dev/attachments",
];

/// edgelink's own top-level keys (docs/configuration.md).
const TOP: &[&str] = &[
    "mode",
    "bridge",
    "uplink",
    "moveUplinkAddresses",
    "macvlanMode",
    "mtu",
    "mac",
    "isGateway",
    "hairpinMode",
    "vlan",
    "stateDir",
    "logFile",
    "logLevel",
    "forwards",
    "allowedTargets",
    "reverse",
    "allowForeignSources",
    // Where devices dial the reverse forwards; one attachment holds them.
    "virtualAddresses",
    "health",
];

const ENTRY: &[&str] = &[
    "name",
    "protocol",
    "port",
    "target",
    "connectTimeoutMs",
    "idleTimeoutMs",
    "maxConnections",
    "queueTimeoutMs",
    "connectRetries",
    "proxyProtocol",
    "path",
];

const REVERSE: &[&str] = &["allowedSources"];

/// A forward's own: Modbus/TCP multiplexing (not for reverse entries).
const FORWARD: &[&str] = &[
    "appProtocol",
    "multiplex",
    "maxInFlight",
    "responseTimeoutMs",
];

/// `health`'s keys, of every type (a key of another type is an error of
/// the config, not an unknown key).
const HEALTH: &[&str] = &[
    "type",
    "target",
    "path",
    "expectStatus",
    "payload",
    "unitId",
    "register",
    "intervalMs",
    "timeoutMs",
    "failureThreshold",
    "successThreshold",
];

/// The built-in IPAM's keys (a delegated IPAM's are its plugin's).
const IPAM: &[&str] = &[
    "type", "ranges", "exclude", "routes", "dns", "nodeName", "probe",
];
const RANGE: &[&str] = &["subnet", "rangeStart", "rangeEnd", "gateway", "node"];
const ROUTE: &[&str] = &["dst", "gw"];
const PROBE: &[&str] = &["enabled", "timeoutMs"];

/// A key edgelink does not know, where it is, and the known key of that
/// place it most likely meant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownKey {
    /// `uplnk`, `forwards[1].prot`, `ipam.ranges[0][0].subnett`.
    pub path: String,
    pub closest: Option<&'static str>,
}

impl fmt::Display for UnknownKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: is not a key edgelink knows", self.path)?;
        if let Some(c) = self.closest {
            write!(f, " (did you mean \"{c}\"?)")?;
        }
        f.write_str("; ignored")
    }
}

/// Every key of `conf` (a network configuration object) that edgelink
/// does not know, in document order: the top level, each entry of
/// `forwards` and `reverse`, `health`, and the built-in IPAM's objects.
pub fn unknown_keys(conf: &Value) -> Vec<UnknownKey> {
    let mut out = Vec::new();
    let Value::Object(o) = conf else {
        return out;
    };
    let top: Vec<&'static str> = CNI.iter().chain(TOP).copied().collect();
    check(o, "", &top, &mut out);
    for (list, extra) in [("forwards", FORWARD), ("reverse", REVERSE)] {
        let known: Vec<&'static str> = ENTRY.iter().chain(extra).copied().collect();
        for (i, e) in array(o.get(list)).iter().enumerate() {
            if let Value::Object(eo) = e {
                check(eo, &format!("{list}[{i}]."), &known, &mut out);
            }
        }
    }
    if let Some(Value::Object(ho)) = o.get("health") {
        check(ho, "health.", HEALTH, &mut out);
    }
    if let Some(Value::Object(io)) = o.get("ipam") {
        let builtin = match io.get("type") {
            None | Some(Value::Null) => true,
            Some(Value::String(t)) => t.is_empty() || t == "edgelink",
            Some(_) => false,
        };
        if builtin {
            check_ipam(io, &mut out);
        }
    }
    out
}

fn check_ipam(io: &Map<String, Value>, out: &mut Vec<UnknownKey>) {
    check(io, "ipam.", IPAM, out);
    for (i, set) in array(io.get("ranges")).iter().enumerate() {
        for (j, r) in array(Some(set)).iter().enumerate() {
            if let Value::Object(ro) = r {
                check(ro, &format!("ipam.ranges[{i}][{j}]."), RANGE, out);
            }
        }
    }
    for (k, r) in array(io.get("routes")).iter().enumerate() {
        if let Value::Object(ro) = r {
            check(ro, &format!("ipam.routes[{k}]."), ROUTE, out);
        }
    }
    if let Some(Value::Object(po)) = io.get("probe") {
        check(po, "ipam.probe.", PROBE, out);
    }
}

fn array(v: Option<&Value>) -> &[Value] {
    match v {
        Some(Value::Array(a)) => a,
        _ => &[],
    }
}

fn check(o: &Map<String, Value>, prefix: &str, known: &[&'static str], out: &mut Vec<UnknownKey>) {
    for k in o.keys() {
        if !known.contains(&k.as_str()) {
            out.push(UnknownKey {
                path: format!("{prefix}{k}"),
                closest: closest(k, known),
            });
        }
    }
}

/// The known key `key` most likely meant: the same but for case, or the
/// nearest by edit distance (a transposition counts as one edit) when at
/// most a third of it differs.
pub fn closest(key: &str, known: &[&'static str]) -> Option<&'static str> {
    if let Some(k) = known.iter().find(|k| k.eq_ignore_ascii_case(key)) {
        return Some(k);
    }
    let lower = key.to_ascii_lowercase();
    known
        .iter()
        .map(|k| {
            (
                strsim::damerau_levenshtein(&lower, &k.to_ascii_lowercase()),
                *k,
            )
        })
        .filter(|(d, k)| *d <= (k.len().max(key.len()) / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn misspelt_keys_are_named_with_the_key_they_meant() {
        let conf = json!({
            "cniVersion": "1.0.0", "name": "n", "type": "edgelink",
            "uplnk": "eth1", "isgateway": true, "colour": "blue",
            "forwards": [{"name": "a", "port": 1, "target": "10.0.0.1:1", "protocl": "udp"}],
            "reverse": [{"name": "b", "port": 2, "target": "x:1", "allowedSource": []}],
            "health": {"type": "http", "intervalMS": 500, "expectedStatus": 200},
            "ipam": {"ranges": [[{"subnet": "10.0.0.0/24", "rangStart": "10.0.0.9"}]],
                     "probe": {"enable": true}, "nodename": "x"}
        });
        let got: Vec<String> = unknown_keys(&conf).iter().map(|u| u.to_string()).collect();
        assert_eq!(
            got,
            [
                "colour: is not a key edgelink knows; ignored",
                "isgateway: is not a key edgelink knows (did you mean \"isGateway\"?); ignored",
                "uplnk: is not a key edgelink knows (did you mean \"uplink\"?); ignored",
                "forwards[0].protocl: is not a key edgelink knows (did you mean \"protocol\"?); ignored",
                "reverse[0].allowedSource: is not a key edgelink knows (did you mean \"allowedSources\"?); ignored",
                "health.expectedStatus: is not a key edgelink knows (did you mean \"expectStatus\"?); ignored",
                "health.intervalMS: is not a key edgelink knows (did you mean \"intervalMs\"?); ignored",
                "ipam.nodename: is not a key edgelink knows (did you mean \"nodeName\"?); ignored",
                "ipam.ranges[0][0].rangStart: is not a key edgelink knows (did you mean \"rangeStart\"?); ignored",
                "ipam.probe.enable: is not a key edgelink knows (did you mean \"enabled\"?); ignored",
            ]
        );
    }

    #[test]
    fn the_specs_keys_and_a_delegated_ipams_are_not_reported() {
        let conf = json!({
            "cniVersion": "1.1.0", "name": "n", "type": "edgelink", "ipMasq": false,
            "capabilities": {"ips": true}, "runtimeConfig": {}, "args": {}, "prevResult": {},
            "disableCheck": false, "disableGC": false, "dns": {},
            "cni.dev/valid-attachments": [],
            "ipam": {"type": "host-local", "subnet": "10.0.0.0/24", "dataDir": "/x"}
        });
        assert_eq!(unknown_keys(&conf), []);
    }
}
