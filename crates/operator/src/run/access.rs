//! Who may use each Device, kept current by the leader: watches of every
//! pod, the namespaces and the DeviceLeases wake a pass (and a pass runs
//! each second anyway, for the leases' expiry and the lost nodes); a pass
//! decides the leases (`edgelink_operator::lease`), writes the statuses
//! that changed, makes the leases the pods' annotation asks for, and puts
//! every node's rules (`edgelink_operator::access`) in the book the
//! heartbeats are answered from (`run::server`). A Device whose access
//! state (under a lease, rules cut to fit) changed is reconciled, for its
//! condition AccessEnforced.

use crate::run::caches::{self, reflected, trim};
use crate::run::context::{kube_err, Ctx, Error};
use crate::run::rules::DeviceState;
use edgelink_access::wire::AccessRules;
use edgelink_operator::access::{self, MAX_RULES_BYTES};
use edgelink_operator::clients::{NamespaceLabels, World};
use edgelink_operator::crd::{DeviceLease, LeaseState};
use edgelink_operator::lease::{self, pod::lease_for, Decided, Devices};
use edgelink_operator::nodes::Heard;
use edgelink_operator::render::MANAGER;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, PartialObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// Keep every pod, the namespaces and the DeviceLeases in `ctx.caches`,
/// each change waking a pass.
pub fn watch(
    ctx: &Arc<Ctx>,
    pods: Writer<Pod>,
    namespaces: Writer<PartialObjectMeta<Namespace>>,
    leases: Writer<DeviceLease>,
) {
    let client = ctx.client.clone();
    keep(
        ctx,
        reflected(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default(),
            pods,
            trim::client,
        ),
    );
    keep(
        ctx,
        reflected(
            Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
            watcher::Config::default(),
            namespaces,
            trim::namespace,
        ),
    );
    keep(
        ctx,
        reflected(
            Api::<DeviceLease>::all(client),
            watcher::Config::default(),
            leases,
            trim::none,
        ),
    );
}

/// Run the watch `s` until the process ends, each change waking a pass.
fn keep<S: futures_util::Stream + Send + 'static>(ctx: &Arc<Ctx>, s: S) {
    let ctx = ctx.clone();
    tokio::spawn(s.for_each(move |_| {
        ctx.access.wake.notify_one();
        std::future::ready(())
    }));
}

/// Passes until the task is aborted.
pub async fn run(ctx: Arc<Ctx>) {
    loop {
        tokio::select! {
            _ = ctx.access.wake.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        // A burst of changes (a Job's pods) makes one pass.
        tokio::time::sleep(Duration::from_millis(50)).await;
        if let Err(e) = pass(&ctx).await {
            tracing::warn!(error = %e, "access pass");
        }
    }
}

/// The nodes of `pods` the operator has taken as lost.
fn lost_nodes(ctx: &Ctx, pods: &[Arc<Pod>]) -> HashSet<String> {
    let nodes: HashSet<&str> = pods
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.as_deref())
        .collect();
    nodes
        .into_iter()
        .filter(|n| matches!(ctx.reports.heard_state(n), Heard::Lost(_)))
        .map(str::to_string)
        .collect()
}

/// One pass over the caches (nothing before they have all listed).
async fn pass(ctx: &Ctx) -> Result<(), Error> {
    let c = &ctx.caches;
    let Some(devices) = ctx.devices.get() else {
        return Ok(());
    };
    if !(caches::ready(devices)
        && caches::ready(&c.clients)
        && caches::ready(&c.namespaces)
        && caches::ready(&c.leases))
    {
        return Ok(());
    }
    let devices = devices.state();
    let pods = c.clients.state();
    let namespaces: NamespaceLabels = c
        .namespaces
        .state()
        .iter()
        .map(|n| (n.name_any(), n.labels().clone()))
        .collect();
    let lost = lost_nodes(ctx, &pods);
    let w = World::new(pods.iter().map(|p| p.as_ref()), &namespaces, &lost);
    let by_key: Devices = devices
        .iter()
        .map(|d| {
            (
                (d.namespace().unwrap_or_default(), d.name_any()),
                d.as_ref(),
            )
        })
        .collect();
    let leases = with_written(ctx, c.leases.state());
    let refs: Vec<&DeviceLease> = leases.iter().collect();
    let now = k8s_openapi::jiff::Timestamp::now();
    let decided = lease::decide(&refs, &by_key, &w, now);
    write_statuses(ctx, &leases, &decided).await;
    make_pod_leases(ctx, &pods, &leases, &w).await?;
    let mut cut = HashSet::new();
    let nodes: BTreeMap<String, AccessRules> = access::rules(pods.iter().map(|p| p.as_ref()), &by_key, &w, &decided)
        .into_iter()
        .map(|(node, a)| {
            let (rules, c) = access::fit(a, MAX_RULES_BYTES);
            if !c.is_empty() {
                tracing::warn!(%node, devices = %c.join(", "), "access rules cut to fit the heartbeat's answer");
            }
            cut.extend(c);
            (node, rules)
        })
        .collect();
    ctx.access
        .book
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .set(nodes);
    states(ctx, &decided, &cut);
    Ok(())
}

