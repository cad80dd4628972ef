//! What the node's attachments add up to, as reported: /status (and with
//! it /metrics and the webhook, through [`edgelink_status::Source`]) and
//! the answer to the plugin's CHECK.

use crate::node::Node;
use edgelink_status::{AttachmentStatus, Gauges, Health, Source, Status};
use std::sync::atomic::Ordering;

impl Node {
    pub fn status(&self) -> Status {
        let mode = self.grants.mode();
        let mut attachments: Vec<AttachmentStatus> =
            self.map().values().map(|a| a.status(mode)).collect();
        attachments.sort_by(|a, b| (&a.container_id, &a.ifname).cmp(&(&b.container_id, &b.ifname)));
        Status {
            node: self.name.clone(),
            version: env!("CARGO_PKG_VERSION").into(),
            started_at: self.started_at,
            last_reconcile_at: self.last_reconcile.load(Ordering::Relaxed),
            draining: self.draining.load(Ordering::Relaxed),
            attachments,
            malformed_records: self
                .malformed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            reclaimed_total: self.reclaimer.reclaimed.load(Ordering::Relaxed),
            retired_links_deleted_total: self.reaped.load(Ordering::Relaxed),
            workers: self.shared.workers.len(),
            worker_replacements_total: self.worker_replacements.load(Ordering::Relaxed),
            warnings: self
                .warnings
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        }
    }

    /// The answer to the plugin's CHECK.
    pub fn check(&self, container_id: &str, ifname: &str) -> edgelink_attachment::CheckReply {
        let map = self.map();
        match map.get(&(container_id.to_string(), ifname.to_string())) {
            None => edgelink_attachment::CheckReply {
                found: false,
                forwards: Vec::new(),
            },
            Some(a) => edgelink_attachment::CheckReply {
                found: true,
                forwards: a
                    .forwards
                    .iter()
                    .map(|f| {
                        let s = f.lock();
                        edgelink_attachment::ForwardLive {
                            name: f.spec.name.clone(),
                            listening: s.listener == "listening",
                            error: s.last_error.clone(),
                        }
                    })
                    .collect(),
            },
        }
    }
}

/// The status surface reads the node through this.
impl Source for Node {
    fn status(&self) -> Status {
        Node::status(self)
    }

    fn health(&self) -> Health {
        Health {
            last_reconcile: self.last_reconcile.load(Ordering::Relaxed),
            interval: self.settings.reconcile_interval,
            draining: self.draining.load(Ordering::Relaxed),
        }
    }

    fn gauges(&self) -> Gauges {
        Gauges {
            socket_pool_taken: self.pool_taken.load(Ordering::Relaxed),
            pipes_in_use: self.pipes.stats().in_use as i64,
            last_pass_seconds: self.last_pass_micros.load(Ordering::Relaxed) as f64 / 1e6,
            full_passes: self.full_passes.load(Ordering::Relaxed),
            record_passes: self.record_passes.load(Ordering::Relaxed),
        }
    }

    fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn audit(&self) -> Option<edgelink_access::Audit> {
        Some(self.settings.audit.clone())
    }
}
