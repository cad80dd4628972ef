//! Where a hand-over gathers what the daemon served, and where the daemon
//! that takes over (or the same one, when a hand-over failed) finds it.
//!
//! Every task that holds something to hand over (an accept loop, a
//! relayed connection, a UDP forward, the status server) holds a
//! [`Guard`] and watches [`Lot::token`]. When the token is cancelled, each
//! stops at its next wait, puts what it holds in the lot ([`Lot::park`])
//! and ends; [`Lot::wait_parked`] returns once none is left. On the other
//! side, [`Lot::adopt`] files what arrived by forward, and
//! edgelink-forward's `start` takes a forward's share ([`Lot::claim`]) instead of
//! binding new sockets.

use edgelink_relay::{ParkedTcp, UdpForward};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// A forward: container ID, interface, forward name.
pub type ForwardId = (String, String, String);

/// A TCP connection handed over.
#[derive(Debug)]
pub enum ParkedConn {
    /// Relayed: both sockets and the state of each direction.
    Relaying(ParkedTcp),
    /// Accepted, waiting in the forward's queue or for its connect: the
    /// new daemon admits (or places) and connects it.
    Pending(Pending),
}

/// An accepted client not relayed yet.
#[derive(Debug)]
pub struct Pending {
    pub client: std::net::TcpStream,
    /// `None`: it had its place under `maxConnections` and was connecting.
    /// `Some`: it was waiting in the queue since then (the queue timeout
    /// counts from there, and the longest waiting goes first).
    pub queued_since: Option<Instant>,
}

impl ParkedConn {
    /// Close with a reset when dropped: nobody will serve it.
    pub fn reset(&self) {
        let socks: Vec<socket2::SockRef<'_>> = match self {
            ParkedConn::Relaying(p) => vec![(&p.client).into(), (&p.upstream).into()],
            ParkedConn::Pending(p) => vec![(&p.client).into()],
        };
        for s in socks {
            let _ = s.set_linger(Some(Duration::ZERO));
        }
    }
}

/// One thing a parked task left.
#[derive(Debug)]
pub enum Item {
    Listener(ForwardId, std::net::TcpListener),
    Conn(ForwardId, ParkedConn),
    Udp(ForwardId, UdpForward),
    Status(std::net::TcpListener),
}

/// A forward's share of a hand-over.
#[derive(Debug, Default)]
pub struct Adopted {
    pub listeners: Vec<std::net::TcpListener>,
    pub conns: Vec<ParkedConn>,
    pub udp: Vec<UdpForward>,
}

impl Adopted {
    pub fn is_empty(&self) -> bool {
        self.listeners.is_empty() && self.conns.is_empty() && self.udp.is_empty()
    }
}

#[derive(Default)]
pub struct Lot {
    token: Mutex<CancellationToken>,
    running: AtomicUsize,
    items: Mutex<Vec<Item>>,
    adopted: Mutex<HashMap<ForwardId, Adopted>>,
}

/// A task that will park when asked; counted while it lives.
pub struct Guard(Arc<Lot>);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::AcqRel);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Lot {
    /// What parkable tasks watch: cancelled when a hand-over starts.
    pub fn token(&self) -> CancellationToken {
        lock(&self.token).clone()
    }

    pub fn guard(self: &Arc<Self>) -> Guard {
        self.running.fetch_add(1, Ordering::AcqRel);
        Guard(self.clone())
    }

    pub fn park(&self, item: Item) {
        lock(&self.items).push(item);
    }

    /// Ask every parkable task to park.
    pub fn start_parking(&self) {
        lock(&self.token).cancel();
    }

    /// Wait until every parkable task has parked or ended; `false` if some
    /// are still running after `within`.
    pub async fn wait_parked(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while self.running.load(Ordering::Acquire) > 0 {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        true
    }

    /// Tasks that have not parked yet.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Acquire)
    }

