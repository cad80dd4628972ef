//! Sessions handed over: parked by one relay, adopted by another (see
//! [`super::super::super::ParkedSession`]).

use super::reply::Replies;
use super::{Local, Session, State, Table};
use crate::counters::Counters;
use socket2::SockAddr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::net::UdpSocket;

impl Table {
    /// Take in a session another relay parked (see [`super::super::ParkedSession`]):
    /// ready at once, its reply task started, its last activity as old as
    /// it was. A session for a client the table has already, or one the
    /// socket of which cannot be registered, is dropped.
    pub(in crate::udp) fn adopt(&mut self, parked: super::super::ParkedSession) {
        let super::super::ParkedSession {
            peer,
            local,
            socket,
            idle_ms,
        } = parked;
        if self.by_peer.contains_key(&peer) {
            return;
        }
        let socket = match socket
            .set_nonblocking(true)
            .and_then(|()| UdpSocket::from_std(socket))
        {
            Ok(s) => Arc::new(s),
            Err(e) => {
                tracing::debug!(%peer, error = %e, "a handed-over UDP session's socket is unusable");
                return;
            }
        };
        let (slot, generation) = self.new_slot();
        let now = self.shared.clock.now();
        let last = now.saturating_sub(idle_ms);
        let local = local
            .filter(|_| self.shared.answer_from_dst)
            .map(|ip| match ip {
                std::net::IpAddr::V4(a) => Local::V4(a),
                std::net::IpAddr::V6(a) => Local::V6(a),
            });
        let last = Arc::new(AtomicU64::new(last));
        // Its audit counts from here (the daemon before wrote nothing).
        let to_client: Option<Arc<AtomicU64>> = self.shared.on_end.is_some().then(Arc::default);
        let replies = Replies {
            socket: socket.clone(),
            shared: self.shared.clone(),
            peer: SockAddr::from(peer),
            local,
            last: last.clone(),
            to_client: to_client.clone(),
            slot,
            generation,
        };
        let indexed = last.load(Ordering::Relaxed);
        self.slots[slot] = Some(Session {
            peer,
            generation,
            last,
            indexed,
            local,
            state: State::Ready { socket },
            task: Some(tokio::spawn(replies.run())),
            started: now,
            to_target: 0,
            to_client,
        });
        self.by_peer.insert(peer, slot);
        self.lru.insert((indexed, slot));
        Counters::inc(&self.shared.counters.udp_sessions);
    }

    /// Whether a session still waits for its upstream socket.
    pub(in crate::udp) fn pending(&self) -> bool {
        self.slots
            .iter()
            .flatten()
            .any(|s| matches!(s.state, State::Pending { .. }))
    }

    /// Stop every session and give back those that have their socket, for
    /// another relay to [`Table::adopt`]. A session still waiting for its
    /// socket (the park waited for it in vain, `SETTLE_PENDING`) is closed:
    /// its queued datagrams are counted as drops.
    pub(in crate::udp) async fn park(&mut self) -> Vec<super::super::ParkedSession> {
        let now = self.shared.clock.now();
        let mut parked = Vec::with_capacity(self.by_peer.len());
        let mut tasks = Vec::with_capacity(self.by_peer.len());
        for slot in 0..self.slots.len() {
            let Some(mut s) = self.remove(slot) else {
                continue;
            };
            if let Some(task) = s.task.take() {
                task.abort();
                tasks.push(task);
            }
            match &s.state {
                State::Ready { socket } => {
                    // A second descriptor of the same socket: this one is
                    // closed (and deregistered) with the session.
                    match socket.as_fd().try_clone_to_owned() {
                        Ok(fd) => parked.push(super::super::ParkedSession {
                            peer: s.peer,
                            local: s.local.map(|l| match l {
                                Local::V4(a) => std::net::IpAddr::V4(a),
                                Local::V6(a) => std::net::IpAddr::V6(a),
                            }),
                            socket: std::net::UdpSocket::from(fd),
                            idle_ms: now.saturating_sub(s.last.load(Ordering::Relaxed)),
                        }),
                        Err(e) => {
                            tracing::debug!(peer = %s.peer, error = %e, "cannot keep a UDP session's socket")
                        }
                    }
                }
                State::Pending { lens, .. } => {
                    Counters::add(&self.shared.counters.udp_drops, lens.len() as u64);
                }
            }
        }
        for task in tasks {
            let _ = task.await;
        }
        parked
    }
}
