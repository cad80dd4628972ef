//! DEL: best effort, again and again. Works without a netns, without
//! prevResult and with a stripped config (multus#755): everything is found
//! from (container ID, ifname). Every step runs; all errors are reported.

use crate::addressing;
use crate::config::basics;
use crate::error::{Errors, NetlinkContext, PluginError};
use crate::names;
use edgelink_attachment::{nudge_daemon, RecordStore};
use edgelink_cni_spec::Env;
use edgelink_netlink::Handle;
use edgelink_netns::{Netns, NetnsError};
use serde_json::Value;

/// `raw` is whatever JSON object came on stdin (possibly stripped).
pub fn run(raw: &Value, env: &Env) -> Result<(), PluginError> {
    let b = basics(raw);
    let network = raw.get("name").and_then(Value::as_str);
    let records = RecordStore::new(&b.state_dir);
    let mut errs = Errors::default();
    let record = errs
        .note(records.read(&env.container_id, &env.ifname))
        .flatten();

    // 1. The pod's interface (a veth's node end goes with it).
    if let Some(path) = &env.netns {
        match Netns::open(path) {
            Ok(ns) => {
                let pod = ns
                    .run(Handle::new)
                    .map_err(PluginError::from)
                    .and_then(|h| h.ctx(|| format!("open netlink in {}", path.display())));
                if let Some(mut pod) = errs.note(pod) {
                    errs.note(
                        pod.del_link_by_name(&env.ifname)
                            .ctx(|| format!("delete {} in {}", env.ifname, path.display())),
                    );
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
    if let Some(mut node) =
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
        nudge_daemon(&b.state_dir);
    }
    errs.into_result()
}
