//! The pod's own resolv.conf: found through a process that lives in the
//! pod's network namespace, read from its mount namespace
//! (`/proc/<pid>/root/etc/resolv.conf`).
//!
//! Read-only: it enters no namespace and changes nothing. The file is the
//! pod's, so it is read as untrusted: resolved inside the pod's root (its
//! symlinks cannot lead to the node's files), only a regular file, only
//! its first 64 KiB, never blocking (a FIFO is refused).

use crate::{ResolvConf, ResolveError};
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The most of a resolv.conf read.
const MAX_CONF_BYTES: u64 = 64 * 1024;

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
        let text = match read_in_root(&dir.join("root"), "etc/resolv.conf") {
            Ok(Some(text)) => text,
            // No file (a pause process), or a process that ended.
            Ok(None) => continue,
            Err(e) => {
                first_error.get_or_insert(ResolveError::Io {
                    what: format!("read {}", path.display()),
                    source: e,
                });
                continue;
            }
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

/// The text of `rel` resolved with `root` as the root directory (absolute
/// symlinks and `..` stay inside it, magic links are refused), if it is a
/// regular file; None when it does not exist (or the process is gone).
fn read_in_root(root: &Path, rel: &str) -> io::Result<Option<String>> {
    let dir = match std::fs::File::open(root) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK | OFlag::O_NOCTTY)
        .mode(Mode::empty())
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let fd = match openat2(&dir, rel, how) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) | Err(nix::errno::Errno::ESRCH) => return Ok(None),
        Err(e) => return Err(io::Error::from(e)),
    };
    let file = std::fs::File::from(fd);
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    let mut text = String::new();
    file.take(MAX_CONF_BYTES).read_to_string(&mut text)?;
    Ok(Some(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A fake /proc with one "process" per (pid, setup) in this test's own
    /// netns, its root a directory `setup` fills.
    type Setup<'a> = &'a dyn Fn(&Path);

    fn fake_proc(procs: &[(u32, Setup)]) -> tempfile::TempDir {
        let tmp = tempfile::tempdir().expect("tempdir");
        for (pid, setup) in procs {
            let dir = tmp.path().join(pid.to_string());
            std::fs::create_dir_all(dir.join("ns")).expect("mkdir");
            symlink("/proc/self/ns/net", dir.join("ns/net")).expect("ns link");
            let root = dir.join("root");
            std::fs::create_dir_all(root.join("etc")).expect("mkdir");
            setup(&root);
        }
        // Another netns's process is never looked at.
        let other = tmp.path().join("7");
        std::fs::create_dir_all(other.join("ns")).expect("mkdir");
        std::fs::write(other.join("ns/net"), "not a netns").expect("write");
        tmp
    }

    fn here() -> &'static Path {
        Path::new("/proc/self/ns/net")
    }

    #[test]
    fn prefers_a_process_with_a_resolv_conf() {
        let none = |_: &Path| {};
        let good = |root: &Path| {
            std::fs::write(root.join("etc/resolv.conf"), "nameserver 192.0.2.53\n").expect("write");
        };
        let proc_root = fake_proc(&[(10, &none), (20, &good)]);
        let (pid, conf) = pod_resolv_conf_in(proc_root.path(), here())
            .expect("scan")
            .expect("found");
        assert_eq!(pid, 20);
        assert_eq!(conf.nameservers, vec!["192.0.2.53:53".parse().unwrap()]);
        let empty = fake_proc(&[(10, &none)]);
        assert!(pod_resolv_conf_in(empty.path(), here())
            .expect("scan")
            .is_none());
    }

    #[test]
    fn absolute_symlinks_resolve_inside_the_pod_root() {
        let linked = |root: &Path| {
            std::fs::create_dir_all(root.join("run/resolver")).expect("mkdir");
            std::fs::write(
                root.join("run/resolver/resolv.conf"),
                "nameserver 192.0.2.54\n",
            )
            .expect("write");
            symlink("/run/resolver/resolv.conf", root.join("etc/resolv.conf")).expect("link");
        };
        let proc_root = fake_proc(&[(30, &linked)]);
        let (_, conf) = pod_resolv_conf_in(proc_root.path(), here())
            .expect("scan")
            .expect("found");
        assert_eq!(conf.nameservers, vec!["192.0.2.54:53".parse().unwrap()]);
        // A link that climbs out stays in the root: not found there.
        let escaping = |root: &Path| {
            symlink(
                "../../../../../../etc/hostname",
                root.join("etc/resolv.conf"),
            )
            .expect("link");
        };
        let proc_root = fake_proc(&[(31, &escaping)]);
        assert!(pod_resolv_conf_in(proc_root.path(), here())
            .expect("scan")
            .is_none());
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let fifo = |root: &Path| {
            nix::unistd::mkfifo(
                &root.join("etc/resolv.conf"),
                Mode::from_bits_truncate(0o600),
            )
            .expect("mkfifo");
        };
        let proc_root = fake_proc(&[(40, &fifo)]);
        let e = pod_resolv_conf_in(proc_root.path(), here()).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("40/root/etc/resolv.conf") && text.contains("not a regular file"),
            "{text}"
        );
    }
}
