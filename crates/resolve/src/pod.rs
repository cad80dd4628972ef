//! The pod's own resolv.conf: found through a process that lives in the
//! pod's network namespace, read from its mount namespace
//! (`/proc/<pid>/root/etc/resolv.conf`).
//!
//! Read-only: it enters no namespace and changes nothing.

use crate::{ResolvConf, ResolveError};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The pod's own /etc/resolv.conf: finds a process whose /proc/<pid>/ns/net
/// is the netns at `netns` (same st_dev and st_ino), preferring one whose
/// /proc/<pid>/root/etc/resolv.conf exists and has a nameserver; returns
/// (pid, parsed conf), the lowest such pid.
///
/// Ok(None) when no process is in that netns, or none of them has a
/// resolv.conf (the sandbox's pause process usually has none; the
/// caller falls back to the runtime's `dns`). When the only files found
/// are unusable, the error of the first one (naming its path).
pub fn pod_resolv_conf(netns: &Path) -> Result<Option<(u32, ResolvConf)>, ResolveError> {
    pod_resolv_conf_in(Path::new("/proc"), netns)
}

fn pod_resolv_conf_in(
    proc_root: &Path,
    netns: &Path,
) -> Result<Option<(u32, ResolvConf)>, ResolveError> {
    let ns = std::fs::metadata(netns).map_err(|source| ResolveError::Io {
        what: format!("stat {}", netns.display()),
        source,
    })?;
    let want = (ns.dev(), ns.ino());
    let entries = std::fs::read_dir(proc_root).map_err(|source| ResolveError::Io {
        what: format!("read {}", proc_root.display()),
        source,
    })?;
    let mut pids: Vec<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    let mut first_error = None;
    for pid in pids {
        let dir = proc_root.join(pid.to_string());
        // A process that ended meanwhile, or one we may not look at: skip.
        let Ok(st) = std::fs::metadata(dir.join("ns/net")) else {
            continue;
        };
        if (st.dev(), st.ino()) != want {
            continue;
        }
        let path: PathBuf = dir.join("root/etc/resolv.conf");
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        match ResolvConf::parse(&text) {
            Ok(conf) => return Ok(Some((pid, conf))),
            Err(e) => {
                first_error.get_or_insert(ResolveError::ConfFile {
                    path,
                    source: Box::new(e),
                });
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(None),
    }
}
