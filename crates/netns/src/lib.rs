//! Network namespaces: open one by path, check it really is one, and run
//! code inside it on the current thread with the previous namespace restored
//! afterwards (also on early return and panic).
//!
//! setns(2) switches only the calling thread. A thread that other code
//! shares (a tokio worker) must never be left in another namespace: the
//! daemon enters them on threads of its own ([`Netns::run_on_thread`]),
//! and a worker only for one synchronous call that cannot yield
//! ([`Netns::run_here`]: an upstream socket made without a hop to
//! another thread).

use nix::sched::{setns, CloneFlags};
use nix::sys::stat::fstat;
use nix::sys::statfs::fstatfs;
use std::cell::OnceCell;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

/// Magic number of nsfs, the filesystem behind /proc/*/ns/* and bind mounts of them.
const NSFS_MAGIC: i64 = 0x6e73_6673;

// NS_GET_NSTYPE = _IO(0xb7, 0x3): which kind of namespace a nsfs fd is.
nix::ioctl_none!(ns_get_nstype, 0xb7, 0x3);

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("network namespace {path} does not exist")]
    NotFound { path: PathBuf },
    #[error("{path} is not a network namespace ({reason})")]
    NotNetns { path: PathBuf, reason: String },
    #[error("cannot open network namespace {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("cannot switch this thread into network namespace {path}: {source}")]
    Enter { path: PathBuf, source: nix::Error },
    #[error("cannot switch this thread back to its network namespace: {source}")]
    Restore { source: nix::Error },
    #[error("the thread running in network namespace {path} panicked")]
    ThreadPanicked { path: PathBuf },
    #[error("cannot start a thread for network namespace {path}: {source}")]
    Spawn { path: PathBuf, source: io::Error },
}

/// An open handle on a network namespace.
#[derive(Debug)]
pub struct Netns {
    fd: OwnedFd,
    path: PathBuf,
}

impl Netns {
    /// Open `path` and check that it is a network namespace.
    pub fn open(path: impl AsRef<Path>) -> Result<Netns, NetnsError> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => NetnsError::NotFound { path: path.clone() },
            _ => NetnsError::Open {
                path: path.clone(),
                source: e,
            },
        })?;
        let fd: OwnedFd = file.into();
        let not_netns = |reason: String| NetnsError::NotNetns {
            path: path.clone(),
            reason,
        };
        let fs = fstatfs(&fd).map_err(|e| not_netns(format!("statfs: {e}")))?;
        if fs.filesystem_type().0 as i64 != NSFS_MAGIC {
            return Err(not_netns("not a namespace file".into()));
        }
        // SAFETY: NS_GET_NSTYPE takes no argument and only reads the fd,
        // which is open and owned by us for the duration of the call.
        let kind = unsafe { ns_get_nstype(fd.as_raw_fd()) }
            .map_err(|e| not_netns(format!("NS_GET_NSTYPE: {e}")))?;
        if kind != libc::CLONE_NEWNET {
            return Err(not_netns(format!(
                "it is a namespace of another kind (0x{kind:x})"
            )));
        }
        Ok(Netns { fd, path })
    }

    /// The calling thread's current network namespace.
    pub fn current() -> Result<Netns, NetnsError> {
        Netns::open("/proc/thread-self/ns/net")
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The (device, inode) pair that identifies the namespace.
    pub fn id(&self) -> Result<(u64, u64), NetnsError> {
        let st = fstat(&self.fd).map_err(|e| NetnsError::Open {
            path: self.path.clone(),
            source: io::Error::from(e),
        })?;
        Ok((st.st_dev, st.st_ino))
    }

    /// Switch the calling thread into this namespace until the guard drops.
    pub fn enter(&self) -> Result<NetnsGuard, NetnsError> {
        let previous = Netns::current()?;
        setns(&self.fd, CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Enter {
            path: self.path.clone(),
            source,
        })?;
        Ok(NetnsGuard {
            previous: Some(previous),
        })
    }

    /// Run `f` on the calling thread inside this namespace, then switch back.
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> Result<T, NetnsError> {
        let guard = self.enter()?;
        let out = f();
        guard.exit()?;
        Ok(out)
    }

    /// Run `f` on the calling thread inside this namespace and switch back
    /// before returning: two setns(2) calls, with the thread's own
    /// namespace opened once per thread (the first call's, which must be
    /// made from the thread's home namespace). For short synchronous work
    /// on a thread that other code shares, such as making a socket on a
    /// tokio worker: `f` must not yield or block, since nothing else may
    /// run on the thread meanwhile. A failure to switch back (or a panic
    /// in `f` followed by one) aborts the process: running on in the pod's
    /// namespace would make the wrong sockets.
    pub fn run_here<T>(&self, f: impl FnOnce() -> T) -> Result<T, NetnsError> {
        thread_local! {
            static HOME: OnceCell<OwnedFd> = const { OnceCell::new() };
        }
        HOME.with(|home| {
            // Opened on the first call that finds it, and kept: a failure
            // (out of descriptors, say) is not, so the next call tries again.
            let home = match home.get() {
                Some(fd) => fd,
                None => {
                    let path = "/proc/thread-self/ns/net";
                    let fd = File::open(path).map_err(|source| NetnsError::Open {
                        path: PathBuf::from(path),
                        source,
                    })?;
                    home.get_or_init(|| fd.into())
                }
            };
            setns(&self.fd, CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Enter {
                path: self.path.clone(),
                source,
            })?;
            let back = Back(home.as_fd());
            let out = f();
            drop(back);
            Ok(out)
        })
    }

    /// A second handle on the same namespace.
    pub fn try_clone(&self) -> Result<Netns, NetnsError> {
        Ok(Netns {
            fd: self.fd.try_clone().map_err(|source| NetnsError::Open {
                path: self.path.clone(),
                source,
            })?,
            path: self.path.clone(),
        })
    }

    /// Run `f` on a new short-lived thread inside this namespace. The
    /// caller's thread never changes namespace; use this from async code
    /// (via spawn_blocking) or anywhere threads are shared.
    pub fn run_on_thread<T, F>(&self, f: F) -> Result<T, NetnsError>
    where
        F: FnOnce() -> T + Send,
        T: Send,
    {
        std::thread::scope(|s| {
            let handle = std::thread::Builder::new()
                .name("netns".into())
                .spawn_scoped(s, || {
                    setns(&self.fd, CloneFlags::CLONE_NEWNET).map_err(|source| {
                        NetnsError::Enter {
                            path: self.path.clone(),
                            source,
                        }
                    })?;
                    // The thread ends here: its namespace never leaks.
                    Ok(f())
                })
                .map_err(|source| NetnsError::Spawn {
                    path: self.path.clone(),
                    source,
                })?;
            handle.join().map_err(|_| NetnsError::ThreadPanicked {
                path: self.path.clone(),
            })?
        })
    }
}

