//! The fragile-device scenario: a device with a tiny listen backlog that
//! accepts slowly (`fragile-device`), and a burst of clients that all
//! connect at once (`burst`). Both bounded in time.

use anyhow::Context;
use serde_json::json;
use socket2::{Domain, Protocol, Socket, Type};
use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Listens with `backlog` and accepts one connection every `every`, like an
/// embedded TCP stack; each accepted connection is an echo on its own
/// thread (read, write back, until EOF). Returns after `secs`.
pub fn device(
    addr: SocketAddr,
    backlog: i32,
    every: Duration,
    secs: f64,
) -> anyhow::Result<serde_json::Value> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.bind(&addr.into())
        .with_context(|| format!("bind {addr}"))?;
    s.listen(backlog)
        .with_context(|| format!("listen {addr}"))?;
    let l: std::net::TcpListener = s.into();
    l.set_nonblocking(true)?;
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let mut accepted: u64 = 0;
    let mut next = start;
    while Instant::now() < deadline {
        let now = Instant::now();
        if now < next {
            std::thread::sleep(next - now);
            continue;
        }
        match l.accept() {
            Ok((c, _)) => {
                accepted += 1;
                next = Instant::now() + every;
                let left = deadline.saturating_duration_since(Instant::now());
                let _ = std::thread::Builder::new()
                    .stack_size(64 << 10)
                    .spawn(move || serve(c, left));
            }
            // Nothing waiting: look again in a millisecond (the pace is an
            // upper bound on the accept rate, not a timer that must tick).
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(_) => next = Instant::now() + every,
        }
    }
    Ok(
        json!({"mode": "fragile-device", "accepted": accepted, "backlog": backlog,
              "accept_every_ms": every.as_secs_f64() * 1e3, "seconds": start.elapsed().as_secs_f64()}),
    )
}

fn serve(mut c: TcpStream, left: Duration) {
    let _ = c.set_nonblocking(false);
    let _ = c.set_nodelay(true);
    let _ = c.set_read_timeout(Some(left.max(Duration::from_millis(1))));
    let mut buf = [0u8; 4096];
    loop {
        match c.read(&mut buf) {
            // SO_RCVTIMEO is set: a stop and continue is an EINTR.
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if c.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}

/// Why one client of a burst failed: the phase and the error's kind.
fn kind(phase: &str, e: &io::Error) -> String {
    let k = match e.kind() {
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => "timeout",
        io::ErrorKind::ConnectionRefused => "refused",
        io::ErrorKind::ConnectionReset => "reset",
        io::ErrorKind::BrokenPipe => "broken pipe",
        io::ErrorKind::UnexpectedEof => "eof",
        io::ErrorKind::InvalidData => "wrong bytes",
        _ => "other",
    };
    format!("{phase} {k}")
}

fn one(addr: SocketAddr, size: usize, deadline: Instant) -> Result<(), String> {
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let mut s = TcpStream::connect_timeout(&addr, left()).map_err(|e| kind("connect", &e))?;
    let x = |e: io::Error| kind("exchange", &e);
    s.set_nodelay(true).map_err(x)?;
    s.set_write_timeout(Some(left())).map_err(x)?;
    let msg: Vec<u8> = (0..size).map(|i| b'a' + (i % 26) as u8).collect();
    s.write_all(&msg).map_err(x)?;
    let mut got = vec![0u8; size];
    let mut n = 0;
    while n < size {
        s.set_read_timeout(Some(left())).map_err(x)?;
        match s.read(&mut got[n..]) {
            Ok(0) => return Err(x(io::ErrorKind::UnexpectedEof.into())),
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(x(e)),
        }
    }
    if got != msg {
        return Err(x(io::ErrorKind::InvalidData.into()));
    }
    Ok(())
}

/// `clients` connections started at once (a barrier), each: connect, send
/// `size` bytes, read them back, close; everything within `timeout`.
pub fn burst(
    addr: SocketAddr,
    clients: usize,
    size: usize,
    timeout: Duration,
) -> anyhow::Result<serde_json::Value> {
    let go = Arc::new(Barrier::new(clients + 1));
    let mut threads = Vec::with_capacity(clients);
    for _ in 0..clients {
        let go = go.clone();
        let t = std::thread::Builder::new()
            .stack_size(64 << 10)
            .spawn(move || {
                let (start, deadline) = {
                    go.wait();
                    let t = Instant::now();
                    (t, t + timeout)
                };
                one(addr, size, deadline).map(|()| start.elapsed().as_secs_f64() * 1e3)
            })
            .context("spawn a client thread")?;
        threads.push(t);
    }
    let start = Instant::now();
    go.wait();
    let mut done = Vec::new();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    for t in threads {
        match t.join() {
            Ok(Ok(ms)) => done.push(ms),
            Ok(Err(k)) => *errors.entry(k).or_default() += 1,
            Err(_) => *errors.entry("panic".into()).or_default() += 1,
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let completed = done.len();
    let max = done.iter().copied().fold(0.0, f64::max);
    Ok(
        json!({"mode": "burst", "clients": clients, "completed": completed,
              "failed": clients - completed, "errors": errors,
              "p50_ms": super::pct(&mut done, 50.0), "p99_ms": super::pct(&mut done, 99.0),
              "max_ms": max, "seconds": seconds}),
    )
}
