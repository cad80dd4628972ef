//! Scenario tests for the `edgelink` CNI plugin: the built binary driven as
//! runtimes and Multus drive it, in namespaces each test creates.
//! Run as root (network namespaces); `make test` builds the binary first.

mod bridge;
mod bridge_options;
mod crash;
mod errors;
mod ipam;
mod lifecycle;
mod macvlan;
mod records;
mod runtimes;