impl AsFd for Netns {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Switches the thread back to its home namespace when dropped, also when
/// [`Netns::run_here`]'s work panics.
struct Back<'a>(BorrowedFd<'a>);

impl Drop for Back<'_> {
    fn drop(&mut self) {
        if let Err(e) = setns(self.0, CloneFlags::CLONE_NEWNET) {
            eprintln!("fatal: cannot switch a shared thread back to its network namespace: {e}");
            std::process::abort();
        }
    }
}

/// Restores the thread's previous namespace when dropped.
#[must_use = "the thread switches back when the guard is dropped"]
pub struct NetnsGuard {
    previous: Option<Netns>,
}

impl NetnsGuard {
    /// Switch back now and report a failure (drop can only log it).
    pub fn exit(mut self) -> Result<(), NetnsError> {
        match self.previous.take() {
            Some(prev) => setns(&prev.fd, CloneFlags::CLONE_NEWNET)
                .map_err(|source| NetnsError::Restore { source }),
            None => Ok(()),
        }
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        if let Some(prev) = self.previous.take() {
            if let Err(e) = setns(&prev.fd, CloneFlags::CLONE_NEWNET) {
                // Running on in the wrong namespace would configure the wrong
                // network: stop the process instead.
                eprintln!("fatal: cannot restore the network namespace: {e}");
                std::process::abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    struct TempNs(String);
    impl TempNs {
        fn new(tag: &str) -> TempNs {
            let name = format!("elk-netns-{}-{tag}", std::process::id());
            let st = Command::new("ip")
                .args(["netns", "add", &name])
                .status()
                .unwrap();
            assert!(st.success());
            TempNs(name)
        }
        fn path(&self) -> PathBuf {
            PathBuf::from(format!("/var/run/netns/{}", self.0))
        }
    }
    impl Drop for TempNs {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }

    #[test]
    fn enters_and_restores_even_on_early_exit() {
        let ns = TempNs::new("a");
        let target = Netns::open(ns.path()).unwrap();
        let before = Netns::current().unwrap().id().unwrap();
        {
            let _g = target.enter().unwrap();
            assert_eq!(
                Netns::current().unwrap().id().unwrap(),
                target.id().unwrap()
            );
        }
        assert_eq!(Netns::current().unwrap().id().unwrap(), before);
        let inside = target
            .run(|| Netns::current().unwrap().id().unwrap())
            .unwrap();
        assert_eq!(inside, target.id().unwrap());
        let on_thread = target
            .run_on_thread(|| Netns::current().unwrap().id().unwrap())
            .unwrap();
        assert_eq!(on_thread, target.id().unwrap());
        assert_eq!(Netns::current().unwrap().id().unwrap(), before);
    }

    #[test]
    fn run_here_switches_back_after_each_call_and_after_a_panic() {
        let ns = TempNs::new("h");
        let target = Netns::open(ns.path()).unwrap();
        std::thread::spawn(move || {
            let home = Netns::current().unwrap().id().unwrap();
            for _ in 0..3 {
                let inside = target
                    .run_here(|| Netns::current().unwrap().id().unwrap())
                    .unwrap();
                assert_eq!(inside, target.id().unwrap());
                assert_eq!(Netns::current().unwrap().id().unwrap(), home);
            }
            let clone = target.try_clone().unwrap();
            let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                clone.run_here(|| panic!("inside")).unwrap()
            }));
            assert!(panicked.is_err());
            assert_eq!(Netns::current().unwrap().id().unwrap(), home);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn refuses_what_is_not_a_netns() {
        assert!(matches!(
            Netns::open("/var/run/netns/elk-does-not-exist"),
            Err(NetnsError::NotFound { .. })
        ));
        assert!(matches!(
            Netns::open("/etc/hostname"),
            Err(NetnsError::NotNetns { .. })
        ));
        assert!(matches!(
            Netns::open("/proc/self/ns/uts"),
            Err(NetnsError::NotNetns { .. })
        ));
    }
}
