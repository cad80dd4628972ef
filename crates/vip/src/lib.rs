//! `edgelink-vip`: the mechanics of a virtual address that moves between
//! edge nodes.
//!
//! A virtual address here is one IP address per Device that the Device's
//! peers dial, held by one proxy pod at a time: the daemon (edgelinkd) of
//! the node running that pod adds it as a host address (/32 or /128, see
//! [`host_net`]) to the pod's segment interface `net1`, and moves it when
//! the operator says another pod holds it now. Two things make a move
//! quick and safe:
//!
//! * a kernel lifetime: the daemon adds the address with
//!   `edgelink_netlink::Handle::hold_addr` and renews it well before it runs
//!   out. If the daemon dies, or loses touch with the operator and stops
//!   renewing, the kernel removes the address by itself, so a stale holder
//!   keeps it at most one lifetime longer. That lifetime is the backstop,
//!   not the way a move normally ends: the old holder deletes the address
//!   when told.
//! * an announcement ([`announce()`]): a gratuitous ARP (IPv4) or unsolicited
//!   Neighbour Advertisement (IPv6) so that devices on the segment point
//!   their neighbour entry at the new holder's MAC at once instead of
//!   sending to the old one until the entry goes stale. It is repeated on
//!   the schedule [`ANNOUNCE_AFTER`].
//!
//! What it must not do: decide who holds an address (the operator does),
//! keep time or spawn threads (the daemon schedules renewals and
//! announcements), switch network namespaces (its caller runs it on a
//! thread that entered the pod's), or depend on tokio or netlink.
//!
//! `unsafe` is denied everywhere except in [`mod@announce`], which needs raw
//! `AF_PACKET` socket calls; each block there carries a `// SAFETY:` note.

#![deny(unsafe_code)]

pub mod announce;

pub use announce::{announce, garp_frames, unsolicited_na, ARP_LEN, NA_LEN};

use ipnetwork::IpNetwork;
use std::net::IpAddr;
use std::time::Duration;

/// When to announce an address after taking it, counted from taking it:
/// at once, after 1.1 s and after 3 s.
///
/// More than once because one announcement can be lost: a frame can be
/// dropped, a device can be busy, and a Linux neighbour ignores an update
/// that comes within `locktime` (1 s by default) of its previous one unless
/// it recognises the packet as gratuitous (current kernels do for both of
/// our ARP frames; old kernels and other stacks may not, and Linux applies
/// it to every non-gratuitous ARP). The second one comes just after that
/// second has passed; the third catches a device that was slow to come
/// back (a link flap, a switch relearning).
pub const ANNOUNCE_AFTER: [Duration; 3] = [
    Duration::ZERO,
    Duration::from_millis(1100),
    Duration::from_secs(3),
];

/// `ip` as a host network: /32 for IPv4, /128 for IPv6, the form a virtual
/// address is added in (it must not bring a subnet route with it).
pub fn host_net(ip: IpAddr) -> IpNetwork {
    IpNetwork::from(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_nets_are_single_addresses() {
        let v4 = host_net("172.31.250.50".parse().unwrap());
        assert_eq!(v4.to_string(), "172.31.250.50/32");
        let v6 = host_net("fd99:250::50".parse().unwrap());
        assert_eq!(v6.to_string(), "fd99:250::50/128");
    }

    #[test]
    fn announcements_start_at_once_and_leave_locktime_between_them() {
        assert_eq!(ANNOUNCE_AFTER[0], Duration::ZERO);
        for pair in ANNOUNCE_AFTER.windows(2) {
            assert!(pair[1] - pair[0] > Duration::from_secs(1), "{pair:?}");
        }
    }
}
