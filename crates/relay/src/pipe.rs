//! Pipes for splice(2), kept in a pool so that a connection pays for
//! pipe2(2) and F_SETPIPE_SZ only when no idle pipe is left.
//!
//! A [`Pipe`] knows how many bytes it holds: it goes back to its pool only
//! when it is empty, so bytes of one connection can never surface in
//! another. A pipe that holds bytes when it is dropped is closed, and its
//! bytes with it (only the error path of a connection does that).
//!
//! Memory: a pipe costs two descriptors and its ring of buffer slots; the
//! data pages are only allocated while bytes sit in it. Idle connections
//! hold no pipe at all (see `tcp`), so only directions with bytes in flight,
//! plus at most `max_idle` pooled pipes, use any.

use nix::errno::Errno;
use nix::fcntl::{fcntl, splice, FcntlArg, OFlag, SpliceFFlags};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// A pool of non-blocking pipes of one size.
#[derive(Debug)]
pub struct PipePool {
    pipe_size: usize,
    max_idle: usize,
    idle: Mutex<Vec<PipeFds>>,
    created: AtomicU64,
    reused: AtomicU64,
    undersized: AtomicU64,
    in_use: AtomicU64,
    /// Pipes handed out at once at most (0: no bound): the relays'
    /// in-flight byte budget, `max_in_use * pipe_size`.
    max_in_use: u64,
}

/// A snapshot of a pool's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PipeStats {
    /// Pipes created since the pool was made.
    pub created: u64,
    /// Acquisitions served by an idle pipe.
    pub reused: u64,
    /// Pipes waiting in the pool now.
    pub idle: usize,
    /// Pipes that could not be given `pipe_size` and kept the kernel's size
    /// (F_SETPIPE_SZ refused, typically EPERM from fs.pipe-user-pages-soft).
    pub undersized: u64,
    /// Pipes handed out and not yet returned or closed.
    pub in_use: u64,
}

#[derive(Debug)]
struct PipeFds {
    read: OwnedFd,
    write: OwnedFd,
    capacity: usize,
    undersized: bool,
}

/// One pipe taken from a [`PipePool`]. It returns to the pool when dropped
/// (or passed to [`PipePool::release`]) if it is empty and full-sized;
/// otherwise its descriptors are closed.
#[derive(Debug)]
pub struct Pipe<'p> {
    pool: &'p PipePool,
    // `Some` until the pipe is dropped.
    fds: Option<PipeFds>,
    len: usize,
}

impl PipePool {
    /// A pool of pipes of `pipe_size` bytes (rounded up by the kernel to a
    /// power of two pages; 0 keeps the kernel's default, normally 64 KiB)
    /// that keeps at most `max_idle` idle pipes.
    ///
    /// Without CAP_SYS_RESOURCE, the pipe pages of all of a user's pipes are
    /// limited (fs.pipe-user-pages-soft, 64 MiB by default): idle pipes count
    /// too, so keep `max_idle * pipe_size` well below it.
    pub fn new(pipe_size: usize, max_idle: usize) -> Arc<PipePool> {
        PipePool::bounded(pipe_size, max_idle, 0)
    }

    /// [`PipePool::new`] that hands out at most `max_in_use` pipes at once
    /// (0: no bound): beyond it [`PipePool::acquire`] fails with ENOMEM,
    /// and a relay direction copies through a small buffer instead.
    pub fn bounded(pipe_size: usize, max_idle: usize, max_in_use: usize) -> Arc<PipePool> {
        Arc::new(PipePool {
            max_in_use: max_in_use as u64,
            pipe_size,
            max_idle,
            idle: Mutex::new(Vec::with_capacity(max_idle.min(1024))),
            created: AtomicU64::new(0),
            reused: AtomicU64::new(0),
            undersized: AtomicU64::new(0),
            in_use: AtomicU64::new(0),
        })
    }

    /// The size asked for each pipe.
    pub fn pipe_size(&self) -> usize {
        self.pipe_size
    }

