//! The NetworkPolicy of a Device with `spec.access.allowedClients`:
//! defence in depth beside edgelinkd's own check, for clusters whose
//! network enforces NetworkPolicies. In the Device's namespace, of the
//! Device's name, it selects the Device's proxy pods and lets in, on the
//! Device's ports only, the allowedClients peers (the same selectors:
//! the same meaning). It is the only check of the kernel path's ports,
//! whose connections edgelinkd never sees. It covers the pods' cluster
//! interface (eth0): the cluster's network plugin does not see the
//! segment's interface (net1), where the reverse entries listen.

use super::{meta, name_ns, DEVICE_LABEL};
use crate::crd::Device;
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;

/// `d`'s NetworkPolicy; None when it lets every client in.
pub fn network_policy(d: &Device) -> Option<NetworkPolicy> {
    let access = d.spec.access.as_ref().filter(|a| a.restricts())?;
    let (name, _) = name_ns(d);
    let from = access
        .allowed_clients
        .iter()
        .map(|p| NetworkPolicyPeer {
            namespace_selector: p.namespace_selector.clone(),
            pod_selector: p.pod_selector.clone(),
            ip_block: None,
        })
        .collect();
    let ports = d
        .spec
        .ports
        .iter()
        .map(|p| NetworkPolicyPort {
            protocol: Some(p.protocol.service().into()),
            port: Some(IntOrString::Int(p.port as i32)),
            end_port: None,
        })
        .collect();
    let proxies = BTreeMap::from([
        (DEVICE_LABEL.to_string(), name.clone()),
        (
            "app.kubernetes.io/component".to_string(),
            "device-proxy".to_string(),
        ),
    ]);
    Some(NetworkPolicy {
        metadata: meta(d),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(proxies),
                match_expressions: None,
            }),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(from),
                ports: Some(ports),
            }]),
            egress: None,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::device;

    #[test]
    fn a_device_with_allowed_clients_gets_a_policy_of_its_peers_on_its_ports() {
        assert!(network_policy(&device()).is_none(), "open: no policy");
        let mut d = device();
        d.spec.access = Some(serde_norway::from_str("{allowedClients: []}").unwrap());
        assert!(network_policy(&d).is_none(), "empty: open");
        d.spec.access = Some(
            serde_norway::from_str(
                "{allowedClients: [{podSelector: {matchLabels: {app: ci}}}, {namespaceSelector: {matchLabels: {team: ci}}, podSelector: {}}]}",
            )
            .unwrap(),
        );
        let p = serde_json::to_value(network_policy(&d).unwrap()).unwrap();
        assert_eq!(p["metadata"]["name"], "device01-01");
        assert_eq!(p["metadata"]["namespace"], "hil");
        assert_eq!(p["metadata"]["ownerReferences"][0]["kind"], "Device");
        assert_eq!(p["metadata"]["ownerReferences"][0]["uid"], "5f1c-uid");
        assert_eq!(
            p["spec"]["podSelector"]["matchLabels"],
            serde_json::json!({"edgelink.io/device": "device01-01", "app.kubernetes.io/component": "device-proxy"})
        );
        assert_eq!(p["spec"]["policyTypes"], serde_json::json!(["Ingress"]));
        let rule = &p["spec"]["ingress"][0];
        assert_eq!(
            rule["from"],
            serde_json::json!([
                {"podSelector": {"matchLabels": {"app": "ci"}}},
                {"namespaceSelector": {"matchLabels": {"team": "ci"}}, "podSelector": {}}
            ])
        );
        assert_eq!(
            rule["ports"],
            serde_json::json!([
                {"protocol": "TCP", "port": 8080},
                {"protocol": "UDP", "port": 5000},
                {"protocol": "TCP", "port": 80}
            ])
        );
        assert!(p["spec"].get("egress").is_none());
    }
}
