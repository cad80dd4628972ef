//! Step 2 of a Device's reconcile (`run::controller`): check it, find
//! its EdgeNetwork, nodes and the Services its reverse entries name, and
//! apply its NetworkAttachmentDefinition, Service and one StatefulSet per
//! node (deleting those of nodes it left), and its NetworkPolicy when it
//! has allowedClients (deleting it when they go), or say why not. It never writes the Device's status (the controller does),
//! and never touches an object of the Device's name it does not own.

use crate::run::caches;
use crate::run::context::{kube_err, Ctx, Error};
use edgelink_operator::crd::{Device, EdgeNetwork, NetworkAttachmentDefinition, MAX_NODES};
use edgelink_operator::render::{self, DEVICE_LABEL, MANAGER};
use edgelink_operator::reverse::Resolved;
use edgelink_operator::validate;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, ListParams, PartialObjectMeta, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;

/// Why the objects were not applied.
pub struct NotApplied {
    pub reason: &'static str,
    pub message: String,
    pub outcome: &'static str,
}

fn not_applied(
    reason: &'static str,
    outcome: &'static str,
    message: impl Into<String>,
) -> NotApplied {
    NotApplied {
        reason,
        outcome,
        message: message.into(),
    }
}

/// Find the nodes: `nodeName`, `nodes` (each must exist), or the nodes
/// `nodeSelector` selects (sorted by name, 16 at most).
async fn resolve_nodes(ctx: &Ctx, d: &Device) -> Result<Result<Vec<String>, NotApplied>, Error> {
    let nodes: Api<PartialObjectMeta<Node>> = Api::all(ctx.client.clone());
    let named: Vec<String> = match &d.spec.node_name {
        Some(n) => vec![n.clone()],
        None => d.spec.nodes.clone(),
    };
    if !named.is_empty() {
        let mut missing = Vec::new();
        for n in &named {
            if caches::get(&ctx.caches.nodes, &nodes, "node", "", n)
                .await?
                .is_none()
            {
                missing.push(n.as_str());
            }
        }
        return Ok(match missing.as_slice() {
            [] => Ok(named),
            [one] => Err(not_applied(
                "NodeNotFound",
                "invalid",
                format!("node {one} does not exist"),
            )),
            many => Err(not_applied(
                "NodeNotFound",
                "invalid",
                format!("nodes {} do not exist", many.join(", ")),
            )),
        });
    }
    let sel = d.spec.node_selector.clone().unwrap_or_default();
    let expr = sel
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let names = caches::nodes_selected(&ctx.caches, &ctx.client, &sel).await?;
    Ok(match names.len() {
        0 => Err(not_applied(
            "NoNodeSelected",
            "invalid",
            format!("nodeSelector {expr} selects no node"),
        )),
        n if n > MAX_NODES as usize => Err(not_applied(
            "TooManyNodes",
            "invalid",
            format!(
                "nodeSelector {expr} selects {n} nodes ({}): at most {MAX_NODES}",
                names.join(", ")
            ),
        )),
        _ => Ok(names),
    })
}

/// The owner that controls `meta`, if it is `d`.
fn owned_by(meta: &kube::api::ObjectMeta, d: &Device) -> bool {
    let uid = d.metadata.uid.as_deref();
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && Some(o.uid.as_str()) == uid)
}

/// `None` when `name` is free or ours; else who holds it. `cached`: the
/// operator's own objects of that kind; a name not among them (or not
/// ours) is asked of the API, which sees everybody's.
async fn conflict<K>(
    cached: &Store<K>,
    api: &Api<K>,
    kind: &str,
    name: &str,
    ns: &str,
    d: &Device,
) -> Result<Option<String>, Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    if caches::ready(cached)
        && cached
            .get(&ObjectRef::new(name).within(ns))
            .is_some_and(|o| owned_by(o.meta(), d))
    {
        return Ok(None);
    }
    let found = api
        .get_opt(name)
        .await
        .map_err(kube_err(format!("get {kind} {ns}/{name}")))?;
    Ok(found.and_then(|o| {
        if owned_by(o.meta(), d) {
            return None;
        }
        let by = o
            .meta()
            .owner_references
            .iter()
            .flatten()
            .find(|r| r.controller == Some(true))
            .map(|r| format!("controlled by {} {}", r.kind, r.name))
            .or_else(|| {
                o.meta()
                    .managed_fields
                    .iter()
                    .flatten()
                    .filter_map(|m| m.manager.clone())
                    .next()
                    .map(|m| format!("made by {m}"))
            })
            .unwrap_or_else(|| "not made by this Device".into());
        Some(format!(
            "{kind} {ns}/{name} exists ({by}) and is left alone"
        ))
    }))
}

