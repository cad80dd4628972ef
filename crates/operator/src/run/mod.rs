//! The running operator (only the binary uses these): the controller, the
//! reports edgelinkd posts and who sent them, leader election, the HTTP
//! endpoint, the Services reverse entries name, and the grants of the
//! Devices' virtual addresses (`holds`).

pub mod auth;
pub mod consumers;
pub mod context;
pub mod controller;
pub mod grants;
pub mod holds;
pub mod leader;
pub mod make;
pub mod metrics;
pub mod proxies;
pub mod reports;
pub mod server;
pub mod services;
