//! Device protection for one TCP forward: at most `maxConnections`
//! connections to the target at once, the clients beyond it waiting first
//! in, first out, for at most the queue timeout; connects retried with
//! backoff while a device restarts; and how long connects take.
//!
//! The queue holds accepted client connections, not the device's backlog:
//! an embedded TCP stack with a backlog of 5 sees at most `maxConnections`
//! connects, whatever the burst. Nothing here touches a socket but to see
//! whether a waiting client has gone.

use edgelink_status::LatencySnapshot;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};
use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};

/// The bounds in force for one forward (its keys, else the daemon's flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Connections to the target at once; `None`: no bound.
    pub max_connections: Option<u32>,
    /// How long a client may wait for a place.
    pub queue_timeout: Duration,
    /// Clients waiting at most; beyond it a new one is reset at once.
    pub max_queue: u32,
    /// Connects tried again after a failure.
    pub connect_retries: u32,
    /// The wait before the first retry; doubled each time, at most
    /// [`MAX_BACKOFF`].
    pub retry_backoff: Duration,
}

/// The longest wait between two connects.
pub const MAX_BACKOFF: Duration = Duration::from_secs(2);

impl Limits {
    /// The wait before retry `n` (0-based).
    pub fn backoff(&self, n: u32) -> Duration {
        self.retry_backoff
            .saturating_mul(1u32.checked_shl(n.min(16)).unwrap_or(u32::MAX))
            .min(MAX_BACKOFF)
    }
}

/// The upper bounds of the connect-latency buckets, in seconds.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A histogram of connect durations (successful connects only).
#[derive(Debug, Default)]
pub struct Latency {
    /// Per bucket, not cumulative; the last one is +Inf.
    counts: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_us: AtomicU64,
}

