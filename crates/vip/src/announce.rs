//! Announcing that a virtual address is now here: a gratuitous ARP request
//! and reply for IPv4, an unsolicited Neighbour Advertisement for IPv6,
//! sent on one Ethernet interface so that every device on the segment
//! points its neighbour entry for the address at this interface's MAC.
//!
//! Devices that have no entry for the address do not create one (Linux
//! needs `arp_accept`/`accept_untracked_na` for that); they resolve it the
//! usual way when they next need it, and the new holder answers.
//!
//! The frames are built by pure functions ([`garp_frames`],
//! [`unsolicited_na`]) and sent from an `AF_PACKET` datagram socket (the
//! kernel adds the Ethernet header), opened with protocol 0 so that it
//! receives nothing: announcing only sends. The socket, and so the
//! interface index, belong to the network namespace current on the calling
//! thread. Sending needs `CAP_NET_RAW` in that namespace's user namespace.
//!
//! The one place of the crate with `unsafe`: raw socket calls through
//! `libc`, each with a `// SAFETY:` note.

#![allow(unsafe_code)]

use std::io;
use std::mem;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const ETH_P_ARP: u16 = 0x0806;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ARPHRD_ETHER: u16 = 1;
const ARPOP_REQUEST: u16 = 1;
const ARPOP_REPLY: u16 = 2;
const BROADCAST: [u8; 6] = [0xff; 6];
/// ff02::1, every node on the link, and its Ethernet multicast address.
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
const ALL_NODES_MAC: [u8; 6] = [0x33, 0x33, 0, 0, 0, 1];
const IPPROTO_ICMPV6: u8 = 58;
const ND_NEIGHBOR_ADVERT: u8 = 136;
/// The Override flag of a Neighbour Advertisement (RFC 4861 §4.4).
const NA_OVERRIDE: u8 = 0x20;
/// Option 2, Target Link-Layer Address, 1 unit of 8 bytes.
const OPT_TARGET_LLADDR: u8 = 2;

/// Length of an ARP payload for Ethernet/IPv4.
pub const ARP_LEN: usize = 28;
/// Length of the NA packet: IPv6 header (40) + NA (24) + option (8).
pub const NA_LEN: usize = 72;
const ICMP_LEN: usize = NA_LEN - 40;

/// Announce `ip` on interface `ifindex` of the calling thread's network
/// namespace: for IPv4 a gratuitous ARP request then a gratuitous ARP reply,
/// both broadcast; for IPv6 one unsolicited Neighbour Advertisement to
/// ff02::1 with the Override flag. Each names the interface's MAC.
///
/// Does not check that `ip` is on the interface: that is the caller's
/// business (it announces an address it holds). Fails with `Unsupported`
/// on an interface that is not Ethernet-like, `InvalidInput` for an
/// address that cannot be a host's (multicast, unspecified, broadcast), and
/// with the kernel's error kind and the interface named in the message when
/// it cannot send (`PermissionDenied` without `CAP_NET_RAW`, `NetworkDown`
/// on a link that is down).
pub fn announce(ifindex: u32, ip: IpAddr) -> io::Result<()> {
    check_unicast(ip)?;
    let sender = Sender::open(ifindex)?;
    match ip {
        IpAddr::V4(v4) => {
            for frame in garp_frames(sender.mac, v4) {
                sender.send(ETH_P_ARP, BROADCAST, &frame)?;
            }
        }
        IpAddr::V6(v6) => {
            sender.send(ETH_P_IPV6, ALL_NODES_MAC, &unsolicited_na(sender.mac, v6))?
        }
    }
    Ok(())
}

fn check_unicast(ip: IpAddr) -> io::Result<()> {
    let bad = match ip {
        IpAddr::V4(v4) => v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast(),
        IpAddr::V6(v6) => v6.is_unspecified() || v6.is_multicast(),
    };
    if bad {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{ip} is not a unicast address, there is nothing to announce"),
        ));
    }
    Ok(())
}

/// The two gratuitous ARP payloads for `ip` owned by `mac` (RFC 5944 §4.6):
/// a request, then a reply. In both, sender and target IP are `ip` and the
/// sender MAC is `mac`; the request's target MAC is zero, the reply's is
/// `mac` too. Linux counts a reply as gratuitous only when its target MAC
/// equals its sender MAC, and applies a gratuitous packet even within the
/// neighbour's `locktime`; devices that ignore requests take the reply.
pub fn garp_frames(mac: [u8; 6], ip: Ipv4Addr) -> [[u8; ARP_LEN]; 2] {
    let frame = |op: u16, target_mac: [u8; 6]| {
        let mut p = [0u8; ARP_LEN];
        p[0..2].copy_from_slice(&ARPHRD_ETHER.to_be_bytes());
        p[2..4].copy_from_slice(&ETH_P_IP.to_be_bytes());
        p[4] = 6;
        p[5] = 4;
        p[6..8].copy_from_slice(&op.to_be_bytes());
        p[8..14].copy_from_slice(&mac);
        p[14..18].copy_from_slice(&ip.octets());
        p[18..24].copy_from_slice(&target_mac);
        p[24..28].copy_from_slice(&ip.octets());
        p
    };
    [frame(ARPOP_REQUEST, [0; 6]), frame(ARPOP_REPLY, mac)]
}

