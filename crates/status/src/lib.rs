//! edgelinkd's status surface: what the node daemon says of itself.
//!
//! - [`model`]: the JSON of `/status` (plain data, filled by edgelink-node
//!   and edgelink-forward).
//! - [`http`]: the read-only endpoint (`/healthz`, `/livez`, `/metrics`,
//!   `/status`) and the client `edgelinkd status` uses.
//! - [`metrics`]: the Prometheus (OpenMetrics) rendering of a [`Status`].
//! - [`webhook`]: the status POSTed to edgelink-operator.
//! - [`heartbeat`]: the heartbeat POSTed beside it, every half second,
//!   and [`grants`]: what the operator's answers grant (virtual addresses).
//! - [`table`]: `edgelinkd status`'s table, filters and exit status.
//!
//! It reads the node through [`Source`] only: it never starts, stops or
//! changes an attachment, and never touches a pod's namespace.

pub mod grants;
pub mod heartbeat;
pub mod http;
pub mod metrics;
mod model;
pub mod sent;
pub mod table;
pub mod webhook;

pub use model::*;

use std::time::Duration;

/// What the status surface reads of the node (edgelink-node's `Node`).
pub trait Source: Send + Sync + 'static {
    /// Everything, as `/status` shows it.
    fn status(&self) -> Status;
    /// What `/healthz` and `/livez` judge by.
    fn health(&self) -> Health;
    /// What `/metrics` shows beside the [`Status`].
    fn gauges(&self) -> Gauges;
    /// Bumped whenever attachments or forward states change (the webhook
    /// posts at once).
    fn changes(&self) -> tokio::sync::watch::Receiver<u64>;
    /// The audit trail, for `/audit` (none: 404).
    fn audit(&self) -> Option<edgelink_access::Audit> {
        None
    }
}

/// The reconcile loop's pulse.
#[derive(Debug, Clone, Copy)]
pub struct Health {
    /// When the last pass ended (Unix seconds; 0: none yet).
    pub last_reconcile: u64,
    /// How often passes run (`--reconcile-interval`).
    pub interval: Duration,
    /// Stopping: no new connections (not ready, still live).
    pub draining: bool,
}

/// The node's own gauges, not per forward.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Gauges {
    /// Upstream TCP sockets taken ready from the `--socket-pool`.
    pub socket_pool_taken: u64,
    /// Splice pipes holding data in flight.
    pub pipes_in_use: i64,
    /// How long the last full reconcile pass took, in seconds.
    pub last_pass_seconds: f64,
    /// Reconcile passes over every record.
    pub full_passes: u64,
    /// Passes over the records that changed (ADD, DEL, inotify).
    pub record_passes: u64,
}

/// What the status surface's own work can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}: only http:// is supported")]
    Scheme(String),
    #[error("{url}: the port: {source}")]
    Port {
        url: String,
        source: std::num::ParseIntError,
    },
    #[error("{path}: {source}")]
    Read {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{0}: is empty")]
    Empty(std::path::PathBuf),
    #[error("no answer from {0} within 5 s")]
    Timeout(std::net::SocketAddr),
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Http(#[from] hyper::Error),
    #[error(transparent)]
    Request(#[from] hyper::http::Error),
}
