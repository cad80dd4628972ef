//! The multiplexer of one device's Modbus/TCP port.
//!
//! Clients' requests go into one first-in first-out queue. Up to
//! `max_connections` tasks each keep a connection to the device and take
//! requests from the queue while fewer than `max_in_flight` are
//! outstanding on it; each gets a transaction id of that connection, and
//! its response goes back to its client with the client's id. What can go
//! wrong is answered, never passed on:
//!
//! - a frame from a client that is not Modbus/TCP resets that client only;
//! - a client that goes leaves nothing behind in the queue (its requests
//!   are skipped); a response to a request of its that was sent already is
//!   dropped;
//! - a request that waits longer than `queue_timeout`, or whose response
//!   takes longer than `response_timeout`, is answered with exception 0x0B;
//!   a request that finds the queue full, or the device unreachable after
//!   the connect retries, with 0x0A;
//! - a frame from the device that is not Modbus/TCP or answers no request
//!   drops that connection: its outstanding requests are answered 0x0B,
//!   and the connection is made again for the next request.

use crate::flight::{Answered, Flight, Sent};
use crate::frame::{self, Frame, GATEWAY_PATH_UNAVAILABLE, GATEWAY_TARGET_FAILED};
use crate::stats::Stats;
use futures_util::future::BoxFuture;
use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// How the multiplexer treats the device.
#[derive(Debug, Clone)]
pub struct Config {
    /// Connections to the device at most (a PLC: often 1).
    pub max_connections: usize,
    /// Requests outstanding per connection (most PLCs: 1).
    pub max_in_flight: usize,
    pub queue_timeout: Duration,
    pub response_timeout: Duration,
    /// Requests waiting at most; beyond, answered 0x0A at once.
    pub max_queue: usize,
    /// Connects tried again after a failure, with a doubling wait.
    pub connect_retries: u32,
    pub retry_backoff: Duration,
}

/// How to connect to the device (in the pod's namespace, by the caller).
pub type Connect = Arc<dyn Fn() -> BoxFuture<'static, io::Result<TcpStream>> + Send + Sync>;

/// Requests one client may have outstanding: beyond, its next one is not
/// read until one is answered.
const PER_CLIENT: usize = 16;

/// A client's request in the queue.
struct Request {
    frame: Frame,
    reply: mpsc::Sender<Frame>,
    at: Instant,
    permit: OwnedSemaphorePermit,
}

struct Inner {
    cfg: Config,
    connect: Connect,
    queue: Mutex<VecDeque<Request>>,
    /// A request was queued.
    work: Notify,
    stats: Arc<Stats>,
    stop: watch::Sender<bool>,
    started: Once,
}

/// One device's multiplexer; its tasks end when it is dropped.
pub struct Mux {
    inner: Arc<Inner>,
}

/// How a client's connection ended, and how many requests it made.
#[derive(Debug, PartialEq, Eq)]
pub struct ClientEnd {
    pub requests: u64,
    /// `None`: closed; else why it was reset.
    pub reset: Option<String>,
}

impl Drop for Mux {
    fn drop(&mut self) {
        let _ = self.inner.stop.send(true);
    }
}

impl Mux {
    pub fn new(cfg: Config, connect: Connect) -> Mux {
        Mux::with_stats(cfg, connect, Arc::default())
    }

    /// [`Mux::new`], counting into `stats` (kept by the caller across
    /// multiplexers of the same forward).
    pub fn with_stats(cfg: Config, connect: Connect, stats: Arc<Stats>) -> Mux {
        let cfg = Config {
            max_connections: cfg.max_connections.max(1),
            max_in_flight: cfg.max_in_flight.max(1),
            ..cfg
        };
        Mux {
            inner: Arc::new(Inner {
                cfg,
                connect,
                queue: Mutex::new(VecDeque::new()),
                work: Notify::new(),
                stats,
                stop: watch::channel(false).0,
                started: Once::new(),
            }),
        }
    }

    pub fn stats(&self) -> &Stats {
        &self.inner.stats
    }

    /// The device's connections and the queue's janitor, at the first
    /// client (they need the runtime).
    fn start(&self) {
        self.inner.started.call_once(|| {
            for _ in 0..self.inner.cfg.max_connections {
                tokio::spawn(upstream(self.inner.clone()));
            }
            tokio::spawn(janitor(self.inner.clone()));
        });
    }

