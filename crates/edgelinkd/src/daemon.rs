//! The set of attachments this node serves, kept in step with the records
//! under `<stateDir>/attachments/`: new records start their forwards, removed
//! ones stop, attachments whose netns is gone are reclaimed (listeners
//! closed, IPAM reservation released, record removed) — the GC Multus never
//! sends to a secondary plugin.

use crate::config::RunArgs;
use crate::factory::Factory;
use crate::fds::{FdReserve, FD_RESERVE};
use crate::forward::{self, Shared};
use crate::kernel::KernelForwards;
use crate::model::{now, AttachmentStatus, ForwardRuntime, MalformedRecord, Status};
use crate::private_side::{PrivateSide, CLUSTER_IFNAME};
use crate::reverse::ReverseSide;
use crate::workers::Workers;
use edgelink_attachment::{Record, RecordError, RecordStore};
use edgelink_netns::{Netns, NetnsError};
use edgelink_relay::PipePool;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

mod provenance;
mod relisten;

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
    /// The tasks of each forward (listeners, probes), as `forwards`.
    tasks: Vec<Vec<JoinHandle<()>>>,
    /// How its sockets are made: kept to retry a forward whose listener
    /// failed. `None` when the netns could not be entered (`error`).
    sockets: Option<(Arc<Factory>, PrivateSide)>,
    /// Its `"path": "kernel"` forwards' table, if it has any.
    kernel: Option<Arc<KernelForwards>>,
}

impl Attachment {
    /// Stop serving and return once its tasks are gone, and with them its
    /// listeners: a replacement (a changed record) binds the same ports.
    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.close.send(true);
        for t in self.tasks.iter().flatten() {
            t.abort();
        }
        for t in self.tasks.into_iter().flatten() {
            let _ = t.await;
        }
        // After its refresh task is gone: the table goes too.
        if let Some(k) = &self.kernel {
            k.remove().await;
        }
    }

    /// The forwards whose listener failed (port taken, netns not ready):
    /// each is retried on every pass, alone, so that the connections and
    /// sessions of the others go on.
    fn failed_forwards(&self) -> Vec<usize> {
        if self.sockets.is_none() {
            return Vec::new();
        }
        (0..self.forwards.len())
            .filter(|&i| {
                self.forwards[i].spec.path.is_relay()
                    && self.forwards[i].lock().listener == "failed"
            })
            .collect()
    }

    /// What forward `i` needs to start again, with the tasks of its last
    /// start (to end first).
    fn restart_of(
        &mut self,
        i: usize,
        shared: &Arc<Shared>,
    ) -> Option<(forward::Ctx, Vec<JoinHandle<()>>)> {
        let (factory, private) = self.sockets.as_ref()?;
        let ctx = forward::Ctx {
            attachment: (self.record.container_id.clone(), self.record.ifname.clone()),
            shared: shared.clone(),
            factory: factory.clone(),
            forward: self.forwards.get(i)?.clone(),
            allowed: self.record.allowed_targets.clone(),
            private: private.clone(),
            stop: self.stop.subscribe(),
            close: self.close.subscribe(),
        };
        Some((ctx, std::mem::take(&mut self.tasks[i])))
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
    /// What every forward gets (settings, pipes, fd reserve, caps).
    pub shared: Arc<Shared>,
    attachments: Mutex<HashMap<Key, Attachment>>,
    malformed: Mutex<Vec<MalformedRecord>>,
    pub last_reconcile: AtomicU64,
    pub reclaimed: AtomicU64,
    /// Links the plugin's DEL retired and this daemon deleted.
    pub reaped: AtomicU64,
    /// Upstream TCP sockets taken ready from a `--socket-pool`.
    pub pool_taken: Arc<AtomicU64>,
    pub draining: AtomicBool,
    /// Workers replaced, counted once their forwards are marked to listen
    /// again: /status never shows a replacement with listeners that are
    /// still gone but reported `listening`.
    worker_replacements: AtomicU64,
    /// Wakes the reconcile loop (inotify, control socket).
    pub nudge: Notify,
    /// Bumped whenever attachments or forward states change (webhook).
    pub changes: watch::Sender<u64>,
    /// One reconcile pass at a time.
    pass: tokio::sync::Mutex<()>,
    /// Who this daemon is in a hand-over (`--instance-id`).
    pub instance: String,
    /// The instance this daemon took over from: never handed back to it.
    pub taken_from: Mutex<Option<String>>,
    /// Serving, handing over or stopping: one at a time.
    pub gate: crate::handover::Gate,
    /// What /status warns of (set by each pass).
    warnings: Mutex<Vec<String>>,
}

