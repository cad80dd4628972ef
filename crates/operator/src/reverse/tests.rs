use super::*;
use crate::fixtures::{device, device_with_reverse, network, services};
use crate::render::{cni_config, render, ProxyPodSettings};

fn targets(r: &[Resolved]) -> Vec<Result<&str, &str>> {
    r.iter()
        .map(|x| match &x.target {
            Ok(t) => Ok(t.as_str()),
            Err(u) => Err(u.message.as_str()),
        })
        .collect()
}

fn problems(d: &Device, resolved: &[Resolved]) -> String {
    let mut p = Vec::new();
    check_spec(d, &mut p);
    check_placement(d, &network(), "kedge1", resolved, &mut p);
    p.join("\n")
}

#[test]
fn a_service_is_its_cluster_ip_and_the_port_by_number_or_name() {
    let d = device_with_reverse();
    let r = resolve(&d, &services(), "cluster.local");
    assert_eq!(
        targets(&r),
        [
            Ok("10.96.4.12:1883"),
            // By name, the UDP port of a Service in another namespace: the
            // Service's port, not its targetPort (the ClusterIP's).
            Ok("10.96.7.40:514"),
            Ok("mock.hil.svc.cluster.local:443"),
        ]
    );
    assert_eq!(r[0].service.as_deref(), Some("hil/mqtt"));
    assert_eq!(r[1].service.as_deref(), Some("telemetry/collector"));
    assert_eq!(r[2].service, None);
    assert_eq!(
        service_keys(&d),
        [
            ("hil".to_string(), "mqtt".to_string()),
            ("telemetry".into(), "collector".into())
        ]
    );
    // No port: the Service's only one of the protocol; else say which.
    let mut d = device_with_reverse();
    d.spec.reverse[1].service.as_mut().unwrap().port = None;
    d.spec.reverse[0].service.as_mut().unwrap().port = Some(IntOrString::String("ws".into()));
    let r = resolve(&d, &services(), "cluster.local");
    assert_eq!(
        targets(&r)[..2],
        [Ok("10.96.4.12:8083"), Ok("10.96.7.40:514")]
    );
    d.spec.reverse[0].service.as_mut().unwrap().port = None;
    let r = resolve(&d, &services(), "cluster.local");
    assert_eq!(
        r[0].target.as_ref().unwrap_err().message,
        "reverse mqtt: Service hil/mqtt has 2 TCP ports: give service.port"
    );
}

#[test]
fn a_missing_service_or_port_leaves_the_entry_out_and_says_why() {
    let d = device_with_reverse();
    let mut s = services();
    s.remove(&("hil".to_string(), "mqtt".to_string()));
    let r = resolve(&d, &s, "cluster.local");
    let u = r[0].target.as_ref().unwrap_err();
    assert_eq!(
        (u.reason, u.message.as_str()),
        (
            "ServiceNotFound",
            "reverse mqtt: Service hil/mqtt does not exist"
        )
    );
    let c = cni_config(&d, &network(), &["kedge1".to_string()], &r);
    let names: Vec<_> = c["reverse"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["collector", "mock"]);
    let (st, _) = status(&d, &r, None);
    assert_eq!(
        (st[0].listener.as_str(), st[0].target.as_deref()),
        ("unresolved", None)
    );
    // A port the Service lacks, or of the other protocol.
    let mut d = device_with_reverse();
    d.spec.reverse[0].service.as_mut().unwrap().port = Some(IntOrString::Int(1884));
    d.spec.reverse[1].service.as_mut().unwrap().port = Some(IntOrString::String("http".into()));
    let r = resolve(&d, &services(), "cluster.local");
    assert_eq!(
        targets(&r)[..2],
        [
            Err("reverse mqtt: Service hil/mqtt has no TCP port 1884"),
            Err("reverse collector: Service telemetry/collector has no UDP port named \"http\""),
        ]
    );
    assert_eq!(
        r[0].target.as_ref().unwrap_err().reason,
        "ServicePortNotFound"
    );
}

