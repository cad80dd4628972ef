//! Writes under /proc/sys/net for the calling thread's network namespace.

use crate::error::PluginError;
use std::path::PathBuf;

/// Set `key` (dotted, e.g. `net.ipv4.ip_forward`) if it differs.
pub fn ensure(key: &str, value: &str) -> Result<(), PluginError> {
    let path = PathBuf::from("/proc/sys").join(key.replace('.', "/"));
    if std::fs::read_to_string(&path).is_ok_and(|cur| cur.trim() == value) {
        return Ok(());
    }
    std::fs::write(&path, value).map_err(|source| PluginError::Io { path, source })
}
