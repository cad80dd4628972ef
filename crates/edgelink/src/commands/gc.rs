//! GC: release every reservation and record of this network that is not in
//! `cni.dev/valid-attachments`. Keeps going on errors and reports them all.
//! A request without the list is refused (code 7). Reservations and records
//! younger than [`GC_GRACE`] are kept: an ADD in flight has them before the
//! runtime lists its attachment.

use super::require_version;
use crate::addressing::LOCK_TIMEOUT;
use crate::config::{Config, Ipam};
use crate::delegate;
use crate::error::{Errors, PluginError};
use crate::names;
use edgelink_attachment::RecordStore;
use edgelink_cni_spec::{codes, CniError, CniVersion, Command, Env};
use edgelink_ipam::{Store, GC_GRACE};
use edgelink_netlink::Handle;
use std::collections::HashSet;

pub fn run(cfg: &Config, env: &Env) -> Result<(), PluginError> {
    require_version(cfg.net.cni_version, CniVersion::V1_1_0, "GC")?;
    if cfg.net.disable_gc {
        return Ok(());
    }
    // Without the list, GC cannot tell live attachments from leaked ones:
    // a missing key is a malformed request, not "nothing is valid".
    let Some(listed) = cfg.net.valid_attachments()? else {
        return Err(PluginError::Cni(CniError::new(
            codes::INVALID_CONFIG,
            "cni.dev/valid-attachments: missing (nor the legacy cni.dev/attachments): \
             GC needs the list of valid attachments and released nothing",
        )));
    };
    let valid: HashSet<(String, String)> = listed
        .into_iter()
        .map(|a| (a.container_id, a.ifname))
        .collect();
    let mut errs = Errors::default();
    let mut node = Handle::new().ok();

    if let Ipam::Builtin(_) = &cfg.ipam {
        if let Some(store) = errs.note(Store::open(&cfg.state_dir, &cfg.net.name)) {
            if let Some(mut lock) = errs.note(store.lock(LOCK_TIMEOUT)) {
                // An ADD in flight has reserved but not yet returned: the
                // runtime may not list it yet.
                let report = lock.release_all_except_with_grace(&valid, GC_GRACE);
                for (net, ip, cid, ifname) in &report.released {
                    tracing::info!(network = %net, %ip, container = %cid, %ifname, "GC released");
                    // An ADD killed before it wrote its record leaves a
                    // node-side veth only its name can find.
                    if let Some(h) = node.as_mut() {
                        let _ = h.del_link_by_name(&names::host_veth(cid, ifname));
                    }
                }
                for e in report.errors {
                    errs.note::<()>(Err(e));
                }
            }
        }
    }

    let records = RecordStore::new(&cfg.state_dir);
    if let Some(list) = errs.note(records.list()) {
        for (path, rec) in list {
            let Ok(rec) = rec else { continue };
            if rec.network != cfg.net.name
                || valid.contains(&(rec.container_id.clone(), rec.ifname.clone()))
                || is_young(&path)
            {
                continue;
            }
            if let Some(h) = node.as_mut() {
                let _ = h.del_link_by_name(&names::host_veth(&rec.container_id, &rec.ifname));
            }
            errs.note(records.remove(&rec.container_id, &rec.ifname));
        }
    }

    if let Ipam::Delegated { plugin } = &cfg.ipam {
        errs.note(delegate::exec(plugin, env, Command::Gc, &cfg.net.raw));
    }
    errs.into_result()
}

/// Whether a record file was written less than [`GC_GRACE`] ago (an
/// unreadable or future mtime counts as young).
fn is_young(path: &std::path::Path) -> bool {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| std::time::SystemTime::now().duration_since(t).ok())
        .is_none_or(|age| age < GC_GRACE)
}