    /// Serve one client until it closes (after its last answer) or is
    /// reset.
    pub async fn serve(&self, mut client: TcpStream) -> ClientEnd {
        self.start();
        let inner = &self.inner;
        let (tx, mut rx) = mpsc::channel::<Frame>(PER_CLIENT + 1);
        let permits = Arc::new(Semaphore::new(PER_CLIENT));
        let mut requests = 0u64;
        let reset = {
            let (mut rd, mut wr) = client.split();
            let reader = async {
                let tx = tx;
                loop {
                    let Ok(permit) = permits.clone().acquire_owned().await else {
                        return Ok(());
                    };
                    match frame::read(&mut rd).await {
                        Ok(Some(f)) => {
                            requests += 1;
                            inner.enqueue(f, &tx, permit);
                        }
                        Ok(None) => return Ok(()),
                        Err(e) => return Err(e),
                    }
                }
            };
            let writer = async {
                while let Some(f) = rx.recv().await {
                    wr.write_all(&f.encode(f.tid)).await?;
                }
                io::Result::Ok(())
            };
            tokio::pin!(reader, writer);
            // The reader's end first: a malformed frame resets the client at
            // once, without waiting for its queued requests' answers; a clean
            // end of file leaves them to the writer.
            tokio::select! {
                r = &mut reader => match r {
                    Ok(()) => None,
                    Err(e) => {
                        if matches!(e, frame::FrameError::Protocol(_) | frame::FrameError::Length(_)) {
                            Stats::inc(&inner.stats.malformed_from_clients);
                        }
                        Some(e.to_string())
                    }
                },
                w = &mut writer => Some(w.err().map_or("the client's answers ended".into(), |e| e.to_string())),
            }
        };
        if reset.is_some() {
            let _ = socket2::SockRef::from(&client).set_linger(Some(Duration::ZERO));
        }
        ClientEnd { requests, reset }
    }
}

impl Inner {
    /// Queue a client's request, or answer it 0x0A when the queue is full.
    fn enqueue(&self, f: Frame, reply: &mpsc::Sender<Frame>, permit: OwnedSemaphorePermit) {
        Stats::inc(&self.stats.requests);
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= self.cfg.max_queue {
            drop(q);
            if reply
                .try_send(f.exception(GATEWAY_PATH_UNAVAILABLE))
                .is_ok()
            {
                self.stats.exception(GATEWAY_PATH_UNAVAILABLE);
            }
            return;
        }
        q.push_back(Request {
            frame: f,
            reply: reply.clone(),
            at: Instant::now(),
            permit,
        });
        Stats::inc(&self.stats.queued);
        drop(q);
        self.work.notify_one();
    }

    /// The next request whose client is still there; those that waited
    /// too long are answered 0x0B on the way.
    fn pop(&self) -> Option<Request> {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(r) = q.pop_front() {
            self.stats
                .queued
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            let waited = r.at.elapsed();
            self.stats.waited(waited);
            if r.reply.is_closed() {
                continue;
            }
            if waited > self.cfg.queue_timeout {
                self.answer(&r, GATEWAY_TARGET_FAILED);
                continue;
            }
            return Some(r);
        }
        None
    }

    fn answer(&self, r: &Request, code: u8) {
        if r.reply.try_send(r.frame.exception(code)).is_ok() {
            self.stats.exception(code);
        }
    }

    fn queued(&self) -> bool {
        !self
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// Every queued request answered with `code` (the device cannot be
    /// reached).
    fn fail_queued(&self, code: u8) {
        let all: Vec<Request> = {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            q.drain(..).collect()
        };
        for r in all {
            self.stats
                .queued
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            if !r.reply.is_closed() {
                self.answer(&r, code);
            }
        }
    }

    /// Connect, trying again with a doubling wait.
    async fn connect(&self) -> io::Result<TcpStream> {
        let mut wait = self.cfg.retry_backoff;
        let mut tried = 0;
        loop {
            match (self.connect)().await {
                Ok(s) => return Ok(s),
                Err(e) if tried >= self.cfg.connect_retries => return Err(e),
                Err(e) => {
                    tracing::debug!(error = %e, retry = tried + 1, "modbus: connect failed");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(2));
                    tried += 1;
                }
            }
        }
    }
}

/// One connection to the device, made when there is work and made again
/// when lost.
async fn upstream(inner: Arc<Inner>) {
    let mut stop = inner.stop.subscribe();
    let mut made = false;
    loop {
        while !inner.queued() {
            tokio::select! {
                () = inner.work.notified() => {}
                _ = stop.changed() => return,
            }
        }
        let stream = tokio::select! {
            s = inner.connect() => s,
            _ = stop.changed() => return,
        };
        match stream {
            Ok(s) => {
                if made {
                    Stats::inc(&inner.stats.reconnects);
                }
                made = true;
                let _ = s.set_nodelay(true);
                if connection(&inner, s, &mut stop).await.is_err() {
                    return;
                }
                // A PLC notices a lost connection only when it next reads
                // it, and refuses a second one meanwhile: the next is made
                // after the retry backoff, not at once.
                tokio::select! {
                    () = tokio::time::sleep(inner.cfg.retry_backoff) => {}
                    _ = stop.changed() => return,
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "modbus: the device cannot be reached: queued requests answered 0x0A");
                inner.fail_queued(GATEWAY_PATH_UNAVAILABLE);
            }
        }
    }
}

