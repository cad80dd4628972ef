//! mode "bridge": a Linux bridge on the node (created if missing), the
//! uplink NIC optionally enslaved to it, and a veth pair whose pod end is
//! CNI_IFNAME and whose node end is named after (container ID, ifname).

use super::{check_mtu, require_uplink};
use crate::config::BridgeConf;
use crate::error::{NetlinkContext, PluginError};
use crate::names;
use crate::node::policy::OWN_BRIDGE_ALIAS;
use crate::node::NodePolicy;
use edgelink_cni_spec::{codes, CniError, Env};
use edgelink_netlink::{BridgePortState, Handle, Link, LinkKind, NewLink, RouteSpec};
use edgelink_netns::Netns;
use ipnetwork::IpNetwork;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

/// How long ADD waits for the new bridge port to reach forwarding.
const FORWARDING_TIMEOUT: Duration = Duration::from_secs(10);

/// What `prepare` changed on the node, step by step, so a failed ADD can
/// put back exactly what it did, wherever it stopped.
#[derive(Debug, Default)]
pub struct Undo {
    /// The bridge, once this ADD changed anything on it (or created it).
    bridge: Option<u32>,
    created_bridge: Option<u32>,
    /// This ADD set an existing bridge up.
    set_bridge_up: bool,
    /// This ADD turned VLAN filtering on for an existing bridge.
    enabled_vlan_filtering: bool,
    /// The uplink whose addresses this ADD moved.
    uplink: Option<u32>,
    /// Addresses added to the bridge (moveUplinkAddresses).
    added_to_bridge: Vec<IpNetwork>,
    enslaved_uplink: Option<u32>,
    /// Addresses removed from the uplink.
    removed_from_uplink: Vec<IpNetwork>,
    /// Routes (as they were on the uplink) added on the bridge.
    moved_routes: Vec<RouteSpec>,
    /// The uplink this ADD set up.
    set_uplink_up: Option<u32>,
}

fn invalid(msg: String) -> PluginError {
    PluginError::Cni(CniError::new(codes::INVALID_CONFIG, msg))
}

/// Addresses that count as "the uplink carries addresses": all but IPv6 link-local.
fn routable_addrs(node: &mut Handle, link: &Link) -> Result<Vec<IpNetwork>, PluginError> {
    Ok(node
        .addrs(Some(link.index))
        .ctx(|| format!("list addresses of {}", link.name))?
        .into_iter()
        .filter(|a| {
            !a.scope_link
                && !matches!(a.network, IpNetwork::V6(n) if n.ip().segments()[0] & 0xffc0 == 0xfe80)
        })
        .map(|a| a.network)
        .collect())
}

/// Give a bridge the plugin made a MAC address of its own: the uplink's
/// (the node keeps the face it had on the segment) or the one the kernel
/// chose. A bridge whose address was never set follows its lowest port's,
/// so a pod's veth joining would change the gateway's MAC under the
/// devices' ARP caches, and frames to the old one (now only a port's) are
/// not the node's: routing through an `isGateway` address stopped until
/// the devices asked again.
fn pin_mac(node: &mut Handle, bridge: &Link, uplink: Option<&Link>) -> Result<(), PluginError> {
    let Some(mac) = uplink.and_then(|u| u.mac).or(bridge.mac) else {
        return Ok(());
    };
    node.set_mac(bridge.index, mac)
        .ctx(|| format!("set the MAC address of bridge {}", bridge.name))
}

