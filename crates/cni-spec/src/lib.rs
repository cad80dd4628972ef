//! The CNI specification's wire types, and nothing else.
//!
//! This crate owns what every CNI plugin shares with its runtime: the spec
//! versions and how a Result converts between them, the error JSON and its
//! codes, the environment contract (CNI_COMMAND & co.), CNI_ARGS parsing and
//! the network configuration keys that the spec itself defines.
//!
//! It must not know anything about edgelink's own configuration keys, touch
//! the kernel, or do I/O beyond reading the process environment.
#![forbid(unsafe_code)]

pub mod args;
pub mod env;
pub mod error;
pub mod netconf;
pub mod result;
pub mod version;

pub use args::CniArgs;
pub use env::{Command, Env};
pub use error::{codes, CniError};
pub use netconf::{GcAttachment, NetConf};
pub use result::{CniResult, Dns, Interface, IpConfig, Route};
pub use version::CniVersion;
