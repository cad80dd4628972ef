//! edgelinkd's hand-over protocol: how a running daemon gives its
//! listeners, live connections and UDP sessions to the one that replaces
//! it, without a byte going through user space.
//!
//! The new daemon (`edgelinkd run --takeover`) connects to the running
//! one's control socket, writes the line `handover`, and from then on both
//! speak in frames over that Unix stream socket:
//!
//! ```text
//! new → old   Hello     { protocol, version, instance }
//! old → new   Welcome   { protocol, version, instance }   or Refused { reason, code }
//! old → new   Inventory { fds: N, state }                 then N descriptors,
//!                                                          in Fds frames of at most 253
//! new → old   Confirm                                     or Abort { reason }
//! old → new   Ack                                         or Refused { reason, code }
//! ```
//!
//! The `Ack` (protocol 2) is what makes exactly one daemon serve: the old
//! daemon waits for the Confirm (for its `--handover-timeout`), answers
//! `Ack` and exits, or, having given up, answers `Refused` and serves on;
//! the new daemon serves nothing before its `Ack`, and a Confirm that is
//! not acknowledged ends it.
//!
//! A frame is a 4-byte big-endian length and that many bytes of JSON
//! ([`Message`]); descriptors ride on `Fds` frames as SCM_RIGHTS ancillary
//! data ([`MAX_FDS_PER_FRAME`] at most each, the kernel's SCM_MAX_FD).
//! The [`State`] refers to descriptors by their index in that sequence
//! ([`Fd`]); [`State::check`] makes sure each index exists and is used
//! once, so a peer cannot make one socket serve twice.
//!
//! Versioning: [`PROTOCOL`] changes whenever a message or the meaning of a
//! field changes. The old daemon refuses a peer of a protocol it does not
//! speak with [`RefusalCode::Protocol`] and keeps running. Protocol 2
//! speaks protocol 1 too ([`OLDEST_PROTOCOL`]): as the old daemon it
//! hands over to a protocol-1 peer without the `Ack`; as the new one,
//! refused by a protocol-1 daemon, it asks again in protocol 1.

mod channel;
pub mod give;
pub mod lot;
mod message;
pub mod pack;
pub mod take;

pub use channel::{Channel, Received};
pub use message::*;

/// The hand-over protocol this build speaks: 2 added the `Ack` after
/// `Confirm` and the queue state of waiting connections.
pub const PROTOCOL: u32 = 2;

/// The oldest protocol this build still speaks (without the `Ack`).
pub const OLDEST_PROTOCOL: u32 = 1;

/// The line that turns a control-socket connection into a hand-over.
pub const HANDOVER_LINE: &str = "handover";

/// The old daemon's answer to the `handover` line, before the frames.
pub const ACK: &str = "ok handover";

/// Each read and write of the conversation, at most.
pub const STEP: std::time::Duration = std::time::Duration::from_secs(10);

/// Who this build is, speaking `protocol`, as instance `instance`.
pub fn peer(protocol: u32, instance: &str) -> Peer {
    Peer {
        protocol,
        version: env!("CARGO_PKG_VERSION").into(),
        instance: instance.into(),
    }
}

/// Run blocking channel work off the runtime's threads.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Io(std::io::Error::other(e)))
}

/// Descriptors per SCM_RIGHTS message at most (Linux's SCM_MAX_FD).
pub const MAX_FDS_PER_FRAME: usize = 253;

/// Largest frame accepted: an inventory of 100,000 connections is ~30 MB.
pub const MAX_FRAME: usize = 64 << 20;

/// Descriptors in one hand-over at most.
pub const MAX_FDS: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("hand-over socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("malformed hand-over message: {0}")]
    Malformed(String),
    #[error("hand-over frame of {0} bytes is larger than the {MAX_FRAME} allowed")]
    TooLarge(usize),
    #[error("the peer closed the hand-over connection {0}")]
    Closed(&'static str),
    #[error("expected {expected}, got {got}")]
    Unexpected { expected: &'static str, got: String },
    #[error("the running edgelinkd refused the hand-over: {reason}")]
    Refused { reason: String, code: RefusalCode },
    #[error("the new edgelinkd aborted the hand-over: {0}")]
    Aborted(String),
}
