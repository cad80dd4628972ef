//! Running another CNI plugin (a delegated IPAM: host-local, static,
//! whereabouts, dhcp) the way the spec's execution protocol says: found by
//! its plain name in the CNI_PATH directories, the network configuration
//! on stdin, `CNI_COMMAND` and the other variables in its environment, the
//! Result or the error JSON on its stdout.
//!
//! Shared by the plugin (ADD, its rollback, CHECK, STATUS, GC, DEL) and the
//! node daemon (the DEL of an attachment it reclaims), so both check a name
//! and read an answer the same way. This crate must not decide *when* a
//! delegate runs, nor know edgelink's own configuration keys.
#![forbid(unsafe_code)]

use edgelink_cni_spec::{CniError, Command};
use serde_json::Value;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Why a delegate did not answer with success.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// `ipam.type` is not a plain plugin name: nothing was executed.
    #[error(
        "ipam.type: {plugin:?} is not a plugin name (letters, digits, '-', '_' and '.', \
         not starting with '.', no '/' or '..'): it must name a file in a CNI_PATH directory"
    )]
    BadName { plugin: String },
    /// No directory holds a file of that name.
    #[error("ipam.type: {plugin:?} was not found in CNI_PATH [{dirs}]")]
    NotFound { plugin: String, dirs: String },
    /// The file could not be started or waited for.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// It exited 0 but printed something that is not JSON.
    #[error("ipam plugin {plugin} ({command}) printed something that is not JSON")]
    NotJson {
        plugin: String,
        command: &'static str,
    },
    /// It failed: its own code and message (code 0 when it printed no
    /// error JSON).
    #[error("ipam plugin {plugin} failed on {command}: {msg} (its code {code}, {status})")]
    Failed {
        plugin: String,
        command: &'static str,
        code: u32,
        msg: String,
        status: ExitStatus,
    },
    /// It did not finish within the time it was given, and was killed.
    #[error("ipam plugin {plugin} ({command}) did not finish within {timeout:?}: killed")]
    TimedOut {
        plugin: String,
        command: &'static str,
        timeout: Duration,
    },
}

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

/// The one check of a delegate's name, made before anything is executed.
pub fn validate_plugin_name(name: &str) -> Result<(), ExecError> {
    if is_plugin_name(name) {
        Ok(())
    } else {
        Err(ExecError::BadName {
            plugin: name.to_string(),
        })
    }
}

/// The first file named `plugin` in `dirs`.
pub fn find(plugin: &str, dirs: &[PathBuf]) -> Result<PathBuf, ExecError> {
    validate_plugin_name(plugin)?;
    dirs.iter()
        .map(|d| d.join(plugin))
        .find(|p| p.is_file())
        .ok_or_else(|| ExecError::NotFound {
            plugin: plugin.to_string(),
            dirs: dirs
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// The environment a delegate runs with.
#[derive(Debug, Clone)]
pub enum Environment {
    /// This process's environment (a plugin's: the runtime set CNI_*),
    /// with `CNI_COMMAND` and these variables set over it.
    Inherited(Vec<(&'static str, String)>),
    /// Only `CNI_COMMAND`, these variables and a standard `PATH` (the
    /// daemon's: nothing of its own environment leaks into the delegate).
    Only(Vec<(&'static str, String)>),
}

/// How one delegate runs.
#[derive(Debug, Clone)]
pub struct Invocation<'a> {
    pub plugin: &'a str,
    /// The directories to find it in (CNI_PATH).
    pub dirs: &'a [PathBuf],
    pub command: Command,
    pub env: Environment,
    /// Killed after this long (None: wait as long as it takes, for a
    /// plugin run by a runtime that has its own deadline).
    pub timeout: Option<Duration>,
}

/// Run the delegate with `stdin` as its configuration; its parsed stdout
/// (None when it printed nothing).
pub fn exec(inv: &Invocation<'_>, stdin: &Value) -> Result<Option<Value>, ExecError> {
    let path = find(inv.plugin, inv.dirs)?;
    let command = inv.command.as_str();
    let mut cmd = std::process::Command::new(&path);
    match &inv.env {
        Environment::Inherited(vars) => {
            cmd.envs(vars.iter().map(|(k, v)| (*k, v.as_str())));
        }
        Environment::Only(vars) => {
            cmd.env_clear()
                .env(
                    "PATH",
                    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                )
                .envs(vars.iter().map(|(k, v)| (*k, v.as_str())));
        }
    }
    cmd.env("CNI_COMMAND", command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let io = |source| ExecError::Io {
        path: path.clone(),
        source,
    };
    let mut child = cmd.spawn().map_err(io)?;
    let body = serde_json::to_vec(stdin).unwrap_or_default();
    if let Some(mut si) = child.stdin.take() {
        // A plugin that exits without reading gives EPIPE: its exit status
        // tells. A configuration is far below a pipe's 64 KiB, so this does
        // not block on a plugin that never reads.
        let _ = si.write_all(&body);
    }
    let (status, stdout) = match inv.timeout {
        None => {
            let out = child.wait_with_output().map_err(io)?;
            (out.status, out.stdout)
        }
        Some(timeout) => wait_for(&mut child, timeout, &path).map_err(|e| match e {
            Waited::Io(source) => io(source),
            Waited::TimedOut => ExecError::TimedOut {
                plugin: inv.plugin.to_string(),
                command,
                timeout,
            },
        })?,
    };
    answer(inv.plugin, command, status, &stdout)
}

enum Waited {
    Io(std::io::Error),
    TimedOut,
}

/// Wait for `child` at most `timeout`, reading its stdout on a thread (a
/// chatty plugin must not block on a full pipe); kill it after that.
fn wait_for(
    child: &mut std::process::Child,
    timeout: Duration,
    path: &Path,
) -> Result<(ExitStatus, Vec<u8>), Waited> {
    let mut stdout = child.stdout.take();
    let reader = std::thread::Builder::new()
        .name(format!("cni-exec {}", path.display()))
        .spawn(move || {
            let mut buf = Vec::new();
            if let Some(s) = stdout.as_mut() {
                // At most 1 MiB: an answer is a few hundred bytes.
                let _ = s.take(1 << 20).read_to_end(&mut buf);
            }
            buf
        })
        .map_err(Waited::Io)?;
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(Waited::Io)? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            // The reader ends with the pipe (unless a grandchild holds it:
            // then it is left to finish on its own).
            return Err(Waited::TimedOut);
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let out = reader.join().unwrap_or_default();
    Ok((status, out))
}

/// Read a delegate's answer: success with its JSON (or nothing), or its
/// error JSON quoted.
fn answer(
    plugin: &str,
    command: &'static str,
    status: ExitStatus,
    stdout: &[u8],
) -> Result<Option<Value>, ExecError> {
    let blank = stdout.iter().all(u8::is_ascii_whitespace);
    let parsed: Option<Value> = if blank {
        None
    } else {
        serde_json::from_slice(stdout).ok()
    };
    if status.success() {
        return match parsed {
            Some(v) => Ok(Some(v)),
            None if blank => Ok(None),
            None => Err(ExecError::NotJson {
                plugin: plugin.to_string(),
                command,
            }),
        };
    }
    let (code, msg) = match parsed.as_ref().and_then(CniError::from_json) {
        Some(e) => (
            e.code,
            format!("{} {}", e.msg, e.details).trim().to_string(),
        ),
        None => (0, String::from_utf8_lossy(stdout).trim().to_string()),
    };
    Err(ExecError::Failed {
        plugin: plugin.to_string(),
        command,
        code,
        msg,
        status,
    })
}

#[cfg(test)]
mod tests;