#[test]
fn a_headless_service_is_its_dns_name_and_an_external_name_its_host() {
    let d = device_with_reverse();
    let mut s = services();
    let mqtt = s.get_mut(&("hil".to_string(), "mqtt".to_string())).unwrap();
    let spec = mqtt.spec.as_mut().unwrap();
    spec.cluster_ip = Some("None".into());
    spec.ports.as_mut().unwrap()[0].target_port = Some(IntOrString::Int(11883));
    let c = s
        .get_mut(&("telemetry".to_string(), "collector".to_string()))
        .unwrap()
        .spec
        .as_mut()
        .unwrap();
    c.type_ = Some("ExternalName".into());
    c.cluster_ip = None;
    c.external_name = Some("syslog.example.net".into());
    let r = resolve(&d, &s, "k8s.lab");
    assert_eq!(
        targets(&r)[..2],
        [
            Ok("mqtt.hil.svc.k8s.lab:11883"),
            Ok("syslog.example.net:514")
        ]
    );
    // A headless Service's named targetPort cannot be known without
    // its pods.
    let mut d2 = d.clone();
    d2.spec.reverse[0].service.as_mut().unwrap().port = Some(IntOrString::String("ws".into()));
    let r = resolve(&d2, &s, "k8s.lab");
    assert!(
        r[0].target
            .as_ref()
            .unwrap_err()
            .message
            .contains("is headless and its port names its targetPort (\"ws\")"),
        "{:?}",
        r[0]
    );
}

#[test]
fn the_nad_gets_the_reverse_list_as_the_plugin_spells_it() {
    let mut d = device_with_reverse();
    d.spec.reverse[0].idle_timeout_ms = Some(0);
    d.spec.reverse[0].max_connections = Some(32);
    d.spec.reverse[0].queue_timeout_ms = Some(1000);
    d.spec.reverse[0].connect_retries = Some(1);
    let resolved = resolve(&d, &services(), "cluster.local");
    let r = render(
        &d,
        &network(),
        &["kedge1".to_string()],
        &ProxyPodSettings::default(),
        &resolved,
    );
    let c: Value = serde_json::from_str(&r.nad.spec.config).unwrap();
    assert_eq!(
        c["reverse"],
        json!([
            {"name": "mqtt", "protocol": "tcp", "port": 1883, "target": "10.96.4.12:1883",
             "allowedSources": ["172.17.16.0/25"], "idleTimeoutMs": 0, "maxConnections": 32,
             "queueTimeoutMs": 1000, "connectRetries": 1},
            {"name": "collector", "protocol": "udp", "port": 9000, "target": "10.96.7.40:514"},
            {"name": "mock", "protocol": "tcp", "port": 8443, "target": "mock.hil.svc.cluster.local:443",
             "connectTimeoutMs": 2000, "proxyProtocol": "v2"}
        ])
    );
    assert!(c.get("allowForeignSources").is_none());
    // The forwards and the allowed targets stay the device's.
    assert_eq!(c["forwards"].as_array().unwrap().len(), 3);
    assert_eq!(c["allowedTargets"], json!(["172.17.16.120/32"]));
    d.spec.allow_foreign_sources = Some(true);
    assert_eq!(
        cni_config(&d, &network(), &["kedge1".to_string()], &resolved)["allowForeignSources"],
        true
    );
    // A Device without reverse entries keeps its config as it was (no
    // key at all), so an upgraded operator replaces no proxy pod.
    let plain = cni_config(&device(), &network(), &["kedge1".to_string()], &[]);
    assert!(plain.get("reverse").is_none() && plain.get("allowForeignSources").is_none());
    // A changed ClusterIP changes the config, and so replaces the pod.
    let mut s = services();
    s.get_mut(&("hil".to_string(), "mqtt".to_string()))
        .unwrap()
        .spec
        .as_mut()
        .unwrap()
        .cluster_ip = Some("10.96.4.99".into());
    let moved = render(
        &d,
        &network(),
        &["kedge1".to_string()],
        &ProxyPodSettings::default(),
        &resolve(&d, &s, "cluster.local"),
    );
    assert!(moved.nad.spec.config.contains("10.96.4.99:1883"));
    assert_ne!(moved.nad.spec.config, r.nad.spec.config);
}

