//! Links: look up, create (bridge, veth, macvlan), change, delete.

use crate::{Handle, NetlinkError, Result};
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::link::{
    AfSpecBridge, BridgePortState as NlPortState, BridgeVlanInfo, BridgeVlanInfoFlags, InfoBridge,
    InfoBridgePort, InfoData, InfoKind, InfoMacVlan, InfoPortData, InfoPortKind, InfoVeth,
    LinkAttribute, LinkFlags, LinkInfo, LinkMessage, MacVlanMode as NlMacvlanMode,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use std::os::fd::{AsRawFd, BorrowedFd};

/// The kind of a link, as far as edgelink cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkKind {
    Bridge,
    Veth,
    Macvlan,
    Other(String),
    /// A physical NIC or anything without IFLA_INFO_KIND.
    Device,
}

impl std::fmt::Display for LinkKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LinkKind::Bridge => "bridge",
            LinkKind::Veth => "veth",
            LinkKind::Macvlan => "macvlan",
            LinkKind::Other(k) => k,
            LinkKind::Device => "device",
        })
    }
}

/// STP state of a bridge port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BridgePortState {
    Disabled,
    Listening,
    Learning,
    Forwarding,
    Blocking,
    Other(u8),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MacvlanMode {
    Bridge,
    Private,
    Vepa,
    Passthru,
}

/// What the kernel says about one link.
#[derive(Debug, Clone)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub kind: LinkKind,
    pub mac: Option<[u8; 6]>,
    pub mtu: u32,
    pub max_mtu: Option<u32>,
    pub up: bool,
    /// IFF_LOWER_UP: carrier.
    pub lower_up: bool,
    /// Index of the bridge (or other controller) this link is enslaved to.
    pub master: Option<u32>,
    /// For a bridge port: its STP state.
    pub port_state: Option<BridgePortState>,
    pub hairpin: Option<bool>,
    /// For a bridge: whether VLAN filtering is on.
    pub vlan_filtering: Option<bool>,
    /// The parent link index (veth peer, macvlan master), in the peer's namespace.
    pub parent: Option<u32>,
    /// IFLA_IFALIAS, the free-form description (`ip link set X alias ...`).
    pub alias: Option<String>,
}

impl Link {
    pub fn mac_string(&self) -> Option<String> {
        self.mac.map(|m| format_mac(&m))
    }
}

pub fn format_mac(m: &[u8; 6]) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
}

/// A link to create.
#[derive(Debug, Clone)]
pub enum NewLink<'a> {
    Bridge {
        name: &'a str,
        mtu: Option<u32>,
        vlan_filtering: bool,
    },
    /// A veth pair: `name` here, `peer_name` created directly in `peer_netns`.
    /// With `up` this end comes up at creation, with `master` it is
    /// enslaved at creation (one request instead of three).
    Veth {
        name: &'a str,
        mtu: Option<u32>,
        master: Option<u32>,
        up: bool,
        peer_name: &'a str,
        peer_mac: Option<[u8; 6]>,
        peer_netns: Option<BorrowedFd<'a>>,
    },
    /// A macvlan child of `parent`, created directly in `netns`.
    Macvlan {
        name: &'a str,
        parent: u32,
        mode: MacvlanMode,
        mtu: Option<u32>,
        mac: Option<[u8; 6]>,
        netns: Option<BorrowedFd<'a>>,
    },
}

fn link_msg(index: u32) -> LinkMessage {
    let mut m = LinkMessage::default();
    m.header.index = index;
    m
}

