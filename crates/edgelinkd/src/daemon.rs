//! The set of attachments this node serves, kept in step with the records
//! under `<stateDir>/attachments/`: new records start their forwards, removed
//! ones stop, attachments whose netns is gone are reclaimed (listeners
//! closed, IPAM reservation released, record removed) — the GC Multus never
//! sends to a secondary plugin.

use crate::config::RunArgs;
use crate::factory::Factory;
use crate::forward;
use crate::model::{now, AttachmentStatus, ForwardRuntime, MalformedRecord, Status};
use edgelink_attachment::{Record, RecordStore};
use edgelink_netns::{Netns, NetnsError};
use edgelink_relay::PipePool;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

pub type Key = (String, String);

/// One attachment being served.
pub struct Attachment {
    pub record: Record,
    /// (device, inode) of the netns when it was opened.
    pub netns_id: (u64, u64),
    pub forwards: Vec<Arc<ForwardRuntime>>,
    pub error: Option<String>,
    stop: watch::Sender<bool>,
    /// Ends the relayed connections too (the attachment is gone; SIGTERM
    /// only stops accepting).
    close: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Attachment {
    /// Stop serving and return once its tasks are gone, and with them its
    /// listeners: a replacement (a changed record) binds the same ports.
    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.close.send(true);
        for t in &self.tasks {
            t.abort();
        }
        for t in self.tasks {
            let _ = t.await;
        }
    }

    fn has_failed_listener(&self) -> bool {
        self.error.is_some() || self.forwards.iter().any(|f| f.lock().listener == "failed")
    }

    fn status(&self) -> AttachmentStatus {
        AttachmentStatus {
            container_id: self.record.container_id.clone(),
            ifname: self.record.ifname.clone(),
            network: self.record.network.clone(),
            pod_namespace: self.record.pod_namespace.clone(),
            pod_name: self.record.pod_name.clone(),
            netns: self.record.netns.clone(),
            mode: self.record.mode.clone(),
            interface: self.record.interface.clone(),
            state: if self.error.is_some() {
                "failed"
            } else {
                "serving"
            }
            .into(),
            error: self.error.clone(),
            forwards: self.forwards.iter().map(|f| f.report()).collect(),
        }
    }
}

pub struct Daemon {
    pub args: RunArgs,
    pub node: String,
    pub started_at: u64,
    pub pipes: Arc<PipePool>,
    attachments: Mutex<HashMap<Key, Attachment>>,
    malformed: Mutex<Vec<MalformedRecord>>,
    pub last_reconcile: AtomicU64,
    pub reclaimed: AtomicU64,
    /// Links the plugin's DEL retired and this daemon deleted.
    pub reaped: AtomicU64,
    /// Upstream TCP sockets taken ready from a `--socket-pool`.
    pub pool_taken: Arc<AtomicU64>,
    pub draining: AtomicBool,
    /// Wakes the reconcile loop (inotify, control socket).
    pub nudge: Notify,
    /// Bumped whenever attachments or forward states change (webhook).
    pub changes: watch::Sender<u64>,
    /// One reconcile pass at a time.
    pass: tokio::sync::Mutex<()>,
}

