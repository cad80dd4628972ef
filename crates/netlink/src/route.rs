//! Routes in the main table.

use crate::{Handle, Result};
use ipnetwork::IpNetwork;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteMetric, RouteProtocol,
    RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use std::net::IpAddr;

/// A route as edgelink adds or looks for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSpec {
    pub dst: IpNetwork,
    pub gw: Option<IpAddr>,
    pub oif: Option<u32>,
    pub priority: Option<u32>,
    pub mtu: Option<u32>,
    pub advmss: Option<u32>,
    /// Table id; main when `None`.
    pub table: Option<u32>,
}

impl RouteSpec {
    pub fn new(dst: IpNetwork, gw: Option<IpAddr>, oif: Option<u32>) -> RouteSpec {
        RouteSpec {
            dst,
            gw,
            oif,
            priority: None,
            mtu: None,
            advmss: None,
            table: None,
        }
    }
}

fn route_msg(r: &RouteSpec) -> RouteMessage {
    let mut m = RouteMessage::default();
    m.header.address_family = if r.dst.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    m.header.destination_prefix_length = r.dst.prefix();
    m.header.protocol = RouteProtocol::Boot;
    m.header.kind = RouteType::Unicast;
    m.header.scope = if r.gw.is_some() {
        RouteScope::Universe
    } else {
        RouteScope::Link
    };
    let table = r.table.unwrap_or(u32::from(RouteHeader::RT_TABLE_MAIN));
    if table < 256 {
        m.header.table = table as u8;
    } else {
        m.header.table = 0;
        m.attributes.push(RouteAttribute::Table(table));
    }
    if r.dst.prefix() > 0 {
        m.attributes
            .push(RouteAttribute::Destination(RouteAddress::from(
                r.dst.network(),
            )));
    }
    if let Some(gw) = r.gw {
        m.attributes
            .push(RouteAttribute::Gateway(RouteAddress::from(gw)));
    }
    if let Some(oif) = r.oif {
        m.attributes.push(RouteAttribute::Oif(oif));
    }
    if let Some(p) = r.priority {
        m.attributes.push(RouteAttribute::Priority(p));
    }
    let mut metrics = Vec::new();
    if let Some(mtu) = r.mtu {
        metrics.push(RouteMetric::Mtu(mtu));
    }
    if let Some(a) = r.advmss {
        metrics.push(RouteMetric::Advmss(a));
    }
    if !metrics.is_empty() {
        m.attributes.push(RouteAttribute::Metrics(metrics));
    }
    m
}

fn addr_of(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v) => Some(IpAddr::V4(*v)),
        RouteAddress::Inet6(v) => Some(IpAddr::V6(*v)),
        _ => None,
    }
}

impl Handle {
    /// Add a route; the same route already present is fine.
    pub fn ensure_route(&mut self, r: &RouteSpec) -> Result<()> {
        match self.request(
            RouteNetlinkMessage::NewRoute(route_msg(r)),
            NLM_F_CREATE | NLM_F_EXCL,
            &format!("add route {} via {:?}", r.dst, r.gw),
        ) {
            Err(e) if e.is_exists() => Ok(()),
            other => other,
        }
    }

    /// Delete a route; absent is fine.
    pub fn del_route(&mut self, r: &RouteSpec) -> Result<()> {
        match self.request(
            RouteNetlinkMessage::DelRoute(route_msg(r)),
            0,
            &format!("delete route {}", r.dst),
        ) {
            Err(e) if e.is_not_found() => Ok(()),
            other => other,
        }
    }

    /// Unicast routes of the main table (both families).
    pub fn routes(&mut self) -> Result<Vec<RouteSpec>> {
        let mut out = Vec::new();
        for fam in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut q = RouteMessage::default();
            q.header.address_family = fam;
            for m in self.query(RouteNetlinkMessage::GetRoute(q), true, "list routes")? {
                let RouteNetlinkMessage::NewRoute(rm) = m else {
                    continue;
                };
                if rm.header.kind != RouteType::Unicast {
                    continue;
                }
                let mut table = u32::from(rm.header.table);
                let mut dst_ip = None;
                let mut spec = RouteSpec::new(
                    IpNetwork::new(
                        if fam == AddressFamily::Inet {
                            IpAddr::from([0u8; 4])
                        } else {
                            IpAddr::from([0u8; 16])
                        },
                        0,
                    )
                    .expect("prefix 0 is valid"),
                    None,
                    None,
                );
                for a in &rm.attributes {
                    match a {
                        RouteAttribute::Destination(d) => dst_ip = addr_of(d),
                        RouteAttribute::Gateway(g) => spec.gw = addr_of(g),
                        RouteAttribute::Oif(o) => spec.oif = Some(*o),
                        RouteAttribute::Priority(p) => spec.priority = Some(*p),
                        RouteAttribute::Table(t) => table = *t,
                        RouteAttribute::Metrics(ms) => {
                            for metric in ms {
                                match metric {
                                    RouteMetric::Mtu(v) => spec.mtu = Some(*v),
                                    RouteMetric::Advmss(v) => spec.advmss = Some(*v),
                                    _ => {}
                                }
                            }
                        }
                        _ => {}
                    }
                }
                if table != u32::from(RouteHeader::RT_TABLE_MAIN) {
                    continue;
                }
                if let Some(ip) = dst_ip {
                    if let Ok(n) = IpNetwork::new(ip, rm.header.destination_prefix_length) {
                        spec.dst = n;
                    }
                }
                out.push(spec);
            }
        }
        Ok(out)
    }
}
