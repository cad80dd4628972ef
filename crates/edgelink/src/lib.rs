//! The edgelink CNI plugin's code, as a library so that more than the
//! `edgelink` binary (src/main.rs) can reach it: the fuzz targets under
//! `fuzz/` parse and validate a network configuration through the same
//! [`config::Config::parse`] the plugin runs.
//!
//! Everything here runs in the plugin's process, once per CNI command; it
//! must not keep state between invocations or print anything on stdout (the
//! binary prints the Result or the CNI error JSON).

pub mod addressing;
pub mod commands;
pub mod config;
pub mod delegate;
pub mod driver;
pub mod error;
#[cfg(test)]
mod examples;
pub mod lock;
pub mod logfile;
pub mod names;
pub mod node;
pub mod sysctl;
pub mod validate;