/// Ensure the bridge (and the uplink as its port). Returns the bridge and
/// the MTU for the veth pair.
pub fn prepare(
    node: &mut Handle,
    conf: &BridgeConf,
    mtu: Option<u32>,
    undo: &mut Undo,
    policy: &NodePolicy,
) -> Result<(Link, u32), PluginError> {
    let uplink = match &conf.uplink {
        Some(name) => Some(require_uplink(node, name, policy)?),
        None => None,
    };
    // An existing bridge must be one the node allows, before anything
    // (the uplink's checks below included) looks at it.
    if let Some(b) = node
        .link_by_name(&conf.name)
        .ctx(|| format!("look up bridge {}", conf.name))?
    {
        policy.check_bridge(&b.name, b.alias.as_deref())?;
    }
    check_mtu(mtu, uplink.as_ref())?;
    if let Some(u) = &uplink {
        if let Some(master) = u.master {
            let is_ours = node
                .link_by_name(&conf.name)
                .ctx(|| format!("look up bridge {}", conf.name))?
                .is_some_and(|b| b.index == master);
            if !is_ours {
                return Err(invalid(format!(
                    "uplink: {:?} is already a port of another device (link #{master}), not of bridge {:?}",
                    u.name, conf.name
                )));
            }
        }
    }

    let bridge = match node
        .link_by_name(&conf.name)
        .ctx(|| format!("look up bridge {}", conf.name))?
    {
        Some(b) if b.kind != LinkKind::Bridge => {
            return Err(invalid(format!(
                "bridge: {:?} exists on the node and is not a bridge ({:?})",
                conf.name, b.kind
            )))
        }
        Some(b) => b,
        None => {
            let bmtu = mtu.or(uplink.as_ref().map(|u| u.mtu));
            match node.create_link(&NewLink::Bridge {
                name: &conf.name,
                mtu: bmtu,
                vlan_filtering: false,
            }) {
                Ok(()) => {
                    let b = node
                        .require_link(&conf.name)
                        .ctx(|| format!("look up bridge {}", conf.name))?;
                    undo.created_bridge = Some(b.index);
                    undo.bridge = Some(b.index);
                    // Marked as the plugin's own: later configs may name
                    // it without the node policy listing it.
                    node.set_alias(b.index, OWN_BRIDGE_ALIAS)
                        .ctx(|| format!("mark bridge {} as the plugin's", conf.name))?;
                    // Before it is up: no IPv6 link-local address on the
                    // segment, through which a device would reach every node
                    // service bound to [::]. Switching only needs no address
                    // (isGateway turns IPv6 on again for an IPv6 gateway).
                    crate::sysctl::ensure_ipv6_conf(&conf.name, "disable_ipv6", "1")?;
                    pin_mac(node, &b, uplink.as_ref())?;
                    b
                }
                // Created meanwhile by someone else than an ADD (ADDs
                // hold the bridge's lock).
                Err(e) if e.is_exists() => {
                    let b = node
                        .require_link(&conf.name)
                        .ctx(|| format!("look up bridge {}", conf.name))?;
                    policy.check_bridge(&b.name, b.alias.as_deref())?;
                    b
                }
                Err(e) => return Err(e).ctx(|| format!("create bridge {}", conf.name)),
            }
        }
    };
    if let Some(vid) = conf.vlan {
        if bridge.vlan_filtering != Some(true) {
            node.set_vlan_filtering(bridge.index, true).map_err(|e| {
                if e.is_not_supported() {
                    PluginError::Cni(CniError::new(
                        codes::KERNEL_FEATURE_MISSING,
                        format!("vlan: {vid} needs bridge VLAN filtering, which this kernel does not support ({e})"),
                    ))
                } else {
                    PluginError::Netlink { context: format!("enable VLAN filtering on {}", conf.name), source: e }
                }
            })?;
            undo.bridge = Some(bridge.index);
            undo.enabled_vlan_filtering = true;
        }
    }
    if !bridge.up {
        node.set_up(bridge.index)
            .ctx(|| format!("set bridge {} up", conf.name))?;
        undo.bridge = Some(bridge.index);
        undo.set_bridge_up = true;
    }

    if let Some(u) = uplink {
        if u.master != Some(bridge.index) {
            let addrs = routable_addrs(node, &u)?;
            if !addrs.is_empty() && !conf.move_uplink_addresses {
                let list: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
                return Err(invalid(format!(
                    "uplink: {:?} carries addresses [{}]; enslaving it to bridge {:?} would cut the node off. \
                     Move them to the bridge yourself, or set \"moveUplinkAddresses\": true",
                    u.name,
                    list.join(", "),
                    conf.name
                )));
            }
            let routes: Vec<RouteSpec> = node
                .routes()
                .ctx(|| "list routes".to_string())?
                .into_iter()
                .filter(|r| r.oif == Some(u.index) && r.gw.is_some())
                .collect();
            // Addresses go on the bridge first, so the node stays reachable.
            undo.bridge = Some(bridge.index);
            undo.uplink = Some(u.index);
            for a in &addrs {
                node.ensure_addr(bridge.index, a, true)
                    .ctx(|| format!("add {a} to bridge {}", conf.name))?;
                undo.added_to_bridge.push(*a);
            }
            node.set_master(u.index, bridge.index).map_err(|e| {
                let why = if e.errno() == Some(libc::EBUSY) {
                    " (the uplink is busy: does it carry a macvlan, a VLAN or another upper device?)"
                } else {
                    ""
                };
                PluginError::Netlink {
                    context: format!("enslave uplink {} to bridge {}{why}", u.name, conf.name),
                    source: e,
                }
            })?;
            undo.enslaved_uplink = Some(u.index);
            for a in &addrs {
                node.del_addr(u.index, a)
                    .ctx(|| format!("remove {a} from uplink {}", u.name))?;
                undo.removed_from_uplink.push(*a);
            }
            for r in &routes {
                let mut moved = r.clone();
                moved.oif = Some(bridge.index);
                node.ensure_route(&moved)
                    .ctx(|| format!("move route {} to bridge {}", r.dst, conf.name))?;
                undo.moved_routes.push(r.clone());
            }
        }
        if !u.up {
            node.set_up(u.index)
                .ctx(|| format!("set uplink {} up", u.name))?;
            undo.set_uplink_up = Some(u.index);
        }
        if let Some(vid) = conf.vlan {
            node.bridge_vlan(u.index, vid, false, true)
                .ctx(|| format!("add VLAN {vid} (tagged) to uplink {}", u.name))?;
        }
    }
    let veth_mtu = mtu.unwrap_or(if bridge.mtu > 0 { bridge.mtu } else { 1500 });
    Ok((bridge, veth_mtu))
}

