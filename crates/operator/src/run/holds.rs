//! Step 4 of a Device's reconcile (`run::controller`): who holds its
//! virtual address (`spec.virtualAddresses`). The choice is the pure
//! `edgelink_operator::vip::choose` over the nodes' decisions; the grants
//! are given in the answers to the nodes' heartbeats (`run::server`) from the
//! book of `run::grants`, so that an address moves as soon as a grant
//! allows, not at the next reconcile. A move is an Event on the Device
//! and a count in the metrics.

use crate::run::context::Ctx;
use crate::run::grants::key;
use crate::run::metrics::DeviceKey;
use edgelink_operator::crd::{Device, DeviceStatus};
use edgelink_operator::nodes::{Heard, NodeDecision};
use edgelink_operator::vip::{self, Candidate};
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use std::time::{Instant, SystemTime};

/// Choose `d`'s holder from the nodes' `decisions`, put it in the book,
/// and fill the status (holder and since), with an Event when it moved.
pub async fn place(
    ctx: &Ctx,
    d: &Device,
    decisions: &[NodeDecision],
    old: &DeviceStatus,
    status: &mut DeviceStatus,
) {
    let ns = d.namespace().unwrap_or_default();
    if d.spec.virtual_addresses.is_empty() || decisions.is_empty() {
        ctx.holds.forget(&key(d));
        return;
    }
    let candidates: Vec<Candidate> = decisions
        .iter()
        .filter_map(|dec| {
            let pod = dec.status.pod.as_ref()?;
            let alive = ctx.reports.heard_state(&dec.status.node) == Heard::Alive;
            Some(Candidate {
                node: dec.status.node.clone(),
                pod: format!("{ns}/{pod}"),
                alive,
                serving: alive && vip::serves(&dec.status),
            })
        })
        .collect();
    let now = Instant::now();
    let (holder, chosen) = {
        let mut book = ctx.holds.lock();
        let holder = book.holder(&key(d), now);
        let current = book
            .chosen(&key(d))
            .or_else(|| holder.as_ref().map(|h| h.0.clone()));
        let chosen = vip::choose(current.as_deref(), &candidates);
        let pods = candidates
            .iter()
            .map(|c| (c.node.clone(), c.pod.clone()))
            .collect();
        book.place(&key(d), pods, chosen.clone());
        (holder, chosen)
    };
    if let Some((_, node, since)) = &holder {
        status.virtual_address_holder = Some(node.clone());
        let at = SystemTime::now() - now.saturating_duration_since(*since);
        status.virtual_address_since = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .ok()
            .and_then(|t| k8s_openapi::jiff::Timestamp::from_second(t.as_secs() as i64).ok())
            .map(|t| t.to_string());
    }
    let was = old.virtual_address_holder.as_deref();
    let is = status.virtual_address_holder.as_deref();
    if is.is_some() && was != is {
        moved(ctx, d, was, is.unwrap_or_default()).await;
    } else if was.is_some() && is.is_none() {
        tracing::info!(device = %d.name_any(), chosen = chosen.as_deref().unwrap_or("nobody"), "the virtual address is between holders");
    }
}

async fn moved(ctx: &Ctx, d: &Device, from: Option<&str>, to: &str) {
    ctx.metrics
        .vip_moves
        .get_or_create(&DeviceKey {
            namespace: d.namespace().unwrap_or_default(),
            device: d.name_any(),
        })
        .inc();
    let addrs = d.spec.virtual_addresses.join(", ");
    let note = match from {
        Some(f) => format!("{addrs} moved from node {f} to node {to}"),
        None => format!("{addrs} held by node {to}"),
    };
    tracing::info!(device = %d.name_any(), "{note}");
    let ev = Event {
        type_: EventType::Normal,
        reason: "VirtualAddressMoved".into(),
        note: Some(note),
        action: "Hold".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &d.object_ref(&())).await {
        tracing::warn!(device = %d.name_any(), error = %e, "event not published");
    }
}
