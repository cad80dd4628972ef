//! edgelink-operator's library: the custom resources (`crd`), the objects
//! made from a Device (`render`), the checks the schema cannot make
//! (`validate`), the device health derived from edgelinkd's reports
//! (`report`) and what it means for each node and its readiness gate
//! (`nodes`), who sent a report (`sender`), and the cluster Services a
//! device may call (`reverse`), the pods that require devices
//! (`requires`), who holds a Device's virtual address (`vip`), and who may
//! use a Device: the DeviceLeases' queue (`lease`), the pods a Device's
//! allowedClients selects (`clients`, `selector`) and the access rules
//! each node's edgelinkd gets (`access`). The
//! binary (src/main.rs and src/run/) adds the controller, leader election
//! and the HTTP endpoints.

pub mod access;
pub mod clients;
pub mod crd;
pub mod lease;
pub mod nodes;
pub mod render;
pub mod report;
pub mod reported;
pub mod requires;
pub mod reverse;
pub mod selector;
pub mod sender;
mod target;
pub mod validate;
mod verdict;
pub mod vip;

#[cfg(test)]
mod fixtures;
