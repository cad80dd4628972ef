//! The topology every test builds for itself, and echo servers on the
//! device:
//!
//! ```text
//!  client                pod                               device
//!  eth0 10.99.0.1 ─veth─ eth0 10.99.0.2   net1 172.31.50.1 ─veth─ eth0 172.31.50.10
//!       fd00:99::1            fd00:99::2       fd00:50::1              fd00:50::10
//! ```
//!
//! The client routes the private segment via the pod and the device routes
//! the cluster side via the pod, so only the pod's ruleset stands between
//! them. Namespaces are named `elkk-<role>-<pid>-<n>` and deleted on drop,
//! also when a test fails; no link or route is ever made outside them.

use edgelink_kernel_path::Options;
use edgelink_netns::Netns;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub const CLIENT: &str = "10.99.0.1";
pub const POD: &str = "10.99.0.2";
pub const POD_NET1: &str = "172.31.50.1";
pub const DEVICE: &str = "172.31.50.10";
pub const POD6: &str = "fd00:99::2";
pub const POD_NET1_6: &str = "fd00:50::1";
pub const DEVICE6: &str = "fd00:50::10";
/// The device's echo ports.
pub const TCP_ECHO: u16 = 7000;
pub const UDP_ECHO: u16 = 7001;

/// How long one exchange may take before it counts as "no answer".
pub const WAIT: Duration = Duration::from_secs(2);

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// The nft program, or why the test cannot run.
pub fn nft_or_skip(test: &str) -> Option<PathBuf> {
    let nft = ["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("nft"));
    let works = Command::new(&nft)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let ip = Command::new("ip")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout == b"0\n");
    let reason = if !works {
        "no nft program (Debian package nftables)"
    } else if !ip {
        "no ip program (iproute2)"
    } else if !root {
        "not root: namespaces and nftables need CAP_NET_ADMIN and CAP_SYS_ADMIN"
    } else {
        return Some(nft);
    };
    eprintln!("{test}: skipped: {reason}");
    None
}

pub fn options(nft: PathBuf) -> Options {
    Options {
        nft,
        ..Options::default()
    }
}

/// A named network namespace, deleted on drop.
pub struct Ns {
    pub name: String,
    pub netns: Netns,
}

