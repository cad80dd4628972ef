//! Serving one attachment's forwards from inside the pod's network
//! namespace. Given an attachment's record and its namespace (by
//! edgelink-node), it makes the sockets there, accepts, protects the
//! device, connects and relays; it reports through each forward's
//! [`ForwardRuntime`]. It never reads records, never decides which
//! attachments exist, and never installs the kernel path.
//!
//! The map, from the entry point down:
//!
//! - [`serve::start`]: one forward: re-checks its record, adopts what a
//!   hand-over brought or binds anew, starts its tasks.
//! - `listen`: listeners and the TCP accept loops; `udp`: a UDP forward's
//!   relay task; `resume`: connections a hand-over brought.
//! - `modbus`: a Modbus/TCP forward's clients, multiplexed (edgelink-modbus).
//! - `connection`: one TCP connection: its place under the caps, admission,
//!   connect (retries, PROXY header), the relay; `ending`: how the relay
//!   ends (by itself, parked, reset when cut short) and what follows.
//! - `protect`: the device's protection (queue, retries, latency).
//! - [`clients`]: who may connect (the access rules: allowedClients, the
//!   lease) and the audit line of each connection.
//! - [`node_local`]: whether a client is the node itself (the kubelet's
//!   probes).
//! - `private_side`: which side of the pod a connection came from.
//! - `reverse`, `follow`: reverse forwards and the names they follow.
//! - `probe`: the reachability probe; [`health`]: the attachment's device
//!   health probe, which replaces it.
//! - [`factory::Factory`]: the thread that makes sockets inside the pod's
//!   namespace; `sockopt`: socket options.
//! - [`workers::Workers`]: the worker threads that serve connections.
//! - [`runtime::ForwardRuntime`]: one forward's shared state and report.
//! - [`ctx`]: what a forward's tasks are given; [`cutoff`]: what ends
//!   an attachment's connections (a hand-over, or the attachment going).

pub mod clients;
mod connection;
pub mod ctx;
pub mod cutoff;
mod ending;
pub mod factory;
mod follow;
pub mod health;
mod listen;
mod modbus;
pub mod node_local;
pub mod private_side;
mod probe;
pub mod protect;
mod resume;
pub mod reverse;
pub mod runtime;
pub mod serve;
mod sockopt;
mod udp;
pub mod workers;

pub use ctx::{Ctx, Settings, Shared};
pub use runtime::{ForwardDefaults, ForwardRuntime, ForwardState};
pub use serve::start;
