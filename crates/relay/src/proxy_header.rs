//! The PROXY protocol header (HAProxy's `proxy-protocol.txt`) a relay sends
//! its target before the client's first byte, so that the target learns
//! the client's address instead of the relay's. Only building it: the
//! relay never receives one.
//!
//! The bytes come from the `ppp` crate, which builds and parses both the
//! text form (version 1) and the binary one (version 2).

use ppp::{v1, v2};
use std::io;
use std::net::{SocketAddr, SocketAddrV4};

/// Which form of the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// Text: `PROXY TCP4 <src> <dst> <sport> <dport>\r\n`.
    V1,
    /// Binary: a 12-byte signature, then command, family and addresses.
    V2,
}

/// The header for a TCP connection from `source` (the client) to
/// `destination` (the address the client dialed).
///
/// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`, what a dual-stack listener
/// reports for an IPv4 client) are sent as IPv4 when both ends are IPv4 or
/// mapped. Ends of two families that remain (which no single socket
/// reports) cannot be written in one header: version 1 then sends
/// `PROXY UNKNOWN\r\n` and version 2 a LOCAL command with the UNSPEC family
/// and no address, both of which tell the target to use the connection's
/// own endpoints, as the specification prescribes.
pub fn build(version: Version, source: SocketAddr, destination: SocketAddr) -> io::Result<Vec<u8>> {
    let (source, destination) = match (mapped_v4(source), mapped_v4(destination)) {
        (Some(s), Some(d)) => (SocketAddr::V4(s), SocketAddr::V4(d)),
        _ => (source, destination),
    };
    let same_family = source.is_ipv4() == destination.is_ipv4();
    match version {
        Version::V1 => {
            let addresses = if same_family {
                v1::Addresses::from((source, destination))
            } else {
                v1::Addresses::Unknown
            };
            Ok(addresses.to_string().into_bytes())
        }
        Version::V2 => {
            let (command, protocol, addresses) = if same_family {
                (
                    v2::Command::Proxy,
                    v2::Protocol::Stream,
                    v2::Addresses::from((source, destination)),
                )
            } else {
                (
                    v2::Command::Local,
                    v2::Protocol::Unspecified,
                    v2::Addresses::Unspecified,
                )
            };
            v2::Builder::with_addresses(v2::Version::Two | command, protocol, addresses).build()
        }
    }
}

