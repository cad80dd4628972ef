//! The Device controller. For each Device:
//!
//! 1. check it (`validate`) and find its EdgeNetwork, its nodes and the
//!    Services its reverse entries name (steps 1 and 2: `run::make`);
//! 2. apply its NetworkAttachmentDefinition, Service and one StatefulSet
//!    per node (server-side apply, field manager `edgelink-operator`,
//!    owner reference to the Device), unless an object of that name
//!    exists that this Device does not own: then nothing is applied and
//!    the conflict is reported;
//! 3. per node, set the proxy pod's readiness gate from the node's device
//!    health, mark a lost node's pod not Ready, and publish an Event when
//!    a node's reachability changes (`run::proxies`);
//! 4. write its status: conditions `Reconciled`, `Ready`,
//!    `DeviceReachable` (and `ReverseResolved` when it has reverse
//!    entries, and `AccessEnforced` when it has allowedClients or a
//!    lease: False when some of its ports take the kernel path), per node its proxy pod, segment address and reachability
//!    (`status.nodes`), and per port and reverse entry what the serving
//!    node's edgelinkd last reported.
//!
//! Deleting a Device deletes its objects through their owner references
//! (the garbage collector). Every Device is reconciled again each
//! `--resync`, on any change of its spec, labels or annotations (not of its status: its
//! own writes), of its objects, of its proxy pods, of its access state
//! (a lease taken or ended: `run::access`), of
//! its EdgeNetwork, of a Service its reverse entries name, when a node's
//! report changes its proxy's states, and when a node goes silent or is
//! heard again.

use crate::run::caches::{self, reflected, trim};
use crate::run::context::{kube_err, Ctx, Error};
use crate::run::make::{make, Made};
use crate::run::metrics::{Outcome, Reason};
use crate::run::{holds, proxies};
use edgelink_operator::crd::{Device, DeviceStatus, EdgeNetwork, NetworkAttachmentDefinition};
use edgelink_operator::nodes::{self, NodeDecision};
use edgelink_operator::render::{self, DEVICE_LABEL, MANAGER};
use edgelink_operator::report::{self, Verdict};
use edgelink_operator::reverse::Resolved;
use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{predicates, watcher, Predicate, WatchStreamExt};
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

pub async fn reconcile(d: Arc<Device>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let t0 = Instant::now();
    let (r, requests) = crate::run::requests::counted(reconcile_inner(&d, &ctx)).await;
    ctx.metrics.duration.observe(t0.elapsed().as_secs_f64());
    ctx.metrics.reconcile_requests.observe(requests as f64);
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
        ctx.holds.forget(&crate::run::grants::key(d));
        ctx.caches
            .applied
            .forget(&d.namespace().unwrap_or_default(), &d.name_any());
        ctx.written
            .forget(&(d.namespace().unwrap_or_default(), d.name_any()));
        // The garbage collector deletes what it owns.
        return Ok((Action::await_change(), "deleting"));
    }
    let ns = d.namespace().unwrap_or_default();
    let gen = d.metadata.generation;
    let old = d.status.clone().unwrap_or_default();
    let mut status = DeviceStatus {
        observed_generation: gen,
        port_list: Some(render::port_list(d)),
        ..Default::default()
    };
    let made = make(ctx, d).await?;
    let (reconciled, outcome) = reconciled_verdict(&made, &ns);
    let (proxies, resolved): (&[(String, String)], &[Resolved]) = match &made {
        Ok(m) => (&m.proxies, &m.reverse),
        Err(_) => (&[], &[]),
    };
    let decisions = proxies::observe(ctx, d, proxies, resolved, &old).await?;
    let primary = fill_nodes(&mut status, &decisions);
    holds::place(ctx, d, &decisions, &old, &mut status).await;
    let reachable = match &made {
        Err(_) => verdict(
            "Unknown",
            "NotApplied",
            "the Device's objects are not applied (see Reconciled)",
        ),
        Ok(_) => nodes::summary(&status.nodes).2,
    };
    let reachable = report::carry_previous(
        reachable,
        &old.conditions,
        ctx.started.elapsed() < ctx.stale_after,
    );
    let ready = ready_verdict(&made, &ns, primary);
    if made.is_ok() {
        status.reverse = edgelink_operator::reverse::status(d, resolved, None).0;
    }
    if let Some(h) = primary.map(|p| &p.health).filter(|h| h.listening.is_some()) {
        status.ports = h.ports.clone();
        status.reverse = h.reverse.clone();
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
    more_conditions(ctx, d, &made, &old, &mut status);
    let key = (ns.clone(), d.name_any());
    // Counters and probe times alone are written at most every
    // --status-refresh; a change of state at once.
    if status != old && (!status.same_state(&old) || ctx.written.due(&key, ctx.status_refresh)) {
        write_status(ctx, d, status).await?;
        ctx.written.wrote(key);
    }
    let action = match &made {
        // Nothing will change by itself but the node or network: look again
        // now and then.
        Err(_) => Action::requeue(ctx.resync.max(Duration::from_secs(30))),
        Ok(_) => Action::requeue(ctx.resync),
    };
    Ok((action, outcome))
}

