//! `edgelink-ipam`: the built-in, node-local IPAM of the edgelink CNI plugin.
//!
//! This crate owns three things:
//!
//! * [`config`]: parsing and validating the `ipam` object of a network
//!   configuration into validated types ([`IpamConfig`]); every error names
//!   the field path and the offending value.
//! * [`store`]: the crash-safe on-disk reservation store under
//!   `<stateDir>/ipam/<network>/` (one file per reserved address, created
//!   atomically with its owner; an owner index so DEL is O(1); sticky memory
//!   per pod; round-robin cursors), the allocator on top of it, and GC.
//! * [`arp`]: an RFC 5227 ARP probe, used when `probe.enabled` is set to skip
//!   candidates that a device on the segment already uses.
//!
//! What it must not do: depend on tokio, on CNI wire types or on netlink;
//! spawn processes; sleep on the ADD path (the only waits are for a contended
//! store lock and for ARP answers when probing is enabled); touch anything
//! outside the state directory it is given, except that [`arp`] sends frames
//! on the interface its caller names.
//!
//! `unsafe` is denied everywhere except in [`arp`], which needs raw
//! `AF_PACKET` socket calls; each block there carries a `// SAFETY:` note.

#![deny(unsafe_code)]

mod addr;
pub mod arp;
pub mod config;
pub mod store;

pub use config::{
    node_name_override, ConfigError, IpamConfig, ProbeConfig, Range, RangeSet, RouteConfig,
};
pub use store::{
    release_all_but, release_all_except, release_all_except_with_grace, valid_network_name,
    Allocation, GcReport, IpamError, Owner, Ownership, Store, StoreLock, GC_GRACE,
};

/// Addresses as a user reads them in a log line: `172.17.16.200, fd00::c8`.
pub fn show_ips(ips: &[std::net::IpAddr]) -> String {
    ips.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
