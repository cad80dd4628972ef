//! What a reconcile reads, kept by watches instead of fetched: the
//! EdgeNetworks, the nodes (their names and labels), every Service (the
//! reverse entries may name any, and a Device's own), and the objects the
//! operator made (NADs, StatefulSets, proxy pods, NetworkPolicies), and
//! for access (`run::access`) every pod (trimmed to what access reads),
//! the namespaces' labels and the DeviceLeases. A Device left alone
//! is reconciled from these with no API read; the API is asked only
//! before a cache has listed once, and where a cache cannot answer: a name
//! the operator's caches do not hold may be held by somebody else's
//! object, which a conflict check must see.
//!
//! [`Applied`] remembers what was last applied: an object whose cached
//! copy is still the one the last apply returned, with the same rendered
//! content, is not applied again.

use crate::run::error::{kube_err, Error};
use edgelink_operator::crd::{DeviceLease, EdgeNetwork, NetworkAttachmentDefinition};
use edgelink_operator::render::MANAGER;
use futures_util::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, ListParams, PartialObjectMeta};
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

/// The readers, for the reconciles.
#[derive(Clone)]
pub struct Caches {
    pub networks: Store<EdgeNetwork>,
    pub nodes: Store<PartialObjectMeta<Node>>,
    pub services: Store<Service>,
    pub nads: Store<NetworkAttachmentDefinition>,
    pub statefulsets: Store<StatefulSet>,
    pub pods: Store<Pod>,
    /// The Devices' NetworkPolicies (`spec.access`).
    pub policies: Store<NetworkPolicy>,
    /// Every pod, as [`trim::client`] leaves it: allowedClients and the
    /// leases' holders.
    pub clients: Store<Pod>,
    pub namespaces: Store<PartialObjectMeta<Namespace>>,
    pub leases: Store<DeviceLease>,
    pub applied: Arc<Applied>,
}

/// The writers, for the watches (`run::controller::run`).
pub struct Writers {
    pub networks: Writer<EdgeNetwork>,
    pub nodes: Writer<PartialObjectMeta<Node>>,
    pub services: Writer<Service>,
    pub nads: Writer<NetworkAttachmentDefinition>,
    pub statefulsets: Writer<StatefulSet>,
    pub pods: Writer<Pod>,
    pub policies: Writer<NetworkPolicy>,
    pub clients: Writer<Pod>,
    pub namespaces: Writer<PartialObjectMeta<Namespace>>,
    pub leases: Writer<DeviceLease>,
}

impl Caches {
    pub fn new() -> (Caches, Writers) {
        let (networks, wn) = reflector::store();
        let (nodes, wno) = reflector::store();
        let (services, ws) = reflector::store();
        let (nads, wna) = reflector::store();
        let (statefulsets, wst) = reflector::store();
        let (pods, wp) = reflector::store();
        let (policies, wpo) = reflector::store();
        let (clients, wc) = reflector::store();
        let (namespaces, wns) = reflector::store();
        let (leases, wl) = reflector::store();
        (
            Caches {
                networks,
                nodes,
                services,
                nads,
                statefulsets,
                pods,
                policies,
                clients,
                namespaces,
                leases,
                applied: Arc::new(Applied::default()),
            },
            Writers {
                networks: wn,
                nodes: wno,
                services: ws,
                nads: wna,
                statefulsets: wst,
                pods: wp,
                policies: wpo,
                clients: wc,
                namespaces: wns,
                leases: wl,
            },
        )
    }
}

/// The label the operator puts on everything it makes.
pub fn managed() -> watcher::Config {
    watcher::Config::default().labels(&format!("app.kubernetes.io/managed-by={MANAGER}"))
}

/// A watch of `api` that keeps `writer`'s store, as the objects it
/// touched. Each object is kept as `trim` leaves it: without managedFields
/// (nothing here reads them, and they are half of a small object) and
/// without what no reconcile reads. A plant's 1000 Devices make 1000 of
/// each kind; whole, they took the operator past 256 MiB.
pub fn reflected<K>(
    api: Api<K>,
    config: watcher::Config,
    writer: Writer<K>,
    trim: fn(&mut K),
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    watcher(api, config)
        .default_backoff()
        .modify(move |o: &mut K| {
            o.meta_mut().managed_fields = None;
            trim(o)
        })
        .reflect(writer)
        .touched_objects()
}

