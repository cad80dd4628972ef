use super::*;
use crate::fixtures::{device, network};

#[test]
fn the_nad_holds_the_nodes_ranges_the_forwards_and_only_the_device_as_target() {
    let r = render(
        &device(),
        &network(),
        &["kedge1".to_string()],
        &ProxyPodSettings::default(),
        &[],
    );
    let c: Value = serde_json::from_str(&r.nad.spec.config).unwrap();
    assert_eq!(c["name"], "plant-floor");
    assert_eq!(c["type"], "edgelink");
    assert_eq!(
        (
            c["mode"].as_str(),
            c["bridge"].as_str(),
            c["uplink"].as_str()
        ),
        (Some("bridge"), Some("edge0"), Some("eth1"))
    );
    assert_eq!(
        c["ipam"]["ranges"],
        json!([[{"subnet": "172.17.16.0/24", "rangeStart": "172.17.16.200", "rangeEnd": "172.17.16.224", "node": "kedge1"}]])
    );
    assert_eq!(
        c["forwards"],
        json!([
            {"name": "api", "protocol": "tcp", "port": 8080, "target": "172.17.16.120:8080"},
            {"name": "telemetry", "protocol": "udp", "port": 5000, "target": "172.17.16.120:5000"},
            {"name": "http", "protocol": "tcp", "port": 80, "target": "172.17.16.120:80", "connectTimeoutMs": 2000}
        ])
    );
    assert_eq!(c["allowedTargets"], json!(["172.17.16.120/32"]));
    assert_eq!(r.nad.metadata.namespace.as_deref(), Some("hil"));
}

#[test]
fn the_relay_keys_and_the_path_go_into_the_forwards_as_the_plugin_spells_them() {
    use crate::crd::{ForwardPath, ProxyProtocol};
    let mut d = device();
    let api = &mut d.spec.ports[0];
    api.max_connections = Some(64);
    api.queue_timeout_ms = Some(5000);
    api.connect_retries = Some(3);
    api.proxy_protocol = Some(ProxyProtocol::V2);
    api.path = Some(ForwardPath::Relay);
    d.spec.ports[1].path = Some(ForwardPath::Kernel);
    d.spec.ports[2].proxy_protocol = Some(ProxyProtocol::V1);
    let r = render(
        &d,
        &network(),
        &["kedge1".to_string()],
        &ProxyPodSettings::default(),
        &[],
    );
    let c: Value = serde_json::from_str(&r.nad.spec.config).unwrap();
    assert_eq!(
        c["forwards"],
        json!([
            {"name": "api", "protocol": "tcp", "port": 8080, "target": "172.17.16.120:8080",
             "maxConnections": 64, "queueTimeoutMs": 5000, "connectRetries": 3,
             "proxyProtocol": "v2", "path": "relay"},
            {"name": "telemetry", "protocol": "udp", "port": 5000, "target": "172.17.16.120:5000", "path": "kernel"},
            {"name": "http", "protocol": "tcp", "port": 80, "target": "172.17.16.120:80", "connectTimeoutMs": 2000,
             "proxyProtocol": "v1"}
        ])
    );
    // A new key replaces the pod, whose forwards are fixed at ADD.
    assert_ne!(
        config_hash(&r.nad.spec.config),
        config_hash(
            &render(
                &device(),
                &network(),
                &["kedge1".to_string()],
                &ProxyPodSettings::default(),
                &[]
            )
            .nad
            .spec
            .config
        )
    );
}

#[test]
fn every_object_is_owned_by_the_device_and_labelled() {
    let d = device();
    let r = render(
        &d,
        &network(),
        &["kedge1".to_string()],
        &ProxyPodSettings::default(),
        &[],
    );
    for m in [
        &r.nad.metadata,
        &r.proxies[0].statefulset.metadata,
        &r.service.metadata,
    ] {
        assert_eq!(m.name.as_deref(), Some("device01-01"));
        let o = &m.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (o.kind.as_str(), o.name.as_str(), o.uid.as_str()),
            ("Device", "device01-01", "5f1c-uid")
        );
        assert_eq!(o.api_version, "edgelink.io/v1alpha1");
        assert_eq!(o.controller, Some(true));
        assert_eq!(
            m.labels.as_ref().unwrap()["app.kubernetes.io/managed-by"],
            MANAGER
        );
    }
}