/// Create the veth pair, attach the node end to the bridge and bring both
/// up. Returns (node end, pod end).
#[allow(clippy::too_many_arguments)]
pub fn attach(
    node: &mut Handle,
    pod: &mut Handle,
    pod_ns: &Netns,
    env: &Env,
    conf: &BridgeConf,
    bridge: &Link,
    mtu: u32,
    mac: Option<[u8; 6]>,
) -> Result<(Link, Link), PluginError> {
    let host = names::host_veth(&env.container_id, &env.ifname);
    let spec = NewLink::Veth {
        name: &host,
        mtu: Some(mtu),
        master: Some(bridge.index),
        up: true,
        peer_name: &env.ifname,
        peer_mac: mac,
        peer_netns: Some(pod_ns.as_fd()),
    };
    let created = match node.create_link(&spec) {
        // CNI_IFNAME was checked free in the pod: the clash is a node-side
        // leftover of an ADD for this very (container, ifname) killed half-way.
        Err(e)
            if e.is_exists()
                && node
                    .del_link_by_name(&host)
                    .ctx(|| format!("remove stale {host}"))? =>
        {
            node.create_link(&spec)
        }
        other => other,
    };
    created.map_err(|e| {
        if e.is_exists() {
            PluginError::Cni(CniError::new(
                codes::INTERFACE_EXISTS,
                format!(
                    "CNI_IFNAME {:?} already exists in network namespace {}",
                    env.ifname,
                    pod_ns.path().display()
                ),
            ))
        } else {
            PluginError::Netlink {
                context: format!(
                    "create veth {host} <-> {} on bridge {}",
                    env.ifname, conf.name
                ),
                source: e,
            }
        }
    })?;
    let host_link = node.require_link(&host).ctx(|| format!("look up {host}"))?;
    if conf.hairpin {
        node.set_hairpin(host_link.index, true)
            .ctx(|| format!("hairpin on {host}"))?;
    }
    if let Some(vid) = conf.vlan {
        node.bridge_vlan(host_link.index, vid, true, true)
            .ctx(|| format!("add VLAN {vid} (PVID, untagged) to {host}"))?;
        if vid != 1 {
            node.bridge_vlan(host_link.index, 1, false, false)
                .ctx(|| format!("remove default VLAN 1 from {host}"))?;
        }
    }
    let pod_link = pod
        .require_link(&env.ifname)
        .ctx(|| format!("look up {}", env.ifname))?;
    pod.set_up(pod_link.index)
        .ctx(|| format!("set {} up", env.ifname))?;
    Ok((host_link, pod_link))
}