/// Apply `obj`, unless its cached copy is still the version the last apply
/// of this same content returned (nobody changed it since).
async fn apply<K>(
    ctx: &Ctx,
    cached: &Store<K>,
    api: &Api<K>,
    obj: &K,
    name: &str,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug,
{
    let mut v = serde_json::to_value(obj).expect("objects serialise");
    v["apiVersion"] = K::api_version(&()).into_owned().into();
    v["kind"] = K::kind(&()).into_owned().into();
    let ns = obj.meta().namespace.clone().unwrap_or_default();
    let key = (K::kind(&()).into_owned(), ns.clone(), name.to_string());
    let hash = caches::content_hash(&v);
    let now = cached.get(&ObjectRef::new(name).within(&ns));
    let seen = now.as_ref().and_then(|o| caches::version(o.meta()));
    if ctx.caches.applied.unchanged(&key, hash, seen.as_deref()) {
        return Ok(());
    }
    let out = api
        .patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(v))
        .await
        .map_err(kube_err(format!("apply {} {name}", K::kind(&()))))?;
    ctx.caches
        .applied
        .record(key, hash, caches::version(out.meta()));
    Ok(())
}

/// What was applied: for which nodes (their proxies), with which reverse
/// targets.
pub struct Made {
    /// (node, StatefulSet name), in the order of the Device's nodes.
    pub proxies: Vec<(String, String)>,
    pub reverse: Vec<Resolved>,
}

/// Apply the objects, or say why not.
pub async fn make(ctx: &Ctx, d: &Device) -> Result<Result<Made, NotApplied>, Error> {
    let name = d.name_any();
    let ns = d.namespace().unwrap_or_default();
    if let Err(e) = validate::device(d) {
        return Ok(Err(not_applied("InvalidSpec", "invalid", e.to_string())));
    }
    let nets: Api<EdgeNetwork> = Api::all(ctx.client.clone());
    let found = caches::get(
        &ctx.caches.networks,
        &nets,
        "EdgeNetwork",
        "",
        &d.spec.network,
    )
    .await?;
    let Some(net) = found else {
        return Ok(Err(not_applied(
            "NetworkNotFound",
            "invalid",
            format!("EdgeNetwork {} does not exist", d.spec.network),
        )));
    };
    if let Err(e) = validate::network(&net) {
        return Ok(Err(not_applied(
            "InvalidNetwork",
            "invalid",
            format!("EdgeNetwork {}: {e}", d.spec.network),
        )));
    }
    let nodes = match resolve_nodes(ctx, d).await? {
        Ok(n) => n,
        Err(na) => return Ok(Err(na)),
    };
    if let Err(e) = validate::connections_split(d, nodes.len()) {
        return Ok(Err(not_applied(
            "InvalidPlacement",
            "invalid",
            e.to_string(),
        )));
    }
    let mut vip = edgelink_operator::vip::check(d, &net, &nodes);
    let others = ctx.devices.get().map(|s| s.state()).unwrap_or_default();
    vip.extend(edgelink_operator::vip::clashes(
        d,
        others.iter().map(|o| o.as_ref()),
    ));
    if !vip.is_empty() {
        return Ok(Err(not_applied(
            "InvalidPlacement",
            "invalid",
            vip.join("; "),
        )));
    }
    let services = crate::run::services::lookup(ctx, d).await?;
    let reverse = edgelink_operator::reverse::resolve(d, &services, &ctx.cluster_domain);
    for node in &nodes {
        let placed = validate::placement(d, &net, node)
            .and_then(|()| validate::reverse_placement(d, &net, node, &reverse));
        if let Err(e) = placed {
            return Ok(Err(not_applied(
                "InvalidPlacement",
                "invalid",
                e.to_string(),
            )));
        }
    }
    let r = render::render(d, &net, &nodes, &ctx.settings, &reverse);
    let nads: Api<NetworkAttachmentDefinition> = Api::namespaced(ctx.client.clone(), &ns);
    let stss: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &ns);
    let svcs: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    let c = &ctx.caches;
    let mut conflicts = Vec::new();
    conflicts.extend(conflict(&c.nads, &nads, "NetworkAttachmentDefinition", &name, &ns, d).await?);
    for p in &r.proxies {
        conflicts.extend(conflict(&c.statefulsets, &stss, "StatefulSet", &p.name, &ns, d).await?);
    }
    conflicts.extend(conflict(&c.services, &svcs, "Service", &name, &ns, d).await?);
    let policy = render::network_policy(d);
    let pols: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), &ns);
    if policy.is_some() {
        conflicts.extend(conflict(&c.policies, &pols, "NetworkPolicy", &name, &ns, d).await?);
    }
    if !conflicts.is_empty() {
        return Ok(Err(not_applied(
            "Conflict",
            "conflict",
            format!(
                "{}; nothing was applied: delete or rename it, or rename the Device",
                conflicts.join("; ")
            ),
        )));
    }
    // The NAD first: the pods' ADD reads it.
    apply(ctx, &c.nads, &nads, &r.nad, &name).await?;
    apply(ctx, &c.services, &svcs, &r.service, &name).await?;
    for p in &r.proxies {
        apply(ctx, &c.statefulsets, &stss, &p.statefulset, &p.name).await?;
    }
    let keep: Vec<&str> = r.proxies.iter().map(|p| p.name.as_str()).collect();
    prune(ctx, &stss, d, &keep).await?;
    ensure_policy(ctx, &pols, d, policy.as_ref()).await?;
    Ok(Ok(Made {
        proxies: r.proxies.into_iter().map(|p| (p.node, p.name)).collect(),
        reverse,
    }))
}