#[test]
fn the_proxy_pod_is_pinned_annotated_probed_and_unprivileged() {
    let r = render(
        &device(),
        &network(),
        &["kedge1".to_string()],
        &ProxyPodSettings::default(),
        &[],
    );
    let s = r.proxies[0].statefulset.spec.clone().unwrap();
    assert_eq!(s.replicas, Some(1));
    let t = s.template;
    let ann = t.metadata.as_ref().unwrap().annotations.as_ref().unwrap();
    assert_eq!(
        ann[NETWORKS_ANNOTATION],
        r#"[{"interface":"net1","name":"device01-01"}]"#
    );
    assert_eq!(ann[CONFIG_HASH_ANNOTATION], config_hash(&r.nad.spec.config));
    let labels = t.metadata.as_ref().unwrap().labels.as_ref().unwrap();
    for (k, v) in s.selector.match_labels.unwrap() {
        assert_eq!(labels[&k], v, "the selector must match the pod's labels");
    }
    let p = t.spec.unwrap();
    let term = &p
        .affinity
        .unwrap()
        .node_affinity
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .unwrap()
        .node_selector_terms[0];
    let f = &term.match_fields.as_ref().unwrap()[0];
    assert_eq!(
        (f.key.as_str(), f.values.as_ref().unwrap()[0].as_str()),
        ("metadata.name", "kedge1")
    );
    assert_eq!(
        term.match_expressions.as_ref().unwrap()[0].key,
        "edgelink.io/edge"
    );
    let c = &p.containers[0];
    assert_eq!(c.image.as_deref(), Some("registry.k8s.io/pause:3.9"));
    assert_eq!(
        c.readiness_probe
            .as_ref()
            .unwrap()
            .tcp_socket
            .as_ref()
            .unwrap()
            .port,
        IntOrString::Int(8080)
    );
    assert_eq!(
        c.security_context
            .as_ref()
            .unwrap()
            .allow_privilege_escalation,
        Some(false)
    );
    assert_eq!(p.automount_service_account_token, Some(false));
}

#[test]
fn a_udp_only_device_has_no_probe_and_ipv6_targets_are_bracketed() {
    let mut d = device();
    d.spec.address = "fd00:17::120".into();
    d.spec
        .ports
        .retain(|p| p.protocol == crate::crd::Protocol::Udp);
    d.spec.ports[0].target_port = Some(5001);
    let r = render(
        &d,
        &network(),
        &["kedge1".to_string()],
        &ProxyPodSettings::default(),
        &[],
    );
    assert!(r.proxies[0]
        .statefulset
        .spec
        .clone()
        .unwrap()
        .template
        .spec
        .unwrap()
        .containers[0]
        .readiness_probe
        .is_none());
    let c: Value = serde_json::from_str(&r.nad.spec.config).unwrap();
    assert_eq!(c["forwards"][0]["target"], "[fd00:17::120]:5001");
    assert_eq!(c["allowedTargets"], json!(["fd00:17::120/128"]));
}

#[test]
fn the_probe_prefers_a_relayed_tcp_port_to_a_kernel_path_one() {
    use crate::crd::ForwardPath;
    let probe_port = |d: &Device| {
        render(
            d,
            &network(),
            &["kedge1".to_string()],
            &ProxyPodSettings::default(),
            &[],
        )
        .proxies[0]
            .statefulset
            .spec
            .clone()
            .unwrap()
            .template
            .spec
            .unwrap()
            .containers[0]
            .readiness_probe
            .as_ref()
            .map(|p| p.tcp_socket.as_ref().unwrap().port.clone())
    };
    let mut d = device();
    d.spec.ports[0].path = Some(ForwardPath::Kernel);
    assert_eq!(probe_port(&d), Some(IntOrString::Int(80)));
    d.spec.ports[2].path = Some(ForwardPath::Kernel);
    assert_eq!(probe_port(&d), Some(IntOrString::Int(8080)));
}

#[test]
fn the_service_has_one_port_per_device_port() {
    let r = render(
        &device(),
        &network(),
        &["kedge1".to_string()],
        &ProxyPodSettings::default(),
        &[],
    );
    let s = r.service.spec.unwrap();
    assert_eq!(s.selector.unwrap()[DEVICE_LABEL], "device01-01");
    let ports: Vec<_> = s
        .ports
        .unwrap()
        .into_iter()
        .map(|p| {
            (
                p.name.unwrap(),
                p.protocol.unwrap(),
                p.port,
                p.target_port.unwrap(),
                p.app_protocol,
            )
        })
        .collect();
    assert_eq!(
        ports,
        [
            (
                "api".to_string(),
                "TCP".to_string(),
                8080,
                IntOrString::Int(8080),
                None
            ),
            (
                "telemetry".into(),
                "UDP".into(),
                5000,
                IntOrString::Int(5000),
                None
            ),
            (
                "http".into(),
                "TCP".into(),
                80,
                IntOrString::Int(80),
                Some("http".to_string())
            ),
        ]
    );
    assert_eq!(port_list(&device()), "8080/tcp,5000/udp,80/tcp");
}

#[test]
fn a_port_edit_changes_the_config_hash_and_so_replaces_the_pod() {
    let n = network();
    let a = render(
        &device(),
        &n,
        &["kedge1".to_string()],
        &ProxyPodSettings::default(),
        &[],
    );
    let mut d = device();
    d.spec.ports[0].port = 8081;
    let b = render(
        &d,
        &n,
        &["kedge1".to_string()],
        &ProxyPodSettings::default(),
        &[],
    );
    let hash = |r: &Rendered| {
        r.proxies[0]
            .statefulset
            .spec
            .clone()
            .unwrap()
            .template
            .metadata
            .unwrap()
            .annotations
            .unwrap()[CONFIG_HASH_ANNOTATION]
            .clone()
    };
    assert_ne!(hash(&a), hash(&b));
    assert_eq!(
        hash(&a),
        hash(&render(
            &device(),
            &n,
            &["kedge1".to_string()],
            &ProxyPodSettings::default(),
            &[]
        ))
    );
}

