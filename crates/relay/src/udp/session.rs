//! The session table of a UDP forward and each session's reply task.
//!
//! A session is made when an unknown client sends: its upstream socket is
//! asked from the [`SocketSource`] in a task of its own (the daemon makes it
//! in another namespace, which takes a moment), and the client's datagrams
//! wait in a small queue meanwhile. Once the socket is there, the queue is
//! flushed and a reply task starts reading the socket.
//!
//! Least recently used order: each session's last activity is an atomic
//! that both the table (datagrams from the client) and its reply task
//! (datagrams from the target) move forward. The table also keeps an index
//! ordered by (time, slot), which it updates itself for the client side
//! and lazily for the reply side: an entry's time is never later than the
//! session's. Evicting takes the first entry; if the session was active
//! since, the entry moves to that time and the next one is looked at. So
//! an eviction costs O(log n), plus one step per session whose replies the
//! index had not seen yet (each such step brings its entry up to date);
//! the idle sweep walks only the entries older than the timeout.

use super::mmsg::{self, Local, RecvBatch, MAX_BATCH};
use crate::counters::Counters;
use crate::{RefuseFn, SocketSource};
use socket2::SockAddr;
use std::collections::{BTreeSet, HashMap};
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

mod parked;
mod reply;

use reply::{send_all, sent_bytes, Replies};

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
    pub target: super::UdpTarget,
    pub source: Arc<dyn SocketSource>,
    pub counters: Arc<Counters>,
    pub refuse: Arc<RefuseFn>,
    pub answer_from_dst: bool,
    pub batch: usize,
    pub max_sessions: usize,
    pub clock: Clock,
    pub created: mpsc::UnboundedSender<Created>,
    /// (slot, generation) of a session whose reply task ended.
    pub ended: mpsc::UnboundedSender<(usize, u64)>,
    /// Whether sends to the target, and to clients, still use GSO.
    pub gso_to_target: AtomicBool,
    pub gso_to_client: AtomicBool,
    pub on_end: Option<super::SessionHook>,
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
    /// [`Clock`] time of the last datagram either way (only moves
    /// forward).
    last: Arc<AtomicU64>,
    /// The time under which the session is in the table's `lru` index: at
    /// most `last`.
    indexed: u64,
    /// Where to answer the client from.
    local: Option<Local>,
    state: State,
    /// The task making the socket, then the reply task.
    task: Option<JoinHandle<()>>,
    /// For [`Shared::on_end`]: [`Clock`] time it opened, and the bytes
    /// relayed each way (the reply task counts its own).
    started: u64,
    to_target: u64,
    to_client: Option<Arc<AtomicU64>>,
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
    /// (time, slot) of every session, oldest first (see the module's
    /// documentation).
    lru: BTreeSet<(u64, usize)>,
    /// Index entries looked at by evictions, for tests of their cost.
    evict_visits: u64,
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
            lru: BTreeSet::new(),
            evict_visits: 0,
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
            self.touch(slot, now);
            let Some(session) = self.slots[slot].as_mut() else {
                Counters::add(&counters.udp_drops, group.len() as u64);
                continue;
            };
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
                        &counters.errors,
                    );
                    let bytes = sent_bytes(&slices[..k], sent);
                    session.to_target += bytes;
                    Counters::add(&counters.udp_datagrams_to_target, sent);
                    Counters::add(&counters.bytes_to_target, bytes);
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
                        || queue.len() + batch * mmsg::SLOT_SIZE > PENDING_BYTES;
                    if full && !*crowded {
                        *crowded = true;
                        self.crowded += 1;
                    }
                }
            }
            Counters::add(&counters.udp_drops, stale as u64);
        }
    }

    /// A datagram from the client of session `slot` at `now`: the session
    /// moves to the young end of the index.
    fn touch(&mut self, slot: usize, now: u64) {
        let Some(session) = self.slots.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        session.last.fetch_max(now, Ordering::Relaxed);
        if session.indexed < now {
            self.lru.remove(&(session.indexed, slot));
            self.lru.insert((now, slot));
            session.indexed = now;
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
        let (slot, generation) = self.new_slot();
        let task = tokio::spawn(make_socket(self.shared.clone(), slot, generation));
        self.slots[slot] = Some(Session {
            peer,
            generation,
            last: Arc::new(AtomicU64::new(now)),
            indexed: now,
            local: local.filter(|_| self.shared.answer_from_dst),
            state: State::Pending {
                queue: Vec::new(),
                lens: Vec::new(),
                crowded: false,
            },
            task: Some(task),
            started: now,
            to_target: 0,
            to_client: self.shared.on_end.is_some().then(Arc::default),
        });
        self.by_peer.insert(peer, slot);
        self.lru.insert((now, slot));
        let counters = &self.shared.counters;
        Counters::inc(&counters.udp_sessions);
        Counters::inc(&counters.udp_sessions_total);
        tracing::debug!(%peer, "UDP session opened");
        (slot, generation)
    }

    /// A free slot for a new session (evicting the least recently used one
    /// if the table is full), and the session's generation.
    fn new_slot(&mut self) -> (usize, u64) {
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
        (slot, generation)
    }

    fn evict_lru(&mut self) {
        while let Some((indexed, slot)) = self.lru.pop_first() {
            self.evict_visits += 1;
            let Some(session) = self.slots.get_mut(slot).and_then(Option::as_mut) else {
                continue; // cannot happen: removal takes the entry out
            };
            let last = session.last.load(Ordering::Relaxed);
            if last > indexed {
                // Its replies kept it busy since: not the oldest after all.
                session.indexed = last;
                self.lru.insert((last, slot));
                continue;
            }
            if let Some(s) = self.remove(slot) {
                tracing::debug!(peer = %s.peer, "UDP session evicted, the table is full");
                self.end(&s, super::SessionEnded::Evicted);
            }
            Counters::inc(&self.shared.counters.udp_evictions);
            return;
        }
    }

    fn remove(&mut self, slot: usize) -> Option<Session> {
        let session = self.slots.get_mut(slot)?.take()?;
        self.by_peer.remove(&session.peer);
        self.lru.remove(&(session.indexed, slot));
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
                    self.end(&s, super::SessionEnded::Failed);
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
            to_client: session.to_client.clone(),
            slot,
            generation,
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
                &counters.errors,
            );
            let bytes = sent_bytes(&slices[..chunk.len()], sent);
            session.to_target += bytes;
            Counters::add(&counters.udp_datagrams_to_target, sent);
            Counters::add(&counters.bytes_to_target, bytes);
            Counters::add(&counters.udp_drops, dropped);
        }
    }

    /// Tell [`Shared::on_end`] what session `s` moved.
    fn end(&self, s: &Session, how: super::SessionEnded) {
        let Some(hook) = &self.shared.on_end else {
            return;
        };
        let ms = self.shared.clock.now().saturating_sub(s.started);
        (hook.0)(super::SessionEnd {
            peer: s.peer,
            duration: std::time::Duration::from_millis(ms),
            bytes_to_target: s.to_target,
            bytes_to_client: s
                .to_client
                .as_ref()
                .map_or(0, |c| c.load(Ordering::Relaxed)),
            how,
        });
    }

    /// The reply task of session `slot`/`generation` ended (its socket
    /// failed for good): the session is closed, and the client's next
    /// datagram opens a new one. Stale reports are dropped.
    pub(super) fn ended(&mut self, slot: usize, generation: u64) {
        let current = self.slots.get(slot).and_then(Option::as_ref);
        if current
            .is_some_and(|s| s.generation == generation && matches!(s.state, State::Ready { .. }))
        {
            if let Some(s) = self.remove(slot) {
                tracing::debug!(peer = %s.peer, "UDP session closed: its socket failed");
                self.end(&s, super::SessionEnded::Failed);
            }
        }
    }

    /// Close the sessions idle for `idle_ms` or more.
    pub(super) fn sweep(&mut self, idle_ms: u64) {
        self.sweep_at(self.shared.clock.now(), idle_ms);
    }

    /// [`Table::sweep`] at [`Clock`] time `now`: walks the index from its
    /// oldest entry up to the first one younger than the timeout.
    fn sweep_at(&mut self, now: u64, idle_ms: u64) {
        while let Some(&(indexed, slot)) = self.lru.first() {
            if now.saturating_sub(indexed) < idle_ms {
                return;
            }
            self.lru.pop_first();
            let Some(session) = self.slots.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            let last = session.last.load(Ordering::Relaxed);
            if now.saturating_sub(last) < idle_ms {
                // Replies came since it was indexed.
                session.indexed = last;
                self.lru.insert((last, slot));
                continue;
            }
            if let Some(s) = self.remove(slot) {
                tracing::debug!(peer = %s.peer, "UDP session closed after its idle timeout");
                self.end(&s, super::SessionEnded::Idle);
            }
        }
    }

    /// Close every session and wait until their tasks (and sockets) are gone.
    pub(super) async fn close(&mut self) {
        let mut tasks = Vec::with_capacity(self.by_peer.len());
        for slot in 0..self.slots.len() {
            if let Some(mut s) = self.remove(slot) {
                self.end(&s, super::SessionEnded::Closed);
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
    let made = match shared.target.current() {
        Ok(target) => shared
            .source
            .udp_socket(target)
            .await
            .map(|socket| (socket, target)),
        Err(e) => Err(e),
    };
    let result = made.and_then(|(socket, target)| {
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

#[cfg(test)]
mod tests;
