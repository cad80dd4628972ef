//! edgelink-operator's library: the custom resources (`crd`), the objects
//! made from a Device (`render`), the checks the schema cannot make
//! (`validate`), the device health derived from edgelinkd's reports
//! (`report`) and what it means for each node and its readiness gate
//! (`nodes`), who sent a report (`sender`), and the cluster Services a
//! device may call (`reverse`), the pods that require devices
//! (`requires`), and who holds a Device's virtual address (`vip`). The
//! binary (src/main.rs and src/run/) adds the controller, leader election
//! and the HTTP endpoints.

pub mod crd;
pub mod nodes;
pub mod render;
pub mod report;
pub mod reported;
pub mod requires;
pub mod reverse;
pub mod sender;
mod target;
pub mod validate;
mod verdict;
pub mod vip;

#[cfg(test)]
mod fixtures;
