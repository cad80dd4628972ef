//! What `edgelink validate` reads: the edgelink configurations in a plain
//! configuration, a conflist, or NetworkAttachmentDefinitions in YAML.

use serde::Deserialize;
use serde_json::Value;

/// One configuration found in the input, or a part of it left out.
#[derive(Debug)]
pub enum Input {
    /// An edgelink configuration; `label` says where it was found.
    Config { label: String, conf: Value },
    /// A document or plugin that is not edgelink's.
    Skipped { label: String, why: String },
    /// A configuration that could not even be read (its one problem).
    Unreadable { label: String, problem: String },
}

/// The configurations of `text`: JSON (a configuration or a conflist),
/// else YAML documents, of which NetworkAttachmentDefinitions are read
/// (their `spec.config`, itself a configuration or a conflist).
pub fn configs(text: &str) -> Result<Vec<Input>, String> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("is not valid JSON: {e}"))?;
        return Ok(network("config", &v));
    }
    let mut out = Vec::new();
    for (i, doc) in serde_norway::Deserializer::from_str(text).enumerate() {
        let v = Value::deserialize(doc).map_err(|e| format!("is not valid JSON or YAML: {e}"))?;
        if v.is_null() {
            continue; // an empty document (a trailing `---`)
        }
        let kind = v.get("kind").and_then(Value::as_str).unwrap_or("");
        let name = v
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("?");
        let label = match v.pointer("/metadata/namespace").and_then(Value::as_str) {
            Some(ns) => format!("NetworkAttachmentDefinition {ns}/{name}"),
            None => format!("NetworkAttachmentDefinition {name}"),
        };
        if kind != "NetworkAttachmentDefinition" {
            let what = if kind.is_empty() {
                "no kind".to_string()
            } else {
                format!("kind {kind}")
            };
            out.push(Input::Skipped {
                label: format!("document {}", i + 1),
                why: format!("{what}, not a NetworkAttachmentDefinition"),
            });
            continue;
        }
        let Some(config) = v.pointer("/spec/config").and_then(Value::as_str) else {
            out.push(Input::Skipped {
                label,
                why: "no spec.config (a NAD without one names a configuration on the node)".into(),
            });
            continue;
        };
        match serde_json::from_str::<Value>(config) {
            Ok(c) => out.extend(network(&label, &c)),
            Err(e) => out.push(Input::Unreadable {
                label,
                problem: format!("spec.config is not valid JSON: {e}"),
            }),
        }
    }
    Ok(out)
}

/// A configuration or a conflist: its edgelink configurations, each with
/// the list's `cniVersion` and `name` as the runtime gives them.
fn network(label: &str, v: &Value) -> Vec<Input> {
    let Some(plugins) = v.get("plugins").and_then(Value::as_array) else {
        return vec![one(label.to_string(), v.clone())];
    };
    plugins
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut p = p.clone();
            if let Value::Object(o) = &mut p {
                for k in ["cniVersion", "name"] {
                    if let Some(x) = v.get(k) {
                        o.insert(k.into(), x.clone());
                    }
                }
            }
            one(format!("{label}, plugins[{i}]"), p)
        })
        .collect()
}

fn one(label: String, conf: Value) -> Input {
    match conf.get("type").and_then(Value::as_str) {
        Some("edgelink") | None => Input::Config { label, conf },
        Some(t) => Input::Skipped {
            label,
            why: format!("type {t:?}, not edgelink"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(i: &[Input]) -> Vec<String> {
        i.iter()
            .map(|x| match x {
                Input::Config { label, .. } => format!("check {label}"),
                Input::Skipped { label, why } => format!("skip {label}: {why}"),
                Input::Unreadable { label, problem } => format!("bad {label}: {problem}"),
            })
            .collect()
    }

    #[test]
    fn reads_a_config_a_conflist_and_nads() {
        let c = configs(r#"{"cniVersion":"1.0.0","name":"n","type":"edgelink"}"#).unwrap();
        assert_eq!(labels(&c), ["check config"]);

        let l = configs(
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"edgelink"},{"type":"tuning"}]}"#,
        )
        .unwrap();
        assert_eq!(
            labels(&l),
            [
                "check config, plugins[0]",
                "skip config, plugins[1]: type \"tuning\", not edgelink"
            ]
        );
        let Input::Config { conf, .. } = &l[0] else {
            unreachable!()
        };
        assert_eq!(conf["name"], "n", "the list's name is given to its plugins");

        let y = configs(
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: hil}\n---\n\
             apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\n\
             metadata: {name: plant, namespace: hil}\n\
             spec:\n  config: '{\"cniVersion\":\"1.0.0\",\"name\":\"plant\",\"type\":\"edgelink\"}'\n---\n",
        )
        .unwrap();
        assert_eq!(
            labels(&y),
            [
                "skip document 1: kind Namespace, not a NetworkAttachmentDefinition",
                "check NetworkAttachmentDefinition hil/plant"
            ]
        );
    }

    #[test]
    fn bad_input_says_what_it_is_not() {
        let e = configs("{\"name\": ").unwrap_err();
        assert!(e.starts_with("is not valid JSON"), "{e}");
        let e = configs("a: [").unwrap_err();
        assert!(e.starts_with("is not valid JSON or YAML"), "{e}");
    }
}
