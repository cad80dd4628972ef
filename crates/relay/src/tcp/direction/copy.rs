//! The two ways a direction copies through a buffer instead of a pipe:
//! for good, where the kernel refuses splice ([`Direction::copy`]), and
//! for one burst, when no descriptor is left for a pipe
//! ([`Direction::copy_burst`]).

use super::{would_block, Direction};
use crate::counters::Counters;
use crate::pipe::Pipe;
use crate::tcp::{DirEnd, BURST_BUFFER_SIZE, BURST_READS, COPY_BUFFER_SIZE, YIELD_EVERY};
use nix::sys::socket::MsgFlags;
use std::io;
use std::os::fd::AsRawFd;
use tokio::io::Interest;

/// How a burst copy ended.
pub(super) enum Burst {
    /// The source has nothing more now (or the burst's reads are used up).
    More,
    /// The source sent its end of file.
    Eof,
    /// The destination takes nothing more now; the bytes not taken are
    /// still in the source.
    Blocked,
}

impl<'p> Direction<'_, 'p> {
    /// Copy what the source has now (a few reads at most) to the
    /// destination through a small buffer dropped at the end, for when no
    /// pipe could be had: unlike [`Direction::copy`], the direction goes
    /// back to splicing afterwards and keeps no buffer while idle.
    ///
    /// The bytes are peeked, and taken from the source only once the
    /// destination took them, so that the caller's wait for the destination
    /// (and a park or a failure meanwhile) finds nothing held here, which
    /// could only go into a pipe, and a pipe is what could not be had
    /// (docs/reliability.md, item 81). One more syscall per read, on this
    /// path only.
    pub(super) fn copy_burst(&self) -> io::Result<Burst> {
        Counters::inc(self.fallbacks);
        let mut buf = vec![0u8; BURST_BUFFER_SIZE];
        let fd = self.src.as_raw_fd();
        for _ in 0..BURST_READS {
            let peeked = self.src.try_io(Interest::READABLE, || {
                Ok(nix::sys::socket::recv(
                    fd,
                    &mut buf,
                    MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
                )?)
            });
            let n = match peeked {
                Ok(0) => return Ok(Burst::Eof),
                Ok(n) => n,
                Err(e) if would_block(&e) => return Ok(Burst::More),
                Err(e) => return Err(e),
            };
            let mut off = 0;
            while off < n {
                match self.dst.try_write(&buf[off..n]) {
                    Ok(m) => {
                        // TCP discards with MSG_TRUNC instead of copying.
                        let taken = nix::sys::socket::recv(
                            fd,
                            &mut buf[off..off + m],
                            MsgFlags::MSG_TRUNC | MsgFlags::MSG_DONTWAIT,
                        )?;
                        if taken != m {
                            return Err(io::Error::other(format!(
                                "took {taken} of {m} peeked bytes from the source"
                            )));
                        }
                        off += m;
                        Counters::add(self.bytes, m as u64);
                        self.activity.touch();
                    }
                    Err(e) if would_block(&e) => return Ok(Burst::Blocked),
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(Burst::More)
    }

    /// The fallback: deliver what is left in the pipe, then copy through a
    /// buffer of [`COPY_BUFFER_SIZE`] bytes. Parked, the bytes of the
    /// buffer go back into a pipe, ahead of those still in the old one.
    pub(super) async fn copy(
        &self,
        mut pipe: Option<Pipe<'p>>,
        mut eof: bool,
    ) -> io::Result<DirEnd<'p>> {
        let mut buf = vec![0u8; COPY_BUFFER_SIZE].into_boxed_slice();
        let (mut start, mut end) = (0usize, 0usize);
        let mut budget = YIELD_EVERY;
        loop {
            if start == end {
                start = 0;
                end = 0;
                match pipe.as_mut() {
                    // The pipe is non-blocking and holds bytes: this read
                    // cannot block.
                    Some(p) if !p.is_empty() => end = p.read_into(&mut buf)?,
                    _ => {
                        // Empty: back to the pool.
                        pipe = None;
                        if eof {
                            self.pass_eof()?;
                            return Ok(DirEnd::Done);
                        }
                        match self.src.try_read(&mut buf) {
                            Ok(0) => eof = true,
                            Ok(n) => end = n,
                            Err(e) if would_block(&e) => {
                                let readable = std::pin::pin!(self.src_readable());
                                match self.unless_parked(readable).await {
                                    Some(r) => r?,
                                    None => return Ok(DirEnd::Parked { pipe, eof }),
                                }
                            }
                            Err(e) => return Err(e),
                        }
                        continue;
                    }
                }
            }
            match self.dst.try_write(&buf[start..end]) {
                Ok(n) => {
                    start += n;
                    Counters::add(self.bytes, n as u64);
                    self.activity.touch();
                }
                Err(e) if would_block(&e) => {
                    match self.writable().await {
                        Some(r) => r?,
                        None => {
                            let pipe = self.rescue(&buf[start..end], pipe)?;
                            return Ok(DirEnd::Parked { pipe, eof });
                        }
                    }
                    budget = YIELD_EVERY;
                    continue;
                }
                Err(e) => return Err(e),
            }
            budget -= 1;
            if budget == 0 {
                budget = YIELD_EVERY;
                tokio::task::yield_now().await;
                if self.park.is_cancelled() {
                    let pipe = self.rescue(&buf[start..end], pipe)?;
                    return Ok(DirEnd::Parked { pipe, eof });
                }
            }
        }
    }

    /// The bytes a copying direction holds, `buffered` then those left in
    /// `pipe`, in one pipe, in that order. Fails (and the connection is
    /// reset) if they do not fit one pipe.
    fn rescue(&self, buffered: &[u8], pipe: Option<Pipe<'p>>) -> io::Result<Option<Pipe<'p>>> {
        if buffered.is_empty() {
            return Ok(pipe);
        }
        let mut fresh = self.pool.acquire()?;
        let mut at = 0;
        while at < buffered.len() {
            match fresh.write_from(&buffered[at..])? {
                0 => return Err(io::ErrorKind::WriteZero.into()),
                n => at += n,
            }
        }
        if let Some(mut old) = pipe {
            fresh.append(&mut old)?;
        }
        Ok(Some(fresh))
    }
}