/// The cached leases, with the status this leader last wrote where it
/// wrote one (the cache may be a write behind).
fn with_written(ctx: &Ctx, cached: Vec<Arc<DeviceLease>>) -> Vec<DeviceLease> {
    let mut written = ctx.access.written.lock().unwrap_or_else(|e| e.into_inner());
    let uids: HashSet<String> = cached.iter().filter_map(|l| l.uid()).collect();
    written.retain(|uid, _| uids.contains(uid));
    cached
        .iter()
        .map(|l| {
            let mut l = (**l).clone();
            if let Some(s) = l.uid().and_then(|u| written.get(&u)) {
                l.status = Some(s.clone());
            }
            l
        })
        .collect()
}

/// Write the statuses that changed (an error is logged: the next pass
/// tries again).
async fn write_statuses(ctx: &Ctx, leases: &[DeviceLease], decided: &[Decided]) {
    let by_name: HashMap<String, &DeviceLease> = leases
        .iter()
        .map(|l| {
            (
                format!("{}/{}", l.namespace().unwrap_or_default(), l.name_any()),
                l,
            )
        })
        .collect();
    for d in decided {
        let Some(l) = by_name.get(&d.name) else {
            continue;
        };
        if l.status.as_ref() == Some(&d.status) || l.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let ns = l.namespace().unwrap_or_default();
        let api: Api<DeviceLease> = Api::namespaced(ctx.client.clone(), &ns);
        let body = serde_json::json!({
            "apiVersion": DeviceLease::api_version(&()),
            "kind": DeviceLease::kind(&()),
            "status": d.status,
        });
        let pp = PatchParams::apply(MANAGER).force();
        match api
            .patch_status(&l.name_any(), &pp, &Patch::Apply(body))
            .await
        {
            Ok(_) => {
                let state = d.status.state.map_or("", LeaseState::as_str);
                tracing::info!(lease = %d.name, device = %format!("{}/{}", d.device.0, d.device.1), state, "lease");
                if let Some(uid) = l.uid() {
                    let mut w = ctx.access.written.lock().unwrap_or_else(|e| e.into_inner());
                    w.insert(uid, d.status.clone());
                }
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => tracing::warn!(lease = %d.name, error = %e, "lease status not written"),
        }
    }
}

/// Create the lease of each live pod whose annotation asks for one and
/// has none yet.
async fn make_pod_leases(
    ctx: &Ctx,
    pods: &[Arc<Pod>],
    leases: &[DeviceLease],
    w: &World<'_>,
) -> Result<(), Error> {
    let have: HashSet<(String, String)> = leases
        .iter()
        .map(|l| (l.namespace().unwrap_or_default(), l.name_any()))
        .collect();
    ctx.access
        .created
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|k| !have.contains(k));
    for p in pods.iter().filter(|p| w.live(p)) {
        let lease = match lease_for(p) {
            None => continue,
            Some(Err(e)) => {
                tracing::debug!(pod = %p.name_any(), namespace = %p.namespace().unwrap_or_default(), "{e}");
                continue;
            }
            Some(Ok(l)) => l,
        };
        let key = (lease.namespace().unwrap_or_default(), lease.name_any());
        let made = |k: &(String, String)| {
            let c = ctx.access.created.lock().unwrap_or_else(|e| e.into_inner());
            c.contains(k)
        };
        if have.contains(&key) || made(&key) {
            continue;
        }
        let api: Api<DeviceLease> = Api::namespaced(ctx.client.clone(), &key.0);
        match api.create(&PostParams::default(), &lease).await {
            Ok(_) => {
                tracing::info!(lease = %format!("{}/{}", key.0, key.1), device = %lease.spec.device, "lease made for an annotated pod")
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => {
                return Err(kube_err(format!("create DeviceLease {}/{}", key.0, key.1))(
                    e,
                ))
            }
        }
        let mut c = ctx.access.created.lock().unwrap_or_else(|e| e.into_inner());
        c.insert(key);
    }
    Ok(())
}

/// Keep each Device's access state; reconcile those whose state changed.
fn states(ctx: &Ctx, decided: &[Decided], cut: &HashSet<String>) {
    let mut now: HashMap<(String, String), DeviceState> = HashMap::new();
    for d in decided {
        if matches!(d.state(), Some(LeaseState::Held | LeaseState::Waiting)) {
            now.entry(d.device.clone()).or_default().0 = true;
        }
    }
    for c in cut {
        if let Some((ns, name)) = c.split_once('/') {
            now.entry((ns.to_string(), name.to_string())).or_default().1 = true;
        }
    }
    let changed: Vec<(String, String)> = {
        let mut m = ctx.access.devices.lock().unwrap_or_else(|e| e.into_inner());
        let keys: HashSet<&(String, String)> = m.keys().chain(now.keys()).collect();
        let changed = keys
            .into_iter()
            .filter(|k| m.get(*k) != now.get(*k))
            .cloned()
            .collect();
        *m = now;
        changed
    };
    for (ns, name) in changed {
        ctx.reports.reconcile(&ns, &name);
    }
}