/// Wait until the node end is a forwarding bridge port (immediately without
/// STP; after the forward delay with it).
pub fn wait_forwarding(node: &mut Handle, host: &Link) -> Result<(), PluginError> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(200);
    loop {
        let l = node
            .link_by_index(host.index)
            .ctx(|| format!("look up {}", host.name))?
            .ok_or_else(|| {
                PluginError::Cni(CniError::new(
                    codes::KERNEL,
                    format!("{} vanished", host.name),
                ))
            })?;
        if l.port_state == Some(BridgePortState::Forwarding) {
            return Ok(());
        }
        if start.elapsed() > FORWARDING_TIMEOUT {
            return Err(PluginError::Cni(CniError::new(
                codes::TRY_AGAIN_LATER,
                format!(
                    "bridge port {} did not reach forwarding within {:?} (state {:?}); is STP on with a long forward delay?",
                    host.name, FORWARDING_TIMEOUT, l.port_state
                ),
            )));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Put gateway addresses on the bridge (isGateway) and enable forwarding,
/// behind the bridge's node-side guard (crates/kernel-path's gateway
/// table): the node routes nothing from the segment to elsewhere or back,
/// and answers nothing new from the segment but ICMP. The guard goes in
/// first. Returns whether this call created the guard's table.
pub fn ensure_gateways(
    node: &mut Handle,
    bridge: &Link,
    gateways: &[IpNetwork],
) -> Result<bool, PluginError> {
    if gateways.is_empty() {
        return Ok(false);
    }
    let created = ensure_guard(&bridge.name)?;
    for g in gateways {
        if g.is_ipv6() {
            // A bridge the plugin created has IPv6 off (no link-local).
            crate::sysctl::ensure_ipv6_conf(&bridge.name, "disable_ipv6", "0")?;
        }
        node.ensure_addr(bridge.index, g, true)
            .ctx(|| format!("add gateway {g} to bridge {}", bridge.name))?;
        if g.is_ipv4() {
            crate::sysctl::ensure("net.ipv4.ip_forward", "1")?;
        } else {
            crate::sysctl::ensure("net.ipv6.conf.all.forwarding", "1")?;
        }
    }
    Ok(created)
}

/// nft as the node's runtime finds it (its PATH), for the guard.
fn nft_options() -> edgelink_kernel_path::Options {
    edgelink_kernel_path::Options::default()
}

fn ensure_guard(bridge: &str) -> Result<bool, PluginError> {
    let node = edgelink_netns::Netns::current()?;
    edgelink_kernel_path::ensure_gateway_guard(&node, bridge, &nft_options()).map_err(|e| {
        PluginError::Cni(CniError::new(
            codes::KERNEL,
            format!(
                "isGateway: cannot guard bridge {bridge:?} (nftables table {}; nft from the Debian package nftables must be on the runtime's PATH): {e}",
                edgelink_kernel_path::gateway_table(bridge)
            ),
        ))
    })
}

/// Remove the guard a failed ADD created, once its bridge is gone too.
pub fn remove_guard(node: &mut Handle, bridge: &str) {
    if matches!(node.link_by_name(bridge), Ok(Some(_))) {
        return; // the bridge stays (another port joined): so does its guard
    }
    let r = edgelink_netns::Netns::current()
        .map_err(|e| e.to_string())
        .and_then(|ns| {
            edgelink_kernel_path::remove_gateway_guard(&ns, bridge, &nft_options())
                .map_err(|e| e.to_string())
        });
    if let Err(e) = r {
        tracing::error!(error = %e, "rollback: cannot remove the guard of bridge {bridge}");
    }
}

/// Undo `prepare` after a failed ADD: every step it recorded, in reverse.
/// When another port joined the bridge meanwhile, an enslaved uplink and
/// the bridge stay as they are (another attachment uses them now); what was
/// done before the uplink was enslaved (addresses copied onto the bridge)
/// is reversed in any case.
pub fn undo(node: &mut Handle, conf: &BridgeConf, undo: Undo) -> Vec<PluginError> {
    let mut errs = Vec::new();
    let Some(bridge) = undo.bridge else {
        return errs; // nothing was changed
    };
    let mut note = |r: Result<(), edgelink_netlink::NetlinkError>, context: String| {
        if let Err(source) = r {
            errs.push(PluginError::Netlink { context, source });
        }
    };
    let others = match node.links() {
        Ok(l) => l
            .iter()
            .any(|p| p.master == Some(bridge) && Some(p.index) != undo.enslaved_uplink),
        Err(e) => {
            note(Err(e), "list links".into());
            return errs;
        }
    };
    if others && undo.enslaved_uplink.is_some() {
        return errs; // someone else uses the bridge and its uplink now
    }

    // The uplink: out of the bridge, its addresses and routes back.
    for r in &undo.moved_routes {
        let mut on_bridge = r.clone();
        on_bridge.oif = Some(bridge);
        let _ = node.del_route(&on_bridge);
    }
    if let Some(u) = undo.enslaved_uplink {
        let r = node.set_master(u, 0);
        note(r, format!("release uplink #{u}"));
    }
    if let Some(u) = undo.uplink {
        // Back on the uplink first (a no-op for those never removed), so
        // the node stays reachable.
        for a in &undo.added_to_bridge {
            let r = node.ensure_addr(u, a, true);
            note(r, format!("restore {a} on uplink #{u}"));
        }
    }
    for a in &undo.added_to_bridge {
        let r = node.del_addr(bridge, a);
        note(r, format!("remove {a} from bridge {}", conf.name));
    }
    for r in &undo.moved_routes {
        let res = node.ensure_route(r);
        note(res, format!("restore route {}", r.dst));
    }
    if let Some(u) = undo.set_uplink_up {
        let r = node.set_down(u);
        note(r, format!("set uplink #{u} down again"));
    }

    // The bridge: removed if this ADD made it, else as it was.
    if others {
        return errs;
    }
    if undo.created_bridge.is_some() {
        let r = node.del_link(bridge).map(|_| ());
        note(r, format!("remove bridge {}", conf.name));
    } else {
        if undo.set_bridge_up {
            let r = node.set_down(bridge);
            note(r, format!("set bridge {} down again", conf.name));
        }
        if undo.enabled_vlan_filtering {
            let r = node.set_vlan_filtering(bridge, false);
            note(
                r,
                format!("turn VLAN filtering off on bridge {}", conf.name),
            );
        }
    }
    errs
}

/// Remove what an ADD for this very (container ID, ifname) left when it was
/// killed half-way: a veth pair whose node end carries the derived name and
/// whose pod end is CNI_IFNAME (each end the other's peer). Without this a
/// retried ADD would fail with 101 on its own leftover. Anything else named
/// CNI_IFNAME is left alone (ADD then fails with 101, as the spec says).
/// Returns whether a leftover was removed.
pub fn remove_own_leftover(
    node: &mut Handle,
    pod: &mut Handle,
    env: &Env,
) -> Result<bool, PluginError> {
    let host = names::host_veth(&env.container_id, &env.ifname);
    let Some(h) = node.link_by_name(&host).ctx(|| format!("look up {host}"))? else {
        return Ok(false);
    };
    let Some(p) = pod
        .link_by_name(&env.ifname)
        .ctx(|| format!("look up {}", env.ifname))?
    else {
        return Ok(false);
    };
    let pair = h.kind == LinkKind::Veth
        && p.kind == LinkKind::Veth
        && h.parent == Some(p.index)
        && p.parent == Some(h.index);
    if !pair {
        return Ok(false);
    }
    tracing::warn!(host = %host, ifname = %env.ifname, "removing the leftover of an earlier ADD for this container and ifname");
    node.del_link(h.index)
        .ctx(|| format!("remove leftover {host}"))?;
    Ok(true)
}
