//! Releasing a delegated IPAM's reservation (host-local, whereabouts, ...)
//! when the daemon reclaims an attachment whose pod went without a DEL: the
//! delegate's own DEL, run as the plugin's DEL would have run it, with the
//! network configuration the plugin recorded at ADD.

use edgelink_attachment::Record;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a delegate's DEL may take.
pub const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum DelegateError {
    #[error("ipam.type {0:?} is not a plugin name (a path, `.` or `..`)")]
    BadName(String),
    #[error("ipam plugin {plugin:?} was not found in --cni-path [{dirs}]")]
    NotFound { plugin: String, dirs: String },
    #[error("ipam plugin {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("ipam plugin {path} DEL did not finish within {TIMEOUT:?}: killed")]
    TimedOut { path: PathBuf },
    #[error("ipam plugin {path} DEL failed ({status}): {output}")]
    Failed {
        path: PathBuf,
        status: std::process::ExitStatus,
        output: String,
    },
}

/// The delegated IPAM plugin of a record: `ipam.type` of the recorded
/// configuration, unless it is empty or edgelink's own (the same rule as
/// the plugin's DEL).
pub fn plugin_of(rec: &Record) -> Option<&str> {
    rec.cni_config
        .as_ref()?
        .get("ipam")?
        .get("type")?
        .as_str()
        .filter(|t| !t.is_empty() && *t != "edgelink")
}

/// A plain plugin name, as libcni's FindInPath wants it: never a path.
fn valid_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['/', '\0']) && name != "." && name != ".."
}

fn find(plugin: &str, dirs: &[PathBuf]) -> Result<PathBuf, DelegateError> {
    if !valid_name(plugin) {
        return Err(DelegateError::BadName(plugin.to_string()));
    }
    dirs.iter()
        .map(|d| d.join(plugin))
        .find(|p| p.is_file())
        .ok_or_else(|| DelegateError::NotFound {
            plugin: plugin.to_string(),
            dirs: join(dirs),
        })
}

fn join(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}

/// CNI_ARGS as Multus passes them, from what the record kept.
fn cni_args(rec: &Record) -> String {
    let mut args = vec!["IgnoreUnknown=1".to_string()];
    for (k, v) in [
        ("K8S_POD_NAMESPACE", &rec.pod_namespace),
        ("K8S_POD_NAME", &rec.pod_name),
        ("K8S_POD_UID", &rec.pod_uid),
    ] {
        if let Some(v) = v {
            args.push(format!("{k}={v}"));
        }
    }
    args.join(";")
}

/// Run the delegate's DEL for `rec` (blocking, at most [`TIMEOUT`]).
/// `Ok(None)`: the record has no delegated IPAM; `Ok(Some(plugin))`: its
/// DEL succeeded.
pub fn release(rec: &Record, dirs: &[PathBuf]) -> Result<Option<String>, DelegateError> {
    let Some(plugin) = plugin_of(rec) else {
        return Ok(None);
    };
    let path = find(plugin, dirs)?;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DelegateError::Io { path, source }
    };
    let mut child = Command::new(&path)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", "DEL")
        .env("CNI_CONTAINERID", &rec.container_id)
        // The pod's netns is gone: that is why the daemon reclaims.
        .env("CNI_NETNS", "")
        .env("CNI_IFNAME", &rec.ifname)
        .env("CNI_ARGS", cni_args(rec))
        .env("CNI_PATH", join(dirs))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io(&path))?;
    let body = serde_json::to_vec(rec.cni_config.as_ref().unwrap_or(&serde_json::Value::Null))
        .unwrap_or_default();
    if let Some(mut stdin) = child.stdin.take() {
        // A plugin that exits without reading gives EPIPE: its status tells.
        let _ = stdin.write_all(&body);
    }
    // DEL prints nothing, or one error object: far below a pipe's capacity,
    // so waiting before reading cannot block the plugin.
    let start = Instant::now();
    loop {
        match child.try_wait().map_err(io(&path))? {
            Some(_) => break,
            None if start.elapsed() >= TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(DelegateError::TimedOut { path });
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    let out = child.wait_with_output().map_err(io(&path))?;
    if out.status.success() {
        return Ok(Some(plugin.to_string()));
    }
    let mut output = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let err = String::from_utf8_lossy(&out.stderr);
    if !err.trim().is_empty() {
        output = format!("{output} {}", err.trim()).trim().to_string();
    }
    output.truncate(500);
    Err(DelegateError::Failed {
        path,
        status: out.status,
        output,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_plugin_names_are_looked_up() {
        for bad in ["", ".", "..", "../x", "/tmp/x.sh", "a/b", "x\0y"] {
            assert!(
                matches!(
                    find(bad, &[PathBuf::from("/usr/lib/cni")]),
                    Err(DelegateError::BadName(_))
                ),
                "{bad:?}"
            );
        }
        assert!(valid_name("host-local"));
    }

    #[test]
    fn a_missing_plugin_names_the_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let e = find("no-such-ipam", &[dir.path().to_path_buf()]).unwrap_err();
        assert!(
            e.to_string().contains(&dir.path().display().to_string()),
            "{e}"
        );
    }
}