/// `ReverseResolved` (with reverse entries) and `AccessEnforced` (with
/// allowedClients or a lease).
fn more_conditions(
    ctx: &Ctx,
    d: &Device,
    made: &Result<Made, crate::run::make::NotApplied>,
    old: &DeviceStatus,
    status: &mut DeviceStatus,
) {
    let gen = d.metadata.generation;
    if !d.spec.reverse.is_empty() {
        let v = match made {
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
    // Its allowedClients may have changed: the access loop looks again.
    ctx.access.wake.notify_one();
    let ns = d.namespace().unwrap_or_default();
    let (leased, cut) = ctx.access.state(&ns, &d.name_any());
    if let Some(v) = edgelink_operator::access::verdict(d, leased, cut) {
        status
            .conditions
            .push(cond("AccessEnforced", &v, gen, &old.conditions));
    }
}

/// `Reconciled`, and the outcome for the metrics.
fn reconciled_verdict(
    made: &Result<Made, crate::run::make::NotApplied>,
    ns: &str,
) -> (Verdict, &'static str) {
    let Ok(Made { proxies, .. }) = made else {
        let na = made.as_ref().err().expect("not made");
        return (verdict("False", na.reason, na.message.clone()), na.outcome);
    };
    let s = if proxies.len() > 1 { "s" } else { "" };
    let list =
        |f: fn(&(String, String)) -> String| proxies.iter().map(f).collect::<Vec<_>>().join(", ");
    let names = list(|(_, sts)| sts.clone());
    let nodes = list(|(n, _)| n.clone());
    (
        verdict(
            "True",
            "Applied",
            format!(
                "NetworkAttachmentDefinition, Service and StatefulSet{s} {ns}/{names} applied for node{s} {nodes}"
            ),
        ),
        "ok",
    )
}

/// The per-node fields of the status, and the node whose proxy speaks
/// for the Device where one node must (Ready first): status.node, pod,
/// segmentAddress, ports and reverse are its.
fn fill_nodes<'a>(
    status: &mut DeviceStatus,
    decisions: &'a [NodeDecision],
) -> Option<&'a NodeDecision> {
    let primary = decisions
        .iter()
        .find(|n| n.status.ready)
        .or(decisions.first());
    if let Some(p) = primary {
        status.node = Some(p.status.node.clone());
        status.pod = p.status.pod.clone();
        status.segment_address = p.status.segment_address.clone();
    }
    status.nodes = decisions.iter().map(|n| n.status.clone()).collect();
    if !status.nodes.is_empty() {
        let (count, last_seen, _) = nodes::summary(&status.nodes);
        status.node_list = Some(
            status
                .nodes
                .iter()
                .map(|n| n.node.as_str())
                .collect::<Vec<_>>()
                .join(","),
        );
        status.reachable_nodes = Some(count);
        status.last_seen = last_seen;
    }
    primary
}

async fn write_status(ctx: &Ctx, d: &Device, status: DeviceStatus) -> Result<(), Error> {
    let (name, ns) = (d.name_any(), d.namespace().unwrap_or_default());
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
    Ok(())
}

/// `Ready`: some proxy pod is Ready (so in the Service) and, as its node
/// reports, every port listens.
fn ready_verdict(
    made: &Result<Made, crate::run::make::NotApplied>,
    ns: &str,
    primary: Option<&NodeDecision>,
) -> Verdict {
    if made.is_err() {
        return verdict(
            "False",
            "NotApplied",
            "the Device's objects are not applied (see Reconciled)",
        );
    }
    let Some(p) = primary else {
        return verdict("False", "NoProxyPod", "no proxy pod yet");
    };
    let s = &p.status;
    let Some(pod) = &s.pod else {
        return verdict(
            "False",
            "NoProxyPod",
            format!("no proxy pod on node {} yet", s.node),
        );
    };
    if !s.ready {
        return verdict(
            "False",
            "ProxyNotReady",
            format!(
                "no proxy pod is ready ({ns}/{pod} on node {}: reachable {}{})",
                s.node,
                s.reachable,
                s.last_error
                    .as_deref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            ),
        );
    }
    match &p.health.listening {
        Some(Err(which)) => verdict(
            "False",
            "NotListening",
            format!("edgelinkd does not listen on {which}"),
        ),
        Some(Ok(())) => verdict(
            "True",
            "Serving",
            format!("pod {ns}/{pod} is ready and every port listens"),
        ),
        None => verdict(
            "True",
            "ProxyReady",
            format!(
                "pod {ns}/{pod} is ready (no report from edgelinkd: {})",
                p.health.reachable.message
            ),
        ),
    }
}

