//! Resolve a reverse forward's target name the way the pod itself would:
//! with the pod's resolver configuration ([`ResolvConf`], found by
//! [`pod_resolv_conf`], given by the runtime, or the cluster's as a
//! `ClusterFirst` pod would have it: [`cluster_first_for`]), over sockets made inside
//! the pod's network namespace, with a TTL-respecting cache ([`Resolver`]).
//!
//! It must not create sockets of its own: every query goes out on a socket
//! the caller makes through [`DnsSockets`] (the daemon's per-netns socket
//! factory), so no query ever leaves from the daemon's own namespace. It
//! knows nothing of forwards, connections or the daemon's state; the DNS
//! wire format is hickory-proto's.

mod cluster;
mod conf;
mod exchange;
mod pod;
mod resolver;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use cluster::cluster_first_for;
pub use conf::{ResolvConf, MAX_NAMESERVERS};
pub use pod::pod_resolv_conf;
pub use resolver::{Resolved, Resolver};

use futures_util::future::BoxFuture;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Makes the sockets queries go out on (the daemon makes them inside the
/// pod's netns).
pub trait DnsSockets: Send + Sync + 'static {
    /// A fresh unconnected non-blocking UDP socket of `server`'s family.
    fn udp(&self, server: SocketAddr) -> BoxFuture<'static, io::Result<std::net::UdpSocket>>;
    /// A fresh unconnected non-blocking TCP socket of `server`'s family
    /// (for truncated answers).
    fn tcp(&self, server: SocketAddr) -> BoxFuture<'static, io::Result<socket2::Socket>>;
}

/// Why a configuration could not be read or a name not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("resolv.conf line {line} ({text:?}): {reason}")]
    Conf {
        line: usize,
        text: String,
        reason: String,
    },
    #[error("dns config value {value:?}: {reason}")]
    ConfValue { value: String, reason: String },
    #[error("the resolver configuration names no nameserver")]
    NoNameserver,
    #[error("{path}: {source}")]
    ConfFile {
        path: PathBuf,
        #[source]
        source: Box<ResolveError>,
    },
    #[error("{host:?} is no valid DNS name: {reason}")]
    BadName { host: String, reason: String },
    #[error("{host:?}: no such name (NXDOMAIN; tried {tried})")]
    NxDomain { host: String, tried: String },
    #[error("{host:?}: the name exists but has no A or AAAA record (tried {tried})")]
    NoRecords { host: String, tried: String },
    #[error("{host:?}: no answer from {servers} ({attempts} attempts of {timeout_ms} ms each)")]
    Timeout {
        host: String,
        servers: String,
        attempts: u8,
        timeout_ms: u128,
    },
    #[error("{host:?}: bad answer from {server}: {reason}")]
    BadAnswer {
        host: String,
        server: SocketAddr,
        reason: String,
    },
    #[error("{host:?}: query to {server}: {source}")]
    Query {
        host: String,
        server: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

impl ResolveError {
    /// The name does not exist or has no address: the answer itself,
    /// not a failure to get one.
    pub fn is_negative(&self) -> bool {
        matches!(
            self,
            ResolveError::NxDomain { .. } | ResolveError::NoRecords { .. }
        )
    }
}

#[cfg(test)]
mod tests;
