//! RFC 5227 ARP probe: is an IPv4 address already used by some device on
//! the segment?
//!
//! A probe is an ARP request with sender IP 0.0.0.0, sender MAC = the
//! interface's MAC and target IP = the candidate, broadcast from an
//! `AF_PACKET` socket bound to the interface. The address is in use when,
//! within the timeout, an ARP packet arrives whose sender IP is the candidate
//! (a reply, or the owner's own traffic), or another host's probe for the
//! same candidate (RFC 5227 §2.1.1). The probe is sent at once and again
//! halfway through the timeout, in case the first frame is lost.
//!
//! The socket lives in the network namespace current when [`Prober::open`]
//! runs (a socket stays bound to its netns), so a caller can open it inside
//! a pod's netns and probe from anywhere. This module sends frames only on
//! the interface it is given; it configures nothing.
//!
//! It is the one place of the crate with `unsafe`: raw socket calls through
//! `libc`, each with a `// SAFETY:` note.

#![allow(unsafe_code)]

use std::io;
use std::mem;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

const ETH_P_ARP: u16 = 0x0806;
const ETH_P_IP: u16 = 0x0800;
const ARPHRD_ETHER: u16 = 1;
const ARPOP_REQUEST: u16 = 1;
const ARP_LEN: usize = 28;
const BROADCAST: [u8; 6] = [0xff; 6];

/// An `AF_PACKET` socket bound to one Ethernet interface, ready to probe.
#[derive(Debug)]
pub struct Prober {
    fd: OwnedFd,
    ifindex: u32,
    mac: [u8; 6],
}

/// Probe `ip` once from interface `ifname` (of the caller's current netns).
/// `Ok(true)`: a device answered, the address is in use.
pub fn probe(ifname: &str, ip: Ipv4Addr, timeout: Duration) -> io::Result<bool> {
    Prober::open(ifname)?.probe(ip, timeout)
}

/// As [`probe`], naming the interface by index.
pub fn probe_index(ifindex: u32, ip: Ipv4Addr, timeout: Duration) -> io::Result<bool> {
    Prober::open_index(ifindex)?.probe(ip, timeout)
}

fn sockaddr_ll(ifindex: u32, dest: Option<[u8; 6]>) -> io::Result<libc::sockaddr_ll> {
    // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as libc::sa_family_t;
    sll.sll_protocol = ETH_P_ARP.to_be();
    sll.sll_ifindex = i32::try_from(ifindex).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface index {ifindex} out of range"),
        )
    })?;
    if let Some(mac) = dest {
        sll.sll_halen = 6;
        sll.sll_addr[..6].copy_from_slice(&mac);
    }
    Ok(sll)
}

const SLL_LEN: libc::socklen_t = mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;

impl Prober {
    /// Open a prober on interface `ifname` of the current network namespace.
    pub fn open(ifname: &str) -> io::Result<Prober> {
        let ifindex = nix::net::if_::if_nametoindex(ifname).map_err(|e| {
            io::Error::new(
                io::Error::from(e).kind(),
                format!("interface {ifname:?}: {e}"),
            )
        })?;
        Self::open_index(ifindex)
    }

    /// Open a prober on the interface with index `ifindex` of the current
    /// network namespace. Fails with `Unsupported` unless it is Ethernet-like.
    pub fn open_index(ifindex: u32) -> io::Result<Prober> {
        // SAFETY: socket(2) with constant arguments; the result is checked
        // and immediately owned below.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                i32::from(ETH_P_ARP.to_be()),
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh, valid descriptor owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };

        let sll = sockaddr_ll(ifindex, None)?;
        // SAFETY: `sll` is a fully initialised sockaddr_ll and SLL_LEN is its size.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast::<libc::sockaddr>(),
                SLL_LEN,
            )
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("bind to interface index {ifindex}: {e}"),
            ));
        }

        // getsockname on a bound packet socket reports the device's hardware address.
        // SAFETY: all-zero is a valid sockaddr_ll.
        let mut name: libc::sockaddr_ll = unsafe { mem::zeroed() };
        let mut len = SLL_LEN;
        // SAFETY: `name` is writable storage of `len` bytes; the kernel writes at most `len`.
        let rc = unsafe {
            libc::getsockname(
                fd.as_raw_fd(),
                (&mut name as *mut libc::sockaddr_ll).cast::<libc::sockaddr>(),
                &mut len,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        if name.sll_hatype != ARPHRD_ETHER || name.sll_halen != 6 {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "interface index {ifindex} is not an Ethernet interface (hardware type {}), ARP probing needs one",
                    name.sll_hatype
                ),
            ));
        }
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&name.sll_addr[..6]);
        Ok(Prober { fd, ifindex, mac })
    }

    /// The interface's MAC address (the probe's sender hardware address).
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// The interface index the prober is bound to.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Probe `ip`: `Ok(true)` when a device answers within `timeout`.
    pub fn probe(&mut self, ip: Ipv4Addr, timeout: Duration) -> io::Result<bool> {
        let started = Instant::now();
        let deadline = started + timeout;
        let resend_at = started + timeout / 2;
        let packet = probe_packet(self.mac, ip);
        self.send(&packet)?;
        let mut resent = false;
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            if !resent && now >= resend_at {
                self.send(&packet)?;
                resent = true;
            }
            let until = if resent { deadline } else { resend_at };
            if self.wait_readable(until.saturating_duration_since(now))? && self.drain(ip)? {
                return Ok(true);
            }
        }
    }

    fn send(&self, packet: &[u8; ARP_LEN]) -> io::Result<()> {
        let dest = sockaddr_ll(self.ifindex, Some(BROADCAST))?;
        // SAFETY: `packet` is a valid buffer of ARP_LEN bytes; `dest` is an
        // initialised sockaddr_ll of SLL_LEN bytes.
        let rc = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                packet.as_ptr().cast::<libc::c_void>(),
                packet.len(),
                0,
                (&dest as *const libc::sockaddr_ll).cast::<libc::sockaddr>(),
                SLL_LEN,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Wait up to `wait` (rounded up to whole ms) for a packet.
    fn wait_readable(&self, wait: Duration) -> io::Result<bool> {
        let ms = wait.as_micros().div_ceil(1000).clamp(1, i32::MAX as u128) as i32;
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, count 1.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            };
        }
        Ok(rc > 0)
    }

    /// Read every queued packet; true if one shows `ip` in use.
    fn drain(&self, ip: Ipv4Addr) -> io::Result<bool> {
        let mut buf = [0u8; 256];
        loop {
            // SAFETY: all-zero is a valid sockaddr_ll.
            let mut from: libc::sockaddr_ll = unsafe { mem::zeroed() };
            let mut from_len = SLL_LEN;
            // SAFETY: `buf` is writable for buf.len() bytes, `from` for `from_len` bytes.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast::<libc::c_void>(),
                    buf.len(),
                    0,
                    (&mut from as *mut libc::sockaddr_ll).cast::<libc::sockaddr>(),
                    &mut from_len,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock => Ok(false),
                    io::ErrorKind::Interrupted => continue,
                    _ => Err(e),
                };
            }
            let len = usize::try_from(n).unwrap_or(0).min(buf.len());
            let ours = u32::try_from(from.sll_ifindex).ok() == Some(self.ifindex);
            if ours
                && from.sll_pkttype != libc::PACKET_OUTGOING
                && shows_in_use(&buf[..len], ip, self.mac)
            {
                return Ok(true);
            }
        }
    }
}

/// The 28-byte ARP probe for `ip` (Ethernet/IPv4).
fn probe_packet(mac: [u8; 6], ip: Ipv4Addr) -> [u8; ARP_LEN] {
    let mut p = [0u8; ARP_LEN];
    p[0..2].copy_from_slice(&ARPHRD_ETHER.to_be_bytes());
    p[2..4].copy_from_slice(&ETH_P_IP.to_be_bytes());
    p[4] = 6;
    p[5] = 4;
    p[6..8].copy_from_slice(&ARPOP_REQUEST.to_be_bytes());
    p[8..14].copy_from_slice(&mac);
    // sender IP 0.0.0.0 (14..18), target MAC zero (18..24)
    p[24..28].copy_from_slice(&ip.octets());
    p
}

/// RFC 5227 §2.1.1: a received ARP packet whose sender IP is the candidate,
/// or a probe for the candidate from another host.
fn shows_in_use(pkt: &[u8], ip: Ipv4Addr, own_mac: [u8; 6]) -> bool {
    if pkt.len() < ARP_LEN
        || pkt[0..2] != ARPHRD_ETHER.to_be_bytes()
        || pkt[2..4] != ETH_P_IP.to_be_bytes()
        || pkt[4] != 6
        || pkt[5] != 4
    {
        return false;
    }
    let op = u16::from_be_bytes([pkt[6], pkt[7]]);
    let sha = &pkt[8..14];
    let spa = &pkt[14..18];
    let tpa = &pkt[24..28];
    let ip = ip.octets();
    spa == ip || (op == ARPOP_REQUEST && spa == [0, 0, 0, 0] && tpa == ip && sha != own_mac)
}

#[cfg(test)]
mod tests;