/// The multiplexer is gone.
struct Stopped;

/// Serve the queue over one connection until it is lost (`Ok`) or the
/// multiplexer stops.
async fn connection(
    inner: &Inner,
    stream: TcpStream,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), Stopped> {
    let (mut rd, mut wr) = stream.into_split();
    // The reader in a task of its own: a frame read halfway is never lost
    // to a select.
    let (ftx, mut frames) = mpsc::channel(8);
    let reader = tokio::spawn(async move {
        loop {
            let f = frame::read(&mut rd).await;
            let end = !matches!(f, Ok(Some(_)));
            if ftx.send(f).await.is_err() || end {
                return;
            }
        }
    });
    let mut flight = Flight::default();
    let cfg = &inner.cfg;
    let r = loop {
        if fill(inner, &mut flight, &mut wr).await.is_err() {
            break Ok(());
        }
        let deadline = flight.deadline();
        let room = flight.len() < cfg.max_in_flight;
        tokio::select! {
            biased;
            _ = stop.changed() => break Err(Stopped),
            got = frames.recv() => match got {
                Some(Ok(Some(f))) => {
                    if let Answered::Unmatched(tid) = flight.answer(&inner.stats, f) {
                        Stats::inc(&inner.stats.malformed_from_device);
                        tracing::debug!(tid, "modbus: a response to no request: the connection is dropped");
                        break Ok(());
                    }
                }
                Some(Err(e)) => {
                    if matches!(e, frame::FrameError::Protocol(_) | frame::FrameError::Length(_)) {
                        Stats::inc(&inner.stats.malformed_from_device);
                    }
                    tracing::debug!(error = %e, "modbus: the device's connection failed");
                    break Ok(());
                }
                Some(Ok(None)) | None => break Ok(()),
            },
            () = inner.work.notified(), if room => {}
            () = sleep_until(deadline), if deadline.is_some() => {
                if !flight.expire(&inner.stats, Instant::now(), cfg.response_timeout) {
                    tracing::debug!("modbus: no response after twice the timeout: the connection is dropped");
                    break Ok(());
                }
            }
        }
    };
    reader.abort();
    flight.fail_all(&inner.stats, GATEWAY_TARGET_FAILED);
    r
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Send queued requests while the connection has room; passes the baton
/// to another connection when requests are left.
async fn fill(
    inner: &Inner,
    flight: &mut Flight,
    wr: &mut tokio::net::tcp::OwnedWriteHalf,
) -> io::Result<()> {
    let cfg = &inner.cfg;
    while flight.len() < cfg.max_in_flight {
        let Some(r) = inner.pop() else { break };
        let tid = flight.next_tid();
        let bytes = r.frame.encode(tid);
        let sent = Sent {
            client_tid: r.frame.tid,
            unit: r.frame.unit,
            function: r.frame.function(),
            reply: Some(r.reply),
            deadline: Instant::now() + cfg.response_timeout,
            permit: Some(r.permit),
        };
        flight.insert(tid, sent);
        match tokio::time::timeout(cfg.response_timeout, wr.write_all(&bytes)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(io::ErrorKind::TimedOut.into()),
        }
    }
    if inner.queued() {
        inner.work.notify_one();
    }
    Ok(())
}

/// Answers 0x0B to requests that waited in the queue longer than its
/// timeout while no connection took them (a device that is slow, or a
/// connection being made).
async fn janitor(inner: Arc<Inner>) {
    let mut stop = inner.stop.subscribe();
    loop {
        let oldest = {
            let q = inner.queue.lock().unwrap_or_else(|e| e.into_inner());
            q.front().map(|r| r.at)
        };
        let next = oldest.map_or(Instant::now() + inner.cfg.queue_timeout, |at| {
            at + inner.cfg.queue_timeout + Duration::from_millis(1)
        });
        tokio::select! {
            () = tokio::time::sleep_until(next) => expire_queue(&inner),
            _ = stop.changed() => return,
        }
    }
}

fn expire_queue(inner: &Inner) {
    let expired: Vec<Request> = {
        let mut q = inner.queue.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        while q
            .front()
            .is_some_and(|r| r.at.elapsed() > inner.cfg.queue_timeout)
        {
            out.extend(q.pop_front());
        }
        out
    };
    for r in expired {
        inner
            .stats
            .queued
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        inner.stats.waited(r.at.elapsed());
        if !r.reply.is_closed() {
            inner.answer(&r, GATEWAY_TARGET_FAILED);
        }
    }
}
