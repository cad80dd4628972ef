//! Forwards that lost their sockets start again: after a hand-over that
//! failed (all of them), or when a worker thread died (those it served).

use crate::node::Node;
use edgelink_attachment::Protocol;
use std::sync::atomic::Ordering;

impl Node {
    /// Worker `slot` died and was replaced: the listeners it held are gone
    /// with it. Every TCP forward had one there and starts again, whole
    /// (on every worker), on the next pass; a UDP forward only if it was
    /// served there, since restarting it ends its session table.
    /// Connections and sessions on the other workers go on.
    pub fn worker_died(&self, slot: usize) {
        self.listen_again_on(Some(slot), &format!("worker {slot} died: listening again"));
        self.worker_replacements.fetch_add(1, Ordering::Relaxed);
        self.ask_pass();
    }

    /// The relay forwards that were listening on worker `slot` (`None`:
    /// on any) start again on the next pass.
    pub(crate) fn listen_again_on(&self, slot: Option<usize>, why: &str) {
        let workers = &self.shared.workers;
        for a in self.map().values() {
            // The kernel path's forwards have no listener on a worker.
            for f in a.forwards.iter().filter(|f| f.spec.path.is_relay()) {
                let there = f.spec.protocol == Protocol::Tcp
                    || slot.is_none_or(|s| workers.for_udp(f.spec.port) == s);
                if there && f.lock().listener == "listening" {
                    f.error(why);
                    f.set_listener("failed");
                }
            }
        }
    }
}
