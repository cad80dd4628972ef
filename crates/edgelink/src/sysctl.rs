//! Writes under /proc/sys/net for the calling thread's network namespace.

use crate::error::PluginError;
use std::path::PathBuf;

/// Set `key` (dotted, e.g. `net.ipv4.ip_forward`) if it differs.
pub fn ensure(key: &str, value: &str) -> Result<(), PluginError> {
    ensure_path(
        PathBuf::from("/proc/sys").join(key.replace('.', "/")),
        value,
    )
}

/// Set an interface's `net.ipv4.conf.<ifname>.<key>` if it differs (the
/// interface name may hold dots, so no dotted key).
pub fn ensure_ipv4_conf(ifname: &str, key: &str, value: &str) -> Result<(), PluginError> {
    let path = PathBuf::from("/proc/sys/net/ipv4/conf")
        .join(ifname)
        .join(key);
    ensure_path(path, value)
}

fn ensure_path(path: PathBuf, value: &str) -> Result<(), PluginError> {
    if std::fs::read_to_string(&path).is_ok_and(|cur| cur.trim() == value) {
        return Ok(());
    }
    std::fs::write(&path, value).map_err(|source| PluginError::Io { path, source })
}
