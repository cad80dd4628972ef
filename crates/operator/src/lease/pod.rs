//! The pod annotation `edgelink.io/lease: <device>` (or
//! `<namespace>/<device>`): the DeviceLease the operator makes for such
//! a pod while it has not finished, in the pod's namespace, named after
//! it, holder the pod, `wait: true`, owned by the pod (garbage-collected
//! with it).

use crate::crd::{DeviceLease, DeviceLeaseSpec, LeaseHolder};
use crate::render::MANAGER;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;
use kube::ResourceExt;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

pub const LEASE_ANNOTATION: &str = "edgelink.io/lease";

/// The lease's name for pod `pod`: `<pod>-lease`, or, past 253
/// characters, the pod's name cut, a hash of it, and `-lease`.
pub fn lease_name(pod: &str) -> String {
    let name = format!("{pod}-lease");
    if name.len() <= 253 {
        return name;
    }
    let hash: String = Sha256::digest(pod.as_bytes())
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect();
    let keep = 253 - "-lease".len() - hash.len() - 1;
    let cut = pod[..keep].trim_end_matches(['-', '.']);
    format!("{cut}-{hash}-lease")
}

fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The DeviceLease pod `p` asks for by its annotation: None without it;
/// Err naming why when the annotation is not a Device's name.
pub fn lease_for(p: &Pod) -> Option<Result<DeviceLease, String>> {
    let value = p.annotations().get(LEASE_ANNOTATION)?.trim();
    let (ns, device) = match value.split_once('/') {
        Some((ns, d)) => (Some(ns), d),
        None => (None, value),
    };
    if !dns_label(device) || ns.is_some_and(|n| !dns_label(n)) {
        return Some(Err(format!(
            "annotation {LEASE_ANNOTATION}: {value:?} is not <device> or <namespace>/<device>"
        )));
    }
    let pod = p.name_any();
    let meta = ObjectMeta {
        name: Some(lease_name(&pod)),
        namespace: p.namespace(),
        labels: Some(BTreeMap::from([(
            "app.kubernetes.io/managed-by".to_string(),
            MANAGER.to_string(),
        )])),
        owner_references: Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: pod.clone(),
            uid: p.uid().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: None,
        }]),
        ..Default::default()
    };
    let spec = DeviceLeaseSpec {
        device: device.to_string(),
        device_namespace: ns.map(str::to_string),
        holder: LeaseHolder {
            pod: Some(pod),
            ..Default::default()
        },
        duration_seconds: None,
        wait: true,
    };
    Some(Ok(DeviceLease {
        metadata: meta,
        spec,
        status: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::pod;

    fn annotated(value: &str) -> Pod {
        let mut p = pod("ci", "runner-1", &[], "10.0.1.1", "kedge2");
        p.metadata.annotations = Some(BTreeMap::from([(LEASE_ANNOTATION.into(), value.into())]));
        p
    }

    #[test]
    fn an_annotated_pod_asks_for_a_lease_it_owns_and_waits_on() {
        assert!(lease_for(&pod("ci", "x", &[], "10.0.1.1", "k")).is_none());
        let l = lease_for(&annotated("hil/device01-01")).unwrap().unwrap();
        assert_eq!(l.metadata.name.as_deref(), Some("runner-1-lease"));
        assert_eq!(l.metadata.namespace.as_deref(), Some("ci"));
        let o = &l.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (o.kind.as_str(), o.name.as_str(), o.uid.as_str()),
            ("Pod", "runner-1", "uid-runner-1")
        );
        assert_eq!(l.spec.device, "device01-01");
        assert_eq!(l.spec.device_namespace.as_deref(), Some("hil"));
        assert_eq!(l.spec.holder.pod.as_deref(), Some("runner-1"));
        assert!(l.spec.wait);
        let l = lease_for(&annotated("device01-01")).unwrap().unwrap();
        assert_eq!(l.spec.device_namespace, None, "the pod's namespace");
        assert!(lease_for(&annotated("a/b/c")).unwrap().is_err());
        assert!(lease_for(&annotated("Device01")).unwrap().is_err());
    }

    #[test]
    fn a_long_pods_lease_name_fits_and_stays_apart() {
        let long = "p".repeat(250);
        let a = lease_name(&long);
        assert_eq!(a.len(), 253);
        assert!(a.ends_with("-lease"));
        assert_ne!(a, lease_name(&format!("{}q", "p".repeat(249))));
        assert_eq!(lease_name("short"), "short-lease");
    }
}