impl Daemon {
    pub fn new(args: RunArgs, node: String, workers: Arc<Workers>) -> Arc<Daemon> {
        let args_instance = args.instance_id.clone();
        let pipes = PipePool::bounded(args.pipe_size, 256, args.pipes_at_most());
        let shared = Arc::new(Shared {
            args: args.clone(),
            pipes: pipes.clone(),
            fds: FdReserve::new(FD_RESERVE),
            connections: AtomicU64::new(0),
            workers,
            lot: Arc::default(),
        });
        Arc::new(Daemon {
            args,
            node,
            started_at: now(),
            pipes,
            shared,
            attachments: Mutex::new(HashMap::new()),
            malformed: Mutex::new(Vec::new()),
            last_reconcile: AtomicU64::new(0),
            reclaimed: AtomicU64::new(0),
            reaped: AtomicU64::new(0),
            pool_taken: Arc::new(AtomicU64::new(0)),
            draining: AtomicBool::new(false),
            worker_replacements: AtomicU64::new(0),
            nudge: Notify::new(),
            changes: watch::channel(0).0,
            pass: tokio::sync::Mutex::new(()),
            instance: instance_id(&args_instance),
            taken_from: Mutex::new(None),
            gate: Default::default(),
            warnings: Mutex::new(Vec::new()),
        })
    }

    /// Every relay forward that was listening starts again on the next
    /// pass (from what the hand-over lot holds for it, if anything).
    pub fn listen_again(&self, why: &str) {
        self.listen_again_on(None, why);
    }

