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

/// Set an interface's `net.ipv6.conf.<ifname>.<key>` if it differs; a
/// no-op where the kernel has no IPv6 (no such directory).
pub fn ensure_ipv6_conf(ifname: &str, key: &str, value: &str) -> Result<(), PluginError> {
    let dir = PathBuf::from("/proc/sys/net/ipv6/conf").join(ifname);
    if !dir.exists() {
        return Ok(());
    }
    ensure_path(dir.join(key), value)
}

/// Turn routing off in the calling thread's namespace (a pod's): IPv4
/// forwarding everywhere (`ip_forward`, which Linux copies to every
/// interface) and of `ifname` in particular, and IPv6 forwarding where the
/// namespace has IPv6. A new netns copies the node's IPv4 forwarding, and a
/// Kubernetes node forwards: left alone, the pod would route between the
/// segment and the cluster in both directions. The kernel path turns it on
/// again once its drop-by-default table is in (crates/kernel-path).
pub fn ensure_no_forwarding(ifname: &str) -> Result<(), PluginError> {
    ensure("net.ipv4.ip_forward", "0")?;
    ensure_ipv4_conf(ifname, "forwarding", "0")?;
    if std::path::Path::new("/proc/sys/net/ipv6/conf/all/forwarding").exists() {
        ensure("net.ipv6.conf.all.forwarding", "0")?;
    }
    Ok(())
}

fn ensure_path(path: PathBuf, value: &str) -> Result<(), PluginError> {
    if std::fs::read_to_string(&path).is_ok_and(|cur| cur.trim() == value) {
        return Ok(());
    }
    std::fs::write(&path, value).map_err(|source| PluginError::Io { path, source })
}
