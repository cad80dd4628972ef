//! `elk-loadgen`: the benchmarks' client. Every mode is bounded in time and
//! prints one JSON object on stdout.
//!
//! - `conn-rate ADDR`: C threads each loop connect, send SIZE bytes, read
//!   SIZE bytes back, close — connections per second.
//! - `rr ADDR`: request/reply on persistent connections — latency p50/p99.
//! - `udp ADDR`: RATE datagrams/s of SIZE bytes from C sockets, counting the
//!   echoes that come back — delivered packets/s and loss.
//! - `fragile-device ADDR`: a device with a small listen backlog that
//!   accepts one connection per interval, each an echo (the server side).
//! - `burst ADDR`: N clients at once, each one exchange — how many complete
//!   and how long they take.
#![forbid(unsafe_code)]

mod fragile;

use anyhow::Context;
use clap::{Parser, Subcommand};
use serde_json::json;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "elk-loadgen",
    about = "Bounded load client for edgelink's benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand)]
enum Mode {
    /// Short connections per second.
    ConnRate {
        addr: SocketAddr,
        #[arg(long, default_value = "16")]
        concurrency: usize,
        #[arg(long, default_value = "5")]
        seconds: f64,
        #[arg(long, default_value = "64")]
        size: usize,
        /// Wait for the server to close first (as an HTTP server with
        /// `Connection: close` does): the server, not this client, then
        /// holds each connection's TIME_WAIT.
        #[arg(long)]
        server_closes: bool,
    },
    /// Request/reply latency on persistent connections.
    Rr {
        addr: SocketAddr,
        #[arg(long, default_value = "1")]
        concurrency: usize,
        #[arg(long, default_value = "5")]
        seconds: f64,
        #[arg(long, default_value = "64")]
        size: usize,
    },
    /// A TCP echo server (thread per connection) until killed: a peer fast
    /// enough not to be the bottleneck of a connection-rate test.
    EchoServer {
        addr: SocketAddr,
        /// Close each connection after echoing this many bytes (the server
        /// closes first, as an HTTP server with `Connection: close` does);
        /// 0: when the client does.
        #[arg(long, default_value = "0")]
        close_after: usize,
    },
    /// UDP echo load at a fixed offered rate.
    Udp {
        addr: SocketAddr,
        #[arg(long, default_value = "1")]
        concurrency: usize,
        #[arg(long, default_value = "5")]
        seconds: f64,
        #[arg(long, default_value = "1400")]
        size: usize,
        /// Datagrams per second offered, over all sockets (0: as fast as possible).
        #[arg(long, default_value = "50000")]
        rate: u64,
    },
    /// A device that listens with a small backlog and accepts slowly (one
    /// connection per interval, each an echo on its own thread), for
    /// SECONDS.
    FragileDevice {
        addr: SocketAddr,
        #[arg(long, default_value = "5")]
        backlog: i32,
        #[arg(long, default_value = "5")]
        accept_every_ms: u64,
        #[arg(long, default_value = "60")]
        seconds: f64,
    },
    /// CLIENTS connections at once, each: connect, SIZE bytes each way,
    /// close; all within TIMEOUT_S.
    Burst {
        addr: SocketAddr,
        #[arg(long, default_value = "200")]
        clients: usize,
        #[arg(long, default_value = "64")]
        size: usize,
        #[arg(long, default_value = "30")]
        timeout_s: f64,
    },
}

fn exchange(s: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<()> {
    s.write_all(buf)?;
    // read_exact, unlike a bare read, retries EINTR: with SO_RCVTIMEO set,
    // a stopped and continued process sees one (signal(7)).
    s.read_exact(buf)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((p / 100.0) * (v.len() - 1) as f64).round() as usize]
}

/// One short connection: connect, `buf` each way, and (server_closes) the
/// server's FIN before this side closes.
fn one_connection(addr: SocketAddr, buf: &mut [u8], server_closes: bool) -> std::io::Result<()> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    exchange(&mut s, buf)?;
    if server_closes {
        let mut rest = [0u8; 64];
        loop {
            match s.read(&mut rest)? {
                0 => break,
                _ => continue,
            }
        }
    }
    Ok(())
}

