//! The kernel-path forwards of one attachment (`"path": "kernel"`): one
//! nftables table in the pod's netns (edgelink-kernel-path: DNAT, fully
//! random masquerade on the edgelink interface, a drop-by-default forward
//! chain, conntrack tuned for short connections), installed when the
//! attachment starts, removed when it stops (DEL, record changed), and its
//! counters copied into the forwards' own for /status and /metrics.
//!
//! The relay's forwards of the same attachment are served by edgelink-forward;
//! this module never listens on a socket. The table stays when the daemon
//! exits (the kernel goes on forwarding through a restart), and the next
//! daemon installs it again in one transaction: never doubled.

use edgelink_attachment::{ForwardPath, Record};
use edgelink_forward::ForwardRuntime;
use edgelink_kernel_path::{FlowCounters, KernelForward, Options, Plan};
use edgelink_netns::Netns;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// The table's name in every pod's netns.
pub const TABLE: &str = "edgelink";

pub struct KernelForwards {
    netns: Arc<Netns>,
    plan: Plan,
    opts: Options,
    /// The forwards in the plan.
    forwards: Vec<Arc<ForwardRuntime>>,
    /// Per forward: what was counted before the last install (which starts
    /// the table's counters from zero), and the last reading since.
    counts: Mutex<BTreeMap<String, (FlowCounters, FlowCounters)>>,
}

fn add(a: FlowCounters, b: FlowCounters) -> FlowCounters {
    FlowCounters {
        connections: a.connections + b.connections,
        packets_to_target: a.packets_to_target + b.packets_to_target,
        bytes_to_target: a.bytes_to_target + b.bytes_to_target,
        packets_to_client: a.packets_to_client + b.packets_to_client,
        bytes_to_client: a.bytes_to_client + b.bytes_to_client,
    }
}

impl KernelForwards {
    /// The attachment's kernel-path forwards, or None when it has none.
    /// Those whose target is outside allowedTargets are marked refused and
    /// left out, as the relay does.
    pub fn new(
        rec: &Record,
        forwards: &[Arc<ForwardRuntime>],
        netns: Arc<Netns>,
        opts: Options,
    ) -> Option<KernelForwards> {
        let mut mine = Vec::new();
        for f in forwards
            .iter()
            .filter(|f| f.spec.path == ForwardPath::Kernel)
        {
            if !f.spec.target_allowed(&rec.allowed_targets) {
                f.set_listener("refused");
                f.error(format!(
                    "target {} is outside allowedTargets {:?}",
                    f.spec.target, rec.allowed_targets
                ));
                continue;
            }
            mine.push(f.clone());
        }
        if mine.is_empty() {
            return None;
        }
        let plan = Plan {
            table: TABLE.into(),
            private_ifname: rec.interface.name.clone(),
            // DNAT what arrives on the cluster interface only: never what
            // comes from a segment, this attachment's or another's.
            cluster_ifname: Some(edgelink_forward::private_side::CLUSTER_IFNAME.into()),
            forwards: mine
                .iter()
                .map(|f| KernelForward {
                    name: f.spec.name.clone(),
                    protocol: f.spec.protocol,
                    port: f.spec.port,
                    target: f.spec.target,
                })
                .collect(),
            allowed: rec.allowed_targets.clone(),
        };
        Some(KernelForwards {
            netns,
            plan,
            opts,
            forwards: mine,
            counts: Mutex::new(BTreeMap::new()),
        })
    }

    /// Whether one of its forwards failed to install (retried each pass).
    pub fn failed(&self) -> bool {
        self.forwards.iter().any(|f| f.lock().listener == "failed")
    }

    /// Install (or install again) the table; the forwards are `listening`
    /// when it took, `failed` with the error otherwise.
    pub async fn ensure(self: &Arc<Self>) -> bool {
        let me = self.clone();
        let r = tokio::task::spawn_blocking(move || {
            edgelink_kernel_path::ensure(&me.netns, &me.plan, &me.opts)
        })
        .await
        .unwrap_or_else(|e| {
            Err(edgelink_kernel_path::Error::InvalidPlan {
                table: TABLE.into(),
                reason: format!("install task: {e}"),
            })
        });
        match r {
            Ok(()) => {
                // The table's counters start from zero again.
                let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
                for (carried, last) in c.values_mut() {
                    *carried = add(*carried, *last);
                    *last = FlowCounters::default();
                }
                for f in &self.forwards {
                    f.set_listener("listening");
                }
                tracing::info!(netns = %self.netns.path().display(), forwards = self.forwards.len(), "kernel path installed");
                true
            }
            Err(e) => {
                tracing::warn!(netns = %self.netns.path().display(), error = %e, "cannot install the kernel path");
                for f in &self.forwards {
                    f.error(&e);
                    f.set_listener("failed");
                }
                false
            }
        }
    }

    /// Read the table's counters into the forwards' own.
    pub async fn refresh(self: &Arc<Self>) {
        let me = self.clone();
        let read = tokio::task::spawn_blocking(move || {
            edgelink_kernel_path::counters(&me.netns, TABLE, &me.opts)
        })
        .await;
        let read = match read {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "cannot read the kernel path's counters");
                return;
            }
            Err(_) => return,
        };
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        for f in &self.forwards {
            let Some(now) = read.get(&f.spec.name).copied() else {
                continue;
            };
            let (carried, last) = counts.entry(f.spec.name.clone()).or_default();
            *last = now;
            let total = add(*carried, now);
            let c = &f.counters;
            c.total.store(total.connections, Ordering::Relaxed);
            c.bytes_to_target
                .store(total.bytes_to_target, Ordering::Relaxed);
            c.bytes_to_client
                .store(total.bytes_to_client, Ordering::Relaxed);
            f.packets_to_target
                .store(total.packets_to_target, Ordering::Relaxed);
            let before = f
                .packets_to_client
                .swap(total.packets_to_client, Ordering::Relaxed);
            // The device answered since the last reading: it is reachable
            // (the kernel path has no connect of its own to tell).
            if total.packets_to_client > before {
                f.reach(true, None);
            }
            if f.spec.protocol == edgelink_attachment::Protocol::Udp {
                // A datagram is a packet here (NAT does not reassemble).
                c.udp_datagrams_to_target
                    .store(total.packets_to_target, Ordering::Relaxed);
                c.udp_datagrams_to_client
                    .store(total.packets_to_client, Ordering::Relaxed);
            }
        }
    }

    /// Remove the table (DEL, record changed): the pod stops forwarding.
    pub async fn remove(self: &Arc<Self>) {
        let me = self.clone();
        let r = tokio::task::spawn_blocking(move || {
            edgelink_kernel_path::remove(&me.netns, TABLE, &me.opts)
        })
        .await;
        match r {
            Ok(Ok(_)) => {
                for f in &self.forwards {
                    f.set_listener("stopped");
                }
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot remove the kernel path"),
            Err(e) => tracing::warn!(error = %e, "cannot remove the kernel path"),
        }
    }
}
