//! What the node decides, never a network configuration: the plugin runs
//! as root, and a NetworkAttachmentDefinition is written by whoever may
//! create one in a namespace (docs/security.md, "What a NAD author
//! controls").
//!
//! * The state directory (IPAM store, attachment records, locks, the
//!   daemon's socket): `EDGELINK_STATE_DIR` in the plugin's environment
//!   (root's, as `EDGELINK_LOG_DIR` is), else [`DEFAULT_STATE_DIR`]. A
//!   config's `stateDir` is accepted only when it names that same directory.
//! * The node policy, `<state dir>/node-policy.json`, written by root (the
//!   DaemonSet's init container): which existing interfaces a config may
//!   name as `uplink` or `bridge`, and which network names pods of several
//!   namespaces may share (module [`policy`]).

use crate::error::PluginError;
use edgelink_cni_spec::{codes, CniError};
use std::path::{Path, PathBuf};

pub mod policy;

pub use policy::{NodePolicy, POLICY_FILE};

/// The state directory when the plugin's environment names none.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/edgelink";
/// The environment variable that moves the state directory. Read from the
/// plugin's process environment (the runtime's, set by root on the node),
/// never from the network configuration.
pub const STATE_DIR_ENV: &str = "EDGELINK_STATE_DIR";

/// This node's state directory: `$EDGELINK_STATE_DIR` when it is an
/// absolute path, else [`DEFAULT_STATE_DIR`].
pub fn state_dir() -> PathBuf {
    std::env::var_os(STATE_DIR_ENV)
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR))
}

/// Whether a config's `stateDir` names the node's state directory `node`
/// (the same components: a trailing or doubled `/` does not matter, `..`
/// and symbolic links are not resolved).
pub fn same_dir(value: &str, node: &Path) -> bool {
    value.starts_with('/') && Path::new(value) == node
}

/// A config's `stateDir`, checked against the node's state directory:
/// code 7 naming both unless it is the same directory.
pub fn check_state_dir(value: &str, node: &Path) -> Result<(), PluginError> {
    if same_dir(value, node) {
        return Ok(());
    }
    Err(PluginError::Cni(CniError::new(
        codes::INVALID_CONFIG,
        format!(
            "stateDir: {value:?} is not this node's state directory {:?}: the node decides \
             where the plugin keeps its state ({STATE_DIR_ENV} in the plugin's environment, \
             default {DEFAULT_STATE_DIR}); leave stateDir out of the config",
            node.display().to_string()
        ),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_node_directory_is_accepted() {
        let node = Path::new("/var/lib/edgelink");
        for ok in [
            "/var/lib/edgelink",
            "/var/lib/edgelink/",
            "/var//lib/edgelink",
        ] {
            assert!(check_state_dir(ok, node).is_ok(), "{ok}");
        }
        for bad in [
            "/tmp/x",
            "var/lib/edgelink",
            "/var/lib/edgelink/../edgelink",
            "/var/lib/edgelink/sub",
            "/proc/sys",
            "",
        ] {
            let e = check_state_dir(bad, node).unwrap_err().into_cni();
            assert_eq!(e.code, 7, "{bad}");
            assert!(
                e.msg.contains("stateDir") && e.msg.contains("/var/lib/edgelink"),
                "{e}"
            );
        }
    }
}