    /// An empty pipe: an idle one, or a new one. A pipe that cannot be
    /// enlarged to `pipe_size` is still returned, at the kernel's size, and
    /// counted as undersized. Fails when pipe2(2) fails (EMFILE, ENFILE),
    /// and with ENOMEM when the pool's bound ([`PipePool::bounded`]) is
    /// reached.
    pub fn acquire(&self) -> io::Result<Pipe<'_>> {
        let taken = self.in_use.fetch_add(1, Ordering::Relaxed);
        if self.max_in_use > 0 && taken >= self.max_in_use {
            self.in_use.fetch_sub(1, Ordering::Relaxed);
            return Err(io::Error::from_raw_os_error(libc::ENOMEM));
        }
        let pooled = self.lock_idle().pop();
        let fds = match pooled {
            Some(fds) => {
                self.reused.fetch_add(1, Ordering::Relaxed);
                fds
            }
            None => self.create().inspect_err(|_| {
                self.in_use.fetch_sub(1, Ordering::Relaxed);
            })?,
        };
        Ok(Pipe {
            pool: self,
            fds: Some(fds),
            len: 0,
        })
    }

    /// Give a pipe back. Same as dropping it: it is pooled only when empty,
    /// full-sized and the pool has room, and closed otherwise.
    pub fn release(&self, pipe: Pipe<'_>) {
        debug_assert!(
            std::ptr::eq(self, pipe.pool),
            "pipe released to another pool"
        );
        drop(pipe);
    }

    /// The pool's counters now.
    pub fn stats(&self) -> PipeStats {
        PipeStats {
            created: self.created.load(Ordering::Relaxed),
            reused: self.reused.load(Ordering::Relaxed),
            idle: self.lock_idle().len(),
            undersized: self.undersized.load(Ordering::Relaxed),
            in_use: self.in_use.load(Ordering::Relaxed),
        }
    }

    fn lock_idle(&self) -> MutexGuard<'_, Vec<PipeFds>> {
        // The vector stays consistent whatever panicked while holding it.
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn create(&self) -> io::Result<PipeFds> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
        self.created.fetch_add(1, Ordering::Relaxed);
        let wanted = libc::c_int::try_from(self.pipe_size).unwrap_or(libc::c_int::MAX);
        let set = if wanted > 0 {
            fcntl(&write, FcntlArg::F_SETPIPE_SZ(wanted)).map(|n| n as usize)
        } else {
            Err(Errno::EINVAL)
        };
        let (capacity, undersized) = match set {
            Ok(capacity) => (capacity, false),
            Err(err) => {
                if wanted > 0 {
                    self.undersized.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(
                        pipe_size = self.pipe_size,
                        %err,
                        "cannot resize pipe, keeping the kernel's size"
                    );
                }
                let capacity = fcntl(&write, FcntlArg::F_GETPIPE_SZ)?;
                (capacity as usize, wanted > 0)
            }
        };
        Ok(PipeFds {
            read,
            write,
            capacity,
            undersized,
        })
    }

    fn put_back(&self, fds: PipeFds, empty: bool) {
        self.in_use.fetch_sub(1, Ordering::Relaxed);
        if !empty || fds.undersized {
            return; // dropped: closed
        }
        let mut idle = self.lock_idle();
        if idle.len() < self.max_idle {
            idle.push(fds);
            return;
        }
        drop(idle);
        drop(fds);
    }
}

/// A pipe taken out of its pool with the bytes it holds, to be handed to
/// another process (edgelinkd's hand-over) and adopted there with
/// [`PipePool::adopt`]. Dropped, it is closed with its bytes.
#[derive(Debug)]
pub struct ParkedPipe {
    pub read: OwnedFd,
    pub write: OwnedFd,
    /// Bytes in it, as the pipe's owner counted them.
    pub len: usize,
}

/// Bytes waiting in a pipe, as the kernel counts them (FIONREAD).
#[allow(unsafe_code)]
fn queued(read: &OwnedFd) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer, which points
    // to a live local; the descriptor is open for the call (borrowed).
    let r = unsafe { libc::ioctl(read.as_raw_fd(), libc::FIONREAD, &mut n) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(n).unwrap_or(0))
}

impl PipePool {
    /// Take in a pipe another process (or this one) parked: it counts as in
    /// use until dropped, and goes back to this pool once empty if its
    /// capacity is this pool's. Its length is what the kernel says it
    /// holds; a different count in `parked` is an error (the pipe is not
    /// the one it claims to be).
    pub fn adopt(&self, parked: ParkedPipe) -> io::Result<Pipe<'_>> {
        let len = queued(&parked.read)?;
        if len != parked.len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "a handed-over pipe holds {len} bytes, not the {} announced",
                    parked.len
                ),
            ));
        }
        for fd in [&parked.read, &parked.write] {
            let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
            fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
        }
        let capacity = fcntl(&parked.write, FcntlArg::F_GETPIPE_SZ)? as usize;
        self.in_use.fetch_add(1, Ordering::Relaxed);
        Ok(Pipe {
            pool: self,
            fds: Some(PipeFds {
                read: parked.read,
                write: parked.write,
                capacity,
                undersized: capacity != self.pipe_size,
            }),
            len,
        })
    }
}

