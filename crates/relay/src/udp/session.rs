//! The session table of a UDP forward and each session's reply task.
//!
//! A session is made when an unknown client sends: its upstream socket is
//! asked from the [`SocketSource`] in a task of its own (the daemon makes it
//! in another namespace, which takes a moment), and the client's datagrams
//! wait in a small queue meanwhile. Once the socket is there, the queue is
//! flushed and a reply task starts reading the socket.

use super::mmsg::{self, Local, RecvBatch, MAX_BATCH};
use crate::counters::Counters;
use crate::{RefuseFn, SocketSource};
use socket2::SockAddr;
use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Datagrams (and bytes) a session keeps while its socket is being made;
/// more are dropped. The whole table keeps at most `PENDING_BYTES_TOTAL`
/// that way, so a flood of new clients cannot make it grow. A session
/// whose queue could not take another batch makes the relay leave the
/// listener alone for a moment (see `Table::crowded`): the kernel's socket
/// buffer holds the rest of a client's first burst meanwhile.
const PENDING_DATAGRAMS: usize = 128;
const PENDING_BYTES: usize = 128 * 1024;
const PENDING_BYTES_TOTAL: usize = 4 << 20;

/// Batches a reply task moves before it lets other tasks run.
const REPLY_ROUNDS: usize = 16;

/// Milliseconds since the relay started: cheap enough to read once a batch.
#[derive(Debug, Clone, Copy)]
pub(super) struct Clock(Instant);

impl Clock {
    pub(super) fn new() -> Clock {
        Clock(Instant::now())
    }

