//! The reachability probe of a TCP forward: a connect to its target now
//! and then, so that /status says whether the device answers before any
//! client asks.

use crate::connection::connect;
use crate::ctx::Ctx;
use edgelink_status::now;

/// Keep `reachability` fresh for forwards nobody uses right now.
pub async fn run(mut ctx: Ctx) {
    let every = ctx.shared.settings.probe_interval;
    loop {
        let recent = {
            let s = ctx.forward.lock();
            now().saturating_sub(s.reachability.checked_at) < every.as_secs()
        };
        if !recent {
            let probe = match ctx.target().await {
                Ok(target) => connect(&ctx, target).await,
                Err(e) => Err(e),
            };
            match probe {
                Ok(s) => {
                    drop(s);
                    ctx.forward.reach(true, None);
                }
                Err(e) => ctx.forward.reach(false, Some(e.to_string())),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = ctx.stop.wait_for(|s| *s) => return,
        }
    }
}