#[test]
fn the_devices_service_has_no_reverse_port() {
    let d = device_with_reverse();
    let resolved = resolve(&d, &services(), "cluster.local");
    let r = render(
        &d,
        &network(),
        &["kedge1".to_string()],
        &ProxyPodSettings::default(),
        &resolved,
    );
    let ports: Vec<(String, i32)> = r
        .service
        .spec
        .unwrap()
        .ports
        .unwrap()
        .into_iter()
        .map(|p| (p.name.unwrap(), p.port))
        .collect();
    assert_eq!(
        ports,
        [
            ("api".to_string(), 8080),
            ("telemetry".into(), 5000),
            ("http".into(), 80)
        ]
    );
    assert_eq!(crate::render::port_list(&d), "8080/tcp,5000/udp,80/tcp");
}

#[test]
fn the_example_is_valid() {
    let d = device_with_reverse();
    assert_eq!(crate::validate::device(&d), Ok(()));
    let resolved = resolve(&d, &services(), "cluster.local");
    assert_eq!(
        crate::validate::reverse_placement(&d, &network(), "kedge1", &resolved),
        Ok(())
    );
}

#[test]
fn a_port_or_name_taken_by_a_forward_or_another_reverse_entry_is_named_with_both() {
    let mut d = device_with_reverse();
    d.spec.reverse[0].port = 8080; // api's, tcp
    d.spec.reverse[2].port = 8080; // and mqtt's now
    d.spec.reverse[1].name = "telemetry".into();
    d.spec.reverse[2].name = "mqtt".into();
    let p = crate::validate::device(&d).unwrap_err().to_string();
    for want in [
        "spec.reverse[0] (mqtt): 8080/tcp is used by spec.ports[0] (api)",
        "spec.reverse[2] (mqtt): 8080/tcp is used by spec.ports[0] (api)",
        "spec.reverse[2] (mqtt): 8080/tcp is used by spec.reverse[0] (mqtt)",
        "spec.reverse[1].name: \"telemetry\" is used by spec.ports[1]",
        "spec.reverse[2].name: \"mqtt\" is used by spec.reverse[0]",
    ] {
        assert!(p.contains(want), "{want}\n in {p}");
    }
    // The same port number of the other protocol is another listener.
    let mut d = device_with_reverse();
    d.spec.reverse[0].protocol = Protocol::Udp;
    d.spec.reverse[0].port = 8080;
    d.spec.reverse[1].port = 5001;
    assert_eq!(problems(&d, &[]), "");
    d.spec.reverse[1].port = 5000; // telemetry's, udp
    assert!(problems(&d, &[])
        .contains("spec.reverse[1] (collector): 5000/udp is used by spec.ports[1] (telemetry)"));
}

#[test]
fn service_or_target_the_target_form_and_the_tcp_only_keys_are_checked() {
    let mut d = device_with_reverse();
    d.spec.reverse[0].target = Some("10.0.0.1:80".into());
    d.spec.reverse[2].target = Some("fd00::1:80".into());
    d.spec.reverse[1].service = None;
    d.spec.reverse[1].proxy_protocol = Some(crate::crd::ProxyProtocol::V1);
    d.spec.reverse[1].idle_timeout_ms = Some(10);
    d.spec.reverse[1].allowed_sources = vec!["nonsense".into()];
    d.spec.reverse.push(d.spec.reverse[0].clone());
    d.spec.reverse[3].name = "self".into();
    d.spec.reverse[3].port = 1;
    d.spec.reverse[3].target = None;
    d.spec.reverse[3].service.as_mut().unwrap().name = "device01-01".into();
    let p = problems(&d, &[]);
    for want in [
        "spec.reverse[0] (mqtt): give service or target, not both",
        "spec.reverse[1] (collector): service or target is required",
        "spec.reverse[2].target: \"fd00::1:80\" is not IP:port (unicast), [IPv6]:port or dns-name:port",
        "spec.reverse[1].proxyProtocol: is only valid with protocol tcp (collector is udp)",
        "spec.reverse[1].idleTimeoutMs: is only valid with protocol tcp (collector is udp)",
        "spec.reverse[1].idleTimeoutMs: 10 is not 0 (never) or in 1000..604800000",
        "spec.reverse[1].allowedSources[0]: \"nonsense\" is not a CIDR",
        "spec.reverse[3].service (self): names the Device's own Service",
    ] {
        assert!(p.contains(want), "{want}\n in {p}");
    }
    for (t, ok) in [
        ("[fd00::1]:80", Some(("fd00::1", 80))),
        ("10.1.2.3:65535", Some(("10.1.2.3", 65535))),
        ("mqtt.hil.svc:1883", Some(("mqtt.hil.svc", 1883))),
        (
            "_mqtt._tcp.hil.svc.cluster.local.:1883",
            Some(("_mqtt._tcp.hil.svc.cluster.local.", 1883)),
        ),
        ("mqtt:0", None),
        ("300.1.2.3:80", None),
        ("0.0.0.0:80", None),
        ("224.0.0.1:80", None),
        ("fd00::1:80", None),
        ("mqtt:65536", None),
        ("-bad:80", None),
        (":80", None),
        ("[nope]:80", None),
    ] {
        assert_eq!(parse_target(t), ok.map(|(h, p)| (h.to_string(), p)), "{t}");
    }
}