    pub(super) fn now(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// What every session of a forward shares.
pub(super) struct Shared {
    pub listener: Arc<UdpSocket>,
    pub target: SocketAddr,
    pub source: Arc<dyn SocketSource>,
    pub counters: Arc<Counters>,
    pub refuse: Arc<RefuseFn>,
    pub answer_from_dst: bool,
    pub batch: usize,
    pub max_sessions: usize,
    pub clock: Clock,
    pub created: mpsc::UnboundedSender<Created>,
    /// Whether sends to the target, and to clients, still use GSO.
    pub gso_to_target: AtomicBool,
    pub gso_to_client: AtomicBool,
}

/// An upstream socket made (or not) for session `slot`/`generation`.
pub(super) struct Created {
    slot: usize,
    generation: u64,
    result: io::Result<UdpSocket>,
}

struct Session {
    peer: SocketAddr,
    generation: u64,
    /// [`Clock`] time of the last datagram either way.
    last: Arc<AtomicU64>,
    /// Where to answer the client from.
    local: Option<Local>,
    state: State,
    /// The task making the socket, then the reply task.
    task: Option<JoinHandle<()>>,
}

enum State {
    Pending {
        queue: Vec<u8>,
        lens: Vec<usize>,
        /// The queue may not take another batch.
        crowded: bool,
    },
    Ready {
        socket: Arc<UdpSocket>,
    },
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

pub(super) struct Table {
    shared: Arc<Shared>,
    slots: Vec<Option<Session>>,
    free: Vec<usize>,
    by_peer: HashMap<SocketAddr, usize>,
    next_generation: u64,
    /// Bytes queued in all pending sessions.
    pending_bytes: usize,
    /// Pending sessions whose queue may not take another batch.
    crowded: usize,
}

impl Table {
    pub(super) fn new(shared: Shared) -> Table {
        Table {
            shared: Arc::new(shared),
            slots: Vec::new(),
            free: Vec::new(),
            by_peer: HashMap::new(),
            next_generation: 0,
            pending_bytes: 0,
            crowded: 0,
        }
    }

    pub(super) fn batch(&self) -> usize {
        self.shared.batch
    }

    /// Whether a new client's queue may not take another batch: the
    /// listener is best left unread until its socket is there.
    pub(super) fn crowded(&self) -> bool {
        self.crowded > 0
    }

    pub(super) fn count_drop(&self, n: u64) {
        Counters::add(&self.shared.counters.udp_drops, n);
    }

    /// Pass on the first `n` datagrams of `rx`: one sendmmsg per session.
    pub(super) fn dispatch(&mut self, rx: &RecvBatch, n: usize) {
        let now = self.shared.clock.now();
        let counters = self.shared.counters.clone();
        // (slot, datagram) pairs, and the generation each datagram's
        // session had: a session made later in the batch may evict one made
        // earlier, whose slot is then reused.
        let mut order = [(0usize, 0usize); MAX_BATCH];
        let mut generations = [0u64; MAX_BATCH];
        let mut m = 0;
        let mut last: Option<(SocketAddr, usize, u64)> = None;
        for (i, datagram_generation) in generations.iter_mut().enumerate().take(n) {
            let meta = rx.meta(i);
            let Some(peer) = meta.peer else {
                Counters::inc(&counters.udp_drops);
                continue;
            };
            if meta.truncated {
                Counters::inc(&counters.udp_drops);
                continue;
            }
            let canonical = SocketAddr::new(peer.ip().to_canonical(), peer.port());
            if (self.shared.refuse)(canonical, meta.ifindex) {
                Counters::inc(&counters.refused);
                continue;
            }
            let (slot, generation) = match last {
                Some((p, slot, generation)) if p == peer => (slot, generation),
                _ => self.session_for(peer, meta.local, now),
            };
            last = Some((peer, slot, generation));
            order[m] = (slot, i);
            *datagram_generation = generation;
            m += 1;
        }
        let order = &mut order[..m];
        order.sort_unstable();
        for group in order.chunk_by(|a, b| a.0 == b.0) {
            let slot = group[0].0;
            let Some(session) = self.slots[slot].as_mut() else {
                Counters::add(&counters.udp_drops, group.len() as u64);
                continue;
            };
            session.last.store(now, Ordering::Relaxed);
            let current = session.generation;
            let datagrams = group
                .iter()
                .map(|&(_, i)| i)
                .filter(|&i| generations[i] == current);
            let mut stale = group.len();
            match &mut session.state {
                State::Ready { socket } => {
                    let mut slices = [IoSlice::new(&[]); MAX_BATCH];
                    let mut k = 0;
                    for i in datagrams {
                        slices[k] = IoSlice::new(rx.datagram(i));
                        k += 1;
                    }
                    stale -= k;
                    let (sent, dropped) = send_all(
                        socket.as_fd(),
                        &slices[..k],
                        None,
                        None,
                        &self.shared.gso_to_target,
                    );
                    Counters::add(&counters.udp_datagrams_to_target, sent);
                    Counters::add(&counters.bytes_to_target, sent_bytes(&slices[..k], sent));
                    Counters::add(&counters.udp_drops, dropped);
                }
                State::Pending {
                    queue,
                    lens,
                    crowded,
                } => {
                    for i in datagrams {
                        stale -= 1;
                        let d = rx.datagram(i);
                        if lens.len() < PENDING_DATAGRAMS
                            && queue.len() + d.len() <= PENDING_BYTES
                            && self.pending_bytes + d.len() <= PENDING_BYTES_TOTAL
                        {
                            queue.extend_from_slice(d);
                            lens.push(d.len());
                            self.pending_bytes += d.len();
                        } else {
                            Counters::inc(&counters.udp_drops);
                        }
                    }
                    let batch = self.shared.batch;
                    let full = lens.len() + batch > PENDING_DATAGRAMS
                        || queue.len() + batch * mmsg::DATAGRAM_SIZE > PENDING_BYTES;
                    if full && !*crowded {
                        *crowded = true;
                        self.crowded += 1;
                    }
                }
            }
            Counters::add(&counters.udp_drops, stale as u64);
        }
    }

    /// The session of `peer`, made (evicting the least recently used one
    /// if the table is full) when there is none.
    fn session_for(&mut self, peer: SocketAddr, local: Option<Local>, now: u64) -> (usize, u64) {
        if let Some(&slot) = self.by_peer.get(&peer) {
            if let Some(s) = &self.slots[slot] {
                return (slot, s.generation);
            }
        }
        if self.by_peer.len() >= self.shared.max_sessions {
            self.evict_lru();
        }
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        let generation = self.next_generation;
        self.next_generation += 1;
        let task = tokio::spawn(make_socket(self.shared.clone(), slot, generation));
        self.slots[slot] = Some(Session {
            peer,
            generation,
            last: Arc::new(AtomicU64::new(now)),
            local: local.filter(|_| self.shared.answer_from_dst),
            state: State::Pending {
                queue: Vec::new(),
                lens: Vec::new(),
                crowded: false,
            },
            task: Some(task),
        });
        self.by_peer.insert(peer, slot);
        let counters = &self.shared.counters;
        Counters::inc(&counters.udp_sessions);
        Counters::inc(&counters.udp_sessions_total);
        tracing::debug!(%peer, "UDP session opened");
        (slot, generation)
    }

    fn evict_lru(&mut self) {
        let oldest = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(slot, s)| s.as_ref().map(|s| (s.last.load(Ordering::Relaxed), slot)))
            .min();
        if let Some((_, slot)) = oldest {
            if let Some(s) = self.remove(slot) {
                tracing::debug!(peer = %s.peer, "UDP session evicted, the table is full");
            }
            Counters::inc(&self.shared.counters.udp_evictions);
        }
    }

    fn remove(&mut self, slot: usize) -> Option<Session> {
        let session = self.slots.get_mut(slot)?.take()?;
        self.by_peer.remove(&session.peer);
        self.free.push(slot);
        if let State::Pending { queue, crowded, .. } = &session.state {
            self.pending_bytes -= queue.len();
            self.crowded -= usize::from(*crowded);
        }
        Counters::dec(&self.shared.counters.udp_sessions);
        Some(session)
    }

    /// An upstream socket arrived: flush the session's queue and start its
    /// reply task. Stale results (the session is gone) are dropped.
    pub(super) fn created(&mut self, created: Created) {
        let Created {
            slot,
            generation,
            result,
        } = created;
        let current = self.slots.get(slot).and_then(Option::as_ref);
        if !current
            .is_some_and(|s| s.generation == generation && matches!(s.state, State::Pending { .. }))
        {
            return;
        }
        let counters = self.shared.counters.clone();
        let socket = match result {
            Ok(socket) => Arc::new(socket),
            Err(e) => {
                Counters::inc(&counters.connect_errors);
                if let Some(s) = self.remove(slot) {
                    tracing::debug!(peer = %s.peer, error = %e, "cannot open the UDP session's upstream socket");
                    if let State::Pending { lens, .. } = &s.state {
                        Counters::add(&counters.udp_drops, lens.len() as u64);
                    }
                }
                return;
            }
        };
        let Some(session) = self.slots[slot].as_mut() else {
            return;
        };
        let replies = Replies {
            socket: socket.clone(),
            shared: self.shared.clone(),
            peer: SockAddr::from(session.peer),
            local: session.local,
            last: session.last.clone(),
        };
        if let Some(old) = session.task.replace(tokio::spawn(replies.run())) {
            old.abort(); // finished already: it sent us this socket
        }
        let State::Pending {
            queue,
            lens,
            crowded,
        } = std::mem::replace(
            &mut session.state,
            State::Ready {
                socket: socket.clone(),
            },
        )
        else {
            return;
        };
        self.pending_bytes -= queue.len();
        self.crowded -= usize::from(crowded);
        let mut offset = 0;
        for chunk in lens.chunks(MAX_BATCH) {
            let mut slices = [IoSlice::new(&[]); MAX_BATCH];
            for (slice, &len) in slices.iter_mut().zip(chunk) {
                *slice = IoSlice::new(&queue[offset..offset + len]);
                offset += len;
            }
            let (sent, dropped) = send_all(
                socket.as_fd(),
                &slices[..chunk.len()],
                None,
                None,
                &self.shared.gso_to_target,
            );
            Counters::add(&counters.udp_datagrams_to_target, sent);
            Counters::add(
                &counters.bytes_to_target,
                sent_bytes(&slices[..chunk.len()], sent),
            );
            Counters::add(&counters.udp_drops, dropped);
        }
    }

    /// Close the sessions idle for `idle_ms` or more.
    pub(super) fn sweep(&mut self, idle_ms: u64) {
        let now = self.shared.clock.now();
        for slot in 0..self.slots.len() {
            let idle = self.slots[slot]
                .as_ref()
                .is_some_and(|s| now.saturating_sub(s.last.load(Ordering::Relaxed)) >= idle_ms);
            if idle {
                if let Some(s) = self.remove(slot) {
                    tracing::debug!(peer = %s.peer, "UDP session closed after its idle timeout");
                }
            }
        }
    }

    /// Close every session and wait until their tasks (and sockets) are gone.
    pub(super) async fn close(&mut self) {
        let mut tasks = Vec::with_capacity(self.by_peer.len());
        for slot in 0..self.slots.len() {
            if let Some(mut s) = self.remove(slot) {
                if let Some(task) = s.task.take() {
                    task.abort();
                    tasks.push(task);
                }
            }
        }
        for task in tasks {
            // Cancelled (or finished): either way its socket is closed.
            let _ = task.await;
        }
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        // When serve_udp is dropped rather than shut down: keep the gauge
        // right; dropping the sessions aborts their tasks.
        for slot in 0..self.slots.len() {
            self.remove(slot);
        }
    }
}

/// Make a session's upstream socket and report it to the table.
async fn make_socket(shared: Arc<Shared>, slot: usize, generation: u64) {
    let target = shared.target;
    let made = shared.source.udp_socket(target).await;
    let result = made.and_then(|socket| {
        socket.connect(target)?;
        socket.set_nonblocking(true)?;
        UdpSocket::from_std(socket)
    });
    // The table is gone when the relay is shutting down.
    let _ = shared.created.send(Created {
        slot,
        generation,
        result,
    });
}

/// One session's way back: target → relay → client.
struct Replies {
    socket: Arc<UdpSocket>,
    shared: Arc<Shared>,
    peer: SockAddr,
    local: Option<Local>,
    last: Arc<AtomicU64>,
}

thread_local! {
    /// Reply buffers, one set per worker thread: a reply task uses them only
    /// between two awaits, so sessions need no buffers of their own.
    static REPLY_BATCH: RefCell<RecvBatch> = RefCell::new(RecvBatch::new(MAX_BATCH));
}

impl Replies {
    async fn run(self) {
        loop {
            if let Err(e) = self.socket.readable().await {
                tracing::debug!(error = %e, "UDP session socket failed");
                return;
            }
            for _ in 0..REPLY_ROUNDS {
                let moved = self.socket.try_io(Interest::READABLE, || {
                    REPLY_BATCH.with(|batch| self.relay_batch(&mut batch.borrow_mut()))
                });
                match moved {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    // ICMP port unreachable from the target: the session
                    // stays, the target may come back.
                    Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "UDP session socket failed");
                        return;
                    }
                }
            }
        }
    }

