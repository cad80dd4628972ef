//! Node-wide locks (files under `<stateDir>/locks/`), for changes that
//! concurrent ADDs of different containers would otherwise race on.

use crate::error::PluginError;
use nix::fcntl::{Flock, FlockArg};
use std::fs::{DirBuilder, File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

/// Held until dropped.
pub struct NodeLock(#[allow(dead_code)] Flock<File>);

/// Take the exclusive lock called `name`, waiting as long as it takes
/// (holders only do a few netlink calls).
pub fn lock(state_dir: &Path, name: &str) -> Result<NodeLock, PluginError> {
    let dir = state_dir.join("locks");
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|source| PluginError::Io {
            path: dir.clone(),
            source,
        })?;
    let path = dir.join(format!("{name}.lock"));
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
        .map_err(|source| PluginError::Io {
            path: path.clone(),
            source,
        })?;
    Flock::lock(f, FlockArg::LockExclusive)
        .map(NodeLock)
        .map_err(|(_, e)| PluginError::Io {
            path,
            source: e.into(),
        })
}