impl Ns {
    pub fn new(role: &str) -> Ns {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let name = format!("elkk-{role}-{}-{n}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        must(Command::new("ip").args(["netns", "add", &name]).output());
        // From here on, Drop cleans up even if the rest fails.
        let guard = NsName(name.clone());
        let netns = Netns::open(format!("/var/run/netns/{name}")).expect("open netns");
        std::mem::forget(guard);
        let ns = Ns { name, netns };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// `ip -n <ns> ARGS`, which must succeed.
    pub fn ip(&self, args: &[&str]) {
        must(
            Command::new("ip")
                .args(["-n", &self.name])
                .args(args)
                .output(),
        );
    }

    /// A program run inside the namespace, whatever its outcome.
    pub fn exec(&self, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .output()
            .expect("run ip netns exec")
    }

    /// A sysctl file as this namespace shows it.
    pub fn read(&self, path: &'static str) -> String {
        self.netns
            .run_on_thread(|| std::fs::read_to_string(path))
            .expect("enter netns")
            .unwrap_or_else(|e| panic!("read {path} in {}: {e}", self.name))
            .trim()
            .to_string()
    }

    pub fn write(&self, path: &'static str, value: &str) {
        self.netns
            .run_on_thread(|| std::fs::write(path, value))
            .expect("enter netns")
            .unwrap_or_else(|e| panic!("write {path} in {}: {e}", self.name));
    }

    /// Run `f` on a thread inside the namespace (its sockets stay there).
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        self.netns.run_on_thread(f).expect("enter netns")
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        drop(NsName(self.name.clone()));
    }
}

struct NsName(String);

impl Drop for NsName {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

fn must(out: io::Result<Output>) {
    let out = out.expect("spawn ip");
    assert!(
        out.status.success(),
        "ip failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The three namespaces, linked and addressed, with echo servers on the
/// device. Fields drop in order: servers stop before namespaces go.
pub struct Lab {
    pub echo: Echo,
    pub client: Ns,
    pub pod: Ns,
    pub device: Ns,
}

impl Lab {
    pub fn new() -> Lab {
        let client = Ns::new("client");
        let pod = Ns::new("pod");
        let device = Ns::new("device");
        // Each veth is made inside the pod and its peer moved straight into
        // the other namespace: nothing appears in the host's.
        pod.ip(&[
            "link",
            "add",
            "eth0",
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &client.name,
        ]);
        pod.ip(&[
            "link",
            "add",
            "net1",
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &device.name,
        ]);
        for (ns, dev, v4, v6) in [
            (&client, "eth0", CLIENT, "fd00:99::1"),
            (&pod, "eth0", POD, POD6),
            (&pod, "net1", POD_NET1, POD_NET1_6),
            (&device, "eth0", DEVICE, DEVICE6),
        ] {
            ns.ip(&["addr", "add", &format!("{v4}/24"), "dev", dev]);
            ns.ip(&["addr", "add", &format!("{v6}/64"), "dev", dev, "nodad"]);
            ns.ip(&["link", "set", dev, "up"]);
        }
        client.ip(&["route", "add", "172.31.50.0/24", "via", POD]);
        client.ip(&["-6", "route", "add", "fd00:50::/64", "via", POD6]);
        device.ip(&["route", "add", "10.99.0.0/24", "via", POD_NET1]);
        device.ip(&["-6", "route", "add", "fd00:99::/64", "via", POD_NET1_6]);
        let echo = Echo::start(&device, &[DEVICE, DEVICE6]);
        Lab {
            echo,
            client,
            pod,
            device,
        }
    }
}

/// TCP and UDP echo servers on [`TCP_ECHO`] and [`UDP_ECHO`] of some
/// addresses of a namespace, which note every peer address they see. They stop when dropped, and in any
/// case after a minute.
pub struct Echo {
    stop: Arc<AtomicBool>,
    pub peers: Arc<Mutex<Vec<SocketAddr>>>,
    threads: Vec<JoinHandle<()>>,
}

impl Echo {
    pub fn start(ns: &Ns, ips: &[&str]) -> Echo {
        let stop = Arc::new(AtomicBool::new(false));
        let peers = Arc::new(Mutex::new(Vec::new()));
        let mut threads = Vec::new();
        for ip in ips {
            let tcp_addr = SocketAddr::new(ip.parse().unwrap(), TCP_ECHO);
            let udp_addr = SocketAddr::new(ip.parse().unwrap(), UDP_ECHO);
            let (listener, udp) = ns.run(|| {
                (
                    TcpListener::bind(tcp_addr).expect("bind tcp echo"),
                    UdpSocket::bind(udp_addr).expect("bind udp echo"),
                )
            });
            let (s, p) = (stop.clone(), peers.clone());
            threads.push(std::thread::spawn(move || tcp_echo(listener, s, p)));
            let (s, p) = (stop.clone(), peers.clone());
            threads.push(std::thread::spawn(move || udp_echo(udp, s, p)));
        }
        Echo {
            stop,
            peers,
            threads,
        }
    }

    pub fn peers(&self) -> Vec<SocketAddr> {
        self.peers.lock().unwrap().clone()
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

const SERVE_AT_MOST: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(20);

fn tcp_echo(listener: TcpListener, stop: Arc<AtomicBool>, peers: Arc<Mutex<Vec<SocketAddr>>>) {
    listener.set_nonblocking(true).unwrap();
    let end = Instant::now() + SERVE_AT_MOST;
    while !stop.load(Ordering::SeqCst) && Instant::now() < end {
        match listener.accept() {
            Ok((mut conn, peer)) => {
                peers.lock().unwrap().push(peer);
                conn.set_nonblocking(false).unwrap();
                conn.set_read_timeout(Some(WAIT)).unwrap();
                // One connection at a time is enough for these tests.
                let mut buf = [0u8; 16 * 1024];
                loop {
                    match conn.read(&mut buf) {
                        // SO_RCVTIMEO is set: a stop and continue of the
                        // test process is an EINTR, not an end (signal(7)).
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Ok(n @ 1..) if conn.write_all(&buf[..n]).is_ok() => continue,
                        _ => break,
                    }
                }
                let _ = conn.shutdown(Shutdown::Both);
            }
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

fn udp_echo(sock: UdpSocket, stop: Arc<AtomicBool>, peers: Arc<Mutex<Vec<SocketAddr>>>) {
    sock.set_read_timeout(Some(POLL * 5)).unwrap();
    let end = Instant::now() + SERVE_AT_MOST;
    let mut buf = [0u8; 2048];
    while !stop.load(Ordering::SeqCst) && Instant::now() < end {
        if let Ok((n, peer)) = sock.recv_from(&mut buf) {
            peers.lock().unwrap().push(peer);
            let _ = sock.send_to(&buf[..n], peer);
        }
    }
}

/// Connect from inside `ns`, send `payload`, half-close, read all back.
pub fn tcp_exchange(ns: &Ns, to: SocketAddr, payload: &[u8]) -> io::Result<Vec<u8>> {
    ns.run(|| {
        let mut s = TcpStream::connect_timeout(&to, WAIT)?;
        s.set_read_timeout(Some(WAIT))?;
        s.set_write_timeout(Some(WAIT))?;
        s.write_all(payload)?;
        s.shutdown(Shutdown::Write)?;
        let mut back = Vec::new();
        s.read_to_end(&mut back)?;
        Ok(back)
    })
}

/// Send one datagram from inside `ns` (from one socket, `tries` times at
/// most) and wait for an answer.
pub fn udp_exchange(ns: &Ns, to: SocketAddr, payload: &[u8], tries: u32) -> io::Result<Vec<u8>> {
    ns.run(|| {
        let any: SocketAddr = if to.is_ipv4() {
            "0.0.0.0:0".parse().unwrap()
        } else {
            "[::]:0".parse().unwrap()
        };
        let s = UdpSocket::bind(any)?;
        s.set_read_timeout(Some(WAIT / 2))?;
        let mut buf = [0u8; 2048];
        let mut last = io::Error::new(io::ErrorKind::TimedOut, "no answer");
        for _ in 0..tries {
            s.send_to(payload, to)?;
            match s.recv_from(&mut buf) {
                Ok((n, _)) => return Ok(buf[..n].to_vec()),
                Err(e) => last = e,
            }
        }
        Err(last)
    })
}

pub fn addr(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().unwrap(), port)
}
