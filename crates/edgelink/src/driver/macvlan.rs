//! mode "macvlan": a macvlan child of the uplink, created in the pod's
//! namespace under a temporary name and renamed to CNI_IFNAME.

use super::{check_mtu, require_uplink};
use crate::config::MacvlanConf;
use crate::error::{NetlinkContext, PluginError};
use crate::names;
use edgelink_cni_spec::{codes, CniError, Env};
use edgelink_netlink::{Handle, Link, LinkKind, NewLink};
use edgelink_netns::Netns;
use std::os::fd::AsFd;

/// Check the uplink and the MTU; returns the uplink.
pub fn prepare(
    node: &mut Handle,
    conf: &MacvlanConf,
    mtu: Option<u32>,
) -> Result<Link, PluginError> {
    let uplink = require_uplink(node, &conf.uplink)?;
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
    let link = pod
        .require_link(&tmp)
        .ctx(|| format!("find {tmp} in {}", pod_ns.path().display()))?;
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
    pod.set_up(link.index)
        .ctx(|| format!("set {} up", env.ifname))?;
    pod.link_by_index(link.index)
        .ctx(|| format!("look up {}", env.ifname))?
        .ok_or_else(|| {
            PluginError::Cni(CniError::new(
                codes::KERNEL,
                format!("{} vanished", env.ifname),
            ))
        })
}