impl Latency {
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = LATENCY_BUCKETS
            .iter()
            .position(|&le| s <= le)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(
            u64::try_from(d.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    pub fn snapshot(&self) -> LatencySnapshot {
        let buckets: Vec<(Option<f64>, u64)> = self
            .counts
            .iter()
            .enumerate()
            .map(|(i, c)| (LATENCY_BUCKETS.get(i).copied(), c.load(Ordering::Relaxed)))
            .collect();
        LatencySnapshot {
            count: buckets.iter().map(|b| b.1).sum(),
            sum_seconds: self.sum_us.load(Ordering::Relaxed) as f64 / 1e6,
            buckets,
        }
    }
}

/// The queue and its counters, shared by every worker serving the forward.
#[derive(Debug)]
pub struct Protection {
    pub limits: Limits,
    /// One permit per connection to the target; FIFO (tokio's semaphore
    /// is fair), so the oldest waiting client goes first.
    slots: Option<Arc<Semaphore>>,
    /// Places given beyond the bound and not paid back yet ([`Place`]).
    debt: Arc<AtomicU64>,
    /// Clients waiting now.
    pub queued: Arc<AtomicU64>,
    /// Clients that had to wait, ever.
    pub queued_total: AtomicU64,
    /// Clients closed because they waited longer than the queue timeout.
    pub queue_timeouts: AtomicU64,
    /// Clients reset at once because the queue was full.
    pub queue_full: AtomicU64,
    /// Clients that reset while waiting.
    pub queue_abandoned: AtomicU64,
    /// Connects tried again.
    pub retries: AtomicU64,
    pub latency: Latency,
}

/// How a client's wait for a place ended.
#[derive(Debug)]
pub enum Admission {
    /// Go on; the place (if the forward has a bound) is held until the
    /// connection ends.
    Go(Option<Place>),
    /// Waited longer than the queue timeout.
    TimedOut,
    /// The queue was full.
    Full,
    /// The client reset while waiting.
    Left,
}

impl Protection {
    pub fn new(limits: Limits) -> Protection {
        Protection {
            slots: limits
                .max_connections
                .map(|n| Arc::new(Semaphore::new(n as usize))),
            limits,
            debt: Arc::default(),
            queued: Arc::default(),
            queued_total: AtomicU64::new(0),
            queue_timeouts: AtomicU64::new(0),
            queue_full: AtomicU64::new(0),
            queue_abandoned: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            latency: Latency::default(),
        }
    }

    /// Wait for a place for `client`: at once when the forward is below its
    /// bound, else in the queue until a place frees, the queue timeout
    /// passes, or the client resets ([`reset_by_peer`]; a half-close
    /// stays). (The daemon takes the turn and waits for it in two steps:
    /// [`Protection::enqueue`], [`Protection::wait`].)
    #[cfg(test)]
    pub async fn admit(&self, client: &tokio::net::TcpStream) -> Admission {
        let turn = self.enqueue(Instant::now());
        self.wait(turn, client).await
    }

    /// A client's turn, taken now for a client that waits since `since`:
    /// a place at once if one is free, else the last place in the queue
    /// (the semaphore is first in, first out from the moment it is first
    /// asked, which is here), with the queue timeout counted from `since`.
    /// A hand-over's waiting clients take theirs in order before the
    /// forward accepts anything new.
    pub fn enqueue(&self, since: Instant) -> Turn {
        let Some(slots) = &self.slots else {
            return Turn::Decided(Admission::Go(None));
        };
        if let Ok(p) = slots.clone().try_acquire_owned() {
            return Turn::Decided(Admission::Go(Some(self.place(p))));
        }
        let waiting = self.queued.fetch_add(1, Ordering::AcqRel);
        if waiting >= u64::from(self.limits.max_queue) {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            self.queue_full.fetch_add(1, Ordering::Relaxed);
            return Turn::Decided(Admission::Full);
        }
        self.queued_total.fetch_add(1, Ordering::Relaxed);
        // Out of the queue however the wait ends, also when it is dropped
        // (a hand-over takes the client along).
        let leave = Leave(self.queued.clone());
        let mut acquire: Acquire = Box::pin(slots.clone().acquire_owned());
        if let Poll::Ready(r) = acquire
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            // A place freed meanwhile.
            drop(leave);
            return Turn::Decided(match r {
                Ok(p) => Admission::Go(Some(self.place(p))),
                Err(_) => Admission::TimedOut,
            });
        }
        let deadline = since.checked_add(self.limits.queue_timeout);
        Turn::Waiting {
            acquire,
            deadline: deadline.map(tokio::time::Instant::from_std),
            _leave: leave,
        }
    }

    /// Wait for `turn` to come, the queue timeout to pass, or `client` to
    /// close.
    pub async fn wait(&self, turn: Turn, client: &tokio::net::TcpStream) -> Admission {
        let (acquire, deadline, _leave) = match turn {
            Turn::Decided(a) => return a,
            Turn::Waiting {
                acquire,
                deadline,
                _leave,
            } => (acquire, deadline, _leave),
        };
        let until = async move {
            match deadline {
                Some(d) => tokio::time::timeout_at(d, acquire).await.ok(),
                None => Some(acquire.await),
            }
        };
        tokio::select! {
            p = until => match p {
                Some(Ok(p)) => Admission::Go(Some(self.place(p))),
                // The semaphore is never closed; treat it as a timeout.
                Some(Err(_)) | None => {
                    self.queue_timeouts.fetch_add(1, Ordering::Relaxed);
                    Admission::TimedOut
                }
            },
            () = reset_by_peer(client) => {
                self.queue_abandoned.fetch_add(1, Ordering::Relaxed);
                Admission::Left
            }
        }
    }

    fn place(&self, p: OwnedSemaphorePermit) -> Place {
        Place {
            permit: Some(p),
            debt: self.debt.clone(),
        }
    }

    /// A place for a connection that is relayed already (handed over, or
    /// connecting when it was): at once, and beyond the bound if none is
    /// free. A place given beyond the bound is a debt: the places that
    /// free next are not given out again until it is paid, so the target
    /// is back under its bound as soon as enough of these end.
    pub fn take_place(&self) -> Option<Place> {
        let slots = self.slots.as_ref()?;
        if let Ok(p) = slots.clone().try_acquire_owned() {
            return Some(self.place(p));
        }
        self.debt.fetch_add(1, Ordering::AcqRel);
        slots.add_permits(1);
        // Nobody waits while a hand-over's connections take their places
        // (they go first); should someone, the place is its, and the debt
        // stays until a place frees.
        Some(Place {
            permit: slots.clone().try_acquire_owned().ok(),
            debt: self.debt.clone(),
        })
    }

    /// A place for a health probe: free now, or none. Never queued, never
    /// beyond the bound, and never while a client waits or a debt is
    /// unpaid (the probe must not pass a client). `Ok(None)`: the forward
    /// has no bound.
    pub fn try_place(&self) -> Result<Option<Place>, NoPlace> {
        let Some(slots) = &self.slots else {
            return Ok(None);
        };
        if self.queued.load(Ordering::Acquire) > 0 || self.debt.load(Ordering::Acquire) > 0 {
            return Err(NoPlace);
        }
        match slots.clone().try_acquire_owned() {
            Ok(p) => Ok(Some(self.place(p))),
            Err(_) => Err(NoPlace),
        }
    }

    /// Connections to the target now (places out, those beyond the bound
    /// included).
    pub fn in_use(&self) -> Option<u64> {
        let slots = self.slots.as_ref()?;
        let max = u64::from(self.limits.max_connections?) + self.debt.load(Ordering::Acquire);
        Some(max.saturating_sub(slots.available_permits() as u64))
    }
}

/// Every place under `maxConnections` is taken, or clients wait for one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoPlace;

type Acquire = Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send>>;

/// A client's turn under `maxConnections` ([`Protection::enqueue`]).
pub enum Turn {
    Decided(Admission),
    Waiting {
        acquire: Acquire,
        deadline: Option<tokio::time::Instant>,
        _leave: Leave,
    },
}

impl std::fmt::Debug for Turn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Turn::Decided(a) => write!(f, "Decided({a:?})"),
            Turn::Waiting { deadline, .. } => write!(f, "Waiting(until {deadline:?})"),
        }
    }
}

