//! One ICMP echo request and its reply, IPv4 or IPv6, from a socket made
//! in the pod: an ICMP datagram socket where the pod's
//! `net.ipv4.ping_group_range` allows one (the kernel then picks the
//! identifier and hands us only our replies), else a raw socket
//! (CAP_NET_RAW), whose replies are matched by identifier and sequence.

use crate::error::ProbeError;
use crate::sockets::{socket, Sockets};
use edgelink_attachment::{HealthKind, HealthTarget};
use socket2::{Protocol, Type};
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, SocketAddr};

const ECHO_REQUEST: [u8; 2] = [8, 128];
const ECHO_REPLY: [u8; 2] = [0, 129];
/// Packets read at most while waiting for the reply (a raw ICMPv6 socket
/// also sees the target's neighbour discovery).
const READS_MAX: usize = 64;
const PAYLOAD: &[u8] = b"edgelink health";

/// The Internet checksum (RFC 1071).
fn checksum(b: &[u8]) -> u16 {
    let mut sum: u32 = b
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An echo request. ICMPv6's checksum covers a pseudo-header: the kernel
/// fills it in (raw and datagram sockets both).
pub fn request(v6: bool, id: u16, seq: u16) -> Vec<u8> {
    let mut p = vec![ECHO_REQUEST[usize::from(v6)], 0, 0, 0];
    p.extend_from_slice(&id.to_be_bytes());
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(PAYLOAD);
    if !v6 {
        let c = checksum(&p);
        p[2..4].copy_from_slice(&c.to_be_bytes());
    }
    p
}

/// Whether `packet` (as a socket read it) is the reply to our request;
/// `id` is checked on raw sockets only (a datagram socket's is the
/// kernel's choice, and the kernel already sorted the replies).
pub fn is_reply(packet: &[u8], v6: bool, raw: bool, id: u16, seq: u16) -> bool {
    // A raw IPv4 socket reads the IP header too.
    let icmp = if raw && !v6 {
        let ihl = usize::from(packet.first().map_or(0, |b| b & 0x0f)) * 4;
        packet.get(ihl..).unwrap_or(&[])
    } else {
        packet
    };
    if icmp.len() < 8 || icmp[0] != ECHO_REPLY[usize::from(v6)] || icmp[1] != 0 {
        return false;
    }
    let got_id = u16::from_be_bytes([icmp[4], icmp[5]]);
    let got_seq = u16::from_be_bytes([icmp[6], icmp[7]]);
    got_seq == seq && (!raw || got_id == id)
}

/// The system's error under a socket's [`ProbeError`].
fn cause(e: ProbeError) -> std::io::Error {
    match e {
        ProbeError::Socket { source, .. } => source,
        other => std::io::Error::other(other.to_string()),
    }
}

pub async fn echo(sockets: &dyn Sockets, ip: IpAddr, seq: u16) -> Result<(), ProbeError> {
    let target = HealthTarget::Host(ip);
    let v6 = ip.is_ipv6();
    let proto = if v6 {
        Protocol::ICMPV6
    } else {
        Protocol::ICMPV4
    };
    let (s, raw) = match socket(sockets, target, Type::DGRAM, proto).await {
        Ok(s) => (s, false),
        Err(datagram) => match socket(sockets, target, Type::RAW, proto).await {
            Ok(s) => (s, true),
            Err(raw) => {
                return Err(ProbeError::IcmpSocket {
                    target,
                    datagram: cause(datagram),
                    raw: cause(raw),
                })
            }
        },
    };
    let io = |source| ProbeError::Io {
        kind: HealthKind::Icmp,
        target,
        source,
    };
    // Connected: only the target's packets are read.
    s.connect(&SocketAddr::new(ip, 0).into()).map_err(io)?;
    let id = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish() as u16;
    // Driven as a tokio UDP socket: its send and recv are send(2) and
    // recv(2) on a connected datagram (or raw) socket, which is what ICMP
    // needs, without an AsyncFd registration (unsafe in tokio).
    let fd = tokio::net::UdpSocket::from_std(s.into()).map_err(io)?;
    fd.send(&request(v6, id, seq)).await.map_err(io)?;
    let mut buf = [0u8; 1500];
    for _ in 0..READS_MAX {
        let n = fd.recv(&mut buf).await.map_err(io)?;
        if is_reply(&buf[..n], v6, raw, id, seq) {
            return Ok(());
        }
    }
    Err(ProbeError::Malformed {
        kind: HealthKind::Icmp,
        target,
        what: format!("no echo reply among {READS_MAX} packets"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_carry_id_seq_and_a_valid_ipv4_checksum() {
        let p = request(false, 0xbeef, 7);
        assert_eq!(&p[..2], &[8, 0]);
        assert_eq!(&p[4..8], &[0xbe, 0xef, 0, 7]);
        assert_eq!(checksum(&p), 0, "a packet with its checksum sums to 0");
        let p6 = request(true, 1, 2);
        assert_eq!((p6[0], &p6[2..4]), (128, &[0u8, 0][..]));
    }

    #[test]
    fn replies_are_matched_by_type_id_and_seq() {
        let mut reply = request(false, 9, 3);
        reply[0] = 0;
        assert!(
            is_reply(&reply, false, false, 1, 3),
            "datagram: the id is the kernel's"
        );
        assert!(!is_reply(&reply, false, false, 9, 4));
        let mut with_ip = vec![0x45];
        with_ip.extend_from_slice(&[0; 19]);
        with_ip.extend_from_slice(&reply);
        assert!(is_reply(&with_ip, false, true, 9, 3));
        assert!(!is_reply(&with_ip, false, true, 8, 3));
        let mut r6 = request(true, 9, 3);
        r6[0] = 129;
        assert!(is_reply(&r6, true, true, 9, 3));
        assert!(
            !is_reply(&request(true, 9, 3), true, true, 9, 3),
            "our own request"
        );
    }
}