/// Apply `d`'s NetworkPolicy, or delete the one it owns when it has
/// none (allowedClients went). Without access and before the cache of
/// NetworkPolicies has listed, nothing is asked of the API.
async fn ensure_policy(
    ctx: &Ctx,
    pols: &Api<NetworkPolicy>,
    d: &Device,
    policy: Option<&NetworkPolicy>,
) -> Result<(), Error> {
    let (name, ns) = (d.name_any(), d.namespace().unwrap_or_default());
    let cached = &ctx.caches.policies;
    if let Some(p) = policy {
        return apply(ctx, cached, pols, p, &name).await;
    }
    let ours = caches::ready(cached)
        && cached
            .get(&ObjectRef::new(&name).within(&ns))
            .is_some_and(|p| owned_by(p.meta(), d));
    if !ours {
        return Ok(());
    }
    tracing::info!(device = %name, namespace = %ns, "deleting the NetworkPolicy of a Device that lets every client in");
    match pols.delete(&name, &Default::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(kube_err(format!("delete NetworkPolicy {ns}/{name}"))(e)),
    }
}

/// Delete the StatefulSets of `d` that are not `keep` (a node the Device
/// left, or the single-node name after a second node came).
async fn prune(ctx: &Ctx, stss: &Api<StatefulSet>, d: &Device, keep: &[&str]) -> Result<(), Error> {
    let device = d.name_any();
    let ns = d.namespace().unwrap_or_default();
    let cached = &ctx.caches.statefulsets;
    let list: Vec<StatefulSet> = if caches::ready(cached) {
        cached
            .state()
            .iter()
            .filter(|s| {
                s.namespace().as_deref() == Some(ns.as_str())
                    && s.labels().get(DEVICE_LABEL) == Some(&device)
            })
            .map(|s| (**s).clone())
            .collect()
    } else {
        stss.list(&ListParams::default().labels(&format!("{DEVICE_LABEL}={device}")))
            .await
            .map_err(kube_err(format!("list StatefulSets of Device {device}")))?
            .items
    };
    for s in list {
        let n = s.name_any();
        if keep.contains(&n.as_str()) || !owned_by(s.meta(), d) {
            continue;
        }
        tracing::info!(device = %d.name_any(), statefulset = %n, "deleting the proxy of a node the Device left");
        match stss.delete(&n, &Default::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(kube_err(format!("delete StatefulSet {n}"))(e)),
        }
    }
    Ok(())
}