    /// No reconcile pass runs while this is held (a hand-over).
    pub async fn hold_passes(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.pass.lock().await
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

    /// End every relayed connection, with a reset (the grace period of a
    /// SIGTERM is over: what is still in flight is lost).
    pub fn close_connections(&self) {
        for a in self.map().values() {
            let _ = a.close.send(true);
        }
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
        // A record that exists but could not be read (EMFILE at the fd
        // limit, EIO) says nothing about its attachment: nothing is stopped
        // in a pass that met one.
        let mut unreadable = false;
        // Nor does one that cannot be parsed (torn, edited by hand): the
        // attachment it would name goes on with the record it was started
        // from (below).
        let mut torn: Vec<String> = Vec::new();
        for (path, r) in listed {
            match r {
                Ok(rec) => {
                    records.insert((rec.container_id.clone(), rec.ifname.clone()), rec);
                }
                Err(e) => {
                    if let RecordError::Io { source, .. } = &e {
                        unreadable |= source.kind() != std::io::ErrorKind::NotFound;
                    }
                    if let (RecordError::Malformed { .. }, Some(name)) = (&e, path.file_name()) {
                        torn.push(name.to_string_lossy().into_owned());
                    }
                    tracing::warn!(path = %path.display(), error = %e, "skipping a malformed attachment record");
                    malformed.push(MalformedRecord {
                        path: path.display().to_string(),
                        error: e.to_string(),
                    });
                }
            }
        }
        // A served attachment whose record file is now malformed keeps the
        // record it was started from: its forwards and connections go on, its
        // netns is still checked (and reclaimed when gone), and the file is
        // reported until it is fixed or removed (a DEL removes it).
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

        // Stop what no longer has a record (DEL), or whose record changed.
        let stale: Vec<Key> = self
            .map()
            .iter()
            // An attachment whose netns could not be entered is started
            // afresh on every pass (a forward that failed alone is retried
            // alone, below).
            .filter(|(k, a)| match records.get(*k) {
                Some(rec) => *rec != a.record || a.error.is_some(),
                None => !unreadable,
            })
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
            let opened = Netns::open(&rec.netns);
            if let Some(why) = provenance::elsewhere(&rec, &opened) {
                changed |= self.not_its_namespace(&k, &rec, &why).await;
                continue;
            }
            match opened {
                Ok(ns) => {
                    let id = ns.id().ok();
                    if let Some(old) = running {
                        if id == Some(old) {
                            if !self.draining.load(Ordering::Relaxed) {
                                changed |= self.retry_failed(&k).await;
                            }
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
                    let netns_id = a.netns_id;
                    self.map().insert(k.clone(), a);
                    self.kernel_again_beside(&k, netns_id).await;
                    changed = true;
                }
                Err(NetnsError::NotFound { .. }) | Err(NetnsError::NotNetns { .. })
                    if self.sees_pids_of(&rec) =>
                {
                    let removed = self.map().remove(&k);
                    if let Some(a) = removed {
                        a.stop().await;
                    }
                    if self.release_delegated(&rec).await {
                        self.reclaim(&rec);
                    }
                    changed = true;
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
        changed |= self.check_conntrack();
        self.last_reconcile.store(now(), Ordering::Relaxed);
        if changed {
            self.changed();
        }
    }

    /// With a kernel-path forward on the node, whether the node's conntrack
    /// table has room (`--conntrack-min`, 90% full): a warning in /status
    /// when it does not. Returns whether the warnings changed.
    fn check_conntrack(&self) -> bool {
        let kernel = self.map().values().any(|a| a.kernel.is_some());
        let now: Vec<String> = if kernel {
            match edgelink_kernel_path::conntrack_headroom(self.args.conntrack_min) {
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

    /// The pod is gone without a DEL and its IPAM is delegated: with
    /// `--cni-path`, run the delegate's DEL. False when that failed: the
    /// record is kept (it holds the only configuration that can release the
    /// address) and the next pass tries again. Without `--cni-path`, the
    /// delegate's reservation is left to its own GC, as documented.
    async fn release_delegated(&self, rec: &Record) -> bool {
        let Some(plugin) = crate::delegate::plugin_of(rec).map(str::to_string) else {
            return true;
        };
        let dirs = self.args.cni_path.0.clone();
        if dirs.is_empty() {
            tracing::info!(container = %rec.container_id, ifname = %rec.ifname, %plugin,
                "delegated IPAM: its reservation is left to its own GC (--cni-path is not set)");
            return true;
        }
        let r = rec.clone();
        let done = tokio::task::spawn_blocking(move || crate::delegate::release(&r, &dirs)).await;
        match done {
            Ok(Ok(_)) => {
                tracing::info!(container = %rec.container_id, ifname = %rec.ifname, %plugin,
                    "the delegated IPAM released the reservation");
                true
            }
            Ok(Err(e)) => {
                tracing::warn!(container = %rec.container_id, ifname = %rec.ifname, %plugin, error = %e,
                    "cannot release the delegated IPAM's reservation: the record is kept and the next pass tries again");
                false
            }
            Err(e) => {
                tracing::warn!(container = %rec.container_id, ifname = %rec.ifname, %plugin, error = %e,
                    "the delegated IPAM's DEL did not complete: the record is kept and the next pass tries again");
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
            Ok(ips) if !ips.is_empty() => {
                tracing::info!(addresses = %edgelink_ipam::show_ips(&ips), "released")
            }
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
    ///
    /// A record file that cannot be read (torn, hand-edited, unreadable)
    /// does not stop GC: nobody knows which attachment it stands for, so the
    /// reservations of every (container ID, ifname) whose record would be
    /// stored under that file name (current or old naming) are kept, and
    /// only those. Names are a function of (container ID, ifname), so this
    /// keeps exactly what the record could protect if it were readable. A
    /// file under a name no attachment's record has (`junk.json`) protects
    /// nothing. If the directory itself cannot be listed, nothing is freed.
    fn gc_reservations(&self) {
        let listed = match RecordStore::new(&self.args.state_dir).list() {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "IPAM GC skipped: cannot list attachment records");
                return;
            }
        };
        let mut valid: HashSet<(String, String)> = HashSet::new();
        let mut unreadable: Vec<String> = Vec::new();
        for (path, r) in listed {
            match r {
                Ok(r) => {
                    valid.insert((r.container_id, r.ifname));
                }
                Err(_) => {
                    unreadable.extend(path.file_name().map(|n| n.to_string_lossy().into_owned()))
                }
            }
        }
        let keep = |cid: &str, ifname: &str| {
            valid.contains(&(cid.to_string(), ifname.to_string()))
                || unreadable
                    .iter()
                    .any(|n| RecordStore::may_name(n, cid, ifname))
        };
        let report = edgelink_ipam::release_all_but(
            &self.args.state_dir,
            &keep,
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

    /// Attachment `k` just started in netns `id`, and its plugin's ADD
    /// turned forwarding off in the whole pod: the kernel path of another
    /// attachment there installs its table again, which turns forwarding
    /// on again behind it.
    async fn kernel_again_beside(&self, k: &Key, id: (u64, u64)) {
        let beside: Vec<Arc<KernelForwards>> = self
            .map()
            .iter()
            .filter(|(other, a)| *other != k && a.netns_id == id)
            .filter_map(|(_, a)| a.kernel.clone())
            .collect();
        for kf in beside {
            kf.ensure().await;
        }
    }

    /// Start again, each alone, the forwards of attachment `k` whose
    /// listener failed; returns whether one came up.
    async fn retry_failed(&self, k: &Key) -> bool {
        let mut up = false;
        // The kernel path's table is installed whole: again, if it failed.
        let kernel = self.map().get(k).and_then(|a| a.kernel.clone());
        if let Some(kf) = kernel.filter(|kf| kf.failed()) {
            up |= kf.ensure().await;
        }
        let failed = self.map().get(k).map(Attachment::failed_forwards);
        for i in failed.unwrap_or_default() {
            let restart = self
                .map()
                .get_mut(k)
                .and_then(|a| a.restart_of(i, &self.shared));
            let Some((ctx, old)) = restart else { continue };
            // Its listener that did come up (IPv4 of a dual-stack pair)
            // binds again too; its relayed connections are tasks of their
            // own and go on.
            for t in &old {
                t.abort();
            }
            for t in old {
                let _ = t.await;
            }
            let f = ctx.forward.clone();
            tracing::debug!(container = %k.0, forward = %f.spec.name, "retrying a failed listener");
            let tasks = forward::start(ctx).await;
            up |= f.lock().listener == "listening";
            match self.map().get_mut(k) {
                Some(a) => a.tasks[i] = tasks,
                None => tasks.iter().for_each(JoinHandle::abort),
            }
        }
        up
    }

    async fn start(self: &Arc<Self>, rec: Record, ns: Netns) -> Attachment {
        let netns_id = ns.id().unwrap_or_default();
        let (stop, _) = watch::channel(false);
        let (close, _) = watch::channel(false);
        let defaults = self.args.forward_defaults();
        let reverse = rec.reverse.iter().cloned().map(|r| {
            let side = ReverseSide::new(
                r,
                rec.netns.clone(),
                rec.dns.clone(),
                rec.interface.ips.clone(),
            );
            ForwardRuntime::reverse(side, &defaults)
        });
        let forwards: Vec<Arc<ForwardRuntime>> = rec
            .forwards
            .iter()
            .cloned()
            .map(|f| ForwardRuntime::new(f, &defaults))
            .chain(reverse)
            .map(Arc::new)
            .collect();
        let mut a = Attachment {
            record: rec,
            netns_id,
            tasks: forwards.iter().map(|_| Vec::new()).collect(),
            forwards,
            error: None,
            stop,
            close,
            sockets: None,
            kernel: None,
        };
        if a.forwards.is_empty() {
            return a;
        }
        // The kernel path's own handle on the netns (the factory's thread
        // keeps the other).
        let kernel_ns = a
            .forwards
            .iter()
            .any(|f| !f.spec.path.is_relay())
            .then(|| Netns::open(ns.path()).ok())
            .flatten()
            .filter(|k| k.id().ok() == Some(netns_id))
            .map(Arc::new);
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
        let private = PrivateSide::new(
            &a.record,
            factory.ifindex(&a.record.interface.name).await.ok(),
            factory.ifindex(CLUSTER_IFNAME).await.ok(),
        );
        a.sockets = Some((factory, private));
        for i in 0..a.forwards.len() {
            if let Some((ctx, _)) = a.restart_of(i, &self.shared) {
                a.tasks[i] = forward::start(ctx).await;
            }
        }
        if let Some(ns) = kernel_ns {
            a.kernel = KernelForwards::new(&a.record, &a.forwards, ns, self.args.kernel_options())
                .map(Arc::new);
        }
        if let Some(kf) = a.kernel.clone() {
            kf.ensure().await;
            let every = self.args.kernel_counters_interval;
            let mut stop = a.close.subscribe();
            let refresh = tokio::spawn(async move {
                loop {
                    kf.refresh().await;
                    tokio::select! {
                        _ = tokio::time::sleep(every) => {}
                        _ = stop.wait_for(|s| *s) => return,
                    }
                }
            });
            if let Some(t) = a.tasks.first_mut() {
                t.push(refresh);
            }
        }
        tracing::info!(container = %a.record.container_id, ifname = %a.record.ifname,
            pod = %a.record.pod_name.as_deref().unwrap_or("-"), forwards = a.forwards.len(), "serving attachment");
        a
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
