//! IP addresses on links.

use crate::{Handle, NetlinkError, Result};
use ipnetwork::IpNetwork;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage, AddressScope, CacheInfo,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use std::net::IpAddr;
use std::time::Duration;

/// IFA_CACHEINFO's "forever" (INFINITY_LIFE_TIME in the kernel).
const FOREVER: u32 = u32::MAX;

/// An address on a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    pub index: u32,
    pub network: IpNetwork,
    pub scope_link: bool,
    /// Still doing duplicate address detection (IPv6).
    pub tentative: bool,
    /// Whole seconds before the kernel removes the address by itself
    /// (IFA_CACHEINFO's ifa_valid as the kernel reports it: what is left);
    /// `None` for an address that lives until someone deletes it.
    pub valid_lft: Option<u32>,
}

/// A lifetime as IFA_CACHEINFO carries it: whole seconds, rounded up so an
/// address never goes before the caller said, at least 1 (0 is invalid) and
/// below [`FOREVER`] (which would make it permanent).
fn lifetime_secs(valid: Duration) -> u32 {
    let secs = valid
        .as_secs()
        .saturating_add(u64::from(valid.subsec_nanos() > 0));
    u32::try_from(secs).unwrap_or(FOREVER).clamp(1, FOREVER - 1)
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

    /// Add an address that the kernel removes by itself `valid` from now
    /// (rounded up to whole seconds), or, if it is already there, restart
    /// its lifetime from now. A holder renews well before the lifetime ends;
    /// if it dies, the address goes anyway, so two holders of a moving
    /// address can overlap by at most one lifetime.
    ///
    /// Meant for a host address (/32 or /128) that moves between nodes.
    /// Replacing a permanent address makes it expire too. An IPv6 one gets
    /// `nodad`: it is usable at once, and duplicate address detection would
    /// only find the previous holder, which is the point. It is also
    /// deprecated from the start (preferred lifetime 0): it still accepts
    /// connections, but source address selection avoids it (RFC 6724 rule
    /// 3). Otherwise a /128 beats the link's own /64 on longest match (rule
    /// 8) and the holder's own connections onto the segment would leave
    /// from the moving address, and break when it moves. An IPv4 one needs
    /// no such care (the subnet route names its own source) and keeps
    /// preferred = valid.
    pub fn hold_addr(&mut self, index: u32, net: &IpNetwork, valid: Duration) -> Result<()> {
        let secs = lifetime_secs(valid);
        let mut m = addr_msg(index, net);
        // CacheInfo is non_exhaustive: built from its default.
        let mut ci = CacheInfo::default();
        ci.ifa_valid = secs;
        ci.ifa_preferred = secs;
        if net.is_ipv6() {
            m.header.flags = AddressHeaderFlags::Nodad;
            m.attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
            ci.ifa_preferred = 0;
        }
        m.attributes.push(AddressAttribute::CacheInfo(ci));
        self.request(
            RouteNetlinkMessage::NewAddress(m),
            NLM_F_CREATE | NLM_F_REPLACE,
            &format!("hold address {net} on link #{index} for {secs} s"),
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
            let mut valid_lft = None;
            let mut tentative = a.header.flags.contains(AddressHeaderFlags::Tentative);
            for attr in &a.attributes {
                match attr {
                    AddressAttribute::Local(l) => ip = Some(*l),
                    AddressAttribute::Address(l) if ip.is_none() => ip = Some(*l),
                    AddressAttribute::Flags(f) => tentative |= f.contains(AddressFlags::Tentative),
                    AddressAttribute::CacheInfo(ci) if ci.ifa_valid != FOREVER => {
                        valid_lft = Some(ci.ifa_valid)
                    }
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
                valid_lft,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetimes_round_up_to_whole_seconds_within_range() {
        assert_eq!(lifetime_secs(Duration::ZERO), 1);
        assert_eq!(lifetime_secs(Duration::from_millis(1)), 1);
        assert_eq!(lifetime_secs(Duration::from_secs(2)), 2);
        assert_eq!(lifetime_secs(Duration::from_millis(2001)), 3);
        assert_eq!(lifetime_secs(Duration::from_secs(u64::MAX)), FOREVER - 1);
    }
}
