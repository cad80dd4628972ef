//! The pods as access sees them: which are alive (not finished, not being
//! deleted, not on a node the operator has taken as lost), their
//! addresses (every `status.podIPs`; none for a hostNetwork pod, whose
//! address is its node's), and the pods a Device's `allowedClients` peer
//! selects. Shared by the leases' queue (`crate::lease`) and the rules
//! sent to edgelinkd (`crate::access`).

use crate::crd::ClientPeer;
use crate::selector;
use edgelink_access::wire::Client;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use std::collections::{BTreeMap, HashMap, HashSet};

/// Namespace → its labels.
pub type NamespaceLabels = BTreeMap<String, BTreeMap<String, String>>;

/// The pods by namespace, the namespaces' labels and the lost nodes.
pub struct World<'a> {
    pods: HashMap<String, Vec<&'a Pod>>,
    namespaces: &'a NamespaceLabels,
    lost: &'a HashSet<String>,
    none: BTreeMap<String, String>,
}

impl<'a> World<'a> {
    pub fn new(
        pods: impl IntoIterator<Item = &'a Pod>,
        namespaces: &'a NamespaceLabels,
        lost: &'a HashSet<String>,
    ) -> World<'a> {
        let mut by_ns: HashMap<String, Vec<&'a Pod>> = HashMap::new();
        for p in pods {
            by_ns
                .entry(p.namespace().unwrap_or_default())
                .or_default()
                .push(p);
        }
        World {
            pods: by_ns,
            namespaces,
            lost,
            none: BTreeMap::new(),
        }
    }

    /// The pods of namespace `ns`.
    pub fn pods_in(&self, ns: &str) -> &[&'a Pod] {
        self.pods.get(ns).map(Vec::as_slice).unwrap_or_default()
    }

    pub fn namespace_labels(&self, ns: &str) -> &BTreeMap<String, String> {
        self.namespaces.get(ns).unwrap_or(&self.none)
    }

    /// Not Succeeded or Failed, not being deleted, not on a lost node.
    pub fn live(&self, p: &Pod) -> bool {
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        let node = p.spec.as_ref().and_then(|s| s.node_name.as_deref());
        !matches!(phase, Some("Succeeded" | "Failed"))
            && p.metadata.deletion_timestamp.is_none()
            && node.is_none_or(|n| !self.lost.contains(n))
    }

    /// A live pod's addresses; none for a hostNetwork pod.
    pub fn clients_of(&self, p: &Pod) -> Vec<Client> {
        let host = p
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
        if host || !self.live(p) {
            return Vec::new();
        }
        let name = format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
        let status = p.status.as_ref();
        let mut ips: Vec<&str> = status
            .and_then(|s| s.pod_ips.as_ref())
            .into_iter()
            .flatten()
            .map(|i| i.ip.as_str())
            .collect();
        if ips.is_empty() {
            ips.extend(status.and_then(|s| s.pod_ip.as_deref()));
        }
        let mut out: Vec<Client> = ips
            .into_iter()
            .filter_map(|ip| ip.parse().ok())
            .map(|address| Client {
                address,
                pod: name.clone(),
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// The pods `peer` selects for a Device of namespace `device_ns`.
    pub fn peer_pods(&self, device_ns: &str, peer: &ClientPeer) -> Vec<&'a Pod> {
        let in_ns = |ns: &str| -> Vec<&'a Pod> {
            self.pods_in(ns)
                .iter()
                .copied()
                .filter(|p| {
                    peer.pod_selector
                        .as_ref()
                        .is_none_or(|s| selector::matches(s, p.labels()))
                })
                .collect()
        };
        match &peer.namespace_selector {
            None => in_ns(device_ns),
            Some(sel) => {
                let mut names: Vec<&String> = self.pods.keys().collect();
                names.sort();
                names
                    .into_iter()
                    .filter(|ns| selector::matches(sel, self.namespace_labels(ns)))
                    .flat_map(|ns| in_ns(ns))
                    .collect()
            }
        }
    }

    /// Whether some peer's namespaceSelector matches namespace `ns`.
    pub fn peers_select_namespace(&self, peers: &[ClientPeer], ns: &str) -> bool {
        peers.iter().any(|p| {
            p.namespace_selector
                .as_ref()
                .is_some_and(|s| selector::matches(s, self.namespace_labels(ns)))
        })
    }

    /// The addresses of `pods`, sorted, each once.
    pub fn clients(&self, pods: &[&Pod]) -> Vec<Client> {
        let mut out: Vec<Client> = pods.iter().flat_map(|p| self.clients_of(p)).collect();
        out.sort();
        out.dedup();
        out
    }
}
