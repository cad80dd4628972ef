//! Running another plugin (a delegated IPAM) from CNI_PATH, as the spec
//! says: same environment but CNI_COMMAND, the same config on stdin, the
//! Result or error JSON on its stdout.

use crate::error::PluginError;
use edgelink_cni_spec::{codes, CniError, Command, Env};
use serde_json::Value;
use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;

/// Whether `name` is a plain plugin name, safe to join to a CNI_PATH
/// directory: not empty, no `/` (nor NUL), not `.` or `..` and no `..` in
/// it, only ASCII letters, digits, `-`, `_` and `.`, not starting with `.`.
/// libcni's FindInPath refuses a name with a path separator; this is
/// stricter.
pub fn is_plugin_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && !name.contains("..")
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The one check of a delegated IPAM's name (`ipam.type`), made by every
/// command before anything is executed: code 7 naming the field.
pub fn validate_plugin_name(name: &str) -> Result<(), PluginError> {
    if is_plugin_name(name) {
        return Ok(());
    }
    Err(PluginError::Cni(CniError::new(
        codes::INVALID_CONFIG,
        format!(
            "ipam.type: {name:?} is not a plugin name (letters, digits, '-', '_' and '.', \
             not starting with '.', no '/' or '..'): it must name a file in a CNI_PATH directory"
        ),
    )))
}

fn find(plugin: &str, env: &Env) -> Result<PathBuf, PluginError> {
    validate_plugin_name(plugin)?;
    env.path
        .iter()
        .map(|d| d.join(plugin))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            let dirs: Vec<String> = env.path.iter().map(|p| p.display().to_string()).collect();
            PluginError::Cni(CniError::new(
                codes::INVALID_CONFIG,
                format!(
                    "ipam.type: {plugin:?} was not found in CNI_PATH [{}]",
                    dirs.join(", ")
                ),
            ))
        })
}

/// Run `plugin` for `command`; returns its parsed stdout (None when empty).
pub fn exec(
    plugin: &str,
    env: &Env,
    command: Command,
    stdin: &Value,
) -> Result<Option<Value>, PluginError> {
    let path = find(plugin, env)?;
    let mut cmd = std::process::Command::new(&path);
    cmd.env("CNI_COMMAND", command.as_str())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if command == Command::Del && env.netns.is_none() {
        cmd.env("CNI_NETNS", "");
    }
    let mut child = cmd.spawn().map_err(|source| PluginError::Io {
        path: path.clone(),
        source,
    })?;
    let body = serde_json::to_vec(stdin).unwrap_or_default();
    if let Some(mut si) = child.stdin.take() {
        // A plugin that exits without reading gives EPIPE: its exit status tells.
        let _ = si.write_all(&body);
    }
    let out = child.wait_with_output().map_err(|source| PluginError::Io {
        path: path.clone(),
        source,
    })?;
    let parsed: Option<Value> = if out.stdout.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        serde_json::from_slice(&out.stdout).ok()
    };
    if out.status.success() {
        return match parsed {
            Some(v) => Ok(Some(v)),
            None if out.stdout.iter().all(u8::is_ascii_whitespace) => Ok(None),
            None => Err(PluginError::Cni(CniError::new(
                codes::DELEGATE_FAILED,
                format!(
                    "ipam plugin {plugin} ({}) printed something that is not JSON",
                    command.as_str()
                ),
            ))),
        };
    }
    let inner = parsed.as_ref().and_then(CniError::from_json);
    let (code, msg) = match &inner {
        Some(e) => (
            e.code,
            format!("{} {}", e.msg, e.details).trim().to_string(),
        ),
        None => (0, String::from_utf8_lossy(&out.stdout).trim().to_string()),
    };
    Err(PluginError::Cni(
        CniError::new(
            codes::DELEGATE_FAILED,
            format!(
                "ipam plugin {plugin} failed on {}: {msg} (its code {code}, {})",
                command.as_str(),
                out.status
            ),
        )
        .with_details(format!("delegate code {code}")),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_names() {
        for ok in [
            "host-local",
            "dhcp",
            "static",
            "whereabouts",
            "my_ipam.v2",
            "a",
        ] {
            assert!(is_plugin_name(ok), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "a/../b",
            "/tmp/x.sh",
            "bin/sh",
            "x..y",
            ".hidden",
            "a b",
            "a\0b",
            "a\\b",
        ] {
            assert!(!is_plugin_name(bad), "{bad:?}");
            let e = validate_plugin_name(bad).unwrap_err().into_cni();
            assert_eq!(e.code, 7);
            assert!(e.msg.starts_with("ipam.type"), "{e}");
        }
    }
}