/// `addr` as IPv4 if it is IPv4 or IPv4-mapped IPv6.
fn mapped_v4(addr: SocketAddr) -> Option<SocketAddrV4> {
    match addr {
        SocketAddr::V4(a) => Some(a),
        SocketAddr::V6(a) => a
            .ip()
            .to_ipv4_mapped()
            .map(|ip| SocketAddrV4::new(ip, a.port())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    const SIG: [u8; 12] = [
        0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A,
    ];

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn v1_text(src: &str, dst: &str) -> String {
        String::from_utf8(build(Version::V1, sa(src), sa(dst)).unwrap()).unwrap()
    }

    /// The header followed by the client's first bytes, as the target
    /// reads them.
    fn stream(header: &[u8]) -> Vec<u8> {
        [header, b"GET / HTTP/1.1\r\n"].concat()
    }

    /// Parsed back by ppp from the stream: the header ends exactly where
    /// the client's bytes begin, and says what it was meant to.
    fn v1_parsed(header: &[u8]) -> v1::Addresses {
        let s = stream(header);
        let h = v1::Header::try_from(&s[..]).expect("ppp parses it");
        assert_eq!(h.header.len(), header.len());
        h.addresses
    }

    fn v2_parsed(header: &[u8]) -> v2::Header<'static> {
        let s = stream(header);
        let h = v2::Header::try_from(&s[..]).expect("ppp parses it");
        assert_eq!(h.len(), header.len());
        h.to_owned()
    }

    #[test]
    fn v1_ipv4() {
        let text = v1_text("10.244.1.20:40312", "10.244.1.10:8080");
        assert_eq!(text, "PROXY TCP4 10.244.1.20 10.244.1.10 40312 8080\r\n");
        assert_eq!(
            v1_parsed(text.as_bytes()),
            v1::Addresses::new_tcp4(
                Ipv4Addr::new(10, 244, 1, 20),
                Ipv4Addr::new(10, 244, 1, 10),
                40312,
                8080
            )
        );
    }

    #[test]
    fn v1_ipv6() {
        let text = v1_text("[fd00:244::20]:51000", "[fd00:244::10]:443");
        assert_eq!(text, "PROXY TCP6 fd00:244::20 fd00:244::10 51000 443\r\n");
        assert_eq!(
            v1_parsed(text.as_bytes()),
            v1::Addresses::new_tcp6(
                "fd00:244::20".parse::<Ipv6Addr>().unwrap(),
                "fd00:244::10".parse::<Ipv6Addr>().unwrap(),
                51000,
                443
            )
        );
    }

    #[test]
    fn v2_ipv4() {
        let bytes = build(Version::V2, sa("10.244.1.20:40312"), sa("10.244.1.10:8080")).unwrap();
        let mut want = SIG.to_vec();
        // PROXY command, TCP over IPv4, 12 address bytes.
        want.extend([0x21, 0x11, 0, 12]);
        want.extend([10, 244, 1, 20, 10, 244, 1, 10]);
        want.extend(40312u16.to_be_bytes());
        want.extend(8080u16.to_be_bytes());
        assert_eq!(bytes, want);
        let h = v2_parsed(&bytes);
        assert_eq!(h.command, v2::Command::Proxy);
        assert_eq!(h.protocol, v2::Protocol::Stream);
        assert_eq!(
            h.addresses,
            v2::Addresses::from((sa("10.244.1.20:40312"), sa("10.244.1.10:8080")))
        );
    }

    #[test]
    fn v2_ipv6() {
        let (src, dst) = (sa("[fd00:244::20]:51000"), sa("[fd00:244::10]:443"));
        let bytes = build(Version::V2, src, dst).unwrap();
        let mut want = SIG.to_vec();
        // PROXY command, TCP over IPv6, 36 address bytes.
        want.extend([0x21, 0x21, 0, 36]);
        want.extend("fd00:244::20".parse::<Ipv6Addr>().unwrap().octets());
        want.extend("fd00:244::10".parse::<Ipv6Addr>().unwrap().octets());
        want.extend(51000u16.to_be_bytes());
        want.extend(443u16.to_be_bytes());
        assert_eq!(bytes, want);
        let h = v2_parsed(&bytes);
        assert_eq!(h.command, v2::Command::Proxy);
        assert_eq!(h.addresses, v2::Addresses::from((src, dst)));
    }

    #[test]
    fn ipv4_mapped_ends_are_sent_as_ipv4() {
        // Both mapped (an IPv4 client on a dual-stack listener), or one.
        for (src, dst) in [
            ("[::ffff:10.244.1.20]:40312", "[::ffff:10.244.1.10]:8080"),
            ("[::ffff:10.244.1.20]:40312", "10.244.1.10:8080"),
            ("10.244.1.20:40312", "[::ffff:10.244.1.10]:8080"),
        ] {
            assert_eq!(
                v1_text(src, dst),
                "PROXY TCP4 10.244.1.20 10.244.1.10 40312 8080\r\n",
                "{src} {dst}"
            );
            assert_eq!(
                build(Version::V2, sa(src), sa(dst)).unwrap(),
                build(Version::V2, sa("10.244.1.20:40312"), sa("10.244.1.10:8080")).unwrap(),
                "{src} {dst}"
            );
        }
        // A mapped end facing a real IPv6 one stays IPv6 (same family).
        assert_eq!(
            v1_text("[::ffff:10.244.1.20]:40312", "[fd00:244::10]:8080"),
            "PROXY TCP6 ::ffff:10.244.1.20 fd00:244::10 40312 8080\r\n"
        );
        // Loopback is not mapped (`to_ipv4` would make ::1 0.0.0.1).
        assert_eq!(
            v1_text("[::1]:40312", "[::1]:8080"),
            "PROXY TCP6 ::1 ::1 40312 8080\r\n"
        );
    }

    #[test]
    fn mixed_families_send_unknown_or_local() {
        for (src, dst) in [
            ("10.244.1.20:40312", "[fd00:244::10]:8080"),
            ("[fd00:244::20]:40312", "10.244.1.10:8080"),
        ] {
            let text = v1_text(src, dst);
            assert_eq!(text, "PROXY UNKNOWN\r\n", "{src} {dst}");
            assert_eq!(v1_parsed(text.as_bytes()), v1::Addresses::Unknown);

            let bytes = build(Version::V2, sa(src), sa(dst)).unwrap();
            let mut want = SIG.to_vec();
            // LOCAL command, UNSPEC family and protocol, no address.
            want.extend([0x20, 0x00, 0, 0]);
            assert_eq!(bytes, want, "{src} {dst}");
            let h = v2_parsed(&bytes);
            assert_eq!(h.command, v2::Command::Local);
            assert_eq!(h.address_family(), v2::AddressFamily::Unspecified);
            assert_eq!(h.addresses, v2::Addresses::Unspecified);
        }
    }
}