#[test]
fn a_target_inside_the_segment_is_a_loop() {
    let mut d = device_with_reverse();
    d.spec.reverse[2].target = Some("172.17.16.9:443".into());
    let mut s = services();
    s.get_mut(&("hil".to_string(), "mqtt".to_string()))
        .unwrap()
        .spec
        .as_mut()
        .unwrap()
        .cluster_ip = Some("172.17.16.50".into());
    let resolved = resolve(&d, &s, "cluster.local");
    let p = crate::validate::reverse_placement(&d, &network(), "kedge1", &resolved)
        .unwrap_err()
        .to_string();
    for want in [
        "spec.reverse[0] (mqtt): target 172.17.16.50:1883 (Service hil/mqtt) is inside the segment 172.17.16.0/24",
        "spec.reverse[2] (mock): target 172.17.16.9:443 is inside the segment 172.17.16.0/24",
        "(a loop)",
    ] {
        assert!(p.contains(want), "{want}\n in {p}");
    }
}

#[test]
fn allowed_sources_outside_the_segment_need_allow_foreign_sources() {
    let mut d = device_with_reverse();
    d.spec.reverse[0].allowed_sources = vec![
        "172.17.16.64/26".into(),
        "172.17.0.0/16".into(),
        "10.20.0.0/24".into(),
        "fd00::/64".into(),
    ];
    let resolved = resolve(&d, &services(), "cluster.local");
    let p = problems(&d, &resolved);
    for want in [
        "spec.reverse[0].allowedSources[1] (mqtt): 172.17.0.0/16 is outside the segment's subnets [172.17.16.0/24] on node kedge1: set spec.allowForeignSources to allow it",
        "spec.reverse[0].allowedSources[2] (mqtt): 10.20.0.0/24 is outside",
        "spec.reverse[0].allowedSources[3] (mqtt): fd00::/64 is outside",
    ] {
        assert!(p.contains(want), "{want}\n in {p}");
    }
    assert!(!p.contains("allowedSources[0]"), "{p}");
    d.spec.allow_foreign_sources = Some(true);
    assert_eq!(problems(&d, &resolved), "");
}

