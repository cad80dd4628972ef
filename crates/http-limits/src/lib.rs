//! Bounds for the small HTTP/1 endpoints that untrusted clients reach:
//! edgelinkd's status server and edgelink-operator's endpoint. hyper's
//! defaults let a client that sends an unfinished request head hold ~408 KiB
//! of buffer for as long as it likes, on as many connections as it opens.
//! Here a connection:
//!
//! - buffers at most [`MAX_BUF`] bytes of request (a longer head is refused
//!   with 431 and the connection closed);
//! - must send its whole request head within `header_timeout` of the
//!   moment the server starts waiting for it (after accept, and after each
//!   answer on a kept-alive connection);
//! - lives at most `conn_timeout`, whatever it does;
//! - is one of at most `max_connections`: at the cap, a new connection
//!   takes the place of the oldest one that is waiting for a request head
//!   (a client being answered is never cut), or is closed at once when
//!   every held connection is being answered.
//!
//! So the memory of idle and slow clients is bounded by
//! `max_connections x (MAX_BUF + a connection's state)`, and a probe that
//! sends its request at once is answered even while slow clients fill the
//! cap. It serves nothing itself and knows no paths: the caller's
//! service does.

#![forbid(unsafe_code)]

use hyper::body::{Body, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// The request buffer of a connection (hyper's minimum is 8 KiB). A
/// request head of edgelinkd or the operator is well below 2 KiB (a
/// ServiceAccount token is about 1 KiB); bodies stream through it.
pub const MAX_BUF: usize = 16 << 10;

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub conn_timeout: Duration,
}

struct Entry {
    /// A request is being answered: not to be evicted.
    busy: AtomicBool,
    evict: Notify,
}

/// The connections held, oldest first.
pub struct Slots {
    cap: usize,
    held: Mutex<VecDeque<Arc<Entry>>>,
}

/// One held connection; dropping it frees its place.
pub struct Slot {
    slots: Arc<Slots>,
    entry: Arc<Entry>,
}

impl Slots {
    pub fn new(max_connections: usize) -> Arc<Slots> {
        Arc::new(Slots {
            cap: max_connections.max(1),
            held: Mutex::new(VecDeque::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Arc<Entry>>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for a new connection: a free one, else the oldest waiting
    /// connection's (which is told to close). `None` when every held
    /// connection is being answered: close the new one.
    pub fn admit(self: &Arc<Self>) -> Option<Slot> {
        let mut held = self.lock();
        if held.len() >= self.cap {
            let idle = held.iter().position(|e| !e.busy.load(Ordering::Acquire))?;
            if let Some(old) = held.remove(idle) {
                old.evict.notify_one();
            }
        }
        let entry = Arc::new(Entry {
            busy: AtomicBool::new(false),
            evict: Notify::new(),
        });
        held.push_back(entry.clone());
        Some(Slot {
            slots: self.clone(),
            entry,
        })
    }

    /// How many connections are held now.
    pub fn held(&self) -> usize {
        self.lock().len()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.slots.lock();
        if let Some(i) = held.iter().position(|e| Arc::ptr_eq(e, &self.entry)) {
            held.remove(i);
        }
    }
}

/// Marks its slot busy while a request is being answered.
struct Busy(Arc<Entry>);

impl Busy {
    fn new(e: &Arc<Entry>) -> Busy {
        e.busy.store(true, Ordering::Release);
        Busy(e.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
    }
}

/// The HTTP/1 server settings of [`Limits`].
pub fn builder(limits: &Limits) -> hyper::server::conn::http1::Builder {
    let mut b = hyper::server::conn::http1::Builder::new();
    b.max_buf_size(MAX_BUF)
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    b
}

/// Serve one accepted connection with `handle` until it ends, its
/// `conn_timeout` passes, or a newer connection takes its slot.
pub async fn serve<F, Fut, B>(stream: tokio::net::TcpStream, limits: Limits, slot: Slot, handle: F)
where
    F: Fn(Request<Incoming>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Response<B>, std::convert::Infallible>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let entry = slot.entry.clone();
    let svc = hyper::service::service_fn(move |req| {
        let busy = Busy::new(&entry);
        let answer = handle(req);
        async move {
            let r = answer.await;
            drop(busy);
            r
        }
    });
    let conn = builder(&limits).serve_connection(TokioIo::new(stream), svc);
    tokio::select! {
        _ = tokio::time::timeout(limits.conn_timeout, conn) => {}
        () = slot.entry.evict.notified() => {}
    }
    drop(slot);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_cap_the_oldest_waiting_connection_makes_room() {
        let slots = Slots::new(2);
        let a = slots.admit().unwrap();
        let b = slots.admit().unwrap();
        let busy_a = Busy::new(&a.entry);
        let c = slots.admit().expect("b waits: c takes its place");
        assert_eq!(slots.held(), 2);
        // b was told to go, a (being answered) was not.
        assert!(futures_ready(b.entry.evict.notified()));
        assert!(!futures_ready(a.entry.evict.notified()));
        let busy_c = Busy::new(&c.entry);
        assert!(slots.admit().is_none(), "all busy: refused");
        drop(busy_a);
        drop(busy_c);
        drop(b); // b's task ends: its place was already taken
        assert_eq!(slots.held(), 2);
        drop(a);
        assert_eq!(slots.held(), 1);
        let _d = slots.admit().unwrap();
        assert_eq!(slots.held(), 2);
    }

    /// Whether a future is ready at its first poll.
    fn futures_ready(f: impl Future) -> bool {
        let mut f = std::pin::pin!(f);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        f.as_mut().poll(&mut cx).is_ready()
    }
}
