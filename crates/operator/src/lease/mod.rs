//! The DeviceLeases' queue, a pure function of (leases with the status
//! they have, Devices, pods, lost nodes, now) → each lease's status and
//! its holder's addresses.
//!
//! Per Device, the admitted leases that have not ended queue in order of
//! creationTimestamp, then namespace/name, then uid. The lease Held stays
//! Held until it ends; when none is, the first of the queue is Held.
//! A lease ends Expired when `durationSeconds` have passed since it was
//! Held, Released when its holder had pods that had not finished and has
//! none left (every one Succeeded, Failed, being deleted, or on a node
//! the operator has taken as lost). Ended leases stay ended. A lease in
//! another namespace than its Device's is admitted only when the
//! Device's allowedClients selects the lease's namespace; else Refused
//! (looked at again at every pass: the Device may come to admit it).

pub mod pod;

use crate::clients::World;
use crate::crd::{Device, DeviceLease, DeviceLeaseStatus, LeaseHolder, LeaseState};
use crate::selector;
use edgelink_access::wire::Client;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use std::collections::{BTreeMap, HashMap};

/// The label a Job's pods carry (and, before Kubernetes 1.27, `job-name`).
pub const JOB_LABEL: &str = "batch.kubernetes.io/job-name";
pub const OLD_JOB_LABEL: &str = "job-name";

/// Devices by (namespace, name).
pub type Devices<'a> = HashMap<(String, String), &'a Device>;

/// One lease, decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Decided {
    /// `namespace/name` of the DeviceLease.
    pub name: String,
    /// (namespace, name) of its Device.
    pub device: (String, String),
    pub status: DeviceLeaseStatus,
    /// The addresses of its holder's live pods.
    pub holders: Vec<Client>,
    pub wait: bool,
    /// `durationSeconds`.
    pub duration: Option<u32>,
}

impl Decided {
    pub fn state(&self) -> Option<LeaseState> {
        self.status.state
    }
}

/// The holder as the HOLDER column shows it.
pub fn describe_holder(h: &LeaseHolder) -> String {
    match (&h.pod, &h.job, &h.pod_selector) {
        (Some(p), _, _) => format!("pod/{p}"),
        (_, Some(j), _) => format!("job/{j}"),
        (_, _, Some(s)) => format!("selector {}", selector::describe(s)),
        _ => "nobody".into(),
    }
}

/// The pods of `l`'s holder (live or not).
fn holder_pods<'a>(l: &DeviceLease, w: &World<'a>) -> Vec<&'a Pod> {
    let ns = l.namespace().unwrap_or_default();
    let h = &l.spec.holder;
    w.pods_in(&ns)
        .iter()
        .copied()
        .filter(|p| match (&h.pod, &h.job, &h.pod_selector) {
            (Some(name), _, _) => &p.name_any() == name,
            (_, Some(job), _) => {
                let labels = p.labels();
                labels.get(JOB_LABEL) == Some(job) || labels.get(OLD_JOB_LABEL) == Some(job)
            }
            (_, _, Some(s)) => selector::matches(s, p.labels()),
            _ => false,
        })
        .collect()
}

fn time(t: Timestamp) -> String {
    Timestamp::from_second(t.as_second())
        .unwrap_or(t)
        .to_string()
}

/// The queue's order: creationTimestamp, namespace/name, uid.
fn order(l: &DeviceLease) -> (Option<Timestamp>, String, String, String) {
    (
        l.metadata.creation_timestamp.as_ref().map(|t| t.0),
        l.namespace().unwrap_or_default(),
        l.name_any(),
        l.uid().unwrap_or_default(),
    )
}

/// Why `l` may not queue for `d` (None: admitted).
fn refusal(l: &DeviceLease, d: &Device, w: &World) -> Option<String> {
    let ns = l.namespace().unwrap_or_default();
    let dns = d.namespace().unwrap_or_default();
    if ns == dns {
        return None;
    }
    let peers = d
        .spec
        .access
        .as_ref()
        .map(|a| a.allowed_clients.as_slice())
        .unwrap_or_default();
    if w.peers_select_namespace(peers, &ns) {
        return None;
    }
    Some(format!(
        "Device {dns}/{} is in another namespace and its spec.access.allowedClients has no namespaceSelector that selects namespace {ns}: a lease may lock only a Device its namespace may use",
        d.name_any()
    ))
}

/// A lease's new status: `state` since now unless it was in it already.
fn entered(
    old: &DeviceLeaseStatus,
    state: LeaseState,
    now: Timestamp,
    message: String,
) -> DeviceLeaseStatus {
    let since = match (old.state, &old.since) {
        (Some(s), Some(t)) if s == state => t.clone(),
        _ => time(now),
    };
    DeviceLeaseStatus {
        state: Some(state),
        since: Some(since),
        expires: None,
        position: None,
        holder: old.holder.clone(),
        holder_seen: old.holder_seen,
        message: Some(message),
    }
}