    fn relay_batch(&self, batch: &mut RecvBatch) -> io::Result<()> {
        let n = mmsg::recv_batch(self.socket.as_fd(), batch, self.shared.batch)?;
        self.last.store(self.shared.clock.now(), Ordering::Relaxed);
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
        );
        Counters::add(&counters.udp_datagrams_to_client, sent);
        Counters::add(&counters.bytes_to_client, sent_bytes(&slices[..k], sent));
        Counters::add(&counters.udp_drops, dropped + (n - k) as u64);
        Ok(())
    }
}

/// Send all of `msgs` without blocking; returns (sent, dropped). A full
/// socket buffer drops the rest; a pending error from an earlier ICMP
/// (ECONNREFUSED) is retried once; an error that may be GSO's turns `gso`
/// off and retries; other errors drop one datagram each.
fn send_all(
    fd: BorrowedFd<'_>,
    msgs: &[IoSlice<'_>],
    to: Option<&SockAddr>,
    from: Option<Local>,
    gso: &AtomicBool,
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
            Err(e) if with_gso && mmsg::gso_refused(&e) => {
                tracing::debug!(error = %e, "UDP GSO refused: sending datagrams one by one");
                gso.store(false, Ordering::Relaxed);
            }
            Err(e)
                if !retried
                    && matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionRefused | io::ErrorKind::Interrupted
                    ) =>
            {
                retried = true
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
fn sent_bytes(slices: &[IoSlice<'_>], sent: u64) -> u64 {
    slices
        .iter()
        .take(sent as usize)
        .map(|s| s.len() as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_all_falls_back_when_gso_is_refused() {
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.connect(rx.local_addr().unwrap()).unwrap();
        crate::sockopt::refuse_gso(&tx);
        let payloads: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 800]).collect();
        let slices: Vec<IoSlice<'_>> = payloads.iter().map(|p| IoSlice::new(p)).collect();
        let gso = AtomicBool::new(true);
        assert_eq!(send_all(tx.as_fd(), &slices, None, None, &gso), (10, 0));
        assert!(
            !gso.load(Ordering::Relaxed),
            "GSO stays off after a refusal"
        );
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 2048];
        for (i, want) in payloads.iter().enumerate() {
            let n = rx.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], &want[..], "datagram {i}");
        }
    }
}
