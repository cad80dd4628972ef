//! Integration tests of the relay, one module per area. Everything runs on
//! loopback, bounded in time.

mod doze;
mod harness;
mod park;
mod pipe;
mod review3;
mod tcp;
mod tcp_edges;
mod udp;
