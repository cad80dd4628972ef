//! The running process around the node: its settings, its name in
//! hand-overs, the gate between serving, handing over and stopping; the
//! reconcile loop and the orderly stop (drain, reset, exit).

use crate::config::RunArgs;
use crate::gate::Gate;
use edgelink_node::Node;
use edgelink_status::http::Endpoint;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::signal::unix::Signal;

pub struct Daemon {
    pub args: RunArgs,
    /// The attachments this node serves.
    pub node: Arc<Node>,
    /// Who this daemon is in a hand-over (`--instance-id`).
    pub instance: String,
    /// The instance this daemon took over from: never handed back to it.
    pub taken_from: Mutex<Option<String>>,
    /// Serving, handing over or stopping: one at a time.
    pub gate: Gate,
}

impl Daemon {
    pub fn new(args: RunArgs, node: Arc<Node>) -> Arc<Daemon> {
        Arc::new(Daemon {
            instance: instance_id(&args.instance_id),
            args,
            node,
            taken_from: Mutex::new(None),
            gate: Gate::default(),
        })
    }

    /// What the status and metrics endpoints serve, and share with the
    /// forwards.
    pub fn endpoint(&self) -> Arc<Endpoint> {
        Arc::new(Endpoint {
            source: self.node.clone(),
            limits: self.args.status_limits(),
            lot: self.node.shared.lot.clone(),
            fds: self.node.shared.fds.clone(),
            commit: crate::COMMIT,
        })
    }

    /// The first pass: what was handed over is filed under its records
    /// (what no record claims is reset) and every record is served. Run
    /// before the webhook's first report: one before it would say the node
    /// serves nothing.
    pub async fn first_pass(&self) {
        let d = &self.node;
        d.reconcile().await;
        for id in d.shared.lot.drop_unclaimed() {
            tracing::warn!(container = %id.0, ifname = %id.1, forward = %id.2,
                "handed over, but no record serves it now: its connections are reset");
        }
    }

    /// After [`Daemon::first_pass`]: a pass over what changed on every
    /// nudge (a record changed, a request of the plugin) and a full pass
    /// every `--reconcile-interval`, until SIGTERM or SIGINT.
    pub async fn serve(&self, term: &mut Signal, int: &mut Signal) {
        let d = &self.node;
        loop {
            tokio::select! {
                _ = d.nudge.notified() => {
                    // Let a burst of record changes settle into one pass.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    d.reconcile_asked().await;
                }
                _ = tokio::time::sleep(self.args.reconcile_interval) => d.reconcile().await,
                _ = term.recv() => break,
                _ = int.recv() => break,
            }
        }
    }

    /// Stop in order: a hand-over under way ends first (this process exits
    /// from it if it succeeds; if it fails, what it took back is served
    /// again, to drain); no new connections; the grace period to drain;
    /// then what is left is reset.
    pub async fn stop(&self) {
        let d = &self.node;
        if self.gate.stop().await {
            d.reconcile().await;
        }
        tracing::info!(grace = ?self.args.grace_period, "stopping: no new connections, draining");
        d.stop_listening();
        let deadline = tokio::time::Instant::now() + self.args.grace_period;
        while d.active() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let left = d.active();
        if left > 0 {
            tracing::warn!(
                connections = left,
                "grace period over: resetting what is left"
            );
            // Reset, not closed: bytes still in the pipes are lost, and a
            // clean end of file would pass a cut transfer off as whole.
            d.close_connections();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
            while d.active() > 0 && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        // What nobody serves (a hand-over took it back and no record claims
        // it now) is reset: closed, it would end with a FIN as if it were
        // whole.
        let reset = d.shared.lot.reset_all();
        if reset > 0 {
            tracing::warn!(
                connections = reset,
                "stopping: reset what was parked and not served"
            );
        }
    }
}

/// This daemon's name in hand-overs: `--instance-id`, else the process ID
/// and the time it started.
pub fn instance_id(given: &Option<String>) -> String {
    given.clone().filter(|s| !s.is_empty()).unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        format!("pid-{}-{t}", std::process::id())
    })
}
