//! Modbus/TCP multiplexing for PLCs that accept one connection (and one
//! request) at a time: every client's requests are carried over at most
//! `max_connections` connections to the device, each with at most
//! `max_in_flight` requests outstanding, first come first served. Each
//! request's transaction id is rewritten on the way up and restored on the
//! way down, so every client sees its own ids; unit ids pass untouched.
//!
//! - [`frame`]: the MBAP frame, read and written.
//! - [`mux::Mux`]: the queue, the device's connections and the clients.
//! - [`stats::Stats`]: what it counts.
//! - [`testing`]: a PLC that serves one connection and one request at a
//!   time, and a client, for tests and benchmarks.
//!
//! It knows nothing of namespaces, forwards or the daemon: it is given a
//! way to connect to the device and the clients' sockets.

mod flight;
pub mod frame;
pub mod mux;
pub mod stats;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use frame::{Frame, FrameError};
pub use mux::{ClientEnd, Config, Connect, Mux};
pub use stats::Stats;
