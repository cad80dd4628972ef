//! The running operator (only the binary uses these): the controller, the
//! reports edgelinkd posts, leader election and the HTTP endpoint.

pub mod controller;
pub mod leader;
pub mod metrics;
pub mod reports;
pub mod server;