fn parse_link(m: LinkMessage) -> Link {
    let mut l = Link {
        index: m.header.index,
        name: String::new(),
        kind: LinkKind::Device,
        mac: None,
        mtu: 0,
        max_mtu: None,
        up: m.header.flags.contains(LinkFlags::Up),
        lower_up: m.header.flags.contains(LinkFlags::LowerUp),
        master: None,
        port_state: None,
        hairpin: None,
        vlan_filtering: None,
        parent: None,
        alias: None,
    };
    for a in m.attributes {
        match a {
            LinkAttribute::IfName(n) => l.name = n,
            LinkAttribute::Mtu(v) => l.mtu = v,
            LinkAttribute::MaxMtu(v) => l.max_mtu = Some(v),
            LinkAttribute::Controller(v) => l.master = Some(v),
            LinkAttribute::Link(v) => l.parent = Some(v),
            LinkAttribute::IfAlias(a) => l.alias = Some(a),
            LinkAttribute::Address(a) if a.len() == 6 => {
                let mut mac = [0u8; 6];
                mac.copy_from_slice(&a);
                l.mac = Some(mac);
            }
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    match i {
                        LinkInfo::Kind(k) => {
                            l.kind = match k {
                                InfoKind::Bridge => LinkKind::Bridge,
                                InfoKind::Veth => LinkKind::Veth,
                                InfoKind::MacVlan => LinkKind::Macvlan,
                                other => LinkKind::Other(other.to_string()),
                            }
                        }
                        LinkInfo::Data(InfoData::Bridge(opts)) => {
                            for o in opts {
                                if let InfoBridge::VlanFiltering(v) = o {
                                    l.vlan_filtering = Some(v);
                                }
                            }
                        }
                        LinkInfo::PortData(InfoPortData::BridgePort(opts)) => {
                            for o in opts {
                                match o {
                                    InfoBridgePort::State(s) => {
                                        l.port_state = Some(match s {
                                            NlPortState::Disabled => BridgePortState::Disabled,
                                            NlPortState::Listening => BridgePortState::Listening,
                                            NlPortState::Learning => BridgePortState::Learning,
                                            NlPortState::Forwarding => BridgePortState::Forwarding,
                                            NlPortState::Blocking => BridgePortState::Blocking,
                                            NlPortState::Other(v) => BridgePortState::Other(v),
                                            _ => BridgePortState::Other(255),
                                        })
                                    }
                                    InfoBridgePort::HairpinMode(h) => l.hairpin = Some(h),
                                    _ => {}
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    l
}

impl Handle {
    /// The link called `name`, or `None`.
    pub fn link_by_name(&mut self, name: &str) -> Result<Option<Link>> {
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.to_string()));
        match self.query(
            RouteNetlinkMessage::GetLink(m),
            false,
            &format!("get link {name}"),
        ) {
            Ok(mut v) => match v.pop() {
                Some(RouteNetlinkMessage::NewLink(l)) => Ok(Some(parse_link(l))),
                _ => Ok(None),
            },
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The link with `index`, or `None`.
    pub fn link_by_index(&mut self, index: u32) -> Result<Option<Link>> {
        match self.query(
            RouteNetlinkMessage::GetLink(link_msg(index)),
            false,
            &format!("get link #{index}"),
        ) {
            Ok(mut v) => match v.pop() {
                Some(RouteNetlinkMessage::NewLink(l)) => Ok(Some(parse_link(l))),
                _ => Ok(None),
            },
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The link called `name`, or `NetlinkError::LinkNotFound`.
    pub fn require_link(&mut self, name: &str) -> Result<Link> {
        self.link_by_name(name)?
            .ok_or_else(|| NetlinkError::LinkNotFound(name.to_string()))
    }

    /// Every link in the namespace.
    pub fn links(&mut self) -> Result<Vec<Link>> {
        Ok(self
            .query(
                RouteNetlinkMessage::GetLink(LinkMessage::default()),
                true,
                "list links",
            )?
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(parse_link(l)),
                _ => None,
            })
            .collect())
    }

    /// Create a link; fails with EEXIST if the name is taken.
    pub fn create_link(&mut self, spec: &NewLink<'_>) -> Result<()> {
        let mut m = LinkMessage::default();
        let op;
        match spec {
            NewLink::Bridge {
                name,
                mtu,
                vlan_filtering,
            } => {
                op = format!("create bridge {name}");
                m.attributes.push(LinkAttribute::IfName(name.to_string()));
                if let Some(mtu) = mtu {
                    m.attributes.push(LinkAttribute::Mtu(*mtu));
                }
                let mut info = vec![LinkInfo::Kind(InfoKind::Bridge)];
                if *vlan_filtering {
                    info.push(LinkInfo::Data(InfoData::Bridge(vec![
                        InfoBridge::VlanFiltering(true),
                    ])));
                }
                m.attributes.push(LinkAttribute::LinkInfo(info));
            }
            NewLink::Veth {
                name,
                mtu,
                master,
                up,
                peer_name,
                peer_mac,
                peer_netns,
            } => {
                op = format!("create veth {name} (peer {peer_name})");
                m.attributes.push(LinkAttribute::IfName(name.to_string()));
                let mut peer = LinkMessage::default();
                // The kernel refuses IFF_UP in the peer's header (ENOTCONN):
                // only this end can come up at creation.
                if *up {
                    m.header.flags = LinkFlags::Up;
                    m.header.change_mask = LinkFlags::Up;
                }
                if let Some(master) = master {
                    m.attributes.push(LinkAttribute::Controller(*master));
                }
                peer.attributes
                    .push(LinkAttribute::IfName(peer_name.to_string()));
                if let Some(mtu) = mtu {
                    m.attributes.push(LinkAttribute::Mtu(*mtu));
                    peer.attributes.push(LinkAttribute::Mtu(*mtu));
                }
                if let Some(mac) = peer_mac {
                    peer.attributes.push(LinkAttribute::Address(mac.to_vec()));
                }
                if let Some(fd) = peer_netns {
                    peer.attributes.push(LinkAttribute::NetNsFd(fd.as_raw_fd()));
                }
                m.attributes.push(LinkAttribute::LinkInfo(vec![
                    LinkInfo::Kind(InfoKind::Veth),
                    LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer))),
                ]));
            }
            NewLink::Macvlan {
                name,
                parent,
                mode,
                mtu,
                mac,
                netns,
            } => {
                op = format!("create macvlan {name} on link #{parent}");
                m.attributes.push(LinkAttribute::IfName(name.to_string()));
                m.attributes.push(LinkAttribute::Link(*parent));
                if let Some(mtu) = mtu {
                    m.attributes.push(LinkAttribute::Mtu(*mtu));
                }
                if let Some(mac) = mac {
                    m.attributes.push(LinkAttribute::Address(mac.to_vec()));
                }
                if let Some(fd) = netns {
                    m.attributes.push(LinkAttribute::NetNsFd(fd.as_raw_fd()));
                }
                let mode = match mode {
                    MacvlanMode::Bridge => NlMacvlanMode::Bridge,
                    MacvlanMode::Private => NlMacvlanMode::Private,
                    MacvlanMode::Vepa => NlMacvlanMode::Vepa,
                    MacvlanMode::Passthru => NlMacvlanMode::Passthrough,
                };
                m.attributes.push(LinkAttribute::LinkInfo(vec![
                    LinkInfo::Kind(InfoKind::MacVlan),
                    LinkInfo::Data(InfoData::MacVlan(vec![InfoMacVlan::Mode(mode)])),
                ]));
            }
        }
        self.request(
            RouteNetlinkMessage::NewLink(m),
            NLM_F_CREATE | NLM_F_EXCL,
            &op,
        )
    }

    /// Delete a link. Returns false if it did not exist.
    pub fn del_link(&mut self, index: u32) -> Result<bool> {
        match self.request(
            RouteNetlinkMessage::DelLink(link_msg(index)),
            0,
            &format!("delete link #{index}"),
        ) {
            Ok(()) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Delete the link called `name`. Returns false if it did not exist.
    pub fn del_link_by_name(&mut self, name: &str) -> Result<bool> {
        match self.link_by_name(name)? {
            Some(l) => self.del_link(l.index),
            None => Ok(false),
        }
    }

    fn set_link(&mut self, m: LinkMessage, op: String) -> Result<()> {
        self.request(RouteNetlinkMessage::SetLink(m), 0, &op)
    }

    pub fn set_up(&mut self, index: u32) -> Result<()> {
        let mut m = link_msg(index);
        m.header.flags = LinkFlags::Up;
        m.header.change_mask = LinkFlags::Up;
        self.set_link(m, format!("set link #{index} up"))
    }

    pub fn set_down(&mut self, index: u32) -> Result<()> {
        let mut m = link_msg(index);
        m.header.change_mask = LinkFlags::Up;
        self.set_link(m, format!("set link #{index} down"))
    }

    pub fn set_name(&mut self, index: u32, name: &str) -> Result<()> {
        let mut m = link_msg(index);
        m.attributes.push(LinkAttribute::IfName(name.to_string()));
        self.set_link(m, format!("rename link #{index} to {name}"))
    }

    /// Set the link's alias (IFLA_IFALIAS).
    pub fn set_alias(&mut self, index: u32, alias: &str) -> Result<()> {
        let mut m = link_msg(index);
        m.attributes.push(LinkAttribute::IfAlias(alias.to_string()));
        self.set_link(m, format!("set the alias of link #{index}"))
    }

    pub fn set_mtu(&mut self, index: u32, mtu: u32) -> Result<()> {
        let mut m = link_msg(index);
        m.attributes.push(LinkAttribute::Mtu(mtu));
        self.set_link(m, format!("set MTU {mtu} on link #{index}"))
    }

    pub fn set_mac(&mut self, index: u32, mac: [u8; 6]) -> Result<()> {
        let mut m = link_msg(index);
        m.attributes.push(LinkAttribute::Address(mac.to_vec()));
        self.set_link(m, format!("set MAC {} on link #{index}", format_mac(&mac)))
    }

    /// Enslave `index` to `master` (0 releases it).
    pub fn set_master(&mut self, index: u32, master: u32) -> Result<()> {
        let mut m = link_msg(index);
        m.attributes.push(LinkAttribute::Controller(master));
        self.set_link(m, format!("attach link #{index} to #{master}"))
    }

    /// Move a link into another namespace.
    pub fn set_netns(&mut self, index: u32, netns: BorrowedFd<'_>) -> Result<()> {
        let mut m = link_msg(index);
        m.attributes.push(LinkAttribute::NetNsFd(netns.as_raw_fd()));
        self.set_link(m, format!("move link #{index} to another namespace"))
    }

    /// Turn VLAN filtering on or off on a bridge.
    pub fn set_vlan_filtering(&mut self, bridge: u32, on: bool) -> Result<()> {
        let mut m = link_msg(bridge);
        m.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Bridge),
            LinkInfo::Data(InfoData::Bridge(vec![InfoBridge::VlanFiltering(on)])),
        ]));
        self.request(
            RouteNetlinkMessage::NewLink(m),
            0,
            &format!("set vlan_filtering={on} on bridge #{bridge}"),
        )
    }

    /// Set hairpin mode on a bridge port.
    pub fn set_hairpin(&mut self, port: u32, on: bool) -> Result<()> {
        let mut m = link_msg(port);
        m.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::PortKind(InfoPortKind::Bridge),
            LinkInfo::PortData(InfoPortData::BridgePort(vec![InfoBridgePort::HairpinMode(
                on,
            )])),
        ]));
        // IFLA_LINKINFO changes go through RTM_NEWLINK on an existing link.
        self.request(
            RouteNetlinkMessage::NewLink(m),
            0,
            &format!("set hairpin={on} on bridge port #{port}"),
        )
    }

    /// Add (or, with `add = false`, remove) a VLAN on a bridge port.
    pub fn bridge_vlan(
        &mut self,
        port: u32,
        vid: u16,
        pvid_untagged: bool,
        add: bool,
    ) -> Result<()> {
        let mut m = link_msg(port);
        m.header.interface_family = AddressFamily::Bridge;
        let mut flags = BridgeVlanInfoFlags::empty();
        if pvid_untagged {
            flags |= BridgeVlanInfoFlags::Pvid | BridgeVlanInfoFlags::Untagged;
        }
        m.attributes
            .push(LinkAttribute::AfSpecBridge(vec![AfSpecBridge::VlanInfo(
                BridgeVlanInfo { flags, vid },
            )]));
        let op = format!(
            "{} VLAN {vid} on bridge port #{port}",
            if add { "add" } else { "remove" }
        );
        if add {
            self.request(RouteNetlinkMessage::SetLink(m), 0, &op)
        } else {
            match self.request(RouteNetlinkMessage::DelLink(m), 0, &op) {
                Err(e) if e.is_not_found() => Ok(()),
                other => other,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_macs() {
        assert_eq!(format_mac(&[2, 0, 0xab, 1, 0xff, 9]), "02:00:ab:01:ff:09");
    }
}
