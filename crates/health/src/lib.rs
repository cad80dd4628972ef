//! Device health: one probe of a device (a TCP connect, an ICMP echo, an
//! HTTP GET, a UDP request, a Modbus/TCP read) and the state machine that
//! turns a run of outcomes into `reachable` / `unreachable` / `unknown`
//! (HAProxy's rise and fall: a state changes only after so many
//! consecutive results).
//!
//! It makes no socket itself: the caller's [`Sockets`] does, inside the
//! pod's network namespace (edgelink-forward's factory), so a probe takes
//! the path clients take. It never enters a namespace, never schedules
//! probes, and knows nothing of forwards or their limits.
#![forbid(unsafe_code)]

mod error;
mod icmp;
mod modbus;
pub mod probe;
mod sockets;
pub mod tracker;

pub use error::ProbeError;
pub use probe::probe;
pub use sockets::Sockets;
pub use tracker::{State, Tracker};