impl Pipe<'_> {
    /// Take the pipe out of its pool with its bytes (see [`ParkedPipe`]).
    pub fn park(mut self) -> ParkedPipe {
        let fds = self
            .fds
            .take()
            .unwrap_or_else(|| unreachable!("a pipe's descriptors are taken only once"));
        self.pool.in_use.fetch_sub(1, Ordering::Relaxed);
        ParkedPipe {
            read: fds.read,
            write: fds.write,
            len: self.len,
        }
    }

    /// Move every byte of `other` to the end of this pipe (pipe to pipe,
    /// in the kernel). Fails with `WouldBlock` if they do not all fit.
    pub fn append(&mut self, other: &mut Pipe<'_>) -> io::Result<()> {
        while other.len > 0 {
            let n = splice(
                &other.fds().read,
                None,
                &self.fds().write,
                None,
                other.len,
                SpliceFFlags::SPLICE_F_NONBLOCK,
            )?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            other.len -= n;
            self.len += n;
        }
        Ok(())
    }

    fn fds(&self) -> &PipeFds {
        match &self.fds {
            Some(fds) => fds,
            None => unreachable!("a pipe's descriptors are taken only by drop"),
        }
    }

    /// How many bytes the pipe holds at most.
    pub fn capacity(&self) -> usize {
        self.fds().capacity
    }

    /// Bytes in the pipe now.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the pipe got less than its pool's `pipe_size`.
    pub fn is_undersized(&self) -> bool {
        self.fds().undersized
    }

    /// splice(2) up to `max` bytes from `src` into the pipe. `Ok(0)` means
    /// end of file when `max > 0`.
    pub fn splice_from(
        &mut self,
        src: impl AsFd,
        max: usize,
        flags: SpliceFFlags,
    ) -> io::Result<usize> {
        let n = splice(src, None, &self.fds().write, None, max, flags)?;
        self.len += n;
        Ok(n)
    }

    /// splice(2) the pipe's bytes (as many as `dst` takes) into `dst`.
    pub fn splice_into(&mut self, dst: impl AsFd, flags: SpliceFFlags) -> io::Result<usize> {
        if self.len == 0 {
            return Ok(0);
        }
        let n = splice(&self.fds().read, None, dst, None, self.len, flags)?;
        self.len -= n;
        Ok(n)
    }

    /// Read bytes out of the pipe into `buf` (the plain-copy fallback).
    pub fn read_into(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.len == 0 || buf.is_empty() {
            return Ok(0);
        }
        let max = buf.len().min(self.len);
        let n = nix::unistd::read(&self.fds().read, &mut buf[..max])?;
        self.len -= n;
        Ok(n)
    }

    /// Write bytes from `buf` into the pipe; fails with `WouldBlock` when
    /// it is full.
    pub fn write_from(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let n = nix::unistd::write(&self.fds().write, buf)?;
        self.len += n;
        Ok(n)
    }
}

impl Drop for Pipe<'_> {
    fn drop(&mut self) {
        if let Some(fds) = self.fds.take() {
            self.pool.put_back(fds, self.len == 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_empty_pipes() {
        let pool = PipePool::new(256 * 1024, 4);
        let a = pool.acquire().unwrap();
        assert!(a.capacity() >= 256 * 1024);
        assert!(a.is_empty());
        pool.release(a);
        let s = pool.stats();
        assert_eq!((s.created, s.reused, s.idle, s.in_use), (1, 0, 1, 0));
        let b = pool.acquire().unwrap();
        let s = pool.stats();
        assert_eq!((s.created, s.reused, s.idle, s.in_use), (1, 1, 0, 1));
        drop(b);
        assert_eq!(pool.stats().idle, 1);
    }

    #[test]
    fn never_pools_a_pipe_with_bytes() {
        let pool = PipePool::new(0, 4);
        let mut p = pool.acquire().unwrap();
        assert_eq!(p.write_from(b"left over").unwrap(), 9);
        assert_eq!(p.len(), 9);
        pool.release(p);
        let s = pool.stats();
        assert_eq!((s.idle, s.in_use), (0, 0));
        // The next pipe is a fresh, empty one.
        let mut p = pool.acquire().unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(p.read_into(&mut buf).unwrap(), 0);
        assert_eq!(pool.stats().created, 2);
        // Emptied again, it may be pooled.
        p.write_from(b"x").unwrap();
        assert_eq!(p.read_into(&mut buf).unwrap(), 1);
        drop(p);
        assert_eq!(pool.stats().idle, 1);
    }

    #[test]
    fn keeps_at_most_max_idle() {
        let pool = PipePool::new(0, 2);
        let pipes: Vec<_> = (0..5).map(|_| pool.acquire().unwrap()).collect();
        assert_eq!(pool.stats().in_use, 5);
        drop(pipes);
        let s = pool.stats();
        assert_eq!((s.created, s.idle, s.in_use), (5, 2, 0));
    }

    #[test]
    fn default_size_when_zero() {
        let pool = PipePool::new(0, 1);
        let p = pool.acquire().unwrap();
        assert!(p.capacity() >= 4096);
        assert!(!p.is_undersized());
        assert_eq!(pool.stats().undersized, 0);
    }
}
