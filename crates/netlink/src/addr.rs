//! IP addresses on links.

use crate::{Handle, NetlinkError, Result};
use ipnetwork::IpNetwork;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage, AddressScope,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use std::net::IpAddr;

/// An address on a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    pub index: u32,
    pub network: IpNetwork,
    pub scope_link: bool,
    /// Still doing duplicate address detection (IPv6).
    pub tentative: bool,
}

fn family(ip: &IpAddr) -> AddressFamily {
    if ip.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

fn addr_msg(index: u32, net: &IpNetwork) -> AddressMessage {
    let mut m = AddressMessage::default();
    m.header.family = family(&net.ip());
    m.header.prefix_len = net.prefix();
    m.header.index = index;
    m.header.scope = AddressScope::Universe;
    m.attributes.push(AddressAttribute::Local(net.ip()));
    if let IpNetwork::V4(v4) = net {
        m.attributes.push(AddressAttribute::Address(net.ip()));
        if v4.prefix() < 31 {
            m.attributes
                .push(AddressAttribute::Broadcast(v4.broadcast()));
        }
    } else {
        m.attributes.push(AddressAttribute::Address(net.ip()));
    }
    m
}

impl Handle {
    /// Add an address. `nodad` skips IPv6 duplicate address detection (the
    /// address is usable at once). An address already present is fine.
    pub fn ensure_addr(&mut self, index: u32, net: &IpNetwork, nodad: bool) -> Result<()> {
        let mut m = addr_msg(index, net);
        if nodad && net.is_ipv6() {
            m.header.flags = AddressHeaderFlags::Nodad | AddressHeaderFlags::Permanent;
            m.attributes.push(AddressAttribute::Flags(
                AddressFlags::Nodad | AddressFlags::Permanent,
            ));
        }
        match self.request(
            RouteNetlinkMessage::NewAddress(m),
            NLM_F_CREATE | NLM_F_EXCL,
            &format!("add address {net} to link #{index}"),
        ) {
            Err(e) if e.is_exists() => Ok(()),
            other => other,
        }
    }

    /// Replace-or-add (used when moving addresses).
    pub fn replace_addr(&mut self, index: u32, net: &IpNetwork) -> Result<()> {
        self.request(
            RouteNetlinkMessage::NewAddress(addr_msg(index, net)),
            NLM_F_CREATE | NLM_F_REPLACE,
            &format!("replace address {net} on link #{index}"),
        )
    }

    /// Remove an address; absent is fine.
    pub fn del_addr(&mut self, index: u32, net: &IpNetwork) -> Result<()> {
        match self.request(
            RouteNetlinkMessage::DelAddress(addr_msg(index, net)),
            0,
            &format!("delete address {net} from link #{index}"),
        ) {
            Err(e) if e.is_not_found() || e.errno() == Some(libc::EADDRNOTAVAIL) => Ok(()),
            other => other,
        }
    }

    /// Addresses of one link (or every link with `None`).
    pub fn addrs(&mut self, index: Option<u32>) -> Result<Vec<Address>> {
        let msgs = self.query(
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            true,
            "list addresses",
        )?;
        let mut out = Vec::new();
        for m in msgs {
            let RouteNetlinkMessage::NewAddress(a) = m else {
                continue;
            };
            if index.is_some_and(|i| i != a.header.index) {
                continue;
            }
            let mut ip = None;
            let mut tentative = a.header.flags.contains(AddressHeaderFlags::Tentative);
            for attr in &a.attributes {
                match attr {
                    AddressAttribute::Local(l) => ip = Some(*l),
                    AddressAttribute::Address(l) if ip.is_none() => ip = Some(*l),
                    AddressAttribute::Flags(f) => tentative |= f.contains(AddressFlags::Tentative),
                    _ => {}
                }
            }
            let Some(ip) = ip else { continue };
            let network =
                IpNetwork::new(ip, a.header.prefix_len).map_err(|e| NetlinkError::Decode {
                    op: "list addresses".into(),
                    reason: e.to_string(),
                })?;
            out.push(Address {
                index: a.header.index,
                network,
                scope_link: a.header.scope == AddressScope::Link,
                tentative,
            });
        }
        Ok(out)
    }
}
