//! daemonset/operator/crds.yaml and crds-1.20.yaml are what
//! `edgelink-operator crds` prints, with and without `--without-cel`:
//! regenerate them with
//!
//!   cargo run -q -p edgelink-operator -- crds > daemonset/operator/crds.yaml
//!   cargo run -q -p edgelink-operator -- crds --without-cel > daemonset/operator/crds-1.20.yaml

#[test]
fn the_stored_crds_are_the_generated_ones() {
    for (file, generated, flag) in [
        ("crds.yaml", edgelink_operator::crd::crds_yaml(), ""),
        (
            "crds-1.20.yaml",
            edgelink_operator::crd::crds_yaml_without_cel(),
            " --without-cel",
        ),
    ] {
        let path = format!(
            "{}/../../daemonset/operator/{file}",
            env!("CARGO_MANIFEST_DIR")
        );
        let stored = std::fs::read_to_string(&path).expect(file);
        assert!(
            stored == generated,
            "daemonset/operator/{file} is stale: cargo run -q -p edgelink-operator -- crds{flag} > daemonset/operator/{file}"
        );
    }
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
        serde_json::json!([{"required": ["nodeName"]}, {"required": ["nodes"]}, {"required": ["nodeSelector"]}])
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
    // CEL rules (x-kubernetes-validations) for Kubernetes 1.31 and later;
    // crds-1.20.yaml has none (crate::crd::cel's tests).
    assert!(spec["x-kubernetes-validations"].is_array());
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
        [
            "READY",
            "REACHABLE",
            "NODES",
            "LAST-SEEN",
            "ADDRESS",
            "PORTS",
            "AGE"
        ]
    );
}

/// Only formats the apiserver knows: 1.36 warns `unrecognized format
/// "uint32"` at every `kubectl apply` of a schema that has one.
#[test]
fn the_crds_name_no_format_the_apiserver_does_not_know() {
    for yaml in [
        edgelink_operator::crd::crds_yaml(),
        edgelink_operator::crd::crds_yaml_without_cel(),
    ] {
        let formats: std::collections::BTreeSet<&str> = yaml
            .lines()
            .filter_map(|l| l.trim().strip_prefix("format: "))
            .collect();
        let known = ["cidr", "ipv4", "ipv6", "int32", "int64", "date-time"];
        let unknown: Vec<_> = formats.iter().filter(|f| !known.contains(f)).collect();
        assert!(
            unknown.is_empty(),
            "formats the apiserver does not know: {unknown:?}"
        );
        assert!(
            formats.contains("cidr"),
            "the schema's own formats stay: {formats:?}"
        );
    }
}
