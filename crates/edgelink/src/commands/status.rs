//! STATUS: can this node serve an ADD for this network right now?

use super::require_version;
use crate::config::{Config, Ipam};
use crate::delegate;
use crate::error::{NetlinkContext, PluginError};
use edgelink_cni_spec::{codes, CniError, CniVersion, Command, Env};
use edgelink_netlink::Handle;

fn unavailable(msg: String) -> PluginError {
    PluginError::Cni(CniError::new(codes::NOT_AVAILABLE, msg))
}

pub fn run(cfg: &Config, env: &Env) -> Result<(), PluginError> {
    require_version(cfg.net.cni_version, CniVersion::V1_1_0, "STATUS")?;
    let dir = &cfg.state_dir;
    if let Err(e) = std::fs::create_dir_all(dir) {
        return Err(unavailable(format!(
            "stateDir {}: cannot create it: {e}",
            dir.display()
        )));
    }
    if nix::unistd::access(dir.as_path(), nix::unistd::AccessFlags::W_OK).is_err() {
        return Err(unavailable(format!(
            "stateDir {}: not writable",
            dir.display()
        )));
    }
    if let Some(u) = cfg.uplink() {
        let mut node = Handle::new().ctx(|| "open netlink in the node namespace".into())?;
        if node
            .link_by_name(u)
            .ctx(|| format!("look up {u}"))?
            .is_none()
        {
            return Err(unavailable(format!(
                "uplink {u:?} does not exist on this node"
            )));
        }
    }
    if let Ipam::Delegated { plugin } = &cfg.ipam {
        delegate::exec(plugin, env, Command::Status, &cfg.net.raw).map_err(|e| {
            let e = e.into_cni();
            unavailable(format!("delegated IPAM is not ready: {}", e.msg))
        })?;
    }
    Ok(())
}
