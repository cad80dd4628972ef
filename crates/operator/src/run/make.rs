//! Step 2 of a Device's reconcile (`run::controller`): check it, find
//! its EdgeNetwork, node and the Services its reverse entries name, and
//! apply its NetworkAttachmentDefinition, Service and StatefulSet, or say
//! why not. It never writes the Device's status (the controller does),
//! and never touches an object of the Device's name it does not own.

use crate::run::context::{kube_err, Ctx, Error};
use edgelink_operator::crd::{Device, EdgeNetwork, NetworkAttachmentDefinition};
use edgelink_operator::render::{self, MANAGER};
use edgelink_operator::reverse::Resolved;
use edgelink_operator::validate;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, ListParams, Patch, PatchParams};
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

/// Find the node: `nodeName`, or the one node `nodeSelector` selects.
async fn resolve_node(ctx: &Ctx, d: &Device) -> Result<Result<String, NotApplied>, Error> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    if let Some(n) = &d.spec.node_name {
        return Ok(
            match nodes
                .get_opt(n)
                .await
                .map_err(kube_err(format!("get node {n}")))?
            {
                Some(_) => Ok(n.clone()),
                None => Err(not_applied(
                    "NodeNotFound",
                    "invalid",
                    format!("node {n} does not exist"),
                )),
            },
        );
    }
    let sel = d.spec.node_selector.clone().unwrap_or_default();
    let expr = sel
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let list = nodes
        .list(&ListParams::default().labels(&expr))
        .await
        .map_err(kube_err(format!("list nodes {expr}")))?;
    let names: Vec<String> = list.items.iter().map(|n| n.name_any()).collect();
    Ok(match names.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(not_applied(
            "NoNodeSelected",
            "invalid",
            format!("nodeSelector {expr} selects no node"),
        )),
        many => Err(not_applied(
            "NodeSelectorAmbiguous",
            "invalid",
            format!(
                "nodeSelector {expr} selects {} nodes ({}): it must select one",
                many.len(),
                many.join(", ")
            ),
        )),
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

/// `None` when `name` is free or ours; else who holds it.
async fn conflict<K>(
    api: &Api<K>,
    kind: &str,
    name: &str,
    ns: &str,
    d: &Device,
) -> Result<Option<String>, Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
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

async fn apply<K>(api: &Api<K>, obj: &K, name: &str) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug,
{
    let mut v = serde_json::to_value(obj).expect("objects serialise");
    v["apiVersion"] = K::api_version(&()).into_owned().into();
    v["kind"] = K::kind(&()).into_owned().into();
    api.patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(v))
        .await
        .map_err(kube_err(format!("apply {} {name}", K::kind(&()))))?;
    Ok(())
}

/// What was applied: for which node, with which reverse targets.
pub struct Made {
    pub node: String,
    pub reverse: Vec<Resolved>,
}

/// Apply the three objects, or say why not.
pub async fn make(ctx: &Ctx, d: &Device) -> Result<Result<Made, NotApplied>, Error> {
    let name = d.name_any();
    let ns = d.namespace().unwrap_or_default();
    if let Err(e) = validate::device(d) {
        return Ok(Err(not_applied("InvalidSpec", "invalid", e.to_string())));
    }
    let nets: Api<EdgeNetwork> = Api::all(ctx.client.clone());
    let Some(net) = nets
        .get_opt(&d.spec.network)
        .await
        .map_err(kube_err(format!("get EdgeNetwork {}", d.spec.network)))?
    else {
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
    let node = match resolve_node(ctx, d).await? {
        Ok(n) => n,
        Err(na) => return Ok(Err(na)),
    };
    if let Err(e) = validate::placement(d, &net, &node) {
        return Ok(Err(not_applied(
            "InvalidPlacement",
            "invalid",
            e.to_string(),
        )));
    }
    let services = crate::run::services::lookup(&ctx.client, d).await?;
    let reverse = edgelink_operator::reverse::resolve(d, &services, &ctx.cluster_domain);
    if let Err(e) = validate::reverse_placement(d, &net, &node, &reverse) {
        return Ok(Err(not_applied(
            "InvalidPlacement",
            "invalid",
            e.to_string(),
        )));
    }
    let r = render::render(d, &net, &node, &ctx.settings, &reverse);
    let nads: Api<NetworkAttachmentDefinition> = Api::namespaced(ctx.client.clone(), &ns);
    let stss: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &ns);
    let svcs: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    let mut conflicts = Vec::new();
    conflicts.extend(conflict(&nads, "NetworkAttachmentDefinition", &name, &ns, d).await?);
    conflicts.extend(conflict(&stss, "StatefulSet", &name, &ns, d).await?);
    conflicts.extend(conflict(&svcs, "Service", &name, &ns, d).await?);
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
    // The NAD first: the pod's ADD reads it.
    apply(&nads, &r.nad, &name).await?;
    apply(&svcs, &r.service, &name).await?;
    apply(&stss, &r.statefulset, &name).await?;
    Ok(Ok(Made { node, reverse }))
}
