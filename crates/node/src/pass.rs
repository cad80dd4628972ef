//! One reconcile pass: make the served set equal to the records on disk.
//! New records start, removed or changed ones stop, attachments whose
//! netns is gone are reclaimed ([`crate::reclaim`]), and reservations
//! without a record are collected.

use crate::attachment::{Attachment, Key};
use crate::node::Node;
use edgelink_attachment::{Record, RecordError, RecordStore};
use edgelink_netns::{Netns, NetnsError};
use edgelink_status::{now, MalformedRecord};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What one listing of the records said.
struct Listing {
    records: HashMap<Key, Record>,
    malformed: Vec<MalformedRecord>,
    /// A record exists but could not be read (EMFILE at the fd limit,
    /// EIO): it says nothing about its attachment, so nothing is stopped
    /// in this pass.
    unreadable: bool,
    /// File names of records that cannot be parsed (torn, edited by
    /// hand): the attachment each would name goes on with the record it
    /// was started from.
    torn: Vec<String>,
}

fn list(store: &RecordStore) -> Option<Listing> {
    let listed = match store.list() {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list attachment records");
            return None;
        }
    };
    let mut l = Listing {
        records: HashMap::new(),
        malformed: Vec::new(),
        unreadable: false,
        torn: Vec::new(),
    };
    for (path, r) in listed {
        match r {
            Ok(rec) => {
                l.records
                    .insert((rec.container_id.clone(), rec.ifname.clone()), rec);
            }
            Err(e) => {
                if let RecordError::Io { source, .. } = &e {
                    l.unreadable |= source.kind() != std::io::ErrorKind::NotFound;
                }
                if let (RecordError::Malformed { .. }, Some(name)) = (&e, path.file_name()) {
                    l.torn.push(name.to_string_lossy().into_owned());
                }
                tracing::warn!(path = %path.display(), error = %e, "skipping a malformed attachment record");
                l.malformed.push(MalformedRecord {
                    path: path.display().to_string(),
                    error: e.to_string(),
                });
            }
        }
    }
    Some(l)
}

