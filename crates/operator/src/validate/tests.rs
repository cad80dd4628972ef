use super::*;
use crate::crd::{MacvlanMode, ProxyProtocol};

fn problems(r: Result<(), Invalid>) -> String {
    r.err().map(|e| e.to_string()).unwrap_or_default()
}

#[test]
fn the_examples_are_valid() {
    assert_eq!(device(&crate::fixtures::device()), Ok(()));
    assert_eq!(network(&crate::fixtures::network()), Ok(()));
    assert_eq!(
        placement(
            &crate::fixtures::device(),
            &crate::fixtures::network(),
            "kedge1"
        ),
        Ok(())
    );
}

#[test]
fn a_device_name_that_cannot_name_a_service_is_refused() {
    for bad in ["1device", "Device", "a".repeat(62).as_str()] {
        let mut d = crate::fixtures::device();
        d.metadata.name = Some(bad.to_string());
        assert!(problems(device(&d)).contains("DNS-1035"), "{bad}");
    }
}

#[test]
fn duplicate_ports_and_bad_addresses_are_named() {
    let mut d = crate::fixtures::device();
    d.spec.ports.push(DevicePort {
        name: "api2".into(),
        protocol: Protocol::Tcp,
        port: 8080,
        target_port: None,
        app_protocol: None,
        connect_timeout_ms: None,
        max_connections: None,
        queue_timeout_ms: None,
        connect_retries: None,
        proxy_protocol: None,
        path: None,
    });
    d.spec.address = "224.0.0.1".into();
    let p = problems(device(&d));
    assert!(
        p.contains("spec.ports[3]: 8080/tcp is used by spec.ports[0] (api)"),
        "{p}"
    );
    assert!(p.contains("224.0.0.1 is not a unicast address"), "{p}");
    d.spec.node_selector = Some([("a".to_string(), "b".to_string())].into());
    assert!(problems(device(&d)).contains("give only one of nodeName, nodes and nodeSelector"));
}

#[test]
fn the_relay_keys_are_valid_on_a_relayed_tcp_port() {
    let mut d = crate::fixtures::device();
    let api = &mut d.spec.ports[0];
    api.max_connections = Some(MAX_CONNECTIONS);
    api.queue_timeout_ms = Some(MAX_QUEUE_TIMEOUT_MS);
    api.connect_retries = Some(0);
    api.proxy_protocol = Some(ProxyProtocol::V2);
    api.path = Some(ForwardPath::Relay);
    d.spec.ports[1].path = Some(ForwardPath::Kernel);
    d.spec.ports[2].path = Some(ForwardPath::Kernel);
    assert_eq!(device(&d), Ok(()));
}

#[test]
fn the_relay_keys_are_refused_on_the_kernel_path_and_on_udp() {
    let mut d = crate::fixtures::device();
    let api = &mut d.spec.ports[0];
    api.path = Some(ForwardPath::Kernel);
    api.max_connections = Some(10);
    api.proxy_protocol = Some(ProxyProtocol::V1);
    let telemetry = &mut d.spec.ports[1];
    telemetry.proxy_protocol = Some(ProxyProtocol::V2);
    telemetry.queue_timeout_ms = Some(1000);
    telemetry.connect_retries = Some(3);
    let p = problems(device(&d));
    for want in [
        "spec.ports[0].maxConnections: needs the relay: it cannot be set with path kernel (api)",
        "spec.ports[0].proxyProtocol: needs the relay: it cannot be set with path kernel (api)",
        "spec.ports[1].proxyProtocol: is only valid with protocol tcp (telemetry is udp)",
        "spec.ports[1].queueTimeoutMs: is only valid with protocol tcp (telemetry is udp)",
        "spec.ports[1].connectRetries: is only valid with protocol tcp (telemetry is udp)",
    ] {
        assert!(p.contains(want), "{want}\n in {p}");
    }
    assert_eq!(p.matches("spec.ports").count(), 5, "{p}");
    // Out of the plugin's ranges (the schema says so too).
    let mut d = crate::fixtures::device();
    d.spec.ports[0].max_connections = Some(0);
    d.spec.ports[0].queue_timeout_ms = Some(MAX_QUEUE_TIMEOUT_MS + 1);
    d.spec.ports[0].connect_retries = Some(11);
    let p = problems(device(&d));
    assert!(
        p.contains("spec.ports[0].maxConnections: 0 is not in 1..1000000"),
        "{p}"
    );
    assert!(
        p.contains("spec.ports[0].queueTimeoutMs: 600001 is not in 1..600000"),
        "{p}"
    );
    assert!(
        p.contains("spec.ports[0].connectRetries: 11 is not in 0..10"),
        "{p}"
    );
}

#[test]
fn network_rules_of_the_plugin_are_checked() {
    let mut n = crate::fixtures::network();
    n.spec.mode = crate::crd::Mode::Macvlan;
    n.spec.uplink = None;
    n.spec.ipam.ranges[0].range_start = Some("172.17.17.1".into());
    n.spec.ipam.ranges[1].node = "kedge1".into();
    let p = problems(network(&n));
    assert!(
        p.contains("spec.uplink: is required with mode macvlan"),
        "{p}"
    );
    assert!(
        p.contains("spec.bridge: is only valid with mode bridge"),
        "{p}"
    );
    assert!(
        p.contains("rangeStart: 172.17.17.1 is outside the subnet 172.17.16.0/24"),
        "{p}"
    );
    let mut n = crate::fixtures::network();
    n.spec.macvlan_mode = Some(MacvlanMode::Vepa);
    n.spec.ipam.ranges[1].node = "kedge1".into();
    n.spec.ipam.ranges[1].range_start = Some("172.17.16.220".into());
    let p = problems(network(&n));
    assert!(
        p.contains("macvlanMode: is only valid with mode macvlan"),
        "{p}"
    );
    assert!(
        p.contains("spec.ipam.ranges[1]: overlaps spec.ipam.ranges[0] on node kedge1"),
        "{p}"
    );
}

