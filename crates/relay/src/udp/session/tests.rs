//! Unit tests of the session table: the send fallback, LRU eviction and
//! its cost, the idle sweep.

use super::*;
use futures_util::future::BoxFuture;

/// Sockets that never come: sessions stay pending, which is all the
/// table's bookkeeping needs.
struct NeverSource;

impl SocketSource for NeverSource {
    fn udp_socket(&self, _: SocketAddr) -> BoxFuture<'static, io::Result<std::net::UdpSocket>> {
        Box::pin(std::future::pending())
    }
    fn tcp_socket(&self, _: SocketAddr) -> BoxFuture<'static, io::Result<socket2::Socket>> {
        Box::pin(std::future::pending())
    }
}

fn table(max_sessions: usize) -> Table {
    let listener = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let (created, _) = mpsc::unbounded_channel();
    let (ended, _) = mpsc::unbounded_channel();
    Table::new(Shared {
        listener: Arc::new(UdpSocket::from_std(listener).unwrap()),
        target: "127.0.0.1:9"
            .parse::<std::net::SocketAddr>()
            .unwrap()
            .into(),
        source: Arc::new(NeverSource),
        counters: Arc::new(Counters::default()),
        refuse: Arc::new(|_, _| false),
        answer_from_dst: false,
        batch: 64,
        max_sessions,
        clock: Clock::new(),
        created,
        ended,
        gso_to_target: AtomicBool::new(true),
        gso_to_client: AtomicBool::new(true),
        on_end: None,
    })
}

/// Client `i` (a loopback address: nothing is sent to it).
fn peer(i: usize) -> SocketAddr {
    let [_, a, b, c] = u32::try_from(i).unwrap().to_be_bytes();
    SocketAddr::from(([127, a, b, c], 4000))
}

/// A datagram from client `i` at time `now`, as `dispatch` records it.
fn from_client(t: &mut Table, i: usize, now: u64) {
    let (slot, _) = t.session_for(peer(i), None, now);
    t.touch(slot, now);
}

/// A reply to client `i` at time `now`, as its reply task records it
/// (behind the table's back).
fn reply_to(t: &Table, i: usize, now: u64) {
    let slot = t.by_peer[&peer(i)];
    let s = t.slots[slot].as_ref().unwrap();
    s.last.fetch_max(now, Ordering::Relaxed);
}

fn live(t: &Table) -> Vec<usize> {
    let mut v: Vec<usize> = (0..64)
        .filter(|&i| t.by_peer.contains_key(&peer(i)))
        .collect();
    v.sort_unstable();
    v
}

#[tokio::test]
async fn eviction_takes_the_least_recently_used_session() {
    let mut t = table(4);
    for i in 0..4 {
        from_client(&mut t, i, i as u64);
    }
    from_client(&mut t, 0, 10); // client 0 sends again
    reply_to(&t, 1, 11); // the target answers client 1
                         // Oldest now: 2 (t=2), 3 (t=3), 0 (t=10), 1 (t=11).
    from_client(&mut t, 4, 12);
    assert_eq!(live(&t), [0, 1, 3, 4]);
    from_client(&mut t, 5, 13);
    assert_eq!(live(&t), [0, 1, 4, 5]);
    from_client(&mut t, 6, 14);
    assert_eq!(live(&t), [1, 4, 5, 6]);
    reply_to(&t, 4, 20);
    from_client(&mut t, 7, 21);
    assert_eq!(live(&t), [4, 5, 6, 7]);
    from_client(&mut t, 8, 22);
    assert_eq!(live(&t), [4, 6, 7, 8]);
    assert_eq!(Counters::get(&t.shared.counters.udp_evictions), 5);
    assert_eq!(Counters::get(&t.shared.counters.udp_sessions), 4);
    assert_eq!(t.lru.len(), 4, "one index entry per session");
}

