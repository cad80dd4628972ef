//! The Device controller. For each Device:
//!
//! 1. check it (`validate`) and find its EdgeNetwork, its node and the
//!    Services its reverse entries name (steps 1 and 2: `run::make`);
//! 2. apply its NetworkAttachmentDefinition, StatefulSet and Service
//!    (server-side apply, field manager `edgelink-operator`, owner
//!    reference to the Device), unless an object of that name exists that
//!    this Device does not own: then nothing is applied and the conflict
//!    is reported;
//! 3. write its status: conditions `Reconciled`, `Ready`,
//!    `DeviceReachable` (and `ReverseResolved` when it has reverse
//!    entries), the proxy pod, its node and segment address, and per port
//!    and reverse entry what the node's edgelinkd last reported.
//!
//! Deleting a Device deletes its objects through their owner references
//! (the garbage collector). Every Device is reconciled again each
//! `--resync`, on any change of it or its objects, of its proxy pod, of
//! its EdgeNetwork, of a Service its reverse entries name, and when its
//! node's report changes its proxy's states.

use crate::run::context::{kube_err, Ctx, Error};
use crate::run::make::{make, Made};
use crate::run::metrics::{Outcome, Reason};
use edgelink_operator::crd::{Device, DeviceStatus, EdgeNetwork, NetworkAttachmentDefinition};
use edgelink_operator::render::{self, DEVICE_LABEL, MANAGER};
use edgelink_operator::report::{self, Verdict};
use edgelink_operator::reverse::Resolved;
use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