impl Daemon {
    pub fn new(args: RunArgs, node: String) -> Arc<Daemon> {
        let pipes = PipePool::new(args.pipe_size, 256);
        Arc::new(Daemon {
            args,
            node,
            started_at: now(),
            pipes,
            attachments: Mutex::new(HashMap::new()),
            malformed: Mutex::new(Vec::new()),
            last_reconcile: AtomicU64::new(0),
            reclaimed: AtomicU64::new(0),
            reaped: AtomicU64::new(0),
            pool_taken: Arc::new(AtomicU64::new(0)),
            draining: AtomicBool::new(false),
            nudge: Notify::new(),
            changes: watch::channel(0).0,
            pass: tokio::sync::Mutex::new(()),
        })
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Attachment>> {
        self.attachments.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn changed(&self) {
        self.changes.send_modify(|v| *v += 1);
    }

    pub fn status(&self) -> Status {
        let mut attachments: Vec<AttachmentStatus> =
            self.map().values().map(Attachment::status).collect();
        attachments.sort_by(|a, b| (&a.container_id, &a.ifname).cmp(&(&b.container_id, &b.ifname)));
        Status {
            node: self.node.clone(),
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
            reclaimed_total: self.reclaimed.load(Ordering::Relaxed),
            retired_links_deleted_total: self.reaped.load(Ordering::Relaxed),
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

    /// Active TCP connections and UDP sessions over all forwards.
    pub fn active(&self) -> u64 {
        self.map()
            .values()
            .flat_map(|a| a.forwards.iter())
            .map(|f| {
                edgelink_relay::Counters::get(&f.counters.active)
                    + edgelink_relay::Counters::get(&f.counters.udp_sessions)
            })
            .sum()
    }

    /// Stop accepting on every forward (SIGTERM); connections go on.
    pub fn stop_listening(&self) {
        self.draining.store(true, Ordering::Relaxed);
        for a in self.map().values() {
            let _ = a.stop.send(true);
        }
        self.changed();
    }

    /// One pass: make the served set equal to the records on disk.
    pub async fn reconcile(self: &Arc<Self>) {
        let _pass = self.pass.lock().await;
        let store = RecordStore::new(&self.args.state_dir);
        let listed = match store.list() {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list attachment records");
                return;
            }
        };
        let mut records: HashMap<Key, Record> = HashMap::new();
        let mut malformed = Vec::new();
        for (path, r) in listed {
            match r {
                Ok(rec) => {
                    records.insert((rec.container_id.clone(), rec.ifname.clone()), rec);
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "skipping a malformed attachment record");
                    malformed.push(MalformedRecord {
                        path: path.display().to_string(),
                        error: e.to_string(),
                    });
                }
            }
        }
        let mut changed = {
            let mut m = self.malformed.lock().unwrap_or_else(|e| e.into_inner());
            let differs = *m != malformed;
            *m = malformed;
            differs
        };

        // Stop what no longer has a record (DEL), or whose record changed.
        let stale: Vec<Key> = self
            .map()
            .iter()
            // A listener that failed (port taken, netns not ready) is
            // retried on every pass: the attachment is started afresh.
            .filter(|(k, a)| records.get(*k) != Some(&a.record) || a.has_failed_listener())
            .map(|(k, _)| k.clone())
            .collect();
        for k in stale {
            let removed = self.map().remove(&k);
            if let Some(a) = removed {
                tracing::info!(container = %k.0, ifname = %k.1, "attachment removed: closing its listeners");
                a.stop().await;
                changed = true;
            }
        }

        // Reclaim records whose netns is gone; start the new ones.
        for (k, rec) in records {
            let running = self.map().get(&k).map(|a| a.netns_id);
            match Netns::open(&rec.netns) {
                Ok(ns) => {
                    let id = ns.id().ok();
                    if let Some(old) = running {
                        if id == Some(old) {
                            continue;
                        }
                        // Same path, another namespace: the old one is gone.
                        let removed = self.map().remove(&k);
                        if let Some(a) = removed {
                            a.stop().await;
                        }
                    }
                    if self.draining.load(Ordering::Relaxed) {
                        continue;
                    }
                    let a = self.start(rec, ns).await;
                    self.map().insert(k, a);
                    changed = true;
                }
                Err(NetnsError::NotFound { .. }) | Err(NetnsError::NotNetns { .. })
                    if self.sees_pids_of(&rec) =>
                {
                    let removed = self.map().remove(&k);
                    if let Some(a) = removed {
                        a.stop().await;
                        changed = true;
                    }
                    if self.release_delegated(&rec).await {
                        self.reclaim(&rec);
                        changed = true;
                    }
                }
                Err(NetnsError::NotFound { .. }) | Err(NetnsError::NotNetns { .. }) => {
                    tracing::warn!(netns = %rec.netns,
                        "a /proc netns path of another PID namespace than this daemon's: not reclaiming it \
                         (run edgelinkd with hostPID, docs/install.md)")
                }
                Err(e) => {
                    tracing::warn!(netns = %rec.netns, error = %e, "cannot open the netns of an attachment")
                }
            }
        }

        self.gc_reservations();
        self.last_reconcile.store(now(), Ordering::Relaxed);
        if changed {
            self.changed();
        }
    }

    /// Whether a netns path of `rec` that cannot be opened means the pod is
    /// gone. A `/proc/<pid>/ns/net` path (cri-dockerd gives those) names a
    /// PID of the plugin's PID namespace; a daemon in another one (no
    /// hostPID) would take every live pod for gone.
    fn sees_pids_of(&self, rec: &Record) -> bool {
        !rec.netns.starts_with("/proc/")
            || rec.pid_namespace.is_none()
            || rec.pid_namespace == edgelink_attachment::own_pid_namespace()
    }

    /// The pod is gone without a DEL and its IPAM is delegated: run the
    /// delegate's DEL. False when it failed: the record stays, and the next
    /// pass tries again (a reservation is never dropped silently).
    async fn release_delegated(&self, rec: &Record) -> bool {
        if crate::delegate::plugin_of(rec).is_none() {
            return true;
        }
        let dirs = self.args.cni_path.0.clone();
        let r = rec.clone();
        match tokio::task::spawn_blocking(move || crate::delegate::release(&r, &dirs)).await {
            Ok(Ok(plugin)) => {
                tracing::info!(container = %rec.container_id, ifname = %rec.ifname, ?plugin,
                    "the delegated IPAM released the reservation");
                true
            }
            Ok(Err(e)) => {
                tracing::warn!(container = %rec.container_id, ifname = %rec.ifname, error = %e,
                    "cannot release the delegated IPAM reservation: keeping the record, retrying on the next pass");
                false
            }
            Err(e) => {
                tracing::warn!(error = %e, "delegated IPAM release: the task failed");
                false
            }
        }
    }

    /// The pod is gone without a DEL: release its address, drop its record.
    fn reclaim(&self, rec: &Record) {
        tracing::info!(container = %rec.container_id, ifname = %rec.ifname, netns = %rec.netns,
            "netns is gone: releasing the attachment's address and record");
        match edgelink_ipam::Store::open(&self.args.state_dir, &rec.network).and_then(|s| {
            let mut l = s.lock(Duration::from_secs(10))?;
            l.release(&rec.container_id, &rec.ifname)
        }) {
            Ok(ips) if !ips.is_empty() => tracing::info!(?ips, "released"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "cannot release the reservation"),
        }
        if let Err(e) =
            RecordStore::new(&self.args.state_dir).remove(&rec.container_id, &rec.ifname)
        {
            tracing::warn!(error = %e, "cannot remove the record");
        }
        self.reclaimed.fetch_add(1, Ordering::Relaxed);
    }

    /// Reservations with no record (an ADD killed before it wrote one) are
    /// released once older than the grace period.
    fn gc_reservations(&self) {
        if !self
            .malformed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
        {
            return; // a malformed record may own a reservation: keep them all
        }
        let valid: HashSet<(String, String)> = match RecordStore::new(&self.args.state_dir).list() {
            Ok(l) => l
                .into_iter()
                .filter_map(|(_, r)| r.ok())
                .map(|r| (r.container_id, r.ifname))
                .collect(),
            Err(_) => return,
        };
        let report = edgelink_ipam::release_all_except_with_grace(
            &self.args.state_dir,
            &valid,
            Duration::from_secs(5),
            self.args.ipam_gc_grace,
        );
        for (net, ip, cid, ifname) in &report.released {
            tracing::info!(network = %net, %ip, container = %cid, %ifname, "released a reservation without attachment record");
        }
        for e in &report.errors {
            tracing::warn!(error = %e, "IPAM GC");
        }
    }

    async fn start(self: &Arc<Self>, rec: Record, ns: Netns) -> Attachment {
        let netns_id = ns.id().unwrap_or_default();
        let (stop, _) = watch::channel(false);
        let (close, _) = watch::channel(false);
        let forwards: Vec<Arc<ForwardRuntime>> = rec
            .forwards
            .iter()
            .cloned()
            .map(|f| Arc::new(ForwardRuntime::new(f)))
            .collect();
        let mut a = Attachment {
            record: rec,
            netns_id,
            forwards,
            error: None,
            stop,
            close,
            tasks: Vec::new(),
        };
        if a.forwards.is_empty() {
            return a;
        }
        let factory = match Factory::start(
            ns,
            self.args.socket_pool as usize,
            self.pool_taken.clone(),
        ) {
            Ok(f) => f,
            Err(e) => {
                a.error = Some(format!("cannot enter netns {}: {e}", a.record.netns));
                tracing::warn!(netns = %a.record.netns, error = %e, "cannot enter the attachment's netns");
                return a;
            }
        };
        let private = forward::PrivateSide::new(
            &a.record,
            factory.ifindex(&a.record.interface.name).await.ok(),
        );
        for f in &a.forwards {
            let ctx = forward::Ctx {
                daemon: self.clone(),
                factory: factory.clone(),
                forward: f.clone(),
                allowed: a.record.allowed_targets.clone(),
                private: private.clone(),
                stop: a.stop.subscribe(),
                close: a.close.subscribe(),
            };
            a.tasks.extend(forward::start(ctx).await);
        }
        tracing::info!(container = %a.record.container_id, ifname = %a.record.ifname,
            pod = ?a.record.pod_name, forwards = a.forwards.len(), "serving attachment");
        a
    }
}
