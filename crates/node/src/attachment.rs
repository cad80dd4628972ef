//! One attachment being served: its record, its forwards' shared state,
//! the tasks that serve them, and how it stops.

use crate::kernel::KernelForwards;
use crate::vip::VipRuntime;
use edgelink_attachment::Record;
use edgelink_forward::cutoff::Cutoff;
use edgelink_forward::factory::Factory;
use edgelink_forward::health::HealthRuntime;
use edgelink_forward::private_side::PrivateSide;
use edgelink_forward::{Ctx, ForwardRuntime, Shared};
use edgelink_status::grants::Mode;
use edgelink_status::AttachmentStatus;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// An attachment's key: (container ID, ifname).
pub type Key = (String, String);

/// One attachment being served.
pub struct Attachment {
    pub record: Record,
    /// (device, inode) of the netns when it was opened.
    pub netns_id: (u64, u64),
    pub forwards: Vec<Arc<ForwardRuntime>>,
    pub error: Option<String>,
    pub(crate) stop: watch::Sender<bool>,
    /// Ends the relayed connections too (the attachment is gone; SIGTERM
    /// only stops accepting).
    close: watch::Sender<bool>,
    /// The same for the relayed connections, which wait on a token
    /// (edgelink-forward's cutoff.rs).
    cutoff: Arc<Cutoff>,
    /// The tasks of each forward (listeners, probes), as `forwards`.
    pub(crate) tasks: Vec<Vec<JoinHandle<()>>>,
    /// How its sockets are made: kept to retry a forward whose listener
    /// failed. `None` when the netns could not be entered (`error`).
    pub(crate) sockets: Option<(Arc<Factory>, PrivateSide)>,
    /// Its `"path": "kernel"` forwards' table, if it has any.
    pub(crate) kernel: Option<Arc<KernelForwards>>,
    /// Its device health (`health`), and the task that probes it.
    pub health: Option<Arc<HealthRuntime>>,
    pub(crate) health_task: Option<JoinHandle<()>>,
    /// Its virtual addresses (with reverse forwards and a pod name), and
    /// the task that holds them.
    pub vip: Option<Arc<VipRuntime>>,
    pub(crate) vip_task: Option<JoinHandle<()>>,
    /// Its access rules, and the task that makes its connections check
    /// them again when they change.
    pub(crate) access: Arc<edgelink_access::Slot>,
    pub(crate) access_task: Option<JoinHandle<()>>,
}

impl Attachment {
    /// Attachment `record`, in netns `netns_id`, with its forwards'
    /// runtimes; nothing started yet.
    pub(crate) fn new(
        record: Record,
        netns_id: (u64, u64),
        forwards: Vec<Arc<ForwardRuntime>>,
        access: Arc<edgelink_access::Slot>,
    ) -> Attachment {
        let health = record
            .health
            .clone()
            .map(|h| Arc::new(HealthRuntime::new(h)));
        let vip = match (&record.pod_namespace, &record.pod_name) {
            (Some(ns), Some(pod))
                if !record.virtual_addresses.is_empty() && !record.reverse.is_empty() =>
            {
                Some(Arc::new(VipRuntime::new(
                    record.virtual_addresses.clone(),
                    format!("{ns}/{pod}"),
                )))
            }
            _ => None,
        };
        Attachment {
            record,
            netns_id,
            tasks: forwards.iter().map(|_| Vec::new()).collect(),
            forwards,
            error: None,
            stop: watch::channel(false).0,
            close: watch::channel(false).0,
            cutoff: Arc::default(),
            sockets: None,
            kernel: None,
            health,
            health_task: None,
            vip,
            vip_task: None,
            access,
            access_task: None,
        }
    }

    /// The access rules' key of an attachment: `namespace/pod` (the
    /// operator's name for a proxy pod's), else its container and ifname
    /// (which no rule names: open).
    pub(crate) fn access_key(record: &Record) -> String {
        match (&record.pod_namespace, &record.pod_name) {
            (Some(ns), Some(pod)) => format!("{ns}/{pod}"),
            _ => format!("{}/{}", record.container_id, record.ifname),
        }
    }

    /// A change of its access rules that may refuse a client let through
    /// before (not a new client pod, not a lease ended) stops its relayed
    /// connections where they stand, to be checked again
    /// (edgelink-forward's clients.rs).
    pub(crate) fn watch_access(&mut self) {
        let mut changes = self.access.subscribe_narrowed();
        let cutoff = self.cutoff.clone();
        self.access_task = Some(tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                cutoff.revoke();
            }
        }));
    }

    /// Stop serving and return once its tasks are gone, and with them its
    /// listeners: a replacement (a changed record) binds the same ports.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(true);
        self.close_connections();
        // The virtual addresses stay as they are (vip.rs says why).
        let tasks = self
            .tasks
            .into_iter()
            .flatten()
            .chain(self.health_task)
            .chain(self.vip_task)
            .chain(self.access_task);
        let tasks: Vec<JoinHandle<()>> = tasks.collect();
        for t in &tasks {
            t.abort();
        }
        for t in tasks {
            let _ = t.await;
        }
        // After its refresh task is gone: the table goes too.
        if let Some(k) = &self.kernel {
            k.remove().await;
        }
    }

    /// End its relayed connections (reset), and the tasks that wait on
    /// `close`.
    pub(crate) fn close_connections(&self) {
        let _ = self.close.send(true);
        self.cutoff.close();
    }

    /// A receiver of `close`: set when the attachment's connections end.
    pub(crate) fn closed(&self) -> watch::Receiver<bool> {
        self.close.subscribe()
    }

    /// The forwards whose listener failed (port taken, netns not ready):
    /// each is retried on every pass, alone, so that the connections and
    /// sessions of the others go on.
    pub(crate) fn failed_forwards(&self) -> Vec<usize> {
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
    pub(crate) fn restart_of(
        &mut self,
        i: usize,
        shared: &Arc<Shared>,
    ) -> Option<(Ctx, Vec<JoinHandle<()>>)> {
        let (factory, private) = self.sockets.as_ref()?;
        let ctx = Ctx {
            attachment: (self.record.container_id.clone(), self.record.ifname.clone()),
            shared: shared.clone(),
            factory: factory.clone(),
            forward: self.forwards.get(i)?.clone(),
            allowed: self.record.allowed_targets.clone(),
            private: private.clone(),
            stop: self.stop.subscribe(),
            close: self.close.subscribe(),
            cutoff: self.cutoff.clone(),
            access: self.access.clone(),
            relay_cfg: Default::default(),
            audit_origin: Default::default(),
            modbus: Default::default(),
            reachability_probe: self.record.health.is_none(),
        };
        Some((ctx, std::mem::take(&mut self.tasks[i])))
    }

    pub(crate) fn status(&self, grants: Mode) -> AttachmentStatus {
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
            health: self.health.as_ref().map(|h| h.report()),
            virtual_addresses: self.vip.as_ref().map(|v| v.report(grants)),
        }
    }
}