fn cond(type_: &str, v: &Verdict, generation: Option<i64>, old: &[Condition]) -> Condition {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    // The transition time stays while the status does.
    let since = old
        .iter()
        .find(|c| c.type_ == type_ && c.status == v.status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(now);
    Condition {
        type_: type_.into(),
        status: v.status.into(),
        reason: v.reason.into(),
        message: v.message.clone(),
        observed_generation: generation,
        last_transition_time: since,
    }
}

fn verdict(status: &'static str, reason: &'static str, message: impl Into<String>) -> Verdict {
    Verdict {
        status,
        reason,
        message: message.into(),
    }
}

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

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub async fn reconcile(d: Arc<Device>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let t0 = Instant::now();
    let r = reconcile_inner(&d, &ctx).await;
    ctx.metrics.duration.observe(t0.elapsed().as_secs_f64());
    match &r {
        Ok((_, outcome)) => {
            ctx.metrics
                .reconciles
                .get_or_create(&Outcome {
                    outcome: outcome.to_string(),
                })
                .inc();
        }
        Err(e) => {
            ctx.metrics
                .reconciles
                .get_or_create(&Outcome {
                    outcome: "error".into(),
                })
                .inc();
            let reason = match e {
                Error::Kube {
                    source: kube::Error::Api(s),
                    ..
                } => s.reason.clone(),
                Error::Kube { .. } => "Client".into(),
            };
            ctx.metrics.errors.get_or_create(&Reason { reason }).inc();
        }
    }
    r.map(|(a, _)| a)
}

async fn reconcile_inner(d: &Device, ctx: &Ctx) -> Result<(Action, &'static str), Error> {
    if d.metadata.deletion_timestamp.is_some() {
        // The garbage collector deletes what it owns.
        return Ok((Action::await_change(), "deleting"));
    }
    let name = d.name_any();
    let ns = d.namespace().unwrap_or_default();
    let gen = d.metadata.generation;
    let old = d.status.clone().unwrap_or_default();
    let mut status = DeviceStatus {
        observed_generation: gen,
        port_list: Some(render::port_list(d)),
        ..Default::default()
    };
    let made = make(ctx, d).await?;
    let (reconciled, outcome, node) = match &made {
        Ok(Made { node, .. }) => (
            verdict(
                "True",
                "Applied",
                format!("NetworkAttachmentDefinition, StatefulSet and Service {ns}/{name} applied for node {node}"),
            ),
            "ok",
            Some(node.clone()),
        ),
        Err(na) => (verdict("False", na.reason, na.message.clone()), na.outcome, None),
    };
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let pod_name = render::pod_name(&name);
    // Our pod only: a pod of that name that is not the StatefulSet's is not
    // the proxy.
    let pod = pods
        .get_opt(&pod_name)
        .await
        .map_err(kube_err(format!("get pod {ns}/{pod_name}")))?
        .filter(|p| p.labels().get(DEVICE_LABEL) == Some(&name));
    let pod_node = pod
        .as_ref()
        .and_then(|p| p.spec.as_ref()?.node_name.clone());
    status.node = pod_node.clone().or(node.clone());
    status.pod = pod.as_ref().map(|_| pod_name.clone());
    status.segment_address = pod.as_ref().and_then(net1_from_annotation);
    let report_node = pod_node.or(node);
    let resolved: &[Resolved] = match &made {
        Ok(m) => &m.reverse,
        Err(_) => &[],
    };
    let health = report_node.as_deref().map(|n| {
        report::health(
            d,
            resolved,
            n,
            &pod_name,
            ctx.reports.get(n).as_ref(),
            SystemTime::now(),
            ctx.stale_after,
        )
    });
    let reachable = match (&made, &health) {
        (Err(_), _) => verdict(
            "Unknown",
            "NotApplied",
            "the Device's objects are not applied (see Reconciled)",
        ),
        (_, Some(h)) => h.reachable.clone(),
        (_, None) => verdict("Unknown", "NoNode", "no node yet"),
    };
    let reachable = report::carry_previous(
        reachable,
        &old.conditions,
        ctx.started.elapsed() < ctx.stale_after,
    );
    let ready = match (&made, &pod, &health) {
        (Err(_), _, _) => verdict(
            "False",
            "NotApplied",
            "the Device's objects are not applied (see Reconciled)",
        ),
        (_, None, _) => verdict(
            "False",
            "NoProxyPod",
            format!("pod {ns}/{pod_name} does not exist yet"),
        ),
        (_, Some(p), _) if !pod_ready(p) => verdict(
            "False",
            "ProxyNotReady",
            format!(
                "pod {ns}/{pod_name} is not ready ({})",
                p.status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_else(|| "Unknown".into())
            ),
        ),
        (_, Some(_), Some(h)) => match &h.listening {
            Some(Err(which)) => verdict(
                "False",
                "NotListening",
                format!("edgelinkd does not listen on {which}"),
            ),
            Some(Ok(())) => verdict(
                "True",
                "Serving",
                format!("pod {ns}/{pod_name} is ready and every port listens"),
            ),
            None => verdict(
                "True",
                "ProxyReady",
                format!(
                    "pod {ns}/{pod_name} is ready (no report from edgelinkd: {})",
                    h.reachable.message
                ),
            ),
        },
        (_, Some(_), None) => verdict(
            "True",
            "ProxyReady",
            format!("pod {ns}/{pod_name} is ready"),
        ),
    };
    if made.is_ok() {
        status.reverse = edgelink_operator::reverse::status(d, resolved, None).0;
    }
    if let Some(h) = health.filter(|h| h.listening.is_some()) {
        status.ports = h.ports;
        status.reverse = h.reverse;
        if h.segment_address.is_some() {
            status.segment_address = h.segment_address;
        }
        status.reported_at = h.reported_at.and_then(|t| {
            let secs = t.duration_since(SystemTime::UNIX_EPOCH).ok()?.as_secs() as i64;
            Some(
                k8s_openapi::jiff::Timestamp::from_second(secs)
                    .ok()?
                    .to_string(),
            )
        });
    }
    status.conditions = vec![
        cond("Reconciled", &reconciled, gen, &old.conditions),
        cond("Ready", &ready, gen, &old.conditions),
        cond("DeviceReachable", &reachable, gen, &old.conditions),
    ];
    if !d.spec.reverse.is_empty() {
        let v = match &made {
            Ok(m) => edgelink_operator::reverse::verdict(&m.reverse),
            Err(_) => verdict(
                "Unknown",
                "NotApplied",
                "the Device's objects are not applied (see Reconciled)",
            ),
        };
        status
            .conditions
            .push(cond("ReverseResolved", &v, gen, &old.conditions));
    }
    if status != old {
        let devices: Api<Device> = Api::namespaced(ctx.client.clone(), &ns);
        let body = serde_json::json!({
            "apiVersion": Device::api_version(&()),
            "kind": Device::kind(&()),
            "status": status,
        });
        devices
            .patch_status(
                &name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(body),
            )
            .await
            .map_err(kube_err(format!("status of Device {ns}/{name}")))?;
    }
    let action = match &made {
        // Nothing will change by itself but the node or network: look again
        // now and then.
        Err(_) => Action::requeue(ctx.resync.max(Duration::from_secs(30))),
        Ok(_) => Action::requeue(ctx.resync),
    };
    Ok((action, outcome))
}

pub fn error_policy(d: Arc<Device>, e: &Error, _ctx: Arc<Ctx>) -> Action {
    tracing::warn!(device = %d.name_any(), namespace = %d.namespace().unwrap_or_default(), error = %e, "reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// Run the controller until `shutdown` resolves.
pub async fn run(
    ctx: Arc<Ctx>,
    triggers: tokio::sync::mpsc::UnboundedReceiver<ObjectRef<Device>>,
    synced: Arc<crate::run::server::App>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let devices: Api<Device> = Api::all(client.clone());
    // Ready (/readyz) once the Devices can be listed. (Not the controller's
    // store: its readiness wakes one waiter only, which is the controller.)
    match devices.list(&ListParams::default().limit(1)).await {
        Ok(_) => {
            synced.synced.store(true, Ordering::Relaxed);
            tracing::info!("Devices listed: ready");
        }
        Err(e) => {
            tracing::warn!(error = %e, "listing Devices failed: not ready until the controller's watch works")
        }
    }
    let managed =
        watcher::Config::default().labels(&format!("app.kubernetes.io/managed-by={MANAGER}"));
    let controller = Controller::new(devices, watcher::Config::default())
        .owns(
            Api::<NetworkAttachmentDefinition>::all(client.clone()),
            managed.clone(),
        )
        .owns(Api::<StatefulSet>::all(client.clone()), managed.clone())
        .owns(Api::<Service>::all(client.clone()), managed.clone())
        .watches(Api::<Pod>::all(client.clone()), managed, |p: Pod| {
            let ns = p.namespace();
            p.labels()
                .get(DEVICE_LABEL)
                .cloned()
                .map(|d| ObjectRef::new(&d).within(&ns.unwrap_or_default()))
        });
    let store = controller.store();
    let controller = controller
        .watches(
            Api::<EdgeNetwork>::all(client.clone()),
            watcher::Config::default(),
            {
                let store = store.clone();
                move |n: EdgeNetwork| {
                    let net = n.name_any();
                    store
                        .state()
                        .into_iter()
                        .filter(|d| d.spec.network == net)
                        .map(|d| ObjectRef::from_obj(&*d))
                        .collect::<Vec<_>>()
                }
            },
        )
        .watches(
            Api::<Service>::all(client.clone()),
            watcher::Config::default(),
            {
                let store = store.clone();
                move |s: Service| crate::run::services::devices_naming(&s, store.state())
            },
        )
        .reconcile_on(tokio_stream_from(triggers))
        .graceful_shutdown_on(shutdown);
    controller
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            match r {
                Ok((o, _)) => tracing::debug!(device = %o.name, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "controller"),
            }
        })
        .await;
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<T>,
) -> impl futures_util::Stream<Item = T> + Send + 'static {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