impl Node {
    /// One pass: make the served set equal to the records on disk.
    pub async fn reconcile(self: &Arc<Self>) {
        let _pass = self.pass.lock().await;
        let t0 = std::time::Instant::now();
        let store = RecordStore::new(&self.settings.state_dir);
        let Some(Listing {
            mut records,
            malformed,
            unreadable,
            torn,
        }) = list(&store)
        else {
            return;
        };
        // A served attachment whose record file is now malformed keeps the
        // record it was started from: its forwards and connections go on,
        // its netns is still checked (and reclaimed when gone), and the
        // file is reported until it is fixed or removed (a DEL removes it).
        for (k, a) in self.map().iter() {
            if !records.contains_key(k) && torn.iter().any(|n| RecordStore::may_name(n, &k.0, &k.1))
            {
                records.insert(k.clone(), a.record.clone());
            }
        }
        let mut changed = {
            let mut m = self.malformed.lock().unwrap_or_else(|e| e.into_inner());
            let differs = *m != malformed;
            *m = malformed;
            differs
        };
        changed |= self.stop_stale(&records, unreadable).await;
        for (k, rec) in records {
            changed |= self.serve_or_reclaim(k, rec).await;
        }
        self.reclaimer.gc_reservations_when_due();
        changed |= self.check_conntrack();
        self.last_reconcile.store(now(), Ordering::Relaxed);
        self.last_pass_micros
            .store(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
        self.full_passes.fetch_add(1, Ordering::Relaxed);
        self.access.prune();
        if changed {
            self.changed();
        }
    }

    /// Stop what no longer has a record (DEL), or whose record changed.
    /// An attachment whose netns could not be entered is started afresh on
    /// every pass (a forward that failed alone is retried alone).
    async fn stop_stale(&self, records: &HashMap<Key, Record>, unreadable: bool) -> bool {
        let stale: Vec<Key> = self
            .map()
            .iter()
            .filter(|(k, a)| match records.get(*k) {
                Some(rec) => *rec != a.record || a.error.is_some(),
                None => !unreadable,
            })
            .map(|(k, _)| k.clone())
            .collect();
        let mut changed = false;
        for k in stale {
            changed |= self.stop_if(&k, |_| true).await;
        }
        changed
    }

    /// Stop attachment `k` if it is served and `stale` says so.
    pub(crate) async fn stop_if(&self, k: &Key, stale: impl Fn(&Attachment) -> bool) -> bool {
        let removed = {
            let mut map = self.map();
            match map.get(k) {
                Some(a) if stale(a) => map.remove(k),
                _ => None,
            }
        };
        let Some(a) = removed else {
            return false;
        };
        tracing::info!(container = %k.0, ifname = %k.1, "attachment removed: closing its listeners");
        a.stop().await;
        true
    }

    /// One record: served (started, or its failed forwards retried), or
    /// reclaimed when its netns is gone. Returns whether anything changed.
    pub(crate) async fn serve_or_reclaim(self: &Arc<Self>, k: Key, rec: Record) -> bool {
        let running = self.map().get(&k).map(|a| a.netns_id);
        let opened = Netns::open(&rec.netns);
        if let Some(why) = crate::provenance::elsewhere(&rec, &opened) {
            return self.not_its_namespace(&k, &rec, &why).await;
        }
        match opened {
            Ok(ns) => {
                let id = ns.id().ok();
                if let Some(old) = running {
                    if id == Some(old) {
                        return !self.draining.load(Ordering::Relaxed)
                            && self.retry_failed(&k).await;
                    }
                    // Same path, another namespace: the old one is gone.
                    let removed = self.map().remove(&k);
                    if let Some(a) = removed {
                        a.stop().await;
                    }
                }
                if self.draining.load(Ordering::Relaxed) {
                    return false;
                }
                let a = self.start(rec, ns).await;
                let netns_id = a.netns_id;
                self.map().insert(k.clone(), a);
                self.kernel_again_beside(&k, netns_id).await;
                true
            }
            Err(NetnsError::NotFound { .. }) | Err(NetnsError::NotNetns { .. })
                if self.sees_pids_of(&rec) =>
            {
                let removed = self.map().remove(&k);
                if let Some(a) = removed {
                    a.stop().await;
                }
                if self.reclaimer.release_delegated(&rec).await {
                    self.reclaimer.reclaim(&rec);
                }
                true
            }
            Err(NetnsError::NotFound { .. }) | Err(NetnsError::NotNetns { .. }) => {
                tracing::warn!(netns = %rec.netns,
                    "a /proc netns path of another PID namespace than this daemon's: not reclaiming it \
                     (run edgelinkd with hostPID, docs/install.md)");
                false
            }
            Err(e) => {
                tracing::warn!(netns = %rec.netns, error = %e, "cannot open the netns of an attachment");
                false
            }
        }
    }

    /// With a kernel-path forward on the node, whether the node's conntrack
    /// table has room (`--conntrack-min`, 90% full): a warning in /status
    /// when it does not. Returns whether the warnings changed.
    pub(crate) fn check_conntrack(&self) -> bool {
        let kernel = self.map().values().any(|a| a.kernel.is_some());
        let now: Vec<String> = if kernel {
            match edgelink_kernel_path::conntrack_headroom(self.settings.conntrack_min) {
                Ok(w) => w.into_iter().collect(),
                Err(e) => vec![e.to_string()],
            }
        } else {
            Vec::new()
        };
        let mut w = self.warnings.lock().unwrap_or_else(|e| e.into_inner());
        if *w == now {
            return false;
        }
        for line in &now {
            tracing::warn!(warning = %line, "kernel path");
        }
        *w = now;
        true
    }
}
