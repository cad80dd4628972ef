//! The node policy, `<state dir>/node-policy.json`: what a network
//! configuration may name on this node. Root writes it (the DaemonSet's
//! init container, from its `UPLINKS`, `BRIDGES` and `SHARED_NETWORKS`):
//!
//! ```json
//! {"uplinks": ["eth1"], "bridges": ["edge0"], "sharedNetworks": ["plant-floor"]}
//! ```
//!
//! * `uplinks`: the node interfaces a config may name as `uplink` (a
//!   macvlan's parent, a bridge's enslaved port, whose addresses
//!   `moveUplinkAddresses` moves). No other interface, ever.
//! * `bridges`: the existing bridges a config may name as `bridge` (the
//!   pod's veth joins it; `isGateway` puts addresses on it). A bridge that
//!   does not exist yet is created by the plugin and marked as its own
//!   ([`OWN_BRIDGE_ALIAS`]); such a bridge needs no listing.
//! * `sharedNetworks`: network names whose built-in IPAM store pods of
//!   several namespaces may use (an EdgeNetwork's `cniName`, whose NADs the
//!   operator writes into every Device's namespace). Every other store
//!   belongs to the namespace of its first pod (docs/configuration.md).
//!
//! No file: all three lists are empty. A file that is not a regular file
//! owned by root and writable by nobody else, that is
//! a symbolic link, or that does not parse, is refused (code 7 naming it):
//! nothing is done on its say-so.

use crate::error::PluginError;
use edgelink_cni_spec::{codes, CniError};
use nix::fcntl::{open, OFlag};
use nix::sys::stat::Mode;
use serde_json::Value;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The policy's file name inside the state directory.
pub const POLICY_FILE: &str = "node-policy.json";
/// The alias the plugin gives a bridge it creates: such a bridge may be
/// named by any config, listed in `bridges` or not.
pub const OWN_BRIDGE_ALIAS: &str = "edgelink: bridge made by the plugin";
/// A policy file is read up to this size.
const MAX_LEN: u64 = 64 * 1024;

/// The parsed policy (see the module header).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodePolicy {
    /// The file it was read from (or would have been), for messages.
    pub file: std::path::PathBuf,
    pub uplinks: Vec<String>,
    pub bridges: Vec<String>,
    pub shared_networks: Vec<String>,
}

fn refused(path: &Path, why: impl std::fmt::Display) -> PluginError {
    PluginError::Cni(CniError::new(
        codes::INVALID_CONFIG,
        format!("node policy {}: {why}", path.display()),
    ))
}

impl NodePolicy {
    /// Read `<state_dir>/node-policy.json`; a missing file is the empty
    /// policy.
    pub fn load(state_dir: &Path) -> Result<NodePolicy, PluginError> {
        let path = state_dir.join(POLICY_FILE);
        let fd = match open(
            &path,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(nix::Error::ENOENT) => {
                return Ok(NodePolicy {
                    file: path,
                    ..NodePolicy::default()
                })
            }
            Err(nix::Error::ELOOP) => return Err(refused(&path, "is a symbolic link")),
            Err(e) => return Err(refused(&path, format!("cannot be opened: {e}"))),
        };
        let file = std::fs::File::from(fd);
        let meta = file
            .metadata()
            .map_err(|e| refused(&path, format!("cannot be examined: {e}")))?;
        if !meta.file_type().is_file() {
            return Err(refused(&path, "is not a regular file"));
        }
        if meta.uid() != 0 {
            return Err(refused(
                &path,
                format!("is owned by uid {}, not by root", meta.uid()),
            ));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(refused(
                &path,
                format!(
                    "is writable by its group or others (mode {:o})",
                    meta.mode() & 0o7777
                ),
            ));
        }
        let mut text = String::new();
        file.take(MAX_LEN)
            .read_to_string(&mut text)
            .map_err(|e| refused(&path, format!("cannot be read: {e}")))?;
        let mut p = Self::parse(&text).map_err(|why| refused(&path, why))?;
        p.file = path;
        Ok(p)
    }

    /// Parse the file's text; the error says which key is wrong.
    pub fn parse(text: &str) -> Result<NodePolicy, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("is not JSON: {e}"))?;
        let Value::Object(o) = v else {
            return Err("is not a JSON object".into());
        };
        let mut p = NodePolicy::default();
        for (k, v) in &o {
            let list = match k.as_str() {
                "uplinks" => &mut p.uplinks,
                "bridges" => &mut p.bridges,
                "sharedNetworks" => &mut p.shared_networks,
                other => {
                    return Err(format!(
                    "{other:?} is not a key of the node policy (uplinks, bridges, sharedNetworks)"
                ))
                }
            };
            let items = v
                .as_array()
                .ok_or_else(|| format!("{k}: {v} is not an array of names"))?;
            for item in items {
                match item.as_str() {
                    Some(s) if !s.is_empty() => list.push(s.to_string()),
                    _ => return Err(format!("{k}: {item} is not a non-empty name")),
                }
            }
        }
        Ok(p)
    }

    pub fn allows_uplink(&self, name: &str) -> bool {
        self.uplinks.iter().any(|u| u == name)
    }

    /// `uplink` must be listed: else code 7 naming the value and the file.
    pub fn check_uplink(&self, name: &str) -> Result<(), PluginError> {
        if self.allows_uplink(name) {
            return Ok(());
        }
        Err(PluginError::Cni(CniError::new(
            codes::INVALID_CONFIG,
            format!(
                "uplink: {name:?} is not an uplink this node allows (\"uplinks\" of {}): \
                 only the node decides which of its interfaces a network may use",
                self.file.display()
            ),
        )))
    }

    /// An existing bridge must be listed or the plugin's own: else code 7
    /// naming the value and the file.
    pub fn check_bridge(&self, name: &str, alias: Option<&str>) -> Result<(), PluginError> {
        if self.allows_bridge(name, alias) {
            return Ok(());
        }
        Err(PluginError::Cni(CniError::new(
            codes::INVALID_CONFIG,
            format!(
                "bridge: {name:?} exists on the node and is not a bridge this node allows \
                 (\"bridges\" of {}; a bridge the plugin creates itself needs no listing)",
                self.file.display()
            ),
        )))
    }

    /// Whether an existing bridge with this name and alias may be used.
    pub fn allows_bridge(&self, name: &str, alias: Option<&str>) -> bool {
        alias == Some(OWN_BRIDGE_ALIAS) || self.bridges.iter().any(|b| b == name)
    }

    pub fn shares(&self, network: &str) -> bool {
        self.shared_networks.iter().any(|n| n == network)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_lists_and_refuses_the_rest() {
        let p = NodePolicy::parse(
            r#"{"uplinks": ["eth1"], "bridges": ["edge0"], "sharedNetworks": ["plant-floor"]}"#,
        )
        .unwrap();
        assert!(p.allows_uplink("eth1") && !p.allows_uplink("eth0"));
        assert!(p.allows_bridge("edge0", None) && !p.allows_bridge("cni0", None));
        assert!(p.allows_bridge("edge7", Some(OWN_BRIDGE_ALIAS)));
        assert!(p.shares("plant-floor") && !p.shares("other"));
        assert_eq!(NodePolicy::parse("{}").unwrap(), NodePolicy::default());
        for bad in [
            "[]",
            "{",
            r#"{"uplink": ["eth1"]}"#,
            r#"{"uplinks": "eth1"}"#,
            r#"{"uplinks": [""]}"#,
            r#"{"bridges": [1]}"#,
        ] {
            assert!(NodePolicy::parse(bad).is_err(), "{bad}");
        }
    }
}
