//! Step 3 of a Device's reconcile (`run::controller`): for each of its
//! nodes, gather what is known (the node's report, whether its edgelinkd
//! is still heard, the proxy pod), decide (`edgelink_operator::nodes`),
//! and act: set the proxy pod's readiness gate `edgelink.io/device-reachable`,
//! mark a lost node's pod not Ready, publish an Event on the Device when a
//! node's reachability changes, and keep the metrics.
//!
//! Why the pod's conditions and not EndpointSlices of our own: the
//! Service stays a plain selector Service that every tool understands,
//! and the EndpointSlice controller keeps its job (terminating endpoints,
//! topology hints); the gate is what the kubelet folds into Ready while it
//! lives, and a lost node's pod gets Ready False from the operator as the
//! node lifecycle controller would give it, ~40 s later.

use crate::run::caches;
use crate::run::context::{kube_err, Ctx, Error};
use crate::run::metrics::{DeviceNode, Transition};
use edgelink_operator::crd::{Device, DeviceStatus};
use edgelink_operator::nodes::{self, NodeDecision, NodeFacts, PodFacts};
use edgelink_operator::render::{self, DEVICE_LABEL, READINESS_GATE};
use edgelink_operator::report::Verdict;
use edgelink_operator::reverse::Resolved;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde_json::json;
use std::time::SystemTime;

/// The segment address Multus recorded for net1, when no report says it.
fn net1_from_annotation(pod: &Pod) -> Option<String> {
    let s = pod.annotations().get("k8s.v1.cni.cncf.io/network-status")?;
    let v: serde_json::Value = serde_json::from_str(s).ok()?;
    v.as_array()?
        .iter()
        .find(|n| n["interface"] == render::SEGMENT_IFNAME)?["ips"][0]
        .as_str()
        .map(str::to_string)
}

fn condition<'a>(
    pod: &'a Pod,
    type_: &str,
) -> Option<&'a k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

pub fn facts_of(pod: &Pod) -> PodFacts {
    PodFacts {
        ready: condition(pod, "Ready").is_some_and(|c| c.status == "True"),
        gate: condition(pod, READINESS_GATE).map(|c| c.status.clone()),
        segment_address: net1_from_annotation(pod),
    }
}

/// The proxy pod `name`, if it is the Device's (from the cache of the
/// operator's pods, once it has listed).
async fn proxy_pod(
    ctx: &Ctx,
    pods: &Api<Pod>,
    ns: &str,
    name: &str,
    device: &str,
) -> Result<Option<Pod>, Error> {
    Ok(caches::get(&ctx.caches.pods, pods, "pod", ns, name)
        .await?
        .filter(|p| p.labels().get(DEVICE_LABEL).map(String::as_str) == Some(device))
        .map(|p| (*p).clone()))
}

/// A pod condition as a strategic-merge patch of the pod's status sets it.
fn pod_condition(type_: &str, v: &Verdict) -> serde_json::Value {
    condition_json(type_, v.status, v.reason, &v.message)
}

fn condition_json(type_: &str, status: &str, reason: &str, message: &str) -> serde_json::Value {
    json!({
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
    })
}

/// Write the gate (and Ready, for a lost node) where it differs.
async fn apply(ctx: &Ctx, pods: &Api<Pod>, pod: &Pod, dec: &NodeDecision) -> Result<(), Error> {
    let name = pod.name_any();
    let mut conditions = Vec::new();
    if let Some(g) = &dec.gate {
        let now = condition(pod, READINESS_GATE);
        if now.is_none_or(|c| c.status != g.status || c.reason.as_deref() != Some(g.reason)) {
            conditions.push(pod_condition(READINESS_GATE, g));
            ctx.metrics.gates_set.inc();
        }
    }
    let ready_now = condition(pod, "Ready").is_some_and(|c| c.status == "True");
    if let (true, true, Some(g)) = (dec.mark_not_ready, ready_now, &dec.gate) {
        // EdgelinkNodeLost, EdgelinkUnreachable, ...: the kubelet (when
        // alive) writes its own Ready later, False too while the gate is.
        let reason = format!("Edgelink{}", g.reason);
        conditions.push(condition_json("Ready", "False", &reason, &g.message));
        ctx.metrics.marked_not_ready.inc();
        tracing::warn!(pod = %name, node = %dec.status.node, reason, "proxy pod marked not Ready");
    }
    if conditions.is_empty() {
        return Ok(());
    }
    pods.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Strategic(json!({"status": {"conditions": conditions}})),
    )
    .await
    .map_err(kube_err(format!("set the readiness gate of pod {name}")))?;
    Ok(())
}

