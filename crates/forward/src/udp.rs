//! A UDP forward's relay task: one socket, on one worker, with its
//! session table (edgelink-relay's `relay_udp`); parked whole for a
//! hand-over.

use crate::ctx::{target_name, Ctx};
use edgelink_handover::lot::Item;
use edgelink_relay::{UdpConfig, UdpForward};
use std::sync::Arc;
use tokio::task::JoinHandle;
use tracing::Instrument;

/// Relay `forward` on worker `w` until the forward stops or parks.
pub fn spawn(ctx: &Ctx, w: usize, forward: UdpForward) -> JoinHandle<()> {
    let f = ctx.forward.clone();
    let spec = &f.spec;
    let span = tracing::info_span!("forward", name = %spec.name, port = spec.port, target = %target_name(&f), worker = w);
    let settings = &ctx.shared.settings;
    let cfg = UdpConfig {
        idle_timeout: settings.udp_idle_timeout,
        max_sessions: settings.udp_max_sessions as usize,
        gso: settings.udp_gso,
        on_end: crate::clients::udp_hook(ctx),
        ..Default::default()
    };
    let private = ctx.private.clone();
    // A forward's datagrams also pass the access rules (a client waiting
    // for its lease is refused: a datagram cannot wait).
    let access = ctx.access.clone();
    let refuse: Arc<edgelink_relay::RefuseFn> = match f.reverse.clone() {
        Some(r) => Arc::new(move |peer, ifindex| !r.admits(peer, ifindex, private.ifindex)),
        None => Arc::new(move |peer, ifindex| {
            private.refuses(peer, None, ifindex)
                || access.verdict(peer.ip()) != edgelink_access::Verdict::Allowed
        }),
    };
    let mut stop = ctx.stop.clone();
    let fr = f.clone();
    let source = edgelink_fd_reserve::Guarded::wrap(ctx.factory.clone(), &ctx.shared.fds);
    let target: edgelink_relay::UdpTarget = match f.reverse.clone() {
        Some(r) => edgelink_relay::UdpTarget::Dynamic(Arc::new(move || r.target())),
        None => spec.target.into(),
    };
    let counters = f.counters.clone();
    let (lot, id, guard) = (ctx.shared.lot.clone(), ctx.id(), ctx.shared.lot.guard());
    let park = lot.token();
    ctx.shared.workers.spawn(
        w,
        async move {
            let _guard = guard;
            let shutdown = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            match edgelink_relay::relay_udp(
                forward, target, source, cfg, counters, refuse, shutdown, &park,
            )
            .await
            {
                Ok(Some(parked)) => lot.park(Item::Udp(id, parked)),
                Ok(None) => fr.set_listener("stopped"),
                Err(e) => {
                    tracing::warn!(error = %e, "UDP relay stopped");
                    fr.error(e);
                    fr.set_listener("failed");
                }
            }
        }
        .instrument(span),
    )
}
