//! One module per CNI command, each taking the validated inputs.

pub mod add;
pub mod check;
pub mod del;
pub mod gc;
pub mod status;
pub mod version;

use crate::error::PluginError;
use edgelink_cni_spec::{codes, CniError, CniVersion};

/// CHECK needs 0.4.0+, STATUS and GC need 1.1.0+.
pub fn require_version(
    have: CniVersion,
    need: CniVersion,
    command: &str,
) -> Result<(), PluginError> {
    if have < need {
        return Err(PluginError::Cni(CniError::new(
            codes::INCOMPATIBLE_VERSION,
            format!("cniVersion {have} does not support {command} (it needs {need} or later)"),
        )));
    }
    Ok(())
}
