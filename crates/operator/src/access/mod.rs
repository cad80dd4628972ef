//! The access rules of each node, as edgelinkd gets them in the answer to
//! its heartbeat (`edgelink_access::wire`): per proxy pod on the node
//! whose Device has `spec.access.allowedClients` or a lease Held, the
//! addresses of the pods allowedClients selects now, and the lease's
//! holders and waiters. A proxy pod of an open Device is absent (open to
//! every client). Pure: a function of (Devices, pods, namespaces, the
//! leases decided by `crate::lease`); the generation is a hash of the
//! content, so it changes only with it. [`book`] keeps the leader's
//! current rules and answers heartbeats from them.

pub mod book;

use crate::clients::World;
use crate::crd::{Device, ForwardPath, LeaseState};
use crate::lease::{Decided, Devices};
use crate::render::PROXY_LABEL;
use crate::render::{DEVICE_LABEL, MANAGER};
use crate::verdict::Verdict;
use edgelink_access::wire::{AccessRules, AttachmentAccess, Client, LeaseAccess};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};

/// The most one node's rules take as JSON: edgelinkd reads answers up to
/// 4 MiB, and the answer carries the virtual-address grants too.
pub const MAX_RULES_BYTES: usize = 3 << 20;

/// Per proxy pod (`namespace/pod`), who may use it.
pub type Attachments = BTreeMap<String, AttachmentAccess>;

/// A name for `attachments`: the first 16 hex digits of the SHA-256 of
/// their JSON (a BTreeMap of sorted lists: the same content, the same
/// text). Never "".
pub fn generation(attachments: &Attachments) -> String {
    let json = serde_json::to_vec(attachments).unwrap_or_default();
    let digest = Sha256::digest(&json);
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The pods `d`'s allowedClients selects, as addresses; None when it has
/// none (every client).
pub fn allowed(d: &Device, w: &World) -> Option<Vec<Client>> {
    let access = d.spec.access.as_ref().filter(|a| a.restricts())?;
    let ns = d.namespace().unwrap_or_default();
    let pods: Vec<&Pod> = access
        .allowed_clients
        .iter()
        .flat_map(|peer| w.peer_pods(&ns, peer))
        .collect();
    Some(w.clients(&pods))
}

/// The lease Held on each Device, with its waiters.
fn leases(decided: &[Decided]) -> BTreeMap<(String, String), LeaseAccess> {
    let mut out: BTreeMap<(String, String), LeaseAccess> = BTreeMap::new();
    for l in decided
        .iter()
        .filter(|l| l.state() == Some(LeaseState::Held))
    {
        out.insert(
            l.device.clone(),
            LeaseAccess {
                name: l.name.clone(),
                holders: l.holders.clone(),
                waiting: Vec::new(),
            },
        );
    }
    for l in decided {
        if l.state() == Some(LeaseState::Waiting) && l.wait {
            if let Some(held) = out.get_mut(&l.device) {
                held.waiting.extend(l.holders.iter().cloned());
            }
        }
    }
    for held in out.values_mut() {
        let set: BTreeSet<Client> = held.waiting.drain(..).collect();
        held.waiting = set.into_iter().collect();
    }
    out
}

/// A proxy pod: its node, key (`namespace/pod`) and Device's name; None
/// for any other pod, and for one not scheduled or finished.
fn proxy(p: &Pod) -> Option<(String, String, String)> {
    let labels = p.labels();
    if labels
        .get("app.kubernetes.io/managed-by")
        .map(String::as_str)
        != Some(MANAGER)
        || !labels.contains_key(PROXY_LABEL)
    {
        return None;
    }
    let device = labels.get(DEVICE_LABEL)?.clone();
    let node = p.spec.as_ref()?.node_name.clone()?;
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return None;
    }
    let key = format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
    Some((node, key, device))
}

