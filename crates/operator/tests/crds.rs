//! daemonset/operator/crds.yaml is what `edgelink-operator crds` prints:
//! regenerate it with
//!
//!   cargo run -q -p edgelink-operator -- crds > daemonset/operator/crds.yaml

#[test]
fn the_stored_crds_are_the_generated_ones() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../daemonset/operator/crds.yaml"
    );
    let stored = std::fs::read_to_string(path).expect("daemonset/operator/crds.yaml");
    let generated = edgelink_operator::crd::crds_yaml();
    assert!(
        stored == generated,
        "daemonset/operator/crds.yaml is stale: cargo run -q -p edgelink-operator -- crds > daemonset/operator/crds.yaml"
    );
}

/// The schema carries the plugin's rules, so `kubectl apply` refuses bad
/// input before the controller sees it.
#[test]
fn the_device_schema_carries_the_plugins_rules() {
    use kube::CustomResourceExt;
    let crd = serde_json::to_value(edgelink_operator::crd::Device::crd()).unwrap();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let port = &spec["properties"]["ports"]["items"];
    assert_eq!(port["properties"]["name"]["maxLength"], 15);
    assert_eq!(
        port["properties"]["name"]["pattern"],
        "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
    );
    assert_eq!(
        port["properties"]["protocol"]["enum"],
        serde_json::json!(["tcp", "udp"])
    );
    for f in ["port", "targetPort"] {
        assert_eq!(port["properties"][f]["minimum"], 1.0, "{f}");
        assert_eq!(port["properties"][f]["maximum"], 65535.0, "{f}");
    }
    for (f, min, max) in [
        ("connectTimeoutMs", 1.0, 600000.0),
        ("maxConnections", 1.0, 1000000.0),
        ("queueTimeoutMs", 1.0, 600000.0),
        ("connectRetries", 0.0, 10.0),
    ] {
        assert_eq!(port["properties"][f]["minimum"], min, "{f}");
        assert_eq!(port["properties"][f]["maximum"], max, "{f}");
    }
    assert_eq!(
        port["properties"]["proxyProtocol"]["enum"],
        serde_json::json!(["v1", "v2"])
    );
    assert_eq!(
        port["properties"]["path"]["enum"],
        serde_json::json!(["relay", "kernel"])
    );
    assert_eq!(
        port["required"],
        serde_json::json!(["name", "port", "protocol"])
    );
    assert_eq!(
        spec["properties"]["address"]["anyOf"],
        serde_json::json!([{"format": "ipv4"}, {"format": "ipv6"}])
    );
    assert_eq!(
        spec["required"],
        serde_json::json!(["address", "network", "ports"])
    );
    assert_eq!(
        spec["oneOf"],
        serde_json::json!([{"required": ["nodeName"]}, {"required": ["nodeSelector"]}])
    );
    assert_eq!(
        spec["properties"]["ports"]["x-kubernetes-list-map-keys"],
        serde_json::json!(["name"])
    );
    // Reverse entries: the plugin's name rule, one of service and target,
    // tcp by default, keyed by name; the Service's port by number or name.
    let rev = &spec["properties"]["reverse"];
    assert_eq!(
        rev["x-kubernetes-list-map-keys"],
        serde_json::json!(["name"])
    );
    let rev = &rev["items"];
    assert_eq!(rev["properties"]["name"]["maxLength"], 15);
    assert_eq!(
        rev["properties"]["name"]["pattern"],
        port["properties"]["name"]["pattern"]
    );
    assert_eq!(
        rev["oneOf"],
        serde_json::json!([{"required": ["service"]}, {"required": ["target"]}])
    );
    assert_eq!(rev["properties"]["protocol"]["default"], "tcp");
    assert_eq!(rev["required"], serde_json::json!(["name", "port"]));
    assert_eq!(rev["properties"]["port"]["maximum"], 65535.0);
    assert_eq!(
        rev["properties"]["service"]["properties"]["port"]["x-kubernetes-int-or-string"],
        true
    );
    assert_eq!(
        rev["properties"]["allowedSources"]["items"]["format"],
        "cidr"
    );
    assert_eq!(spec["properties"]["allowForeignSources"]["type"], "boolean");
    // No CEL (x-kubernetes-validations): Kubernetes 1.20 is the floor.
    assert!(!crd.to_string().contains("x-kubernetes-validations"));
    // An enum with null in it is refused by the apiserver (schemars writes
    // one for an Option of an enum).
    let all = edgelink_operator::crd::crds_yaml();
    assert!(!all.contains("- null"), "an enum holds null");
    let cols: Vec<String> = crd["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_uppercase())
        .collect();
    assert_eq!(
        cols,
        ["NODE", "ADDRESS", "PORTS", "READY", "REACHABLE", "AGE"]
    );
}