    /// What the parked tasks left, and what was handed to this daemon (or
    /// taken back after a hand-over that failed) and no forward claimed
    /// yet: everything a hand-over must send.
    pub fn take_all(&self) -> Vec<Item> {
        let mut items = std::mem::take(&mut *lock(&self.items));
        let adopted: Vec<(ForwardId, Adopted)> = lock(&self.adopted).drain().collect();
        for (id, a) in adopted {
            items.extend(
                a.listeners
                    .into_iter()
                    .map(|l| Item::Listener(id.clone(), l)),
            );
            items.extend(a.conns.into_iter().map(|c| Item::Conn(id.clone(), c)));
            items.extend(a.udp.into_iter().map(|u| Item::Udp(id.clone(), u)));
        }
        items
    }

    /// At exit: everything still here is closed, its connections reset (a
    /// close would end them with a FIN, as if the streams were whole).
    /// Returns how many connections were reset.
    pub fn reset_all(&self) -> usize {
        let items = self.take_all();
        let mut n = 0;
        for i in &items {
            if let Item::Conn(_, c) = i {
                c.reset();
                n += 1;
            }
        }
        n
    }

    /// A fresh token, for tasks started after a hand-over that failed.
    pub fn reopen(&self) {
        *lock(&self.token) = CancellationToken::new();
    }

    /// File what arrived (or came back) by forward.
    pub fn adopt(&self, id: ForwardId, a: Adopted) {
        let mut m = lock(&self.adopted);
        let e = m.entry(id).or_default();
        e.listeners.extend(a.listeners);
        e.conns.extend(a.conns);
        e.udp.extend(a.udp);
    }

    /// A forward's share, once.
    pub fn claim(&self, id: &ForwardId) -> Option<Adopted> {
        lock(&self.adopted).remove(id)
    }

    /// What no forward claimed (its record is gone): closed, its
    /// connections reset. Returns the forwards dropped.
    pub fn drop_unclaimed(&self) -> Vec<ForwardId> {
        let left: Vec<(ForwardId, Adopted)> = lock(&self.adopted).drain().collect();
        let mut ids = Vec::new();
        for (id, a) in left {
            a.conns.iter().for_each(ParkedConn::reset);
            ids.push(id);
        }
        ids
    }
}

impl Item {
    /// Group items into adopted shares (a hand-over that failed gives its
    /// items back to this same process); the status listener apart.
    pub fn regroup(
        items: Vec<Item>,
    ) -> (HashMap<ForwardId, Adopted>, Option<std::net::TcpListener>) {
        let mut m: HashMap<ForwardId, Adopted> = HashMap::new();
        let mut status = None;
        for i in items {
            match i {
                Item::Listener(id, l) => m.entry(id).or_default().listeners.push(l),
                Item::Conn(id, c) => m.entry(id).or_default().conns.push(c),
                Item::Udp(id, u) => m.entry(id).or_default().udp.push(u),
                Item::Status(l) => status = Some(l),
            }
        }
        (m, status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> ForwardId {
        ("c".into(), "net1".into(), name.into())
    }

    /// What a failed hand-over took back and no pass served yet goes with
    /// the next hand-over, beside what tasks parked since.
    #[test]
    fn take_all_includes_what_was_taken_back_and_not_served_yet() {
        let lot = Arc::new(Lot::default());
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        lot.adopt(
            id("api"),
            Adopted {
                listeners: vec![l.try_clone().unwrap()],
                conns: vec![ParkedConn::Pending(Pending {
                    client,
                    queued_since: None,
                })],
                udp: Vec::new(),
            },
        );
        lot.park(Item::Listener(id("drain"), l));
        let items = lot.take_all();
        let names: Vec<&str> = items
            .iter()
            .map(|i| match i {
                Item::Listener(f, _) => f.2.as_str(),
                Item::Conn(f, _) => f.2.as_str(),
                _ => "other",
            })
            .collect();
        assert_eq!(items.len(), 3, "{names:?}");
        assert!(names.contains(&"drain") && names.iter().filter(|n| **n == "api").count() == 2);
        assert!(lot.claim(&id("api")).is_none());
        assert!(lot.take_all().is_empty());
    }
}
