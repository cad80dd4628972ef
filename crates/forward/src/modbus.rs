//! A Modbus/TCP forward with `"multiplex": true`: its clients are served
//! by one multiplexer (edgelink-modbus) per forward, which carries their
//! requests over at most `maxConnections` (default 1) connections to the
//! device, made in the pod's namespace as the relay's are. The access
//! rules apply as to any client: checked at accept, and again when they
//! change (a client no longer let through is reset).
//!
//! A hand-over does not carry a multiplexed client: it is reset (it
//! connects again to the new daemon); its requests on their way are lost
//! with it.

use crate::clients;
use crate::connection::Slot;
use crate::ctx::Ctx;
use crate::cutoff::Cut;
use edgelink_access::Ended;
use edgelink_modbus::{Config, Connect, Mux};
use edgelink_relay::Counters;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

/// The forward's multiplexer, when it multiplexes.
pub(crate) fn mux_of(ctx: &Ctx) -> Option<Arc<Mux>> {
    let f = &ctx.forward;
    let m = f.spec.modbus?;
    let stats = f.modbus.clone()?;
    let limits = &f.protection.limits;
    let cfg = Config {
        max_connections: f.spec.max_connections.unwrap_or(1) as usize,
        max_in_flight: m.max_in_flight as usize,
        queue_timeout: limits.queue_timeout,
        response_timeout: Duration::from_millis(m.response_timeout_ms),
        max_queue: limits.max_queue as usize,
        connect_retries: limits.connect_retries,
        retry_backoff: limits.retry_backoff,
    };
    let c = Arc::new(ctx.clone_for());
    let connect: Connect = Arc::new(move || {
        let c = c.clone();
        Box::pin(async move {
            let target = c.target().await?;
            let r = crate::connection::connect(&c, target).await;
            c.forward
                .reach(r.is_ok(), r.as_ref().err().map(|e| e.to_string()));
            r
        })
    });
    Some(Arc::new(Mux::with_stats(cfg, connect, stats)))
}

/// Serve one accepted client until it closes, is reset, or the rules
/// change against it; then its audit line, with its request count.
pub(crate) async fn client(
    mux: Arc<Mux>,
    client: tokio::net::TcpStream,
    ctx: Arc<Ctx>,
    slot: Slot,
    peer: std::net::IpAddr,
) {
    Counters::inc(&ctx.forward.counters.total);
    let since = clients::now_ms();
    let fd = client.as_raw_fd();
    let served = mux.serve(client);
    tokio::pin!(served);
    let mut park = ctx.cutoff.token(&ctx.shared.lot);
    let (ended, requests) = loop {
        tokio::select! {
            end = &mut served => {
                let how = if end.reset.is_some() { Ended::Reset } else { Ended::Closed };
                break (how, Some(end.requests));
            }
            () = park.cancelled() => {
                let cut = match ctx.cutoff.why(&ctx.shared.lot) {
                    Cut::Revoked => clients::still_admits(&ctx, (peer, 0).into()).err(),
                    Cut::HandOver | Cut::Closed => Some(Ended::Reset),
                };
                match cut {
                    None => park = ctx.cutoff.token(&ctx.shared.lot),
                    Some(e) => {
                        // The socket is still open (in `served`): a reset,
                        // not a FIN, as it goes.
                        let _ = crate::sockopt::linger_zero(fd);
                        break (e, None);
                    }
                }
            }
        }
    };
    drop(slot);
    clients::audit_with(&ctx, peer, since, (0, 0), ended, requests);
}