#[test]
fn placement_needs_a_range_on_the_node_and_an_allowed_address_outside_it() {
    let (d, n) = (crate::fixtures::device(), crate::fixtures::network());
    assert!(problems(placement(&d, &n, "kworker1")).contains("has no range for node kworker1"));
    let mut d2 = d.clone();
    d2.spec.address = "172.17.16.210".into();
    let p = problems(placement(&d2, &n, "kedge1"));
    assert!(
        p.contains("outside EdgeNetwork plant-floor's allowed targets"),
        "{p}"
    );
    let mut n2 = n.clone();
    n2.spec.allowed_targets.clear();
    let p = problems(placement(&d2, &n2, "kedge1"));
    assert!(
        p.contains("inside the range 172.17.16.200-172.17.16.224"),
        "{p}"
    );
    let mut d3 = d.clone();
    d3.spec.address = "fd00::1".into();
    assert!(problems(placement(&d3, &n, "kedge1")).contains("no IPv6 address"));
}

#[test]
fn the_nodes_are_given_one_way_unique_and_bounded() {
    let mut d = crate::fixtures::device();
    d.spec.node_name = None;
    assert!(problems(device(&d)).contains("one of nodeName, nodes and nodeSelector is required"));
    d.spec.nodes = vec!["kedge1".into(), "kedge2".into()];
    assert_eq!(device(&d), Ok(()));
    d.spec.nodes.push("kedge1".into());
    assert!(problems(device(&d)).contains(r#"spec.nodes[2]: "kedge1" is also spec.nodes[0]"#));
    d.spec.nodes = (0..17).map(|i| format!("edge{i}")).collect();
    assert!(problems(device(&d)).contains("spec.nodes: 17 nodes, at most 16"));
    d.spec.nodes = vec!["kedge1".into()];
    d.spec.node_name = Some("kedge1".into());
    assert!(problems(device(&d)).contains("give only one of nodeName, nodes and nodeSelector"));
}

#[test]
fn a_health_probe_takes_the_keys_of_its_type_and_a_port_it_can_find() {
    use crate::crd::{DeviceHealth, ProbeType};
    let mut d = crate::fixtures::device();
    d.spec.health = Some(DeviceHealth {
        type_: Some(ProbeType::Icmp),
        port: Some(80),
        path: Some("/".into()),
        ..Default::default()
    });
    let p = problems(device(&d));
    assert!(
        p.contains("spec.health.port: is not a key of probe type icmp"),
        "{p}"
    );
    assert!(
        p.contains("spec.health.path: is not a key of probe type icmp"),
        "{p}"
    );
    d.spec.health = Some(DeviceHealth {
        type_: Some(ProbeType::Udp),
        interval_seconds: Some(1),
        timeout_seconds: Some(2),
        ..Default::default()
    });
    let p = problems(device(&d));
    assert!(
        p.contains("spec.health.payload: is required with probe type udp"),
        "{p}"
    );
    assert!(
        p.contains("spec.health.timeoutSeconds: 2 is longer than intervalSeconds (1)"),
        "{p}"
    );
    // A UDP probe of a TCP-only device needs its port.
    d.spec.ports.retain(|p| p.protocol == Protocol::Tcp);
    d.spec.health = Some(DeviceHealth {
        type_: Some(ProbeType::Udp),
        payload: Some("x".into()),
        ..Default::default()
    });
    assert!(problems(device(&d)).contains("probe type udp and the Device has no UDP port"));
    d.spec.health.as_mut().unwrap().port = Some(5000);
    assert_eq!(device(&d), Ok(()));
    // Modbus takes its keys; defaults need nothing.
    d.spec.health = Some(DeviceHealth {
        type_: Some(ProbeType::Modbus),
        unit_id: Some(3),
        register: Some(40),
        ..Default::default()
    });
    assert_eq!(device(&d), Ok(()));
}

#[test]
fn max_connections_is_split_between_the_nodes_and_each_needs_a_place() {
    let mut d = crate::fixtures::device();
    d.spec.ports[0].max_connections = Some(1);
    assert_eq!(connections_split(&d, 1), Ok(()));
    let p = problems(connections_split(&d, 2));
    assert!(
        p.contains("spec.ports[0].maxConnections: 1 is below the Device's 2 nodes"),
        "{p}"
    );
    d.spec.ports[0].max_connections = Some(5);
    assert_eq!(connections_split(&d, 2), Ok(()));
    assert_eq!(crate::render::share(5, 2), 2, "never more than the total");
    assert_eq!(crate::render::share(64, 1), 64);
}

#[test]
fn allowed_clients_the_api_server_would_refuse_are_named() {
    let mut d = crate::fixtures::device();
    d.spec.access = Some(
        serde_norway::from_str(
            "{allowedClients: [{podSelector: {matchLabels: {app: ci}}}, {}, {namespaceSelector: {matchExpressions: [{key: team, operator: Gt, values: ['1']}]}}]}",
        )
        .unwrap(),
    );
    let p = problems(device(&d));
    assert!(
        p.contains("spec.access.allowedClients[1]: give namespaceSelector, podSelector or both"),
        "{p}"
    );
    assert!(
        p.contains(
            "spec.access.allowedClients[2].namespaceSelector.matchExpressions[0]: operator \"Gt\""
        ),
        "{p}"
    );
    assert!(!p.contains("allowedClients[0]"), "{p}");
}
