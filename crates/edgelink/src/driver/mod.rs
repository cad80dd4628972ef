//! The two ways of giving a pod its second interface. Each driver prepares
//! the node side, creates the pod interface, and can undo exactly what it
//! did; both are driven by `commands::add` after the config was validated.

pub mod bridge;
pub mod macvlan;

use crate::error::{NetlinkContext, PluginError};
use edgelink_cni_spec::{codes, CniError};
use edgelink_netlink::{Handle, Link};

/// The uplink named in the config, which must exist on the node.
pub fn require_uplink(node: &mut Handle, name: &str) -> Result<Link, PluginError> {
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

/// The pod's CNI_IFNAME must not exist yet (ADD on an existing interface
/// fails without touching it).
pub fn ensure_ifname_free(pod: &mut Handle, ifname: &str, netns: &str) -> Result<(), PluginError> {
    if pod
        .link_by_name(ifname)
        .ctx(|| format!("look up {ifname} in {netns}"))?
        .is_some()
    {
        return Err(PluginError::Cni(CniError::new(
            codes::INTERFACE_EXISTS,
            format!("CNI_IFNAME {ifname:?} already exists in network namespace {netns}"),
        )));
    }
    Ok(())
}
