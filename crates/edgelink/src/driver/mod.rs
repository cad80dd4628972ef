//! The two ways of giving a pod its second interface. Each driver prepares
//! the node side, creates the pod interface, and can undo exactly what it
//! did; both are driven by `commands::add` after the config was validated.

pub mod bridge;
pub mod macvlan;

use crate::error::{NetlinkContext, PluginError};
use crate::node::NodePolicy;
use edgelink_attachment::RETIRED_ALIAS;
use edgelink_cni_spec::{codes, CniError};
use edgelink_netlink::{Handle, Link};

/// The uplink named in the config, which the node policy must allow (first:
/// a config learns nothing about the node's other interfaces) and which
/// must exist on the node.
pub fn require_uplink(
    node: &mut Handle,
    name: &str,
    policy: &NodePolicy,
) -> Result<Link, PluginError> {
    policy.check_uplink(name)?;
    node.link_by_name(name)
        .ctx(|| format!("look up uplink {name}"))?
        .ok_or_else(|| {
            PluginError::Cni(CniError::new(
                codes::INVALID_CONFIG,
                format!("uplink: {name:?} does not exist in the node's network namespace"),
            ))
        })
}

/// `mtu` must not exceed the uplink's.
pub fn check_mtu(mtu: Option<u32>, uplink: Option<&Link>) -> Result<(), PluginError> {
    if let (Some(m), Some(u)) = (mtu, uplink) {
        if m > u.mtu {
            return Err(PluginError::Cni(CniError::new(
                codes::INVALID_CONFIG,
                format!("mtu: {m} exceeds the MTU {} of uplink {:?}", u.mtu, u.name),
            )));
        }
    }
    Ok(())
}

/// How long ADD waits for an interface of the same name that a DEL handed
/// to the daemon (the kernel takes tens of milliseconds to delete it).
const RETIRED_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The pod's CNI_IFNAME must not exist yet (ADD on an existing interface
/// fails without touching it). One that DEL retired ([`RETIRED_ALIAS`]) is
/// on its way out: wait for it, and delete it if the daemon has not.
pub fn ensure_ifname_free(pod: &mut Handle, ifname: &str, netns: &str) -> Result<(), PluginError> {
    let lookup = |pod: &mut Handle| {
        pod.link_by_name(ifname)
            .ctx(|| format!("look up {ifname} in {netns}"))
    };
    let mut found = lookup(pod)?;
    let deadline = std::time::Instant::now() + RETIRED_WAIT;
    while let Some(l) = found
        .as_ref()
        .filter(|l| l.alias.as_deref() == Some(RETIRED_ALIAS))
    {
        if std::time::Instant::now() >= deadline {
            tracing::warn!(
                ifname,
                "deleting {ifname}, retired by a DEL and still there"
            );
            pod.del_link(l.index)
                .ctx(|| format!("delete the retired {ifname} in {netns}"))?;
        } else {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        found = lookup(pod)?;
    }
    if found.is_some() {
        return Err(PluginError::Cni(CniError::new(
            codes::INTERFACE_EXISTS,
            format!("CNI_IFNAME {ifname:?} already exists in network namespace {netns}"),
        )));
    }
    Ok(())
}
