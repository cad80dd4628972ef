//! Heap held by idle UDP forwards, counted by a global allocator that keeps
//! the live total. A test binary of its own: the allocator is process-wide.
//!
//! A node daemon serves one UDP forward per pod that declares one, most of
//! them idle; each used to hold 64 datagram buffers of its own (~140 KiB),
//! which made edgelinkd grow by hundreds of MiB as pods came and went
//! (docs/reliability.md, item 31).

use edgelink_relay::{serve_udp, Counters, RefuseFn, SocketSource, UdpConfig};
use futures_util::future::BoxFuture;
use std::alloc::{GlobalAlloc, Layout, System};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is passed on to the system allocator unchanged; the
// counter only adds up the sizes it hands out and takes back.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is the system allocator's.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: as above.
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

struct Source;

impl SocketSource for Source {
    fn udp_socket(&self, _: SocketAddr) -> BoxFuture<'static, io::Result<std::net::UdpSocket>> {
        Box::pin(async {
            let s = std::net::UdpSocket::bind("127.0.0.1:0")?;
            s.set_nonblocking(true)?;
            Ok(s)
        })
    }

    fn tcp_socket(&self, _: SocketAddr) -> BoxFuture<'static, io::Result<socket2::Socket>> {
        Box::pin(async { Err(io::Error::other("no TCP here")) })
    }
}

/// Start `n` UDP forwards on the current thread, let each reach its first
/// wait, and return their stop senders and tasks.
async fn start(
    n: usize,
) -> Vec<(
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<io::Result<()>>,
)> {
    let target: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let refuse: Arc<RefuseFn> = Arc::new(|_, _| false);
    let mut out = Vec::new();
    for _ in 0..n {
        let listener = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve_udp(
            listener,
            target,
            Arc::new(Source),
            UdpConfig::default(),
            Arc::new(Counters::default()),
            refuse.clone(),
            async {
                let _ = rx.await;
            },
        ));
        out.push((tx, task));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    out
}

#[tokio::test(flavor = "current_thread")]
async fn an_idle_udp_forward_holds_a_few_kib_and_gives_them_back() {
    // Whatever one forward allocates once per thread (tokio's timer wheel,
    // per-thread buffers) is paid before the baseline.
    for (tx, task) in start(1).await {
        let _ = tx.send(());
        task.await.unwrap().unwrap();
    }
    let before = LIVE.load(Ordering::Relaxed);
    let n = 100;
    let forwards = start(n).await;
    let per_forward = (LIVE.load(Ordering::Relaxed) - before) / n as isize;
    assert!(
        per_forward < 16 * 1024,
        "each idle UDP forward holds {per_forward} bytes of heap"
    );
    for (tx, task) in forwards {
        let _ = tx.send(());
        task.await.unwrap().unwrap();
    }
    let left = LIVE.load(Ordering::Relaxed) - before;
    assert!(
        left < 64 * 1024,
        "{left} bytes still held after {n} UDP forwards stopped"
    );
}