fn conn_rate(
    addr: SocketAddr,
    c: usize,
    secs: f64,
    size: usize,
    server_closes: bool,
) -> serde_json::Value {
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let threads: Vec<_> = (0..c)
        .map(|_| {
            let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
            std::thread::spawn(move || {
                let mut buf = vec![b'x'; size];
                while !stop.load(Ordering::Relaxed) {
                    match one_connection(addr, &mut buf, server_closes) {
                        Ok(()) => ok.fetch_add(1, Ordering::Relaxed),
                        Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let el = start.elapsed().as_secs_f64();
    json!({"mode": "conn-rate", "connections": ok.load(Ordering::Relaxed), "failed": failed.load(Ordering::Relaxed),
           "seconds": el, "per_second": ok.load(Ordering::Relaxed) as f64 / el})
}

fn rr(addr: SocketAddr, c: usize, secs: f64, size: usize) -> anyhow::Result<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let threads: Vec<_> = (0..c)
        .map(|_| {
            std::thread::spawn(move || -> std::io::Result<Vec<f64>> {
                let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
                s.set_nodelay(true)?;
                s.set_read_timeout(Some(Duration::from_secs(2)))?;
                let mut buf = vec![b'r'; size];
                let mut lat = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    exchange(&mut s, &mut buf)?;
                    lat.push(t.elapsed().as_secs_f64() * 1e6);
                }
                Ok(lat)
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in threads {
        all.extend(
            t.join()
                .map_err(|_| anyhow::anyhow!("client thread panicked"))??,
        );
    }
    let n = all.len();
    Ok(
        json!({"mode": "rr", "requests": n, "p50_us": pct(&mut all, 50.0), "p99_us": pct(&mut all, 99.0)}),
    )
}

fn udp(
    addr: SocketAddr,
    c: usize,
    secs: f64,
    size: usize,
    rate: u64,
) -> anyhow::Result<serde_json::Value> {
    let sent = Arc::new(AtomicU64::new(0));
    let got = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let per_thread = if rate == 0 {
        0
    } else {
        (rate / c as u64).max(1)
    };
    let start = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..c {
        let bind = if addr.is_ipv6() {
            "[::]:0"
        } else {
            "0.0.0.0:0"
        };
        let s = UdpSocket::bind(bind).context("bind")?;
        // The replies of a relay that sends in batches come in bursts: an
        // 8 MiB buffer (as the bench's echo has) keeps the client's own
        // buffer from being where they are lost. Needs CAP_NET_ADMIN beyond
        // net.core.rmem_max; best effort.
        let _ =
            nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::RcvBufForce, &(8 << 20));
        s.connect(addr)?;
        let r = s.try_clone()?;
        r.set_read_timeout(Some(Duration::from_millis(200)))?;
        let (got2, stop2) = (got.clone(), stop.clone());
        handles.push(std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            while !stop2.load(Ordering::Relaxed) {
                if r.recv(&mut buf).is_ok() {
                    got2.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
        let (sent2, stop3) = (sent.clone(), stop.clone());
        handles.push(std::thread::spawn(move || {
            let buf = vec![b'u'; size];
            let t0 = Instant::now();
            let mut n: u64 = 0;
            while !stop3.load(Ordering::Relaxed) {
                if per_thread > 0 {
                    let due = (t0.elapsed().as_secs_f64() * per_thread as f64) as u64;
                    if n >= due {
                        std::thread::sleep(Duration::from_micros(50));
                        continue;
                    }
                }
                if s.send(&buf).is_ok() {
                    n += 1;
                }
            }
            sent2.fetch_add(n, Ordering::Relaxed);
        }));
    }
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        let _ = h.join();
    }
    let el = start.elapsed().as_secs_f64();
    let (s, g) = (sent.load(Ordering::Relaxed), got.load(Ordering::Relaxed));
    Ok(
        json!({"mode": "udp", "sent": s, "received": g, "seconds": el,
              "delivered_per_second": g as f64 / el, "loss": if s > 0 { 1.0 - g as f64 / s as f64 } else { 0.0 }}),
    )
}

fn echo_server(addr: SocketAddr, close_after: usize) -> anyhow::Result<()> {
    let l = std::net::TcpListener::bind(addr).with_context(|| format!("bind {addr}"))?;
    for s in l.incoming() {
        let Ok(mut s) = s else { continue };
        std::thread::spawn(move || {
            let _ = s.set_nodelay(true);
            let mut buf = [0u8; 65536];
            let mut echoed = 0;
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if s.write_all(&buf[..n]).is_err() {
                            return;
                        }
                        echoed += n;
                        if close_after > 0 && echoed >= close_after {
                            return; // dropped: this side's FIN goes first
                        }
                    }
                }
            }
        });
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let out = match Cli::parse().mode {
        Mode::EchoServer { addr, close_after } => return echo_server(addr, close_after),
        Mode::ConnRate {
            addr,
            concurrency,
            seconds,
            size,
            server_closes,
        } => conn_rate(addr, concurrency, seconds.min(600.0), size, server_closes),
        Mode::Rr {
            addr,
            concurrency,
            seconds,
            size,
        } => rr(addr, concurrency, seconds.min(600.0), size)?,
        Mode::Udp {
            addr,
            concurrency,
            seconds,
            size,
            rate,
        } => udp(addr, concurrency, seconds.min(600.0), size, rate)?,
        Mode::FragileDevice {
            addr,
            backlog,
            accept_every_ms,
            seconds,
        } => fragile::device(
            addr,
            backlog,
            Duration::from_millis(accept_every_ms),
            seconds.min(86_400.0),
        )?,
        Mode::Burst {
            addr,
            clients,
            size,
            timeout_s,
        } => fragile::burst(
            addr,
            clients.clamp(1, 20_000),
            size,
            Duration::from_secs_f64(timeout_s.clamp(0.001, 600.0)),
        )?,
    };
    println!("{out}");
    Ok(())
}
