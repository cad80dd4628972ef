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