/// Each node's decision, acted upon. `proxies`: (node, StatefulSet) as
/// made; `old`: the Device's status before.
pub async fn observe(
    ctx: &Ctx,
    d: &Device,
    proxies: &[(String, String)],
    resolved: &[Resolved],
    old: &DeviceStatus,
) -> Result<Vec<NodeDecision>, Error> {
    let device = d.name_any();
    let ns = d.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let fresh = ctx.started.elapsed() < ctx.fresh_for;
    // First what each node is: its pod, whether it is heard.
    let mut facts = Vec::new();
    for (node, sts) in proxies {
        let pod_name = render::pod_name(sts);
        ctx.reports.register(&ns, &pod_name, &device);
        let pod = proxy_pod(ctx, &pods, &ns, &pod_name, &device).await?;
        let heard = ctx.reports.heard_state(node);
        facts.push((node, pod_name, pod, heard));
    }
    let serving = |n: &str| {
        facts.iter().any(|(node, _, pod, heard)| {
            node.as_str() != n
                && *heard == nodes::Heard::Alive
                && pod.as_ref().is_some_and(|p| facts_of(p).ready)
        })
    };
    let mut out = Vec::new();
    for (node, pod_name, pod, heard) in &facts {
        let pf = pod.as_ref().map(facts_of);
        let received = ctx.reports.get(node);
        let f = NodeFacts {
            node,
            pod_name,
            pod: pf.as_ref(),
            received: received.as_ref(),
            heard: *heard,
            fresh,
            others_serve: serving(node),
        };
        let before = old.nodes.iter().find(|n| &n.node == *node);
        let dec = nodes::decide(d, resolved, &f, before, SystemTime::now(), ctx.stale_after);
        if let Some(p) = pod {
            apply(ctx, &pods, p, &dec).await?;
        }
        record(ctx, d, before.map(|b| b.reachable.as_str()), &dec).await;
        out.push(dec);
    }
    Ok(out)
}

/// Metrics, and an Event on the Device when the node's reachability changed.
async fn record(ctx: &Ctx, d: &Device, before: Option<&str>, dec: &NodeDecision) {
    let s = &dec.status;
    let key = DeviceNode {
        namespace: d.namespace().unwrap_or_default(),
        device: d.name_any(),
        node: s.node.clone(),
    };
    let v = match s.reachable.as_str() {
        "True" => 1,
        "False" => 0,
        _ => -1,
    };
    ctx.metrics.reachable.get_or_create(&key).set(v);
    if before == Some(s.reachable.as_str()) || (before.is_none() && v == -1) {
        return;
    }
    ctx.metrics
        .transitions
        .get_or_create(&Transition {
            namespace: key.namespace,
            device: key.device,
            node: key.node,
            to: s.reachable.clone(),
        })
        .inc();
    let reason = s.reason.clone().unwrap_or_default();
    let note = match &s.last_error {
        Some(e) => e.clone(),
        None => format!("node {} reaches the device", s.node),
    };
    let ev = Event {
        type_: if v == 1 {
            EventType::Normal
        } else {
            EventType::Warning
        },
        reason: format!("Node{reason}"),
        note: Some(note),
        action: "Probe".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &d.object_ref(&())).await {
        tracing::warn!(device = %d.name_any(), error = %e, "event not published");
    }
}
