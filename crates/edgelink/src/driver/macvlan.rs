//! mode "macvlan": a macvlan child of the uplink, created in the pod's
//! namespace under a temporary name and renamed to CNI_IFNAME.

use super::{check_mtu, require_uplink};
use crate::config::MacvlanConf;
use crate::error::{NetlinkContext, PluginError};
use crate::names;
use crate::node::NodePolicy;
use edgelink_cni_spec::{codes, CniError, Env};
use edgelink_netlink::{Handle, Link, LinkKind, NewLink};
use edgelink_netns::Netns;
use std::os::fd::AsFd;

/// What `attach` made in the pod, for rollback.
#[derive(Debug, Default)]
pub struct Created {
    /// The macvlan's temporary name: set once it exists.
    pub temp_name: Option<String>,
    /// Its index in the pod: set once it was found.
    pub index: Option<u32>,
}

/// Remove what `attach` made, whatever step it stopped at.
pub fn undo(pod: &mut Handle, created: &Created) -> Result<(), PluginError> {
    if let Some(i) = created.index {
        pod.del_link(i).ctx(|| format!("delete macvlan #{i}"))?;
    }
    if let Some(t) = &created.temp_name {
        pod.del_link_by_name(t).ctx(|| format!("delete {t}"))?;
    }
    Ok(())
}

/// Check the uplink and the MTU; returns the uplink.
pub fn prepare(
    node: &mut Handle,
    conf: &MacvlanConf,
    mtu: Option<u32>,
    policy: &NodePolicy,
) -> Result<Link, PluginError> {
    let uplink = require_uplink(node, &conf.uplink, policy)?;
    check_mtu(mtu, Some(&uplink))?;
    // A port of a bridge or bond cannot carry macvlans (the kernel answers
    // EBUSY): say which config is in the way instead.
    if let Some(master) = uplink.master {
        let m = node
            .link_by_index(master)
            .ctx(|| format!("look up the master of uplink {}", conf.uplink))?;
        if let Some(m) = m.filter(|m| match &m.kind {
            LinkKind::Bridge => true,
            LinkKind::Other(k) => k == "bond" || k == "team",
            _ => false,
        }) {
            return Err(PluginError::Cni(CniError::new(
                codes::INVALID_CONFIG,
                format!(
                    "uplink: {:?} is a port of {:?} ({:?}) and cannot carry a macvlan; \
                     use mode \"bridge\" with \"bridge\": {:?}, or another uplink",
                    conf.uplink, m.name, m.kind, m.name
                ),
            )));
        }
    }
    Ok(uplink)
}

/// Create the pod's interface; returns it (up, no addresses yet).
/// `created` is set as soon as the macvlan exists, so that a failure in any
/// later step can remove it (see `commands::add`): the temporary name is
/// derived from (container ID, ifname) and is this ADD's alone; the index
/// follows the link through its rename.
#[allow(clippy::too_many_arguments)]
pub fn attach(
    node: &mut Handle,
    pod: &mut Handle,
    pod_ns: &Netns,
    env: &Env,
    conf: &MacvlanConf,
    uplink: &Link,
    mtu: Option<u32>,
    mac: Option<[u8; 6]>,
    created: &mut Created,
) -> Result<Link, PluginError> {
    let tmp = names::temp_ifname(&env.container_id, &env.ifname);
    // A leftover of an ADD that was killed half-way.
    pod.del_link_by_name(&tmp)
        .ctx(|| format!("remove stale {tmp}"))?;
    node.create_link(&NewLink::Macvlan {
        name: &tmp,
        parent: uplink.index,
        mode: conf.mode,
        mtu,
        mac,
        netns: Some(pod_ns.as_fd()),
    })
    .ctx(|| {
        format!(
            "create macvlan on uplink {:?} ({:?} mode)",
            conf.uplink, conf.mode
        )
    })?;
    created.temp_name = Some(tmp.clone());
    let link = pod
        .require_link(&tmp)
        .ctx(|| format!("find {tmp} in {}", pod_ns.path().display()))?;
    created.index = Some(link.index);
    if let Err(e) = pod.set_name(link.index, &env.ifname) {
        let _ = pod.del_link(link.index);
        if e.is_exists() {
            return Err(PluginError::Cni(CniError::new(
                codes::INTERFACE_EXISTS,
                format!(
                    "CNI_IFNAME {:?} already exists in network namespace {}",
                    env.ifname,
                    pod_ns.path().display()
                ),
            )));
        }
        return Err(e).ctx(|| format!("rename {tmp} to {}", env.ifname));
    }
    pod.set_up(link.index).map_err(|e| {
        let why = if e.errno() == Some(libc::EADDRINUSE) {
            " (its MAC address is already used by the uplink or another macvlan on it)"
        } else {
            ""
        };
        PluginError::Netlink {
            context: format!("set {} up{why}", env.ifname),
            source: e,
        }
    })?;
    pod.link_by_index(link.index)
        .ctx(|| format!("look up {}", env.ifname))?
        .ok_or_else(|| {
            PluginError::Cni(CniError::new(
                codes::KERNEL,
                format!("{} vanished", env.ifname),
            ))
        })
}