/// What each cache keeps beside the metadata.
pub mod trim {
    use super::*;
    use k8s_openapi::api::core::v1::PodStatus;

    /// Whole (the Devices, the EdgeNetworks: the reconcile reads them).
    pub fn none<K>(_: &mut K) {}

    /// The NAD's config is never read back: the apply's hash says whether
    /// it changed.
    pub fn nad(n: &mut NetworkAttachmentDefinition) {
        n.spec.config = String::new();
    }

    /// Owner, labels and generation are all a reconcile reads.
    pub fn statefulset(s: &mut StatefulSet) {
        s.spec = None;
        s.status = None;
    }

    /// The conditions (Ready, the gate) and the annotations (Multus's
    /// network-status) are all a reconcile reads.
    pub fn pod(p: &mut Pod) {
        p.spec = None;
        p.status = p.status.take().map(|s| PodStatus {
            conditions: s.conditions,
            ..Default::default()
        });
    }

    /// A pod as access reads it: labels, owner, the lease annotation, its
    /// node and hostNetwork, its phase and addresses.
    pub fn client(p: &mut Pod) {
        use k8s_openapi::api::core::v1::PodSpec;
        let lease = edgelink_operator::lease::pod::LEASE_ANNOTATION;
        if let Some(a) = p.metadata.annotations.as_mut() {
            a.retain(|k, _| k == lease);
        }
        p.spec = p.spec.take().map(|s| PodSpec {
            node_name: s.node_name,
            host_network: s.host_network,
            ..Default::default()
        });
        p.status = p.status.take().map(|s| PodStatus {
            phase: s.phase,
            pod_ip: s.pod_ip,
            pod_ips: s.pod_ips,
            ..Default::default()
        });
    }

    /// Labels, for namespaceSelector.
    pub fn namespace(n: &mut PartialObjectMeta<Namespace>) {
        n.metadata.annotations = None;
    }

    /// The spec (ClusterIP, ports) for the reverse entries.
    pub fn service(s: &mut Service) {
        s.status = None;
    }

    /// Names and labels.
    pub fn node(n: &mut PartialObjectMeta<Node>) {
        n.metadata.annotations = None;
    }
}

/// Keep the nodes' store (names and labels) until the process ends.
pub fn keep_nodes(client: Client, writer: Writer<PartialObjectMeta<Node>>) {
    let s = reflected(
        Api::<PartialObjectMeta<Node>>::all(client),
        watcher::Config::default(),
        writer,
        trim::node,
    );
    tokio::spawn(s.for_each(|_| std::future::ready(())));
}

/// Whether the store has listed once (its answers are the cluster's).
pub fn ready<K: Resource + Clone>(s: &Store<K>) -> bool
where
    K::DynamicType: Eq + Hash + Clone,
{
    s.wait_until_ready()
        .now_or_never()
        .is_some_and(|r| r.is_ok())
}

/// `name` in namespace `ns` ("" for a cluster object), from the store
/// once it has listed, else from the API.
pub async fn get<K>(
    store: &Store<K>,
    api: &Api<K>,
    kind: &str,
    ns: &str,
    name: &str,
) -> Result<Option<Arc<K>>, Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    if ready(store) {
        let key = if ns.is_empty() {
            ObjectRef::new(name)
        } else {
            ObjectRef::new(name).within(ns)
        };
        return Ok(store.get(&key));
    }
    Ok(api
        .get_opt(name)
        .await
        .map_err(kube_err(format!("get {kind} {name}")))?
        .map(Arc::new))
}

