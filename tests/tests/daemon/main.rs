//! Scenario tests for `edgelinkd`, the node daemon: the demo's topology
//! (node, device, a pod whose eth0 reaches a cluster client and whose net1
//! comes from the plugin with forwards) built in namespaces each test
//! creates, with the daemon running in the node namespace and traffic sent
//! from the client through the pod's forwards to the device.
//! Run as root. The harness builds the current binaries itself
//! (`edgelink_tests::built_bins`), so `cargo test` alone is enough.

mod lab;

mod access;
mod cli;
mod handover;
mod handover_races;
mod health;
mod kernel_path;
mod lifecycle;
mod limits;
mod modbus;
mod nudge;
mod pods;
mod private_side;
mod promises;
mod protection;
mod proxy_protocol;
mod records;
mod restarts;
mod reverse;
mod reverse_dns;
mod review3_http;
mod review3_limits;
mod review3_listeners;
mod review3_segments;
mod security;
mod settings;
mod tcp;
mod udp;
mod virtual_address;
mod visibility;
mod webhook_file;
