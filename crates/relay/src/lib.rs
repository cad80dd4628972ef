//! The data path of one forward, and nothing else: TCP relayed with
//! splice(2) through pooled pipes, UDP relayed with batched syscalls and a
//! per-client session table, and the counters both keep; also the PROXY
//! protocol header a TCP relay may send its target first (`proxy_header`).
//!
//! This crate does not know about network namespaces, attachments or
//! configuration files. Sockets that must live in a pod's namespace are
//! handed in ready-made, or made through a [`SocketSource`] the caller
//! implements (the node daemon creates them inside the right namespace).
//!
//! Unsafe code is confined to the batched UDP syscalls and the mapping
//! long datagrams spill into (`udp::mmsg`), and three socket calls
//! (`sockopt`: an int setsockopt, the SIOCATMARK and SIOCINQ ioctls); the
//! rest goes through nix's safe wrappers (splice, pipe2, fcntl, recv).
//!
//! splice(2) into a socket whose peer is gone raises SIGPIPE: the process
//! must ignore it, as every Rust binary does unless told otherwise.

#![deny(unsafe_code)]

pub mod counters;
pub mod pipe;
pub mod proxy_header;
#[allow(unsafe_code)]
mod sockopt;
pub mod tcp;
pub mod udp;

pub use counters::Counters;
pub use pipe::{ParkedPipe, Pipe, PipePool, PipeStats};
pub use tcp::{
    keepalive_params, prepare_socket, relay_tcp, resume_tcp, splice_duplex, ParkedDirection,
    ParkedTcp, Relayed, Tally, TcpRelayConfig, DEFAULT_PIPE_SIZE,
};
pub use udp::{
    relay_udp, serve_udp, ParkedSession, SessionEnd, SessionEnded, SessionHook, UdpConfig,
    UdpForward, UdpTarget,
};

use futures_util::future::BoxFuture;
use std::io;
use std::net::SocketAddr;

/// Where new upstream sockets come from. The node daemon's implementation
/// creates them inside the pod's network namespace (a socket stays in the
/// namespace it was created in, whichever thread uses it later).
pub trait SocketSource: Send + Sync {
    /// A fresh, unconnected, non-blocking UDP socket of the target's family.
    fn udp_socket(&self, target: SocketAddr)
        -> BoxFuture<'static, io::Result<std::net::UdpSocket>>;
    /// A fresh, unconnected, non-blocking TCP socket of the target's family.
    fn tcp_socket(&self, target: SocketAddr) -> BoxFuture<'static, io::Result<socket2::Socket>>;
}

/// Whether traffic from `peer`, which arrived on interface `ifindex` (when
/// known), must be refused (it comes from the private side).
pub type RefuseFn = dyn Fn(SocketAddr, Option<u32>) -> bool + Send + Sync;