/// When a lease Held since `since` for `secs` ends.
fn expiry(since: &str, secs: Option<u32>) -> Option<Timestamp> {
    let since: Timestamp = since.parse().ok()?;
    since
        .checked_add(SignedDuration::from_secs(i64::from(secs?)))
        .ok()
}

/// Every lease's status and holders.
pub fn decide(
    leases: &[&DeviceLease],
    devices: &Devices,
    w: &World,
    now: Timestamp,
) -> Vec<Decided> {
    let mut out: Vec<Decided> = Vec::new();
    // Per Device, the indexes in `out` of the leases that queue.
    let mut queues: BTreeMap<(String, String), Vec<usize>> = BTreeMap::new();
    let mut sorted: Vec<&DeviceLease> = leases.to_vec();
    sorted.sort_by_key(|l| order(l));
    for l in sorted {
        let (d, queues_for) = first_pass(l, devices, w, now);
        if let Some(key) = queues_for {
            queues.entry(key).or_default().push(out.len());
        }
        out.push(d);
    }
    for idx in queues.values() {
        queue(&mut out, idx, now);
    }
    out
}

/// `l`'s status when it does not queue; or, when it does, the Device it
/// queues for (its state set by [`queue`]).
fn first_pass(
    l: &DeviceLease,
    devices: &Devices,
    w: &World,
    now: Timestamp,
) -> (Decided, Option<(String, String)>) {
    let ns = l.namespace().unwrap_or_default();
    let key = (
        l.spec.device_namespace(&ns).to_string(),
        l.spec.device.clone(),
    );
    let mut old = l.status.clone().unwrap_or_default();
    old.holder = Some(describe_holder(&l.spec.holder));
    let pods = holder_pods(l, w);
    let live: Vec<&Pod> = pods.iter().copied().filter(|p| w.live(p)).collect();
    let seen = old.holder_seen.unwrap_or(false) || !live.is_empty();
    old.holder_seen = seen.then_some(true);
    let mut decided = Decided {
        name: format!("{ns}/{}", l.name_any()),
        device: key.clone(),
        status: old.clone(),
        holders: Vec::new(),
        wait: l.spec.wait,
        duration: l.spec.duration_seconds,
    };
    if old.state.is_some_and(LeaseState::ended) {
        return (decided, None);
    }
    let held_until = (old.state == Some(LeaseState::Held))
        .then(|| {
            expiry(
                old.since.as_deref().unwrap_or_default(),
                l.spec.duration_seconds,
            )
        })
        .flatten();
    let (state, message) = if seen && live.is_empty() {
        (
            LeaseState::Released,
            "the holder's pods have all finished, been deleted, or their node was lost".to_string(),
        )
    } else if held_until.is_some_and(|t| t <= now) {
        let secs = l.spec.duration_seconds.unwrap_or_default();
        (
            LeaseState::Expired,
            format!("durationSeconds ({secs}) ran out"),
        )
    } else {
        let Some(d) = devices.get(&key) else {
            let m = format!("Device {}/{} does not exist", key.0, key.1);
            decided.status = entered(&old, LeaseState::Waiting, now, m);
            return (decided, None);
        };
        if let Some(why) = refusal(l, d, w) {
            decided.status = entered(&old, LeaseState::Refused, now, why);
            return (decided, None);
        }
        decided.holders = w.clients(&live);
        return (decided, Some(key));
    };
    decided.status = entered(&old, state, now, message);
    (decided, None)
}

/// The queue of one Device (`idx` into `out`, in order): the lease Held
/// keeps it, else the first is Held; the others wait, numbered.
fn queue(out: &mut [Decided], idx: &[usize], now: Timestamp) {
    let holder = idx
        .iter()
        .copied()
        .find(|&i| out[i].status.state == Some(LeaseState::Held))
        .or(idx.first().copied());
    let Some(holder) = holder else { return };
    let holder_name = out[holder].name.clone();
    let mut position = 0;
    for &i in idx {
        let old = out[i].status.clone();
        let (dns, dname) = out[i].device.clone();
        if i == holder {
            let mut s = entered(
                &old,
                LeaseState::Held,
                now,
                format!("only the holder's pods reach Device {dns}/{dname}"),
            );
            s.expires = s
                .since
                .as_deref()
                .and_then(|t| expiry(t, out[i].duration))
                .map(time);
            out[i].status = s;
        } else {
            position += 1;
            let mut s = entered(
                &old,
                LeaseState::Waiting,
                now,
                format!("waiting behind {holder_name} for Device {dns}/{dname}"),
            );
            s.position = Some(position);
            out[i].status = s;
        }
    }
}

#[cfg(test)]
mod tests;