#[test]
fn status_comes_from_the_reverse_forwards_of_the_report() {
    let d = device_with_reverse();
    let resolved = resolve(&d, &services(), "cluster.local");
    let a: ReportAttachment = serde_json::from_value(json!({
        "containerId": "c1", "ifname": "net1", "podNamespace": "hil", "podName": "device01-01-0",
        "state": "serving", "interface": {"name": "net1", "ips": ["172.17.16.200/24"]},
        "forwards": [
            {"name": "api", "protocol": "tcp", "port": 8080, "listener": "listening"},
            {"name": "mqtt", "direction": "reverse", "protocol": "tcp", "port": 1883,
             "target": "10.96.4.12:1883", "listener": "listening", "activeConnections": 2,
             "totalConnections": 9, "bytesToTarget": 300, "bytesToClient": 40},
            {"name": "collector", "direction": "reverse", "protocol": "udp", "port": 9000,
             "listener": "failed", "udpSessionsTotal": 4, "lastError": "address in use"},
            {"name": "mock", "direction": "reverse", "protocol": "tcp", "port": 8443,
             "target": "mock.hil.svc.cluster.local:443", "listener": "listening",
             "resolved": {"address": "10.96.9.9:443", "answeredAs": "mock.hil.svc.cluster.local.",
                          "error": "last lookup: timed out", "lookups": 3}}
        ]
    }))
    .unwrap();
    let (st, not_listening) = status(&d, &resolved, Some(&a));
    let mqtt = &st[0];
    assert_eq!(
        (
            mqtt.target.as_deref(),
            mqtt.service.as_deref(),
            mqtt.listening,
            mqtt.active_connections,
            mqtt.total_connections,
            mqtt.bytes_to_target,
            mqtt.bytes_from_target
        ),
        (
            Some("10.96.4.12:1883"),
            Some("hil/mqtt"),
            true,
            2,
            9,
            300,
            40
        )
    );
    assert_eq!(
        (
            st[1].listener.as_str(),
            st[1].total_connections,
            st[1].last_error.as_deref()
        ),
        ("failed", 4, Some("address in use"))
    );
    assert_eq!(
        (
            st[2].listening,
            st[2].resolved_address.as_deref(),
            st[2].resolve_error.as_deref()
        ),
        (true, Some("10.96.9.9:443"), Some("last lookup: timed out"))
    );
    assert_eq!(mqtt.resolved_address, None);
    assert_eq!(not_listening, ["collector (reverse, failed)"]);
    // An entry the pod does not serve yet (a pod made before it was added).
    let mut a2 = a.clone();
    a2.forwards.retain(|f| f.name != "mock");
    let (st, not_listening) = status(&d, &resolved, Some(&a2));
    assert_eq!(st[2].listener, "absent");
    assert_eq!(
        not_listening,
        [
            "collector (reverse, failed)",
            "mock (reverse, not in the proxy pod's forwards yet)"
        ]
    );
    // A forward port is never taken for a reverse entry of its name.
    let mut d2 = device_with_reverse();
    d2.spec.reverse[2].name = "api".into();
    let (st, _) = status(&d2, &resolve(&d2, &services(), "cluster.local"), Some(&a));
    assert_eq!(st[2].listener, "absent");
    // And the health of the ports is unchanged by reverse forwards: the
    // Ready condition's list names them too.
    let now = std::time::SystemTime::now();
    let report = crate::report::Received {
        report: crate::report::NodeReport {
            node: "kedge1".into(),
            attachments: vec![a],
            ..Default::default()
        },
        at: now,
    };
    let h = crate::report::health(
        &d,
        &resolved,
        "kedge1",
        "device01-01-0",
        Some(&report),
        now,
        std::time::Duration::from_secs(35),
    );
    assert_eq!(h.reverse.len(), 3);
    assert!(
        matches!(&h.listening, Some(Err(m)) if m.contains("collector (reverse, failed)")),
        "{:?}",
        h.listening
    );
}

#[test]
fn the_reverse_resolved_condition_names_each_entry_left_out() {
    let d = device_with_reverse();
    let v = verdict(&resolve(&d, &services(), "cluster.local"));
    assert_eq!((v.status, v.reason), ("True", "Resolved"));
    assert!(
        v.message.contains("mqtt -> 10.96.4.12:1883, collector -> 10.96.7.40:514, mock -> mock.hil.svc.cluster.local:443"),
        "{}",
        v.message
    );
    let mut d = device_with_reverse();
    d.spec.reverse[0].service.as_mut().unwrap().port = Some(IntOrString::Int(1));
    let mut s = services();
    s.remove(&("telemetry".to_string(), "collector".to_string()));
    let v = verdict(&resolve(&d, &s, "cluster.local"));
    assert_eq!((v.status, v.reason), ("False", "ServiceNotFound"));
    assert_eq!(
        v.message,
        "reverse mqtt: Service hil/mqtt has no TCP port 1; \
         reverse collector: Service telemetry/collector does not exist; \
         left out of the proxy's config until resolved"
    );
    let v = verdict(&resolve(&d, &services(), "cluster.local"));
    assert_eq!((v.status, v.reason), ("False", "ServicePortNotFound"));
}