#[test]
fn on_two_nodes_each_node_has_its_pinned_proxy_and_the_nad_both_ranges() {
    let nodes = ["kedge1".to_string(), "kedge2".to_string()];
    let r = render(
        &device(),
        &network(),
        &nodes,
        &ProxyPodSettings::default(),
        &[],
    );
    let c: Value = serde_json::from_str(&r.nad.spec.config).unwrap();
    assert_eq!(
        c["ipam"]["ranges"],
        json!([[
            {"subnet": "172.17.16.0/24", "rangeStart": "172.17.16.200", "rangeEnd": "172.17.16.224", "node": "kedge1"},
            {"subnet": "172.17.16.0/24", "rangeStart": "172.17.16.225", "rangeEnd": "172.17.16.249", "node": "kedge2"}
        ]])
    );
    let names: Vec<_> = r
        .proxies
        .iter()
        .map(|p| (p.node.as_str(), p.name.as_str(), p.pod()))
        .collect();
    assert_eq!(
        names,
        [
            (
                "kedge1",
                "device01-01-kedge1",
                "device01-01-kedge1-0".to_string()
            ),
            (
                "kedge2",
                "device01-01-kedge2",
                "device01-01-kedge2-0".to_string()
            )
        ]
    );
    for p in &r.proxies {
        let s = p.statefulset.spec.clone().unwrap();
        assert_eq!(
            p.statefulset.metadata.name.as_deref(),
            Some(p.name.as_str())
        );
        let sel = s.selector.match_labels.unwrap();
        assert_eq!(
            sel[PROXY_LABEL], p.name,
            "each StatefulSet selects its own pod only"
        );
        let t = s.template;
        let labels = t.metadata.as_ref().unwrap().labels.clone().unwrap();
        for (k, v) in &sel {
            assert_eq!(&labels[k], v);
        }
        assert_eq!(labels[NODE_LABEL], p.node);
        let spec = t.spec.unwrap();
        let pinned = &spec
            .affinity
            .unwrap()
            .node_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap()
            .node_selector_terms[0]
            .match_fields
            .clone()
            .unwrap()[0];
        assert_eq!(
            pinned.values.as_ref().unwrap(),
            std::slice::from_ref(&p.node)
        );
        assert_eq!(
            spec.readiness_gates.unwrap()[0].condition_type,
            READINESS_GATE
        );
        // The pods share the NAD (named after the Device).
        assert_eq!(
            t.metadata.unwrap().annotations.unwrap()[NETWORKS_ANNOTATION],
            r#"[{"interface":"net1","name":"device01-01"}]"#
        );
    }
    // The Service selects every proxy.
    assert_eq!(
        r.service.spec.unwrap().selector.unwrap(),
        BTreeMap::from([(DEVICE_LABEL.to_string(), "device01-01".to_string())])
    );
}

#[test]
fn one_node_keeps_the_names_it_had_and_long_or_dotted_node_names_are_hashed() {
    let one = render(
        &device(),
        &network(),
        &["kedge1".to_string()],
        &ProxyPodSettings::default(),
        &[],
    );
    assert_eq!(one.proxies[0].name, "device01-01");
    assert_eq!(one.proxies[0].pod(), "device01-01-0");
    let sel = one.proxies[0]
        .statefulset
        .spec
        .clone()
        .unwrap()
        .selector
        .match_labels
        .unwrap();
    assert_eq!(
        sel,
        BTreeMap::from([(DEVICE_LABEL.to_string(), "device01-01".to_string())]),
        "a StatefulSet's selector cannot change: the one-node selector stays"
    );
    let dotted = proxy_name("device01-01", "edge-1.plant.example", true);
    assert!(
        dotted.starts_with("device01-01-n") && dotted.len() == "device01-01-n".len() + 8,
        "{dotted}"
    );
    assert_ne!(
        dotted,
        proxy_name("device01-01", "edge-2.plant.example", true)
    );
    let long = "d".repeat(61);
    let n = proxy_name(&long, "kedge1", true);
    assert!(n.len() <= 61, "{n}");
    assert_ne!(n, proxy_name(&long, "kedge2", true));
}

#[test]
fn on_two_nodes_each_proxy_admits_half_of_max_connections() {
    let mut d = device();
    d.spec.ports[0].max_connections = Some(9);
    let both = ["kedge1".to_string(), "kedge2".to_string()];
    let c = cni_config(&d, &network(), &both, &[]);
    assert_eq!(c["forwards"][0]["maxConnections"], 4);
    let one = cni_config(&d, &network(), &both[..1], &[]);
    assert_eq!(one["forwards"][0]["maxConnections"], 9);
}
