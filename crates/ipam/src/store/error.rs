//! Errors of the store and the allocator.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong while reserving or releasing addresses.
/// Each variant names what it is about (network, address, owner, file).
#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    /// Every candidate of a range set is reserved, excluded, reserved by the
    /// subnet (network, broadcast, gateway) or answered an ARP probe.
    #[error("no free address left in network {network:?}: every address of {ranges} is reserved, excluded, or answered an ARP probe")]
    Exhausted { network: String, ranges: String },

    /// A requested address is held by another (container, ifname).
    #[error("requested address {ip} is already reserved by container {container_id:?} interface {ifname:?}")]
    RequestedTaken {
        ip: IpAddr,
        container_id: String,
        ifname: String,
    },

    /// A requested address cannot be handed out: it lies in no range of this
    /// node, is a network/broadcast/gateway or excluded address, or a second
    /// requested address for a range set that already has one.
    #[error("requested address {ip} is not allocatable here: it is outside every range of this node, a network, broadcast, gateway or excluded address, or a second address for one range set")]
    RequestedOutOfRange { ip: IpAddr },

    /// The store belongs to another namespace: a pod of it holds addresses
    /// there (the network name is taken on this node).
    #[error("network {network:?}: this node's IPAM store of that name belongs to namespace {owner:?}, whose pods hold addresses in it; a pod of namespace {namespace:?} may not take addresses from it (use another network name, or let the node share it: sharedNetworks of the node policy)")]
    NotOwner {
        network: String,
        owner: String,
        namespace: String,
    },

    /// The store lock could not be taken in time (another operation holds it).
    #[error("could not lock {} within {waited:?}: another IPAM operation holds it", path.display())]
    LockTimeout { path: PathBuf, waited: Duration },

    /// A file system operation on the store failed.
    #[error("I/O error on {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A store file does not hold what it should.
    #[error("{} is corrupt: {reason}", path.display())]
    Corrupt { path: PathBuf, reason: String },
}

impl IpamError {
    /// An [`IpamError::Io`] on `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> IpamError {
        IpamError::Io {
            path: path.into(),
            source,
        }
    }
}