/// The names of the nodes whose labels hold all of `sel`, sorted.
pub async fn nodes_selected(
    c: &Caches,
    client: &Client,
    sel: &BTreeMap<String, String>,
) -> Result<Vec<String>, Error> {
    let matches =
        |labels: &BTreeMap<String, String>| sel.iter().all(|(k, v)| labels.get(k) == Some(v));
    let mut names: Vec<String> = if ready(&c.nodes) {
        c.nodes
            .state()
            .iter()
            .filter(|n| matches(n.labels()))
            .map(|n| n.name_any())
            .collect()
    } else {
        let expr = sel
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        Api::<Node>::all(client.clone())
            .list_metadata(&ListParams::default().labels(&expr))
            .await
            .map_err(kube_err(format!("list nodes {expr}")))?
            .items
            .iter()
            .map(|n| n.name_any())
            .collect()
    };
    names.sort();
    Ok(names)
}

/// What each object was last applied as: (kind, namespace, name) → the
/// hash of the rendered object and the [`version`] the apply returned.
#[derive(Default)]
pub struct Applied(Mutex<HashMap<ObjectKey, (u64, String)>>);

/// (kind, namespace, name).
pub type ObjectKey = (String, String, String);

/// The version of an object that tells whether somebody changed what the
/// operator applied: its generation where it has one (a StatefulSet, a
/// NAD as every custom resource: status updates do not move it, an edit
/// of its spec does), else its resourceVersion (a Service).
pub fn version(meta: &kube::api::ObjectMeta) -> Option<String> {
    meta.generation
        .map(|g| format!("generation {g}"))
        .or_else(|| meta.resource_version.clone())
}

/// A hash of the rendered object (its JSON).
pub fn content_hash(v: &serde_json::Value) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    v.to_string().hash(&mut h);
    h.finish()
}

impl Applied {
    /// Whether `cached` is the [`version`] our last apply of this content
    /// returned: then nobody changed it since, and applying it again would
    /// change nothing.
    pub fn unchanged(&self, key: &ObjectKey, hash: u64, cached: Option<&str>) -> bool {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match (m.get(key), cached) {
            (Some((h, rv)), Some(c)) => *h == hash && rv == c,
            _ => false,
        }
    }

    pub fn record(&self, key: ObjectKey, hash: u64, version: Option<String>) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match version {
            Some(v) => {
                m.insert(key, (hash, v));
            }
            None => {
                m.remove(&key);
            }
        }
    }

    /// Keep only the objects `keep` (kind, namespace, name) says exist.
    pub fn retain(&self, keep: impl Fn(&ObjectKey) -> bool) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.retain(|k, _| keep(k));
    }

    /// Forget the objects of a Device being deleted: its name and the
    /// names it prefixes (another Device's caught by the prefix is only
    /// applied once more).
    pub fn forget(&self, ns: &str, name: &str) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.retain(|(_, n, o), _| !(n == ns && (o == name || o.starts_with(&format!("{name}-")))));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: &str) -> (String, String, String) {
        ("StatefulSet".into(), "hil".into(), n.into())
    }

    #[test]
    fn an_object_is_applied_again_when_its_content_or_its_version_moved() {
        let a = Applied::default();
        let v = serde_json::json!({"spec": {"replicas": 1}});
        let h = content_hash(&v);
        assert!(!a.unchanged(&key("d1"), h, Some("7")), "never applied");
        a.record(key("d1"), h, Some("7".into()));
        assert!(a.unchanged(&key("d1"), h, Some("7")));
        assert!(
            !a.unchanged(&key("d1"), h, Some("8")),
            "somebody changed it"
        );
        assert!(!a.unchanged(&key("d1"), h, None), "not cached: gone?");
        let h2 = content_hash(&serde_json::json!({"spec": {"replicas": 2}}));
        assert!(!a.unchanged(&key("d1"), h2, Some("7")), "new content");
        a.record(key("d1-kedge2"), h, Some("9".into()));
        a.record(key("d10"), h, Some("9".into()));
        a.forget("hil", "d1");
        assert!(!a.unchanged(&key("d1"), h, Some("7")));
        assert!(!a.unchanged(&key("d1-kedge2"), h, Some("9")));
        assert!(a.unchanged(&key("d10"), h, Some("9")), "another Device's");
    }
}