/// The unsolicited Neighbour Advertisement for `ip` owned by `mac`, as an
/// IPv6 packet (RFC 4861 §7.2.6): from `ip` to ff02::1, hop limit 255 (a
/// receiver drops ND from anything else), Override set, Solicited and
/// Router clear, target `ip`, Target Link-Layer Address option `mac`.
pub fn unsolicited_na(mac: [u8; 6], ip: Ipv6Addr) -> [u8; NA_LEN] {
    let mut p = [0u8; NA_LEN];
    // IPv6 header: version 6, traffic class and flow label 0.
    p[0] = 0x60;
    p[4..6].copy_from_slice(&(ICMP_LEN as u16).to_be_bytes());
    p[6] = IPPROTO_ICMPV6;
    p[7] = 255;
    p[8..24].copy_from_slice(&ip.octets());
    p[24..40].copy_from_slice(&ALL_NODES.octets());
    // ICMPv6: type, code 0, checksum (42..44) filled below, flags + reserved.
    let icmp = &mut p[40..];
    icmp[0] = ND_NEIGHBOR_ADVERT;
    icmp[4] = NA_OVERRIDE;
    icmp[8..24].copy_from_slice(&ip.octets());
    icmp[24] = OPT_TARGET_LLADDR;
    icmp[25] = 1;
    icmp[26..32].copy_from_slice(&mac);
    let sum = icmpv6_checksum(ip, ALL_NODES, icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    p
}

/// The ICMPv6 checksum (RFC 4443 §2.3): the one's complement of the one's
/// complement sum over the pseudo-header (source, destination, upper-layer
/// length, next header) and the message with its checksum field zero.
fn icmpv6_checksum(src: Ipv6Addr, dst: Ipv6Addr, icmp: &[u8]) -> u16 {
    let len = u32::try_from(icmp.len()).unwrap_or(u32::MAX);
    let mut sum = 0u32;
    let mut add = |bytes: &[u8]| {
        for chunk in bytes.chunks(2) {
            let hi = u32::from(chunk[0]) << 8;
            sum += hi | chunk.get(1).map_or(0, |&lo| u32::from(lo));
            sum = (sum & 0xffff) + (sum >> 16);
        }
    };
    add(&src.octets());
    add(&dst.octets());
    add(&len.to_be_bytes());
    add(&[0, 0, 0, IPPROTO_ICMPV6]);
    add(&icmp[..2]);
    add(&icmp[4..]);
    !(sum as u16)
}

const SLL_LEN: libc::socklen_t = mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;

fn sockaddr_ll(ifindex: i32, protocol: u16, dest: Option<[u8; 6]>) -> libc::sockaddr_ll {
    // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as libc::sa_family_t;
    sll.sll_protocol = protocol.to_be();
    sll.sll_ifindex = ifindex;
    if let Some(mac) = dest {
        sll.sll_halen = 6;
        sll.sll_addr[..6].copy_from_slice(&mac);
    }
    sll
}

/// "net1 (#3)", or "#3" when the name cannot be read.
fn describe(ifindex: u32) -> String {
    match nix::net::if_::if_indextoname(ifindex) {
        Ok(name) => format!("interface {} (#{ifindex})", name.to_string_lossy()),
        Err(_) => format!("interface #{ifindex}"),
    }
}

fn with_context(e: io::Error, what: String) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// A send-only packet socket bound to one Ethernet interface.
struct Sender {
    fd: OwnedFd,
    ifindex: i32,
    mac: [u8; 6],
    name: String,
}

impl Sender {
    fn open(ifindex: u32) -> io::Result<Sender> {
        let name = describe(ifindex);
        let index = i32::try_from(ifindex).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("interface index {ifindex} out of range"),
            )
        })?;
        // SAFETY: socket(2) with constant arguments; the result is checked
        // and immediately owned below. Protocol 0: the socket receives nothing.
        let raw =
            unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(with_context(
                io::Error::last_os_error(),
                format!("open a packet socket for {name} (needs CAP_NET_RAW)"),
            ));
        }
        // SAFETY: `raw` is a fresh, valid descriptor owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };

        let sll = sockaddr_ll(index, 0, None);
        // SAFETY: `sll` is a fully initialised sockaddr_ll and SLL_LEN is its size.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast::<libc::sockaddr>(),
                SLL_LEN,
            )
        };
        if rc < 0 {
            return Err(with_context(
                io::Error::last_os_error(),
                format!("bind to {name}"),
            ));
        }

        // getsockname on a bound packet socket reports the device's
        // hardware type and address.
        // SAFETY: all-zero is a valid sockaddr_ll.
        let mut own: libc::sockaddr_ll = unsafe { mem::zeroed() };
        let mut len = SLL_LEN;
        // SAFETY: `own` is writable storage of `len` bytes; the kernel writes at most `len`.
        let rc = unsafe {
            libc::getsockname(
                fd.as_raw_fd(),
                (&mut own as *mut libc::sockaddr_ll).cast::<libc::sockaddr>(),
                &mut len,
            )
        };
        if rc < 0 {
            return Err(with_context(
                io::Error::last_os_error(),
                format!("read the hardware address of {name}"),
            ));
        }
        if own.sll_hatype != ARPHRD_ETHER || own.sll_halen != 6 {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "{name} is not an Ethernet interface (hardware type {}): \
                     ARP and neighbour advertisements need one",
                    own.sll_hatype
                ),
            ));
        }
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&own.sll_addr[..6]);
        Ok(Sender {
            fd,
            ifindex: index,
            mac,
            name,
        })
    }

    fn send(&self, protocol: u16, dest: [u8; 6], payload: &[u8]) -> io::Result<()> {
        let to = sockaddr_ll(self.ifindex, protocol, Some(dest));
        // SAFETY: `payload` is valid for payload.len() bytes; `to` is an
        // initialised sockaddr_ll of SLL_LEN bytes.
        let rc = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                payload.as_ptr().cast::<libc::c_void>(),
                payload.len(),
                0,
                (&to as *const libc::sockaddr_ll).cast::<libc::sockaddr>(),
                SLL_LEN,
            )
        };
        if rc < 0 {
            return Err(with_context(
                io::Error::last_os_error(),
                format!("send an announcement on {}", self.name),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
