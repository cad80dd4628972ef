//! Label selectors (`matchLabels`, `matchExpressions`) as the API server
//! evaluates them: an empty selector matches everything, an operator it
//! does not know matches nothing (access is narrowed, never widened, by a
//! selector the operator cannot read).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::BTreeMap;

/// Whether `labels` satisfy `sel`.
pub fn matches(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let plain = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    plain
        && sel.match_expressions.iter().flatten().all(|e| {
            let values = e.values.as_deref().unwrap_or_default();
            let has = labels.get(&e.key);
            match e.operator.as_str() {
                "In" => has.is_some_and(|v| values.contains(v)),
                "NotIn" => has.is_none_or(|v| !values.contains(v)),
                "Exists" => has.is_some(),
                "DoesNotExist" => has.is_none(),
                _ => false,
            }
        })
}

/// What the API server would refuse in `sel` (at `path`): an operator
/// other than the four, In or NotIn without values, Exists or
/// DoesNotExist with some.
pub fn problems(sel: &LabelSelector, path: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, e) in sel.match_expressions.iter().flatten().enumerate() {
        let n = e.values.as_ref().map_or(0, Vec::len);
        let at = format!("{path}.matchExpressions[{i}]");
        match e.operator.as_str() {
            "In" | "NotIn" if n == 0 => {
                out.push(format!("{at}: operator {} needs values", e.operator))
            }
            "Exists" | "DoesNotExist" if n > 0 => {
                out.push(format!("{at}: operator {} takes no values", e.operator))
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            op => out.push(format!(
                "{at}: operator {op:?} is not In, NotIn, Exists or DoesNotExist"
            )),
        }
    }
    out
}

/// `sel` as `kubectl get -l` spells it (for messages and columns).
pub fn describe(sel: &LabelSelector) -> String {
    let mut parts: Vec<String> = sel
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in sel.match_expressions.iter().flatten() {
        let values = e.values.as_deref().unwrap_or_default().join(",");
        parts.push(match e.operator.as_str() {
            "Exists" => e.key.clone(),
            "DoesNotExist" => format!("!{}", e.key),
            op => format!("{} {} ({values})", e.key, op.to_ascii_lowercase()),
        });
    }
    if parts.is_empty() {
        "everything".into()
    } else {
        parts.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(v: serde_json::Value) -> LabelSelector {
        serde_json::from_value(v).unwrap()
    }

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selectors_match_as_the_api_servers_do() {
        let ci = labels(&[("app", "ci"), ("tier", "test")]);
        assert!(matches(&sel(serde_json::json!({})), &ci), "empty: all");
        assert!(matches(
            &sel(serde_json::json!({"matchLabels": {"app": "ci"}})),
            &ci
        ));
        assert!(!matches(
            &sel(serde_json::json!({"matchLabels": {"app": "web"}})),
            &ci
        ));
        let expr = |op: &str, values: &[&str]| {
            sel(
                serde_json::json!({"matchExpressions": [{"key": "tier", "operator": op, "values": values}]}),
            )
        };
        assert!(matches(&expr("In", &["test", "prod"]), &ci));
        assert!(!matches(&expr("NotIn", &["test"]), &ci));
        assert!(
            matches(&expr("NotIn", &["test"]), &labels(&[])),
            "absent: not in"
        );
        assert!(matches(&expr("Exists", &[]), &ci));
        assert!(!matches(&expr("DoesNotExist", &[]), &ci));
        assert!(!matches(&expr("Gt", &["1"]), &ci), "unknown: nothing");
        assert!(problems(&expr("In", &["a"]), "s").is_empty());
        assert_eq!(
            problems(&expr("In", &[]), "s"),
            ["s.matchExpressions[0]: operator In needs values"]
        );
        assert_eq!(problems(&expr("Exists", &["a"]), "s").len(), 1);
        assert_eq!(problems(&expr("Gt", &["1"]), "s").len(), 1);
        assert_eq!(
            describe(&sel(
                serde_json::json!({"matchLabels": {"app": "ci"}, "matchExpressions": [{"key": "x", "operator": "Exists"}]})
            )),
            "app=ci,x"
        );
    }
}
