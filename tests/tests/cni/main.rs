//! Scenario tests for the `edgelink` CNI plugin: the built binary driven as
//! runtimes and Multus drive it, in namespaces each test creates.
//! Run as root (network namespaces). The harness builds the current plugin
//! itself (`edgelink_tests::built_bins`), so `cargo test` alone is enough.

mod bridge;
mod bridge_options;
mod crash;
mod docs;
mod errors;
mod ipam;
mod lifecycle;
mod macvlan;
mod records;
mod review3_node_files;
mod review3_segment;
mod review_plugin;
mod runtimes;
mod sticky_pod;
mod validate;
mod virtual_addresses;
