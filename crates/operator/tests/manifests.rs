//! daemonset/operator/ against daemonset/daemonset.yaml: edgelinkd sends
//! the token the operator takes (its ServiceAccount's, for the audience the
//! operator asks the API server about), the operator may review it, and
//! the NetworkPolicy lets edgelinkd and nobody else at the operator's port.

use serde::Deserialize;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_norway::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

fn find(file: &str, kind: &str) -> Value {
    documents(&repo().join(file))
        .into_iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {file}"))
}

/// `--flag=value` among a container's args.
fn arg(c: &Value, flag: &str) -> String {
    c["args"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|a| a.as_str()?.strip_prefix(&format!("{flag}=")))
        .unwrap_or_else(|| panic!("no {flag}=..."))
        .to_string()
}

fn operator_container() -> (Value, Value) {
    let deploy = find("daemonset/operator/operator.yaml", "Deployment");
    let c = deploy["spec"]["template"]["spec"]["containers"][0].clone();
    (deploy, c)
}

#[test]
fn edgelinkd_sends_the_token_the_operator_reviews() {
    let ds = find("daemonset/daemonset.yaml", "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let (_, op) = operator_container();
    // The projected token: edgelinkd's ServiceAccount, for the operator's
    // audience only, short-lived.
    let vol = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "status-token")
        .expect("a status-token volume");
    let src = &vol["projected"]["sources"][0]["serviceAccountToken"];
    assert_eq!(src["audience"], arg(&op, "--webhook-audience").as_str());
    let ttl = src["expirationSeconds"]
        .as_u64()
        .expect("expirationSeconds");
    assert!((600..=3600).contains(&ttl), "{ttl}");
    assert_eq!(
        format!(
            "{}:{}",
            ds["metadata"]["namespace"].as_str().unwrap(),
            pod["serviceAccountName"].as_str().unwrap()
        ),
        arg(&op, "--webhook-service-account")
    );
    // No API token for edgelinkd all the same.
    assert_eq!(pod["automountServiceAccountToken"], false);
    // The file the ConfigMap tells edgelinkd to send.
    let c = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "edgelinkd")
        .unwrap();
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "status-token")
        .expect("status-token mounted");
    let cm = find("daemonset/operator/operator.yaml", "ConfigMap");
    assert_eq!(
        cm["data"]["EDGELINKD_STATUS_WEBHOOK_TOKEN_FILE"],
        format!(
            "{}/{}",
            mount["mountPath"].as_str().unwrap(),
            src["path"].as_str().unwrap()
        )
    );
    // The shared Secret is gone everywhere.
    for f in [
        "daemonset/daemonset.yaml",
        "daemonset/operator/operator.yaml",
    ] {
        let text = std::fs::read_to_string(repo().join(f)).unwrap();
        assert!(!text.contains("secretName: edgelink-status-token"), "{f}");
    }
}

#[test]
fn the_operator_may_review_tokens_and_read_pods() {
    let role = find("daemonset/operator/rbac.yaml", "ClusterRole");
    let allows = |group: &str, resource: &str, verb: &str| {
        role["rules"].as_array().unwrap().iter().any(|r| {
            let has = |k: &str, v: &str| r[k].as_array().unwrap().iter().any(|x| x == v);
            has("apiGroups", group) && has("resources", resource) && has("verbs", verb)
        })
    };
    assert!(allows("authentication.k8s.io", "tokenreviews", "create"));
    assert!(allows("", "pods", "get"));
    // The readiness gates, a lost node's pods, the Events.
    assert!(allows("", "pods/status", "patch"));
    assert!(allows("events.k8s.io", "events", "create"));
    // Access: every pod's addresses, the namespaces' labels, the leases
    // (their status, the annotated pods' ones) and the NetworkPolicies.
    assert!(allows("", "pods", "watch"));
    assert!(allows("", "namespaces", "watch"));
    assert!(allows("edgelink.io", "deviceleases", "create"));
    assert!(allows("edgelink.io", "deviceleases/status", "patch"));
    assert!(allows("networking.k8s.io", "networkpolicies", "patch"));
    assert!(!allows("edgelink.io", "deviceleases", "delete"));
    // The two deletes: a StatefulSet of a node the Device left, the
    // NetworkPolicy of a Device whose allowedClients went.
    let deletes: Vec<String> = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["verbs"].as_array().unwrap().iter().any(|v| v == "delete"))
        .map(|r| r["resources"].to_string())
        .collect();
    assert_eq!(deletes, [r#"["statefulsets"]"#, r#"["networkpolicies"]"#]);
}

#[test]
fn the_network_policy_admits_edgelinkd_at_the_operators_port() {
    let np = find("daemonset/operator/networkpolicy.yaml", "NetworkPolicy");
    let (deploy, op) = operator_container();
    let ds = find("daemonset/daemonset.yaml", "DaemonSet");
    assert_eq!(np["metadata"]["namespace"], deploy["metadata"]["namespace"]);
    // It selects the operator's pods.
    let labels = &deploy["spec"]["template"]["metadata"]["labels"];
    for (k, v) in np["spec"]["podSelector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(&labels[k], v, "{k}");
    }
    assert_eq!(np["spec"]["policyTypes"], serde_json::json!(["Ingress"]));
    let rules = np["spec"]["ingress"].as_array().unwrap();
    assert_eq!(rules.len(), 1);
    // The port the operator listens on.
    let listen = arg(&op, "--listen");
    let port: u64 = listen.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(rules[0]["ports"][0]["port"], port);
    assert_eq!(op["ports"][0]["containerPort"], port);
    // edgelinkd's pods by their labels, and the nodes by address.
    let from = rules[0]["from"].as_array().unwrap();
    let ds_labels = &ds["spec"]["template"]["metadata"]["labels"];
    assert!(from.iter().any(|f| {
        f["namespaceSelector"].is_null()
            && f["podSelector"]["matchLabels"]
                .as_object()
                .is_some_and(|m| m.iter().all(|(k, v)| &ds_labels[k] == v))
    }));
    assert!(from.iter().any(|f| f["ipBlock"]["cidr"].is_string()));
    // Nothing admits every pod of a namespace or of the cluster.
    for f in from {
        if !f["namespaceSelector"].is_null() {
            assert!(
                !f["podSelector"].is_null(),
                "a whole namespace is admitted: {f}"
            );
        }
        assert_ne!(f["ipBlock"]["cidr"], "0.0.0.0/0");
    }
}
