//! Pods that name the Devices they need (`edgelink.io/requires-devices`):
//! their condition `edgelink.io/device-reachable` follows those Devices'
//! `DeviceReachable` (`edgelink_operator::requires` decides).
//!
//! Pods are watched cluster-wide as metadata only (the annotation is all
//! that is read), Devices whole. Any change of either looks at every
//! annotated pod again (in memory: a decision is a few map lookups) and
//! writes the condition of those whose value changed. No admission
//! webhook adds the readiness gate: the pod's author writes it next to the
//! annotation (docs/operator.md), so no pod creation in the cluster ever
//! waits on, or fails with, the operator.

use crate::run::metrics::Metrics;
use edgelink_operator::crd::Device;
use edgelink_operator::render::{READINESS_GATE, REQUIRES_DEVICES_ANNOTATION};
use edgelink_operator::report::Verdict;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{reflector::reflector, watcher, WatchStreamExt};
use kube::ResourceExt;
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// What was last written, per pod UID: status and reason.
type Written = HashMap<String, (&'static str, &'static str)>;

/// Write each annotated pod's condition where it changed.
async fn sync(
    client: &kube::Client,
    pods: &Store<PartialObjectMeta<Pod>>,
    devices: &Store<Device>,
    written: &mut Written,
    metrics: &Metrics,
) {
    let by_name: HashMap<(String, String), Arc<Device>> = devices
        .state()
        .into_iter()
        .map(|d| ((d.namespace().unwrap_or_default(), d.name_any()), d))
        .collect();
    let mut seen = HashSet::new();
    for p in pods.state() {
        let Some(wanted) = p.annotations().get(REQUIRES_DEVICES_ANNOTATION) else {
            continue;
        };
        let (ns, name) = (p.namespace().unwrap_or_default(), p.name_any());
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let v = edgelink_operator::requires::gate(wanted, &ns, |dns, dname| {
            by_name
                .get(&(dns.to_string(), dname.to_string()))
                .map(|d| d.as_ref())
        });
        let key = p.uid().unwrap_or_default();
        seen.insert(key.clone());
        if written.get(&key) == Some(&(v.status, v.reason)) {
            continue;
        }
        match write(client, &ns, &name, &v).await {
            Ok(()) => {
                metrics.gates_set.inc();
                tracing::info!(pod = %format!("{ns}/{name}"), status = v.status, message = %v.message, "requires-devices");
                written.insert(key, (v.status, v.reason));
            }
            Err(e) => {
                tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "requires-devices: condition not written")
            }
        }
    }
    written.retain(|k, _| seen.contains(k));
}

async fn write(client: &kube::Client, ns: &str, name: &str, v: &Verdict) -> kube::Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let c = json!({
        "type": READINESS_GATE,
        "status": v.status,
        "reason": v.reason,
        "message": v.message,
        "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
    });
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Strategic(json!({"status": {"conditions": [c]}})),
    )
    .await
    .map(|_| ())
}

/// Watch and write until the process ends.
pub async fn run(client: kube::Client, metrics: Arc<Metrics>) {
    let (pod_store, pod_writer) = reflector::store();
    let (dev_store, dev_writer) = reflector::store();
    let pod_events = reflector(
        pod_writer,
        watcher(
            Api::<PartialObjectMeta<Pod>>::all(client.clone()),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .map(|e| e.map(|_| ()));
    let dev_events = reflector(
        dev_writer,
        watcher(
            Api::<Device>::all(client.clone()),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .map(|e| e.map(|_| ()));
    let mut events = std::pin::pin!(futures_util::stream::select(pod_events, dev_events));
    let mut written = Written::new();
    while let Some(e) = events.next().await {
        if let Err(e) = e {
            tracing::debug!(error = %e, "requires-devices watch");
            continue;
        }
        // Let a burst of events settle into one look.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        while let Some(Some(_)) = futures_util::FutureExt::now_or_never(events.next()) {}
        sync(&client, &pod_store, &dev_store, &mut written, &metrics).await;
    }
}
