//! Starting an attachment (its forwards, its kernel-path table) and
//! starting again what failed.

use crate::attachment::{Attachment, Key};
use crate::kernel::KernelForwards;
use crate::node::Node;
use edgelink_attachment::Record;
use edgelink_forward::factory::Factory;
use edgelink_forward::health::{self, Prober};
use edgelink_forward::private_side::{PrivateSide, CLUSTER_IFNAME};
use edgelink_forward::reverse::ReverseSide;
use edgelink_forward::ForwardRuntime;
use edgelink_netns::Netns;
use std::sync::Arc;
use tokio::task::JoinHandle;

impl Node {
    /// Attachment `k` just started in netns `id`, and its plugin's ADD
    /// turned forwarding off in the whole pod: the kernel path of another
    /// attachment there installs its table again, which turns forwarding
    /// on again behind it.
    pub(crate) async fn kernel_again_beside(&self, k: &Key, id: (u64, u64)) {
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
    pub(crate) async fn retry_failed(&self, k: &Key) -> bool {
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
            let tasks = edgelink_forward::start(ctx).await;
            up |= f.lock().listener == "listening";
            match self.map().get_mut(k) {
                Some(a) => a.tasks[i] = tasks,
                None => tasks.iter().for_each(JoinHandle::abort),
            }
        }
        up
    }

    /// The record's reverse forwards, each with what resolves its name.
    fn reverse_forwards(&self, rec: &Record) -> Vec<ForwardRuntime> {
        rec.reverse
            .iter()
            .cloned()
            .map(|r| {
                let side = ReverseSide::new(
                    r,
                    rec.netns.clone(),
                    rec.dns.clone(),
                    rec.interface.ips.clone(),
                )
                .cluster_resolver(
                    rec.pod_namespace.clone(),
                    self.settings.cluster_resolv_conf.clone(),
                )
                .virtual_addresses(rec.virtual_addresses.clone());
                ForwardRuntime::reverse(side, &self.settings.defaults)
            })
            .collect()
    }

    pub(crate) async fn start(self: &Arc<Self>, rec: Record, ns: Netns) -> Attachment {
        let netns_id = ns.id().unwrap_or_default();
        let defaults = self.settings.defaults.clone();
        let forwards: Vec<Arc<ForwardRuntime>> = rec
            .forwards
            .iter()
            .cloned()
            .map(|f| ForwardRuntime::new(f, &defaults))
            .chain(self.reverse_forwards(&rec))
            .map(Arc::new)
            .collect();
        let access = self.access.slot(&Attachment::access_key(&rec));
        let mut a = Attachment::new(rec, netns_id, forwards, access);
        if a.forwards.is_empty() && a.health.is_none() {
            return a;
        }
        a.watch_access();
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
        let keepalive = Some(self.settings.forward.tcp_keepalive).filter(|k| !k.is_zero());
        let factory = match Factory::start(
            ns,
            self.settings.socket_pool as usize,
            self.pool_taken.clone(),
            keepalive,
        ) {
            Ok(f) => f,
            Err(e) => {
                a.error = Some(format!("cannot enter netns {}: {e}", a.record.netns));
                if let Some(h) = &a.health {
                    h.not_probed(format!("not probed: {}", a.error.as_deref().unwrap_or("")));
                }
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
                a.tasks[i] = edgelink_forward::start(ctx).await;
            }
        }
        if let Some(ns) = kernel_ns {
            a.kernel =
                KernelForwards::new(&a.record, &a.forwards, ns, self.settings.kernel.clone())
                    .map(Arc::new);
        }
        self.start_kernel(&mut a).await;
        self.start_health(&mut a);
        self.start_vip(&mut a);
        tracing::info!(container = %a.record.container_id, ifname = %a.record.ifname,
            pod = %a.record.pod_name.as_deref().unwrap_or("-"), forwards = a.forwards.len(), "serving attachment");
        a
    }

    /// The device health probe of `a`, if it has one, from its netns: a
    /// target the record names outside allowedTargets is not probed.
    fn start_health(self: &Arc<Self>, a: &mut Attachment) {
        let (Some(h), Some((factory, _))) = (a.health.clone(), a.sockets.as_ref()) else {
            return;
        };
        if !h.spec.target.allowed(&a.record.allowed_targets) {
            let why = format!(
                "health target {} is outside allowedTargets {:?}: not probed",
                h.spec.target, a.record.allowed_targets
            );
            tracing::warn!(container = %a.record.container_id, "{why}");
            h.not_probed(why);
            return;
        }
        let node = Arc::downgrade(self);
        let prober = Prober {
            limiter: health::limiter_for(&h.spec, &a.forwards),
            health: h,
            sockets: factory.clone(),
            stop: a.stop.subscribe(),
            changed: Arc::new(move || {
                if let Some(n) = node.upgrade() {
                    n.changed();
                }
            }),
            name: format!("{}/{}", a.record.container_id, a.record.ifname),
        };
        a.health_task = Some(tokio::spawn(health::run(prober)));
    }

    /// The task that holds `a`'s virtual addresses, if it has any.
    fn start_vip(self: &Arc<Self>, a: &mut Attachment) {
        let (Some(v), Some((factory, _))) = (a.vip.clone(), a.sockets.as_ref()) else {
            return;
        };
        let node = Arc::downgrade(self);
        let holder = crate::vip::Holder {
            vip: v,
            factory: factory.clone(),
            ifname: a.record.interface.name.clone(),
            grants: self.grants.clone(),
            stop: a.stop.subscribe(),
            changed: Arc::new(move || {
                if let Some(n) = node.upgrade() {
                    n.changed();
                }
            }),
        };
        a.vip_task = Some(tokio::spawn(crate::vip::run(holder)));
    }

    /// The kernel path's table of `a`, installed, and the task that copies
    /// its counters into the forwards' (ends with the attachment).
    async fn start_kernel(&self, a: &mut Attachment) {
        if let Some(kf) = a.kernel.clone() {
            kf.ensure().await;
            let every = self.settings.kernel_counters_interval;
            let mut stop = a.closed();
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
    }
}
