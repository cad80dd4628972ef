//! The write path of an allocation: intent (owner index) first, then the
//! address files, then sticky memory and cursors; and its rollback.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use super::disk::{self, OwnerIndex, Reservation, Sticky};
use super::{failpoint, IpamError, Owner, StoreLock};

/// One address chosen for a range set: `fresh` when this call reserves it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pick {
    pub ip: IpAddr,
    pub fresh: bool,
}

impl StoreLock<'_> {
    /// Write the picks: index first (intent), then the address files, then
    /// sticky memory and cursors (best effort). Rolls back on failure.
    pub(super) fn commit(
        &self,
        owner: &Owner,
        index_path: &Path,
        held: &[IpAddr],
        picks: &[Option<Pick>],
    ) -> Result<(), IpamError> {
        let layout = &self.store.layout;
        let fresh: Vec<(usize, IpAddr)> = picks
            .iter()
            .enumerate()
            .filter_map(|(s, p)| p.filter(|p| p.fresh).map(|p| (s, p.ip)))
            .collect();
        let mut listed = held.to_vec();
        listed.extend(fresh.iter().map(|(_, ip)| *ip));
        let index = OwnerIndex {
            container_id: owner.container_id.clone(),
            ifname: owner.ifname.clone(),
            ips: listed,
        };
        disk::write_atomic(index_path, &disk::to_json(&index, index_path)?)?;
        failpoint::check("allocate:after_index", index_path)?;

        let record = Reservation {
            container_id: owner.container_id.clone(),
            ifname: owner.ifname.clone(),
            pod_namespace: owner.pod_namespace.clone(),
            pod_name: owner.pod_name.clone(),
            pod_uid: owner.pod_uid.clone(),
            reserved_at: disk::now_rfc3339(),
        };
        let mut created: Vec<PathBuf> = Vec::with_capacity(fresh.len());
        for &(_, ip) in &fresh {
            let path = layout.ip_file(ip);
            let result =
                disk::to_json(&record, &path).and_then(|b| disk::create_exclusive(&path, &b));
            let error = match result {
                Ok(true) => {
                    created.push(path);
                    continue;
                }
                Ok(false) => IpamError::Corrupt {
                    reason: "it appeared while the store lock was held: something writes this store without taking its lock".into(),
                    path,
                },
                Err(e) => e,
            };
            self.roll_back(owner, index_path, held, &created);
            return Err(error);
        }
        failpoint::check("allocate:after_ip_files", index_path)?;

        if let Some((ns, name)) = owner.pod() {
            let path = layout.sticky_file(ns, name, &owner.ifname);
            let sticky = Sticky {
                pod_namespace: ns.to_string(),
                pod_name: name.to_string(),
                ifname: owner.ifname.clone(),
                ips: picks.iter().flatten().map(|p| p.ip).collect(),
            };
            let written = disk::to_json(&sticky, &path).and_then(|b| disk::write_hint(&path, &b));
            if let Err(e) = written {
                tracing::warn!(error = %e, "could not record the sticky address");
            }
        }
        for &(s, ip) in &fresh {
            let path = layout.last_reserved_file(s);
            if let Err(e) = disk::write_hint(&path, ip.to_string().as_bytes()) {
                tracing::warn!(error = %e, "could not record the round-robin cursor");
            }
        }
        Ok(())
    }

    /// Undo a failed commit: remove the files this call created and restore
    /// the index. Errors are logged: what remains is listed in the index, so
    /// DEL or GC removes it.
    fn roll_back(&self, owner: &Owner, index_path: &Path, held: &[IpAddr], created: &[PathBuf]) {
        if failpoint::crashed() {
            return;
        }
        for path in created {
            if let Err(e) = disk::remove_if_exists(path) {
                tracing::warn!(error = %e, "rollback could not remove a reservation");
            }
        }
        let restored = if held.is_empty() {
            disk::remove_if_exists(index_path)
        } else {
            let index = OwnerIndex {
                container_id: owner.container_id.clone(),
                ifname: owner.ifname.clone(),
                ips: held.to_vec(),
            };
            disk::to_json(&index, index_path).and_then(|b| disk::write_atomic(index_path, &b))
        };
        if let Err(e) = restored {
            tracing::warn!(error = %e, "rollback could not restore the owner index");
        }
    }
}