pub fn error_policy(d: Arc<Device>, e: &Error, _ctx: Arc<Ctx>) -> Action {
    tracing::warn!(device = %d.name_any(), namespace = %d.namespace().unwrap_or_default(), error = %e, "reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// Run the controller until `shutdown` resolves.
pub async fn run(
    ctx: Arc<Ctx>,
    writers: crate::run::caches::Writers,
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
    let managed = crate::run::caches::managed();
    crate::run::caches::keep_nodes(client.clone(), writers.nodes);
    let sweep = tokio::spawn(sweep(ctx.clone()));
    crate::run::access::watch(&ctx, writers.clients, writers.namespaces, writers.leases);
    let access = tokio::spawn(crate::run::access::run(ctx.clone()));
    // A Device's own status writes (each reconcile's, the live fields)
    // must not reconcile it again: only its spec, labels and annotations.
    let (device_store, device_writer) = kube::runtime::reflector::store();
    let device_changes = watcher(devices, watcher::Config::default())
        .default_backoff()
        .modify(|d: &mut Device| d.metadata.managed_fields = None)
        .reflect(device_writer)
        .touched_objects()
        .predicate_filter(
            predicates::generation
                .combine(predicates::labels)
                .combine(predicates::annotations),
            Default::default(),
        );
    let controller = Controller::for_stream(device_changes, device_store)
        .with_config(kube::runtime::controller::Config::default().concurrency(ctx.concurrency))
        .owns_stream(reflected(
            Api::<NetworkAttachmentDefinition>::all(client.clone()),
            managed.clone(),
            writers.nads,
            trim::nad,
        ))
        .owns_stream(reflected(
            Api::<StatefulSet>::all(client.clone()),
            managed.clone(),
            writers.statefulsets,
            trim::statefulset,
        ))
        .owns_stream(reflected(
            Api::<NetworkPolicy>::all(client.clone()),
            managed.clone(),
            writers.policies,
            trim::none,
        ))
        .watches_stream(
            reflected(
                Api::<Pod>::all(client.clone()),
                managed,
                writers.pods,
                trim::pod,
            ),
            |p: Pod| {
                let ns = p.namespace();
                p.labels()
                    .get(DEVICE_LABEL)
                    .cloned()
                    .map(|d| ObjectRef::new(&d).within(&ns.unwrap_or_default()))
            },
        );
    let store = controller.store();
    let _ = ctx.devices.set(store.clone());
    let controller = controller
        .watches_stream(
            reflected(
                Api::<EdgeNetwork>::all(client.clone()),
                watcher::Config::default(),
                writers.networks,
                trim::none,
            ),
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
        // Every Service: a Device's own (owned: its owner's reconcile) and
        // those reverse entries name.
        .watches_stream(
            reflected(
                Api::<Service>::all(client.clone()),
                watcher::Config::default(),
                writers.services,
                trim::service,
            ),
            {
                let store = store.clone();
                move |s: Service| {
                    let mut to = crate::run::services::devices_naming(&s, store.state());
                    to.extend(owner_device(&s));
                    to
                }
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
    sweep.abort();
    access.abort();
}

/// Every few minutes, forget what was applied to objects that are gone,
/// and when the statuses of Devices that are gone were written (a Device
/// deleted without finalizers is never reconciled again).
async fn sweep(ctx: Arc<Ctx>) {
    let mut every = tokio::time::interval(Duration::from_secs(300));
    loop {
        every.tick().await;
        let c = &ctx.caches;
        if !(caches::ready(&c.nads) && caches::ready(&c.statefulsets) && caches::ready(&c.services))
        {
            continue;
        }
        c.applied.retain(|(kind, ns, name)| match kind.as_str() {
            "NetworkAttachmentDefinition" => c.nads.get(&ObjectRef::new(name).within(ns)).is_some(),
            "StatefulSet" => c
                .statefulsets
                .get(&ObjectRef::new(name).within(ns))
                .is_some(),
            _ => c.services.get(&ObjectRef::new(name).within(ns)).is_some(),
        });
        if let Some(devices) = ctx.devices.get() {
            ctx.written
                .retain(|(ns, name)| devices.get(&ObjectRef::new(name).within(ns)).is_some());
        }
    }
}

/// The Device that controls `s`, when one does (an owned Service's
/// change reconciles its owner).
fn owner_device(s: &Service) -> Option<ObjectRef<Device>> {
    let o = s
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "Device")?;
    Some(ObjectRef::new(&o.name).within(&s.namespace().unwrap_or_default()))
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<T>,
) -> impl futures_util::Stream<Item = T> + Send + 'static {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
