//! DEL: best effort, again and again. Works without a netns, without
//! prevResult and with a stripped config (multus#755): everything is found
//! from (container ID, ifname). Every step runs; all errors are reported.

use crate::addressing;
use crate::config::basics;
use crate::error::{Errors, NetlinkContext, PluginError};
use crate::names;
use edgelink_attachment::{nudge_daemon, Record, RecordError, RecordStore, RETIRED_ALIAS};
use edgelink_cni_spec::Env;
use edgelink_netlink::{Handle, Link, LinkKind};
use edgelink_netns::{Netns, NetnsError};
use serde_json::Value;

/// `raw` is whatever JSON object came on stdin (possibly stripped).
pub fn run(raw: &Value, env: &Env) -> Result<(), PluginError> {
    let b = basics(raw);
    let network = raw.get("name").and_then(Value::as_str);
    let records = RecordStore::new(&b.state_dir);
    let mut errs = Errors::default();
    let record = match records.read(&env.container_id, &env.ifname) {
        Ok(r) => r,
        // A torn or hand-edited record: DEL goes on without it and removes
        // it (step 4). It is an error only where DEL needed it: to find the
        // pod's netns (no CNI_NETNS) or a delegated IPAM (a stripped
        // config). Otherwise the runtime would retry a DEL that did all of
        // its work (docs/reliability.md, item 33).
        Err(e @ RecordError::Malformed { .. })
            if env.netns.is_some() && raw.get("ipam").is_some() =>
        {
            tracing::warn!(error = %e, "DEL goes on without the unreadable record");
            None
        }
        Err(e) => {
            errs.note::<()>(Err(e));
            None
        }
    };

    // 1. The pod's interface (a veth's node end goes with it). Without
    //    CNI_NETNS (containerd's second DEL, which may be the only one), the
    //    netns recorded by ADD: a macvlan left in a live netns would keep an
    //    address that IPAM is about to hand out again.
    let recorded = record
        .as_ref()
        .map(|r| r.netns.as_str())
        .filter(|p| !p.is_empty())
        .map(std::path::PathBuf::from);
    // The pod's interface went to the daemon, which deletes it (and a
    // veth's node end with it) in the background.
    let mut handed_off = false;
    if let Some(path) = &env.netns.clone().or(recorded) {
        match Netns::open(path) {
            Ok(ns) => {
                let pod = ns
                    .run(Handle::new)
                    .map_err(PluginError::from)
                    .and_then(|h| h.ctx(|| format!("open netlink in {}", path.display())));
                if let Some(mut pod) = errs.note(pod) {
                    let found = pod
                        .link_by_name(&env.ifname)
                        .ctx(|| format!("look up {} in {}", env.ifname, path.display()));
                    if let Some(Some(link)) = errs.note(found) {
                        if is_ours(&link, env, record.as_ref()) {
                            handed_off = errs
                                .note(retire_or_delete(&mut pod, &link, env, &b.state_dir, path))
                                .unwrap_or(false);
                        } else {
                            tracing::warn!(
                                ifname = %env.ifname,
                                kind = %link.kind,
                                "not deleting the pod's interface: edgelink did not make it (an ADD that failed with code 101?)"
                            );
                        }
                    }
                    let tmp = names::temp_ifname(&env.container_id, &env.ifname);
                    errs.note(pod.del_link_by_name(&tmp).ctx(|| format!("delete {tmp}")));
                }
            }
            // Gone already: its interfaces went with it.
            Err(NetnsError::NotFound { .. }) | Err(NetnsError::NotNetns { .. }) => {}
            Err(e) => {
                errs.note::<()>(Err(e));
            }
        }
    }

    // 2. The node end of a bridge attachment, in case the pod end is gone
    //    without it (an ADD killed half-way).
    if handed_off {
        // It goes with the pod end.
    } else if let Some(mut node) =
        errs.note(Handle::new().ctx(|| "open netlink in the node namespace".into()))
    {
        let host = names::host_veth(&env.container_id, &env.ifname);
        errs.note(
            node.del_link_by_name(&host)
                .ctx(|| format!("delete {host}")),
        );
    }

    // 3. Addresses: the built-in store (always; cheap and safe), then a
    //    delegated IPAM named by this config or, if stripped, by the record.
    errs.note(addressing::release_builtin(&b.state_dir, network, env));
    let delegated_config = if raw.get("ipam").is_some() {
        Some(raw.clone())
    } else {
        record.as_ref().and_then(|r| r.cni_config.clone())
    };
    if let Some(cfg) = delegated_config {
        if let Some(plugin) = cfg["ipam"]["type"]
            .as_str()
            .filter(|t| !t.is_empty() && *t != "edgelink")
        {
            errs.note(addressing::release_delegated(plugin, env, &cfg));
        }
    }

    // 4. The record.
    if errs.note(records.remove(&env.container_id, &env.ifname)) == Some(true) {
        nudge_daemon(&b.state_dir, &env.container_id, &env.ifname);
    }
    errs.into_result()
}

/// Take the pod's interface away. With a node daemon running: its
/// addresses removed (nothing answers for them once IPAM hands them out
/// again), marked with [`RETIRED_ALIAS`], and handed to the daemon, which
/// deletes it in the background: the kernel needs 15–40 ms to delete a link
/// (it waits for RCU grace periods). A new ADD of the same CNI_IFNAME waits
/// for it (`driver::ensure_ifname_free`). Deleted here, synchronously, when
/// no daemon takes it. `Ok(true)`: the daemon took it.
fn retire_or_delete(
    pod: &mut Handle,
    link: &Link,
    env: &Env,
    state_dir: &std::path::Path,
    netns: &std::path::Path,
) -> Result<bool, PluginError> {
    if let Some(reaper) = edgelink_attachment::Reaper::connect(state_dir) {
        let retired = pod.addrs(Some(link.index)).is_ok_and(|addrs| {
            addrs
                .iter()
                .all(|a| pod.del_addr(link.index, &a.network).is_ok())
        }) && pod.set_alias(link.index, RETIRED_ALIAS).is_ok();
        if retired {
            match reaper.reap(netns, link.index, &link.name) {
                Ok(()) => return Ok(true),
                Err(e) => {
                    tracing::debug!(error = %e, "the daemon did not take {}: deleting it now", link.name)
                }
            }
        }
    }
    pod.del_link(link.index)
        .map(|_| false)
        .ctx(|| format!("delete {} in {}", env.ifname, netns.display()))
}

/// Whether the pod's CNI_IFNAME is edgelink's to delete. An ADD that failed
/// with code 101 is followed by a DEL for the same name, which must not take
/// away the interface that was there first (the primary network's eth0 when
/// a NAD asks for that name). edgelink makes only two kinds: a veth whose
/// node end carries the name derived from (container ID, ifname), and a
/// macvlan (with the recorded MAC, when there is a record).
fn is_ours(link: &Link, env: &Env, record: Option<&Record>) -> bool {
    match link.kind {
        LinkKind::Veth => {
            let host = names::host_veth(&env.container_id, &env.ifname);
            // When the node cannot be asked, delete as before (best effort).
            Handle::new()
                .and_then(|mut node| node.link_by_name(&host))
                .map_or(true, |l| l.is_some())
        }
        LinkKind::Macvlan => record.is_none_or(|r| {
            r.interface.mac.is_empty()
                || link
                    .mac_string()
                    .is_some_and(|m| m.eq_ignore_ascii_case(&r.interface.mac))
        }),
        _ => false,
    }
}
