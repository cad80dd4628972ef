//! Test fixtures: the examples of cni-conf/, as the user applies them.

use crate::crd::{Device, EdgeNetwork};

pub fn device() -> Device {
    let mut d: Device = serde_norway::from_str(include_str!("../../../cni-conf/device01-01.yaml"))
        .expect("device01-01.yaml");
    d.metadata.uid = Some("5f1c-uid".into());
    d
}

pub fn network() -> EdgeNetwork {
    serde_norway::from_str(include_str!(
        "../../../cni-conf/edgenetwork-plant-floor.yaml"
    ))
    .expect("edgenetwork-plant-floor.yaml")
}

/// device01-01 calling the cluster: an MQTT broker by Service (port by
/// number), a collector by Service port name in another namespace, and a
/// mock server by `host:port`.
pub fn device_with_reverse() -> Device {
    let mut d = device();
    d.spec.reverse = serde_norway::from_str(
        r#"
- {name: mqtt, port: 1883, service: {name: mqtt, port: 1883}, allowedSources: [172.17.16.0/25]}
- {name: collector, protocol: udp, port: 9000, service: {name: collector, namespace: telemetry, port: syslog}}
- {name: mock, port: 8443, target: "mock.hil.svc.cluster.local:443", connectTimeoutMs: 2000, proxyProtocol: v2}
"#,
    )
    .expect("reverse entries");
    d
}

/// The Services device_with_reverse() names, as the apiserver returns them.
pub fn services() -> crate::reverse::Services {
    let svc = |y: &str| -> k8s_openapi::api::core::v1::Service {
        serde_norway::from_str(y).expect("a Service")
    };
    let mqtt = svc(r#"
metadata: {name: mqtt, namespace: hil}
spec:
  clusterIP: 10.96.4.12
  ports:
    - {name: mqtt, protocol: TCP, port: 1883, targetPort: 1883}
    - {name: ws, protocol: TCP, port: 8083, targetPort: ws}
"#);
    let collector = svc(r#"
metadata: {name: collector, namespace: telemetry}
spec:
  clusterIP: 10.96.7.40
  ports:
    - {name: http, protocol: TCP, port: 8080}
    - {name: syslog, protocol: UDP, port: 514, targetPort: 5514}
"#);
    crate::reverse::Services::from([
        (("hil".into(), "mqtt".into()), mqtt),
        (("telemetry".into(), "collector".into()), collector),
    ])
}

/// A running pod with `labels`, one address, on `node`.
pub fn pod(
    ns: &str,
    name: &str,
    labels: &[(&str, &str)],
    ip: &str,
    node: &str,
) -> k8s_openapi::api::core::v1::Pod {
    let labels: std::collections::BTreeMap<&str, &str> = labels.iter().copied().collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": ns, "labels": labels, "uid": format!("uid-{name}")},
        "spec": {"nodeName": node, "containers": []},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}
    }))
    .expect("a pod")
}

/// `p` in phase `phase`.
pub fn phase(
    mut p: k8s_openapi::api::core::v1::Pod,
    phase: &str,
) -> k8s_openapi::api::core::v1::Pod {
    if let Some(s) = p.status.as_mut() {
        s.phase = Some(phase.into());
    }
    p
}

/// The proxy pod of device01-01 on kedge1 (as render makes it).
pub fn proxy_pod() -> k8s_openapi::api::core::v1::Pod {
    pod(
        "hil",
        "device01-01-0",
        &[
            ("app.kubernetes.io/managed-by", "edgelink-operator"),
            ("edgelink.io/device", "device01-01"),
            ("edgelink.io/proxy", "device01-01"),
        ],
        "10.244.1.9",
        "kedge1",
    )
}

/// A DeviceLease created at second `created` of 2026-01-01.
pub fn lease(ns: &str, name: &str, created: i64, spec: &str) -> crate::crd::DeviceLease {
    let t = k8s_openapi::jiff::Timestamp::from_second(1_767_225_600 + created).expect("a time");
    let spec: serde_json::Value = serde_norway::from_str(spec).expect("a lease's spec");
    serde_json::from_value(serde_json::json!({
        "apiVersion": "edgelink.io/v1alpha1", "kind": "DeviceLease",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"),
                     "creationTimestamp": t.to_string()},
        "spec": spec
    }))
    .expect("a DeviceLease")
}