/// Every node's attachments: per proxy pod among `pods` of a Device that
/// restricts its clients or is Held under a lease.
pub fn rules<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    devices: &Devices,
    w: &World,
    decided: &[Decided],
) -> BTreeMap<String, Attachments> {
    let held = leases(decided);
    let mut per_device: BTreeMap<(String, String), Option<AttachmentAccess>> = BTreeMap::new();
    let mut out: BTreeMap<String, Attachments> = BTreeMap::new();
    for p in pods {
        let Some((node, key, device)) = proxy(p) else {
            continue;
        };
        let dkey = (p.namespace().unwrap_or_default(), device);
        let entry = per_device.entry(dkey.clone()).or_insert_with(|| {
            let d = devices.get(&dkey)?;
            let a = AttachmentAccess {
                device: format!("{}/{}", dkey.0, dkey.1),
                allowed: allowed(d, w),
                lease: held.get(&dkey).cloned(),
            };
            (a.allowed.is_some() || a.lease.is_some()).then_some(a)
        });
        if let Some(a) = entry {
            out.entry(node).or_default().insert(key, a.clone());
        }
    }
    out
}

/// `attachments` as one node's rules of at most `max` bytes of JSON, and
/// the Devices whose lists were cut to fit (`namespace/name`). Every
/// list is cut to the same length, halved until the rules fit: the
/// clients left out are refused (the rules narrow, never widen).
pub fn fit(mut attachments: Attachments, max: usize) -> (AccessRules, Vec<String>) {
    let size = |a: &Attachments| serde_json::to_vec(a).map(|v| v.len()).unwrap_or(usize::MAX);
    let mut cut = BTreeSet::new();
    let longest = attachments
        .values()
        .flat_map(|a| {
            let l = a.lease.as_ref();
            [
                a.allowed.as_ref().map_or(0, Vec::len),
                l.map_or(0, |l| l.holders.len()),
                l.map_or(0, |l| l.waiting.len()),
            ]
        })
        .max()
        .unwrap_or(0);
    let mut cap = longest;
    while size(&attachments) > max && cap > 0 {
        cap /= 2;
        for a in attachments.values_mut() {
            let mut lists: Vec<&mut Vec<Client>> = a.allowed.iter_mut().collect();
            if let Some(l) = a.lease.as_mut() {
                lists.push(&mut l.holders);
                lists.push(&mut l.waiting);
            }
            for list in lists {
                if list.len() > cap {
                    list.truncate(cap);
                    cut.insert(a.device.clone());
                }
            }
        }
    }
    let rules = AccessRules {
        generation: generation(&attachments),
        attachments,
    };
    (rules, cut.into_iter().collect())
}

/// The condition `AccessEnforced` of a Device that restricts its clients
/// or is under a lease (`leased`): False when some ports take the kernel
/// path (edgelinkd does not see those connections) or the rules were cut
/// to fit (`cut`); None for an open Device.
pub fn verdict(d: &Device, leased: bool, cut: bool) -> Option<Verdict> {
    let restricts = d.spec.access.as_ref().is_some_and(|a| a.restricts());
    if !restricts && !leased {
        return None;
    }
    let kernel: Vec<&str> = d
        .spec
        .ports
        .iter()
        .filter(|p| p.path == Some(ForwardPath::Kernel))
        .map(|p| p.name.as_str())
        .collect();
    if !kernel.is_empty() {
        let policy = if restricts {
            format!("only the NetworkPolicy {} limits who reaches them (where the cluster's network enforces NetworkPolicies)", d.name_any())
        } else {
            "nothing limits who reaches them".into()
        };
        return Some(Verdict::new(
            "False",
            "KernelPath",
            format!(
                "port(s) {} take the kernel path: edgelinkd does not see their connections, so neither allowedClients nor leases are checked there; {policy}",
                kernel.join(", ")
            ),
        ));
    }
    if cut {
        return Some(Verdict::new(
            "False",
            "TooManyClients",
            format!("the node's access rules passed {MAX_RULES_BYTES} bytes: the lists of clients were cut, and the clients left out are refused"),
        ));
    }
    Some(Verdict::new(
        "True",
        "Enforced",
        "edgelinkd checks every connection against allowedClients and the lease held",
    ))
}

#[cfg(test)]
mod tests;