#[tokio::test]
async fn each_session_that_ends_is_reported_with_how() {
    use crate::udp::{SessionEnd, SessionEnded, SessionHook};
    let ends: Arc<std::sync::Mutex<Vec<SessionEnd>>> = Arc::default();
    let seen = ends.clone();
    let mut t = table(2);
    Arc::get_mut(&mut t.shared).unwrap().on_end =
        Some(SessionHook(Arc::new(move |e| seen.lock().unwrap().push(e))));
    from_client(&mut t, 0, 0);
    from_client(&mut t, 1, 1);
    from_client(&mut t, 2, 2); // evicts client 0
    t.sweep_at(1_000_000, 1_000); // both others idle
    let ends = ends.lock().unwrap();
    let got: Vec<(SocketAddr, SessionEnded)> = ends.iter().map(|e| (e.peer, e.how)).collect();
    assert_eq!(
        got,
        [
            (peer(0), SessionEnded::Evicted),
            (peer(1), SessionEnded::Idle),
            (peer(2), SessionEnded::Idle)
        ]
    );
    assert!(ends
        .iter()
        .all(|e| e.bytes_to_target == 0 && e.bytes_to_client == 0));
}

/// Eviction looks at one index entry (plus one per session whose
/// replies it had not seen), whatever the table's size: before, it
/// scanned every slot, for every new client of a full table.
#[tokio::test]
async fn eviction_cost_does_not_grow_with_the_table() {
    const NEW_CLIENTS: usize = 100;
    for size in [16, 20_000] {
        let mut t = table(size);
        for i in 0..size {
            from_client(&mut t, i, i as u64);
        }
        assert_eq!(t.evict_visits, 0);
        for k in 0..NEW_CLIENTS {
            from_client(&mut t, size + k, (size + k) as u64);
        }
        assert_eq!(
            t.evict_visits, NEW_CLIENTS as u64,
            "index entries looked at for {NEW_CLIENTS} evictions in a table of {size}"
        );
        // Replies to the next 10 oldest: each costs one more look, once.
        let before = t.evict_visits;
        let later = (size + NEW_CLIENTS) as u64;
        for i in NEW_CLIENTS..NEW_CLIENTS + 10 {
            reply_to(&t, i, later);
        }
        from_client(&mut t, size + NEW_CLIENTS, later + 1);
        assert_eq!(t.evict_visits - before, 11);
        assert!(!t.by_peer.contains_key(&peer(NEW_CLIENTS + 10)));
        assert_eq!(t.lru.len(), size);
        assert_eq!(t.by_peer.len(), size);
    }
}

#[tokio::test]
async fn sweep_closes_the_idle_sessions_only() {
    let mut t = table(64);
    for i in 0..10 {
        from_client(&mut t, i, i as u64);
    }
    reply_to(&t, 2, 50);
    from_client(&mut t, 5, 40);
    t.sweep_at(60, 30);
    assert_eq!(live(&t), [2, 5]);
    assert_eq!(t.lru.len(), 2);
    t.sweep_at(79, 30);
    assert_eq!(live(&t), [2]);
    t.sweep_at(80, 30);
    assert!(live(&t).is_empty());
    assert!(t.lru.is_empty());
    assert_eq!(Counters::get(&t.shared.counters.udp_sessions), 0);
}

#[test]
fn send_all_falls_back_when_gso_is_refused() {
    let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    tx.connect(rx.local_addr().unwrap()).unwrap();
    crate::sockopt::refuse_gso(&tx);
    let payloads: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 800]).collect();
    let slices: Vec<IoSlice<'_>> = payloads.iter().map(|p| IoSlice::new(p)).collect();
    let gso = AtomicBool::new(true);
    assert_eq!(
        send_all(tx.as_fd(), &slices, None, None, &gso, &AtomicU64::new(0)),
        (10, 0)
    );
    assert!(
        !gso.load(Ordering::Relaxed),
        "GSO stays off after a refusal"
    );
    rx.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 2048];
    for (i, want) in payloads.iter().enumerate() {
        let n = crate::udp::mmsg::tests::recv_from(&rx, &mut buf).unwrap().0;
        assert_eq!(&buf[..n], &want[..], "datagram {i}");
    }
}
