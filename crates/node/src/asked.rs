//! What the next pass is asked to look at: every record (a full pass,
//! [`Node::reconcile`]), or only the records that changed (a pass over
//! them, [`Node::reconcile_records`]): the plugin names the attachment it
//! ADDed or DELeted, inotify names the files. At 500 attachments a full
//! pass reads 500 records and opens 500 netns; the plugin asks for one
//! after each ADD, and in a burst of pods each ran beside the next ADD.
//! The periodic pass is always a full one: it reclaims what a pod left
//! without a DEL and retries what failed.

use crate::attachment::Key;
use crate::node::{Asked, Node};
use edgelink_attachment::RecordStore;
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Node {
    /// Ask for a full pass, soon.
    pub fn ask_pass(&self) {
        self.asked().all = true;
        self.nudge.notify_one();
    }

    /// Ask for a pass over the record of (container ID, ifname), soon.
    pub fn ask_record(&self, container_id: &str, ifname: &str) {
        self.ask_file(RecordStore::file_name(container_id, ifname));
    }

    /// Ask for a pass over the record file `name` (inotify saw it change).
    pub fn ask_file(&self, name: String) {
        if RecordStore::is_record_name(&name) {
            self.asked().names.insert(name);
            self.nudge.notify_one();
        }
    }

    /// The pass asked for since the last one (nothing if none was).
    pub async fn reconcile_asked(self: &Arc<Self>) {
        let asked = std::mem::take(&mut *self.asked());
        if asked.all {
            self.reconcile().await;
        } else if !asked.names.is_empty() {
            self.reconcile_records(asked.names).await;
        }
    }

    /// A pass over these record files only: a record that is there and
    /// names itself by this file is served as a full pass would serve it
    /// (started, or stopped and started again if it changed); a file that
    /// is gone stops the attachment it was the record of, unless its
    /// record is found under its other name. Anything else (a record that
    /// does not parse or cannot be read, one under an old name) makes it a
    /// full pass, which knows what to keep.
    pub async fn reconcile_records(self: &Arc<Self>, names: BTreeSet<String>) {
        let pass = self.pass.lock().await;
        let store = RecordStore::new(&self.settings.state_dir);
        let mut changed = false;
        for name in names {
            match store.read_file(&name) {
                Ok(Some(rec)) if RecordStore::file_name(&rec.container_id, &rec.ifname) == name => {
                    changed |= self.forget_malformed(&store, &name);
                    let k: Key = (rec.container_id.clone(), rec.ifname.clone());
                    changed |= self
                        .stop_if(&k, |a| a.record != rec || a.error.is_some())
                        .await;
                    changed |= self.serve_or_reclaim(k, rec).await;
                }
                Ok(None) => {
                    changed |= self.forget_malformed(&store, &name);
                    // The attachment this file could be the record of
                    // (under its name or its old one), stopped only if no
                    // file holds its record now (an old name moved to the
                    // new one leaves the record where it went).
                    let named = self
                        .map()
                        .keys()
                        .find(|k| RecordStore::may_name(&name, &k.0, &k.1))
                        .cloned();
                    match named.map(|k| (store.read(&k.0, &k.1), k)) {
                        Some((Ok(None), k)) => changed |= self.stop_if(&k, |_| true).await,
                        Some((Err(_), _)) => return self.full_pass_instead(pass, changed).await,
                        _ => {}
                    }
                }
                _ => return self.full_pass_instead(pass, changed).await,
            }
        }
        // A kernel-path forward may have started (or the last one gone).
        changed |= self.check_conntrack();
        self.record_passes.fetch_add(1, Ordering::Relaxed);
        if changed {
            self.changed();
        }
    }

    /// What a pass over some records could not settle: a full pass, after
    /// telling what this one changed.
    async fn full_pass_instead(
        self: &Arc<Self>,
        pass: tokio::sync::MutexGuard<'_, ()>,
        changed: bool,
    ) {
        drop(pass);
        if changed {
            self.changed();
        }
        self.reconcile().await
    }

    /// The file `name` is no longer reported malformed.
    fn forget_malformed(&self, store: &RecordStore, name: &str) -> bool {
        let path = store.dir().join(name).display().to_string();
        let mut m = self.malformed.lock().unwrap_or_else(|e| e.into_inner());
        let before = m.len();
        m.retain(|r| r.path != path);
        m.len() != before
    }

    fn asked(&self) -> std::sync::MutexGuard<'_, Asked> {
        self.asked.lock().unwrap_or_else(|e| e.into_inner())
    }
}
