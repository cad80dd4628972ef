//! The running operator (only the binary uses these): the controller, the
//! reports edgelinkd posts and who sent them, leader election, the HTTP
//! endpoint, the Services reverse entries name, and the grants of the
//! Devices' virtual addresses (`holds`), the caches a reconcile reads
//! instead of the API (`caches`) and the count of API requests
//! (`requests`), and who may use each Device (`access`: the leases, the
//! nodes' access rules).

pub mod access;
pub mod auth;
pub mod caches;
pub mod consumers;
pub mod context;
pub mod controller;
pub mod error;
pub mod grants;
pub mod holds;
pub mod leader;
pub mod make;
pub mod metrics;
pub mod proxies;
pub mod reports;
pub mod requests;
pub mod rules;
pub mod server;
pub mod services;
#[cfg(test)]
mod steady;
