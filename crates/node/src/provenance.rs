//! Whether a record's netns path still names the namespace the record was
//! written for.
//!
//! A path is only a name: `/proc/<pid>/ns/net` (cri-dockerd gives those)
//! names whatever process has that PID now, after a reboot or once the PID
//! is reused, and a bind mount can be replaced. The plugin writes the boot
//! and the namespace (device, inode) into the record; a record of another
//! boot, or whose path names another namespace now, is never served: its
//! pod is gone, and it is reclaimed as one gone without a DEL. Records
//! written before those fields existed are served as before (wherever the
//! path points), and a daemon that cannot read the boot ID compares only
//! the namespace.

use crate::attachment::Key;
use crate::node::Node;
use edgelink_attachment::{NetnsId, Record};
use edgelink_netns::{Netns, NetnsError};
use std::sync::OnceLock;

/// This boot's ID, read once.
fn this_boot() -> Option<&'static str> {
    static BOOT: OnceLock<Option<String>> = OnceLock::new();
    BOOT.get_or_init(edgelink_attachment::boot_id).as_deref()
}

/// Whether `rec` was written in another boot than this one.
fn other_boot(rec: &Record) -> bool {
    matches!((rec.boot_id.as_deref(), this_boot()), (Some(then), Some(now)) if then != now)
}

/// Why `rec` must not be served in what its path names now (`opened`), if
/// it must not.
pub(crate) fn elsewhere(rec: &Record, opened: &Result<Netns, NetnsError>) -> Option<String> {
    if other_boot(rec) {
        return Some(format!(
            "written in another boot ({}; this one is {})",
            rec.boot_id.as_deref().unwrap_or_default(),
            this_boot().unwrap_or_default()
        ));
    }
    let (want, ns) = (rec.netns_id?, opened.as_ref().ok()?);
    let (dev, ino) = ns.id().ok()?;
    (NetnsId { dev, ino } != want).then(|| {
        format!(
            "{} names another network namespace (inode {ino}) than the one it was written for (inode {})",
            rec.netns, want.ino
        )
    })
}

impl Node {
    /// Whether a netns path of `rec` that cannot be opened, or that names
    /// another namespace, means the pod is gone. A `/proc/<pid>/ns/net`
    /// path names a PID of the plugin's PID namespace; a daemon in another
    /// one (no hostPID) would take every live pod for gone.
    pub(crate) fn sees_pids_of(&self, rec: &Record) -> bool {
        !rec.netns.starts_with("/proc/")
            || rec.pid_namespace.is_none()
            || rec.pid_namespace == edgelink_attachment::own_pid_namespace()
    }

    /// `rec` is not to be served where its path points ([`elsewhere`]):
    /// what runs for it stops, and its pod is reclaimed (address, record)
    /// unless its path is one of another PID namespace, where this daemon
    /// cannot tell. Returns whether anything changed.
    pub(crate) async fn not_its_namespace(&self, k: &Key, rec: &Record, why: &str) -> bool {
        let removed = self.map().remove(k);
        let changed = removed.is_some();
        if let Some(a) = removed {
            a.stop().await;
        }
        if other_boot(rec) || self.sees_pids_of(rec) {
            tracing::warn!(container = %k.0, ifname = %k.1, netns = %rec.netns, %why,
                "not serving an attachment record outside its namespace: reclaiming it");
            if self.reclaimer.release_delegated(rec).await {
                self.reclaimer.reclaim(rec);
            }
            return true;
        }
        tracing::warn!(container = %k.0, ifname = %k.1, netns = %rec.netns, %why,
            "not serving an attachment record outside its namespace (a /proc path of another PID namespace: not reclaimed)");
        changed
    }
}
