//! A session's reply task (target → relay → client) and the batched send
//! both directions use.
//!
//! ICMP: a session's socket is connected, so the kernel reports an ICMP
//! error about an earlier datagram (port unreachable, host or network
//! prohibited, ...) to the next call on it, receive or send, once. Such an
//! error says nothing about the socket: it is counted in `errors` and the
//! session goes on, since the target (or the firewall in front of it) may
//! answer the next datagram. Only errors that mean the socket itself is
//! unusable end the reply task, and with it the session.

use super::super::mmsg::{self, Local, RecvBatch, MAX_BATCH};
use super::{Shared, REPLY_ROUNDS};
use crate::counters::Counters;
use socket2::SockAddr;
use std::cell::RefCell;
use std::io::{self, IoSlice};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::io::Interest;
use tokio::net::UdpSocket;

/// One session's way back: target → relay → client.
pub(super) struct Replies {
    pub(super) socket: Arc<UdpSocket>,
    pub(super) shared: Arc<Shared>,
    pub(super) peer: SockAddr,
    pub(super) local: Option<Local>,
    pub(super) last: Arc<AtomicU64>,
    /// Bytes sent back to the client, when the session's end is reported.
    pub(super) to_client: Option<Arc<AtomicU64>>,
    /// The session's place in the table, reported when the task ends.
    pub(super) slot: usize,
    pub(super) generation: u64,
}

thread_local! {
    /// Reply buffers, one set per worker thread: a reply task uses them only
    /// between two awaits, so sessions need no buffers of their own.
    static REPLY_BATCH: RefCell<RecvBatch> = RefCell::new(RecvBatch::new(MAX_BATCH));
}

impl Replies {
    pub(super) async fn run(self) {
        if let Err(e) = self.relay().await {
            tracing::debug!(error = %e, "UDP session socket failed: session closed");
        }
        // The table closes the session: otherwise it would go on sending
        // the client's datagrams, and no answer would come back.
        let _ = self.shared.ended.send((self.slot, self.generation));
    }

    /// Relay the target's datagrams until the socket fails for good.
    async fn relay(&self) -> io::Result<()> {
        loop {
            self.socket.readable().await?;
            for _ in 0..REPLY_ROUNDS {
                let moved = self.socket.try_io(Interest::READABLE, || {
                    REPLY_BATCH.with(|batch| self.relay_batch(&mut batch.borrow_mut()))
                });
                match moved {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if broken(&e) => return Err(e),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    // An ICMP error about an earlier datagram (see the
                    // module's documentation): the session stays.
                    Err(e) => {
                        tracing::debug!(error = %e, "UDP session: error reported by the target's side");
                        Counters::inc(&self.shared.counters.errors);
                    }
                }
            }
        }
    }

    fn relay_batch(&self, batch: &mut RecvBatch) -> io::Result<()> {
        let n = mmsg::recv_batch(self.socket.as_fd(), batch, self.shared.batch)?;
        // fetch_max: the table may have stored a later time meanwhile.
        self.last
            .fetch_max(self.shared.clock.now(), Ordering::Relaxed);
        let mut slices = [IoSlice::new(&[]); MAX_BATCH];
        let mut k = 0;
        for i in 0..n {
            if !batch.meta(i).truncated {
                slices[k] = IoSlice::new(batch.datagram(i));
                k += 1;
            }
        }
        let counters = &self.shared.counters;
        let (sent, dropped) = send_all(
            self.shared.listener.as_fd(),
            &slices[..k],
            Some(&self.peer),
            self.local,
            &self.shared.gso_to_client,
            &counters.errors,
        );
        let bytes = sent_bytes(&slices[..k], sent);
        if let Some(c) = &self.to_client {
            c.fetch_add(bytes, Ordering::Relaxed);
        }
        Counters::add(&counters.udp_datagrams_to_client, sent);
        Counters::add(&counters.bytes_to_client, bytes);
        Counters::add(&counters.udp_drops, dropped + (n - k) as u64);
        batch.release();
        Ok(())
    }
}

/// Errors that mean a session's socket itself is unusable (a bug, or a
/// descriptor closed under it): everything else a connected UDP socket
/// reports is about a datagram, not the socket.
fn broken(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EBADF | libc::ENOTSOCK | libc::EFAULT | libc::EINVAL)
    )
}

/// Send all of `msgs` without blocking; returns (sent, dropped). A full
/// socket buffer drops the rest; a pending error from an earlier ICMP
/// (port or host unreachable, prohibited, ...: any error but [`broken`]
/// ones) is counted in `errors` and the send retried once; an error that
/// may be GSO's turns `gso` off and retries; other errors drop one
/// datagram each.
pub(super) fn send_all(
    fd: BorrowedFd<'_>,
    msgs: &[IoSlice<'_>],
    to: Option<&SockAddr>,
    from: Option<Local>,
    gso: &AtomicBool,
    errors: &AtomicU64,
) -> (u64, u64) {
    let (mut sent, mut dropped) = (0u64, 0u64);
    let mut offset = 0;
    let mut retried = false;
    while offset < msgs.len() {
        let with_gso = gso.load(Ordering::Relaxed);
        match mmsg::send_batch(fd, &msgs[offset..], to, from, with_gso) {
            Ok(0) => break,
            Ok(k) => {
                sent += k as u64;
                offset += k;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e)
                if with_gso
                    && mmsg::gso_refused(&e)
                    && mmsg::first_run(&msgs[offset..], true) > 1 =>
            {
                tracing::debug!(error = %e, "UDP GSO refused: sending datagrams one by one");
                gso.store(false, Ordering::Relaxed);
            }
            Err(e) if !retried && !broken(&e) => {
                retried = true;
                if e.kind() != io::ErrorKind::Interrupted {
                    Counters::inc(errors);
                }
            }
            Err(e) => {
                tracing::trace!(error = %e, "UDP send failed");
                dropped += 1;
                offset += 1;
            }
        }
    }
    dropped += (msgs.len() - offset) as u64;
    (sent, dropped)
}

/// Bytes in the first `sent` datagrams of a batch (what actually went out).
pub(super) fn sent_bytes(slices: &[IoSlice<'_>], sent: u64) -> u64 {
    slices
        .iter()
        .take(sent as usize)
        .map(|s| s.len() as u64)
        .sum()
}
