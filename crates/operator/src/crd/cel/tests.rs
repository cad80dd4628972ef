use super::*;
use crate::crd::{Device, EdgeNetwork, ForwardPath, MacvlanMode, Mode, ProxyProtocol};
use crate::fixtures::{device, device_with_reverse, network};
use kube::CustomResourceExt;
use serde_json::Value;

fn schema<K: CustomResourceExt>() -> Value {
    let crd = serde_json::to_value(K::crd()).unwrap();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

/// Every schema in `s` that carries rules, by path, with its rules.
fn with_rules<'a>(s: &'a Value, path: &str, out: &mut Vec<(String, &'a Value)>) {
    if s.get("x-kubernetes-validations").is_some() {
        out.push((path.to_string(), s));
    }
    if let Some(props) = s["properties"].as_object() {
        for (k, v) in props {
            with_rules(v, &format!("{path}.{k}"), out);
        }
    }
    if s["items"].is_object() {
        with_rules(&s["items"], &format!("{path}[]"), out);
    }
}

fn all_rules() -> Vec<(String, Value)> {
    let (d, n) = (schema::<Device>(), schema::<EdgeNetwork>());
    let mut out = Vec::new();
    with_rules(&d, "Device", &mut out);
    with_rules(&n, "EdgeNetwork", &mut out);
    out.into_iter().map(|(p, s)| (p, s.clone())).collect()
}

/// The fields `self.<field>` in `expr` names (`has(self.<field>)` too).
fn fields_named(expr: &str) -> Vec<&str> {
    expr.match_indices("self.")
        .map(|(i, _)| {
            let rest = &expr[i + 5..];
            let end = rest
                .find(|c: char| !c.is_ascii_alphanumeric())
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect()
}

#[test]
fn every_rule_reads_and_points_at_fields_of_its_own_schema() {
    let rules = all_rules();
    let paths: Vec<_> = rules.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        [
            "Device",
            "Device.spec",
            "Device.spec.address",
            "Device.spec.health",
            "Device.spec.ports",
            "Device.spec.ports[]",
            "Device.spec.reverse",
            "Device.spec.reverse[]",
            "Device.spec.virtualAddresses",
            "EdgeNetwork.spec",
            "EdgeNetwork.spec.ipam.ranges[]",
        ]
    );
    for (path, s) in &rules {
        for r in s["x-kubernetes-validations"].as_array().unwrap() {
            let rule = r["rule"].as_str().unwrap();
            let message = r["messageExpression"].as_str().unwrap_or("");
            for f in fields_named(rule).into_iter().chain(fields_named(message)) {
                // `self` of a rule on a string or a list is that (`self.all(...)`).
                let own = s["type"] != "object" || s["properties"].get(f).is_some();
                let root_meta = path == "Device" && f == "metadata";
                assert!(own || root_meta, "{path}: self.{f} in {rule}");
            }
            if let Some(fp) = r["fieldPath"].as_str() {
                let mut at = s;
                for part in fp.trim_start_matches('.').split('.') {
                    at = &at["properties"][part];
                    assert!(at.is_object(), "{path}: fieldPath {fp}");
                }
            }
            for m in [&r["message"], &r["messageExpression"]] {
                assert!(!m.as_str().unwrap_or("").contains('\n'), "{path}: {m}");
            }
        }
    }
}

/// The apiserver refuses a CRD whose rules' estimated cost is too high:
/// every list a rule walks or lies in has maxItems, and every string a rule
/// reads has maxLength (or an enum).
#[test]
fn every_list_and_string_the_rules_see_is_bounded() {
    fn carries_rules(s: &Value) -> bool {
        s.get("x-kubernetes-validations").is_some()
            || s["properties"]
                .as_object()
                .is_some_and(|p| p.values().any(carries_rules))
            || (s["items"].is_object() && carries_rules(&s["items"]))
    }
    fn lists(s: &Value, path: &str) {
        if s["type"] == "array" && carries_rules(s) {
            assert!(s["maxItems"].is_u64(), "{path} has no maxItems");
        }
        if let Some(props) = s["properties"].as_object() {
            for (k, v) in props {
                lists(v, &format!("{path}.{k}"));
            }
        }
        if s["items"].is_object() {
            lists(&s["items"], &format!("{path}[]"));
        }
    }
    lists(&schema::<Device>(), "Device");
    lists(&schema::<EdgeNetwork>(), "EdgeNetwork");
    for (path, s) in all_rules() {
        for r in s["x-kubernetes-validations"].as_array().unwrap() {
            let rule = r["rule"].as_str().unwrap();
            // A presence test reads no value.
            let reads = rule.replace("has(self.", "has(");
            for f in fields_named(&reads) {
                let field = if s["type"] == "string" {
                    &s
                } else {
                    &s["properties"][f]
                };
                if field["type"] == "string" {
                    assert!(
                        field["maxLength"].is_u64() || field["enum"].is_array(),
                        "{path}.{f}: a string without maxLength in {rule}"
                    );
                }
            }
        }
    }
}

#[test]
fn without_cel_is_the_same_crds_less_the_rules() {
    let docs = |y: &str| -> Vec<Value> {
        y.split("\n---\n")
            .skip(1)
            .map(|d| serde_norway::from_str(d).unwrap())
            .collect()
    };
    let mut with = docs(&crate::crd::crds_yaml());
    let without = docs(&crate::crd::crds_yaml_without_cel());
    // Device, EdgeNetwork (both with rules) and DeviceLease (none).
    assert_eq!(with.len(), 3);
    assert!(with[..2]
        .iter()
        .all(|d| d.to_string().contains("x-kubernetes-validations")));
    assert!(!without
        .iter()
        .any(|d| d.to_string().contains("x-kubernetes-validations")));
    with.iter_mut().for_each(strip);
    assert_eq!(with, without);
}

/// The static rule messages are the controller's words for the same
/// object: `spec.<fieldPath>: <message>` is in what `validate` reports.
#[test]
fn the_rules_messages_are_the_controllers() {
    fn message(s: &Value, field: &str) -> String {
        let r = s["x-kubernetes-validations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["fieldPath"] == format!(".{field}") && r["message"].is_string())
            .unwrap_or_else(|| panic!("no rule with a fixed message on {field}"));
        format!("spec.{field}: {}", r["message"].as_str().unwrap())
    }
    let spec = &schema::<EdgeNetwork>()["properties"]["spec"];
    let mut n = network();
    n.spec.mode = Mode::Macvlan;
    n.spec.uplink = None;
    n.spec.move_uplink_addresses = Some(true);
    n.spec.vlan = Some(10);
    let p = crate::validate::network(&n).unwrap_err().to_string();
    for f in ["uplink", "bridge", "moveUplinkAddresses", "vlan"] {
        assert!(p.contains(&message(spec, f)), "{f}: {p}");
    }
    let mut n = network();
    n.spec.macvlan_mode = Some(MacvlanMode::Private);
    let p = crate::validate::network(&n).unwrap_err().to_string();
    assert!(p.contains(&message(spec, "macvlanMode")), "{p}");

    let spec = &schema::<Device>()["properties"]["spec"];
    let mut d = device();
    d.spec.node_name = None;
    d.spec.node_selector = Some(Default::default());
    let p = crate::validate::device(&d).unwrap_err().to_string();
    assert!(p.contains(&message(spec, "nodeSelector")), "{p}");

    let mut d = device_with_reverse();
    d.spec.reverse[0].idle_timeout_ms = Some(500);
    let p = crate::validate::device(&d).unwrap_err().to_string();
    let rev = &spec["properties"]["reverse"]["items"];
    let idle = message(rev, "idleTimeoutMs").replace("spec.idleTimeoutMs: ", "");
    assert!(
        p.contains(&format!("spec.reverse[0].idleTimeoutMs: 500 {idle}")),
        "{p}"
    );

    let mut d = device();
    d.metadata.name = Some("1device".into());
    let p = crate::validate::device(&d).unwrap_err().to_string();
    let root = device_name().message.unwrap();
    let Message::Message(m) = root else {
        panic!("{root:?}")
    };
    let (field, words) = m.split_once(": ").unwrap();
    assert!(
        p.starts_with(&format!("{field}: \"1device\" {words}")),
        "{p}\n{m}"
    );
}

/// What the controller refuses, rule by rule, is what a rule is written
/// for: the keys and values the rules name are the controller's.
#[test]
fn the_rules_cover_the_controllers_relay_keys() {
    let mut d = device();
    let api = &mut d.spec.ports[0];
    api.path = Some(ForwardPath::Kernel);
    api.max_connections = Some(1);
    api.queue_timeout_ms = Some(1);
    api.connect_retries = Some(1);
    api.proxy_protocol = Some(ProxyProtocol::V1);
    let p = crate::validate::device(&d).unwrap_err().to_string();
    for key in RELAY_KEYS {
        assert!(
            p.contains(&format!(
                "spec.ports[0].{key}: needs the relay: it cannot be set with path kernel (api)"
            )),
            "{key}: {p}"
        );
    }
    let port = &schema::<Device>()["properties"]["spec"]["properties"]["ports"]["items"];
    let rules = port["x-kubernetes-validations"].as_array().unwrap();
    for key in RELAY_KEYS {
        let on_key: Vec<_> = rules
            .iter()
            .filter(|r| r["fieldPath"] == format!(".{key}"))
            .collect();
        assert_eq!(on_key.len(), 2, "{key}: protocol and path");
    }
}
