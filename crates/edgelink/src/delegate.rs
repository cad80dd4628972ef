//! Running another plugin (a delegated IPAM) from CNI_PATH, as the spec
//! says: same environment but CNI_COMMAND, the same config on stdin, the
//! Result or error JSON on its stdout. The running itself is
//! `edgelink-cni-exec`'s (shared with the node daemon's reclaim); this
//! module turns its errors into the plugin's codes.

use crate::error::PluginError;
use edgelink_cni_exec::{Environment, ExecError, Invocation};
use edgelink_cni_spec::{codes, CniError, Command, Env};
use serde_json::Value;

impl From<ExecError> for PluginError {
    fn from(e: ExecError) -> PluginError {
        match e {
            ExecError::BadName { .. } | ExecError::NotFound { .. } => {
                PluginError::Cni(CniError::new(codes::INVALID_CONFIG, e.to_string()))
            }
            ExecError::Io { path, source } => PluginError::Io { path, source },
            ExecError::Failed { code, .. } => PluginError::Cni(
                CniError::new(codes::DELEGATE_FAILED, e.to_string())
                    .with_details(format!("delegate code {code}")),
            ),
            ExecError::NotJson { .. } | ExecError::TimedOut { .. } => {
                PluginError::Cni(CniError::new(codes::DELEGATE_FAILED, e.to_string()))
            }
        }
    }
}

/// The one check of a delegated IPAM's name (`ipam.type`), made by every
/// command before anything is executed: code 7 naming the field.
pub fn validate_plugin_name(name: &str) -> Result<(), PluginError> {
    Ok(edgelink_cni_exec::validate_plugin_name(name)?)
}

/// Run `plugin` for `command`; returns its parsed stdout (None when empty).
pub fn exec(
    plugin: &str,
    env: &Env,
    command: Command,
    stdin: &Value,
) -> Result<Option<Value>, PluginError> {
    let mut vars = Vec::new();
    if command == Command::Del && env.netns.is_none() {
        vars.push(("CNI_NETNS", String::new()));
    }
    let inv = Invocation {
        plugin,
        dirs: &env.path,
        command,
        env: Environment::Inherited(vars),
        // The runtime that runs this plugin has its own deadline.
        timeout: None,
    };
    Ok(edgelink_cni_exec::exec(&inv, stdin)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_name_is_code_7_naming_the_field() {
        for bad in ["", "..", "../x", "/tmp/x.sh", "bin/sh", ".hidden"] {
            let e = validate_plugin_name(bad).unwrap_err().into_cni();
            assert_eq!(e.code, 7);
            assert!(e.msg.starts_with("ipam.type"), "{e}");
        }
        assert!(validate_plugin_name("host-local").is_ok());
    }
}
