//! Address arithmetic shared by config validation and the allocator: IPv4 and
//! IPv6 addresses mapped onto `u128` so ranges of both families are handled
//! by one code path. Only addresses of the same family are ever compared.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnetwork::IpNetwork;

/// The address as an unsigned integer (IPv4 in the low 32 bits).
pub(crate) fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The inverse of [`to_u128`] for the family of `like`. Values beyond the
/// IPv4 space are truncated, callers only pass values inside a subnet.
pub(crate) fn from_u128(value: u128, v4: bool) -> IpAddr {
    if v4 {
        let v = u32::try_from(value).unwrap_or(u32::MAX);
        IpAddr::V4(Ipv4Addr::from(v))
    } else {
        IpAddr::V6(Ipv6Addr::from(value))
    }
}

/// First and last address of a network, as integers.
pub(crate) fn net_span(net: &IpNetwork) -> (u128, u128) {
    match net {
        IpNetwork::V4(n) => (
            u128::from(u32::from(n.network())),
            u128::from(u32::from(n.broadcast())),
        ),
        IpNetwork::V6(n) => {
            let first = u128::from(n.network());
            let host_bits = 128 - u32::from(n.prefix());
            let last = if host_bits == 128 {
                u128::MAX
            } else {
                first | ((1u128 << host_bits) - 1)
            };
            (first, last)
        }
    }
}

/// The network with its host bits cleared (`10.0.0.5/8` -> `10.0.0.0/8`).
pub(crate) fn canonical(net: IpNetwork) -> IpNetwork {
    match net {
        IpNetwork::V4(n) => {
            IpNetwork::V4(ipnetwork::Ipv4Network::new(n.network(), n.prefix()).unwrap_or(n))
        }
        IpNetwork::V6(n) => {
            IpNetwork::V6(ipnetwork::Ipv6Network::new(n.network(), n.prefix()).unwrap_or(n))
        }
    }
}

/// Whether the network address (and, for IPv4, the broadcast address) of
/// this subnet is reserved and never handed out. Point-to-point sized
/// subnets (IPv4 /31 and /32, IPv6 /127 and /128) use every address.
pub(crate) fn has_reserved_edges(subnet: &IpNetwork) -> bool {
    match subnet {
        IpNetwork::V4(n) => n.prefix() <= 30,
        IpNetwork::V6(n) => n.prefix() <= 126,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_and_round_trip() {
        let n: IpNetwork = "10.1.2.0/24".parse().unwrap();
        let (a, b) = net_span(&n);
        assert_eq!(from_u128(a, true), "10.1.2.0".parse::<IpAddr>().unwrap());
        assert_eq!(from_u128(b, true), "10.1.2.255".parse::<IpAddr>().unwrap());
        let n6: IpNetwork = "2001:db8::/64".parse().unwrap();
        let (a, b) = net_span(&n6);
        assert_eq!(from_u128(a, false), "2001:db8::".parse::<IpAddr>().unwrap());
        assert_eq!(
            from_u128(b, false),
            "2001:db8::ffff:ffff:ffff:ffff".parse::<IpAddr>().unwrap()
        );
        let all: IpNetwork = "::/0".parse().unwrap();
        assert_eq!(net_span(&all), (0, u128::MAX));
        let ip: IpAddr = "2001:db8::7".parse().unwrap();
        assert_eq!(from_u128(to_u128(ip), false), ip);
    }

    #[test]
    fn canonical_clears_host_bits() {
        let n: IpNetwork = "10.0.0.5/8".parse().unwrap();
        assert_eq!(canonical(n).to_string(), "10.0.0.0/8");
        let n: IpNetwork = "2001:db8::5/64".parse().unwrap();
        assert_eq!(canonical(n).to_string(), "2001:db8::/64");
    }
}