/// Counts a client in the queue while it lives.
#[derive(Debug)]
pub struct Leave(Arc<AtomicU64>);

impl Drop for Leave {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A connection's place under `maxConnections`, held until it ends. While
/// the forward is in debt ([`Protection::take_place`]) a place that frees
/// pays one back instead of going to the next client.
#[derive(Debug)]
pub struct Place {
    permit: Option<OwnedSemaphorePermit>,
    debt: Arc<AtomicU64>,
}

impl Drop for Place {
    fn drop(&mut self) {
        let Some(p) = self.permit.take() else { return };
        let paid = self
            .debt
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| d.checked_sub(1));
        if paid.is_ok() {
            p.forget();
        }
    }
}

/// Resolves when `client` has reset the connection or it failed (a
/// pending socket error: RST, ICMP, keepalive), never on its FIN: a client
/// that only reads may half-close at once and still wait for the device's
/// answer; its bytes and its FIN reach the device once it is let in (the
/// relay passes a half-close on). Reads nothing and consumes no error.
pub async fn reset_by_peer(client: &tokio::net::TcpStream) {
    loop {
        match client.ready(tokio::io::Interest::ERROR).await {
            Ok(r) if r.is_error() => return,
            // Not an error after all (spurious): wait again.
            Ok(_) => tokio::task::yield_now().await,
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};

    fn limits(max: u32, queue: u32, timeout_ms: u64) -> Limits {
        Limits {
            max_connections: Some(max),
            queue_timeout: Duration::from_millis(timeout_ms),
            max_queue: queue,
            connect_retries: 0,
            retry_backoff: Duration::from_millis(100),
        }
    }

    async fn pair(l: &TcpListener) -> (TcpStream, TcpStream) {
        let peer = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (ours, _) = l.accept().await.unwrap();
        (ours, peer)
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let l = limits(1, 1, 1);
        assert_eq!(l.backoff(0), Duration::from_millis(100));
        assert_eq!(l.backoff(1), Duration::from_millis(200));
        assert_eq!(l.backoff(3), Duration::from_millis(800));
        assert_eq!(l.backoff(5), MAX_BACKOFF);
        assert_eq!(l.backoff(u32::MAX), MAX_BACKOFF);
    }

    #[test]
    fn latency_lands_in_its_bucket() {
        let h = Latency::default();
        h.observe(Duration::from_micros(300));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(30));
        let s = h.snapshot();
        assert_eq!(s.count, 3);
        assert_eq!(s.buckets[0], (Some(0.0005), 1));
        assert_eq!(s.buckets[3], (Some(0.005), 1));
        assert_eq!(s.buckets.last(), Some(&(None, 1)));
        assert!((s.sum_seconds - 30.0033).abs() < 1e-6, "{}", s.sum_seconds);
    }

    #[tokio::test]
    async fn clients_wait_first_in_first_out_and_time_out() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let p = Arc::new(Protection::new(limits(1, 8, 5_000)));
        let (a, _pa) = pair(&l).await;
        let Admission::Go(Some(first)) = p.admit(&a).await else {
            panic!("the first client waits")
        };
        assert_eq!(p.in_use(), Some(1));
        // Three wait, in order.
        let (order_tx, mut order_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut peers = Vec::new();
        for i in 0..3 {
            let (c, peer) = pair(&l).await;
            peers.push(peer);
            let (q, tx) = (p.clone(), order_tx.clone());
            tokio::spawn(async move {
                if let Admission::Go(Some(permit)) = q.admit(&c).await {
                    tx.send(i).unwrap();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    drop(permit);
                }
            });
            // Queue in this order.
            while p.queued.load(Ordering::Acquire) < i + 1 {
                tokio::task::yield_now().await;
            }
        }
        assert_eq!(p.queued_total.load(Ordering::Relaxed), 3);
        drop(first);
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(order_rx.recv().await.unwrap());
        }
        assert_eq!(got, [0, 1, 2]);
        assert_eq!(p.queued.load(Ordering::Acquire), 0);

        // A short queue timeout closes a client that waits too long.
        let p = Protection::new(limits(1, 8, 50));
        let (a, _pa) = pair(&l).await;
        let Admission::Go(Some(_held)) = p.admit(&a).await else {
            panic!()
        };
        let (b, _pb) = pair(&l).await;
        assert!(matches!(p.admit(&b).await, Admission::TimedOut));
        assert_eq!(p.queue_timeouts.load(Ordering::Relaxed), 1);
        assert_eq!(p.queued.load(Ordering::Acquire), 0);
    }

    #[tokio::test]
    async fn a_full_queue_refuses_and_a_client_that_resets_is_dropped() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let p = Arc::new(Protection::new(limits(1, 1, 10_000)));
        let (a, _pa) = pair(&l).await;
        let Admission::Go(Some(_held)) = p.admit(&a).await else {
            panic!()
        };
        let (b, mut pb) = pair(&l).await;
        let p2 = p.clone();
        let waiting = tokio::spawn(async move { p2.admit(&b).await });
        while p.queued.load(Ordering::Acquire) < 1 {
            tokio::task::yield_now().await;
        }
        let (c, _pc) = pair(&l).await;
        assert!(matches!(p.admit(&c).await, Admission::Full));
        assert_eq!(p.queue_full.load(Ordering::Relaxed), 1);
        // Its half-close is not leaving: it may wait for the answer.
        pb.shutdown().await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !waiting.is_finished(),
            "a half-closed client left the queue"
        );
        assert_eq!(p.queued.load(Ordering::Acquire), 1);
        // The waiting client resets: it leaves the queue at once.
        pb.set_zero_linger().unwrap();
        drop(pb);
        let out = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the queue noticed the client leave")
            .unwrap();
        assert!(matches!(out, Admission::Left), "{out:?}");
        assert_eq!(p.queue_abandoned.load(Ordering::Relaxed), 1);
        assert_eq!(p.queued.load(Ordering::Acquire), 0);
    }

    /// A hand-over's waiting clients take their turns in their order,
    /// whatever order their tasks then run in; one whose queue timeout
    /// passed before (it counts from its first arrival) times out.
    #[tokio::test]
    async fn turns_taken_in_order_are_served_in_order_and_keep_their_clock() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let p = Arc::new(Protection::new(limits(1, 8, 60_000)));
        let held = p.take_place().unwrap();
        let mut peers = Vec::new();
        let mut turns = Vec::new();
        for _ in 0..3 {
            let (c, peer) = pair(&l).await;
            peers.push(peer);
            turns.push((c, p.enqueue(Instant::now())));
        }
        assert_eq!(p.queued.load(Ordering::Acquire), 3);
        // Waited for last to first.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for (i, (c, turn)) in turns.into_iter().enumerate().rev() {
            let (q, tx) = (p.clone(), tx.clone());
            tokio::spawn(async move {
                if let Admission::Go(Some(place)) = q.wait(turn, &c).await {
                    tx.send(i).unwrap();
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    drop(place);
                }
            });
        }
        drop(held);
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(rx.recv().await.unwrap());
        }
        assert_eq!(got, [0, 1, 2]);

        let _held = p.take_place().unwrap();
        let (c, _peer) = pair(&l).await;
        let long_ago = Instant::now().checked_sub(Duration::from_secs(61)).unwrap();
        let turn = p.enqueue(long_ago);
        assert!(matches!(p.wait(turn, &c).await, Admission::TimedOut));
        assert_eq!(p.queued.load(Ordering::Acquire), 0);
    }

    /// Three relayed connections handed to a forward bounded at one: all
    /// keep going; a waiting client gets a place only once all three ended.
    #[tokio::test]
    async fn places_beyond_the_bound_are_paid_back_before_anyone_waiting_goes() {
        use futures_util::FutureExt;
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let p = Protection::new(limits(1, 8, 60_000));
        let mut places: Vec<Place> = (0..3).map(|_| p.take_place().unwrap()).collect();
        assert_eq!(p.in_use(), Some(3));
        let (c, _peer) = pair(&l).await;
        let turn = p.enqueue(Instant::now());
        let mut waiting = Box::pin(p.wait(turn, &c));
        assert!((&mut waiting).now_or_never().is_none());
        for left in [2, 1] {
            drop(places.pop());
            assert!(
                (&mut waiting).now_or_never().is_none(),
                "{left} still relayed"
            );
            assert_eq!(p.in_use(), Some(left));
        }
        drop(places.pop());
        let got = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .unwrap();
        let Admission::Go(Some(place)) = got else {
            panic!("{got:?}")
        };
        assert_eq!(p.in_use(), Some(1));
        drop(place);
        assert_eq!(p.in_use(), Some(0));
    }

    #[tokio::test]
    async fn without_a_bound_everyone_goes() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let p = Protection::new(Limits {
            max_connections: None,
            ..limits(1, 1, 1)
        });
        let (a, _pa) = pair(&l).await;
        assert!(matches!(p.admit(&a).await, Admission::Go(None)));
        assert_eq!(p.in_use(), None);
    }
}
