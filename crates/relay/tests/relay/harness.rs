//! Shared pieces: a runtime, a relay between a listener and an upstream
//! address, servers, a deterministic byte stream and a SHA-256 of it.

use edgelink_relay::{splice_duplex, Counters, PipePool, SocketSource, TcpRelayConfig};
use futures_util::future::BoxFuture;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinHandle;

/// A two-worker runtime, like the machine's two cores.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Tests that load both cores run one at a time.
pub fn heavy() -> MutexGuard<'static, ()> {
    static HEAVY: Mutex<()> = Mutex::new(());
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Raise the soft descriptor limit to the hard one.
pub fn raise_nofile() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).expect("setrlimit");
}

/// A listener with a backlog for many simultaneous connects.
pub fn listen(addr: SocketAddr) -> TcpListener {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .expect("socket");
    socket.set_reuseaddr(true).expect("reuseaddr");
    socket.bind(addr).expect("bind");
    socket.listen(4096).expect("listen")
}

/// A relay: accepts on `addr`, connects each client to `upstream` and runs
/// `splice_duplex` in a task per connection.
pub struct TcpRelay {
    pub addr: SocketAddr,
    pub pool: Arc<PipePool>,
    pub counters: Arc<Counters>,
    pub results: Arc<Mutex<Vec<io::Result<()>>>>,
    pub started: Arc<AtomicUsize>,
    accept: JoinHandle<()>,
}

impl TcpRelay {
    pub async fn start(upstream: SocketAddr, cfg: TcpRelayConfig) -> TcpRelay {
        Self::start_with_pool(upstream, cfg.clone(), PipePool::new(cfg.pipe_size, 64)).await
    }

    pub async fn start_with_pool(
        upstream: SocketAddr,
        cfg: TcpRelayConfig,
        pool: Arc<PipePool>,
    ) -> TcpRelay {
        let listener = listen("127.0.0.1:0".parse().unwrap());
        let addr = listener.local_addr().unwrap();
        let counters = Arc::new(Counters::default());
        let results = Arc::new(Mutex::new(Vec::new()));
        let started = Arc::new(AtomicUsize::new(0));
        let cfg = Arc::new(cfg);
        let accept = {
            let (pool, counters, results, started) = (
                pool.clone(),
                counters.clone(),
                results.clone(),
                started.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        return;
                    };
                    started.fetch_add(1, Ordering::SeqCst);
                    let (pool, counters, results, cfg) =
                        (pool.clone(), counters.clone(), results.clone(), cfg.clone());
                    tokio::spawn(async move {
                        let result = match TcpStream::connect(upstream).await {
                            Ok(up) => splice_duplex(client, up, &pool, &counters, &cfg).await,
                            Err(e) => Err(e),
                        };
                        results.lock().unwrap().push(result);
                    });
                }
            })
        };
        TcpRelay {
            addr,
            pool,
            counters,
            results,
            started,
            accept,
        }
    }

    pub fn finished(&self) -> usize {
        self.results.lock().unwrap().len()
    }

    /// Wait until `n` relayed connections have ended.
    pub async fn wait_finished(&self, n: usize, within: Duration) {
        let deadline = Instant::now() + within;
        while self.finished() < n {
            assert!(
                Instant::now() < deadline,
                "only {} of {n} connections ended in {within:?}",
                self.finished()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Wait until no pipe is in use.
    pub async fn wait_no_pipe_in_use(&self, within: Duration) {
        let deadline = Instant::now() + within;
        while self.pool.stats().in_use != 0 {
            assert!(
                Instant::now() < deadline,
                "pipes still in use: {:?}",
                self.pool.stats()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Drop for TcpRelay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// A TCP echo server: each connection's bytes back until end of file, then
/// shutdown.
pub async fn echo_server() -> (SocketAddr, JoinHandle<()>) {
    let listener = listen("127.0.0.1:0".parse().unwrap());
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if conn.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
                let _ = conn.shutdown().await;
            });
        }
    });
    (addr, task)
}

/// A deterministic stream: a random block, each chunk stamped with its index.
pub struct Generator {
    block: Vec<u8>,
    index: u64,
}

impl Generator {
    pub fn new(chunk: usize, seed: u64) -> Generator {
        let mut x = seed | 1;
        let mut block = Vec::with_capacity(chunk);
        while block.len() < chunk {
            // xorshift64
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            block.extend_from_slice(&x.to_le_bytes());
        }
        block.truncate(chunk);
        Generator { block, index: 0 }
    }

    /// The next chunk.
    pub fn next_chunk(&mut self) -> &[u8] {
        let stamp = self.index.to_le_bytes();
        let len = self.block.len();
        self.block[..8].copy_from_slice(&stamp);
        self.block[len / 2..len / 2 + 8].copy_from_slice(&stamp);
        self.index += 1;
        &self.block
    }
}

/// SHA-256 by the system's `sha256sum` (optimised, unlike a debug build of
/// the sha2 crate, which hashes at ~50 MB/s), fed from a descriptor or a pipe.
pub struct Sha256Sum {
    child: Child,
}

impl Sha256Sum {
    /// Hash whatever is read from `fd` (a socket, say) until end of file.
    pub fn of_fd(fd: OwnedFd) -> Sha256Sum {
        Sha256Sum::spawn(Stdio::from(fd))
    }

    /// Hash what is written with [`Sha256Sum::write`].
    pub fn piped() -> Sha256Sum {
        Sha256Sum::spawn(Stdio::piped())
    }

    fn spawn(stdin: Stdio) -> Sha256Sum {
        // The Command (and with it our copy of `stdin`) is dropped at the
        // end of the statement, so the child alone holds the descriptor.
        let child = Command::new("sha256sum")
            .stdin(stdin)
            .stdout(Stdio::piped())
            .spawn()
            .expect("sha256sum (coreutils) is needed by this test");
        Sha256Sum { child }
    }

    pub fn write(&mut self, data: &[u8]) {
        self.child
            .stdin
            .as_mut()
            .expect("piped")
            .write_all(data)
            .expect("write to sha256sum");
    }

    /// The hex digest.
    pub fn finish(mut self) -> String {
        drop(self.child.stdin.take());
        let out = self.child.wait_with_output().expect("sha256sum");
        assert!(out.status.success(), "sha256sum failed");
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string()
    }
}

/// Upstream UDP sockets made in this namespace, counting how many.
#[derive(Default)]
pub struct LocalSource {
    pub made: AtomicUsize,
}

impl SocketSource for LocalSource {
    fn udp_socket(
        &self,
        target: SocketAddr,
    ) -> BoxFuture<'static, io::Result<std::net::UdpSocket>> {
        self.made.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            let bind: SocketAddr = if target.is_ipv4() {
                "0.0.0.0:0"
            } else {
                "[::]:0"
            }
            .parse()
            .unwrap();
            let s = std::net::UdpSocket::bind(bind)?;
            s.set_nonblocking(true)?;
            Ok(s)
        })
    }

    fn tcp_socket(&self, target: SocketAddr) -> BoxFuture<'static, io::Result<socket2::Socket>> {
        Box::pin(async move {
            let domain = socket2::Domain::for_address(target);
            let s = socket2::Socket::new(domain, socket2::Type::STREAM, None)?;
            s.set_nonblocking(true)?;
            Ok(s)
        })
    }
}

/// Poll `f` until it holds, at most `within`.
pub async fn eventually(within: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
