//! The demo's topology, as a fixture:
//!
//! ```text
//!   client (10.244.1.20) --eth0 veth eth0-- pod (10.244.1.10)
//!                                           pod net1 (plugin ADD, bridge edge0)
//!   node: edge0 + uplink0 --veth-- device dev0 (172.31.250.10)
//!   node: edgelinkd (status on 127.0.0.1:9310 inside the node netns)
//! ```
//!
//! The device's servers run in this test process, on a tokio runtime whose
//! threads live in the device namespace; clients run on one living in the
//! client namespace. Everything is torn down on drop (daemon killed first).

use edgelink_tests::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const POD_IP: &str = "10.244.1.10";
pub const CLIENT_IP: &str = "10.244.1.20";
pub const POD_IP6: &str = "fd00:244::10";
pub const CLIENT_IP6: &str = "fd00:244::20";
/// In the device's subnet, nobody there: connects time out.
pub const DEAD_IP: &str = "172.31.250.99";
pub const CID: &str = "proxy-0-cid";
pub const NET: &str = "plant-floor";

/// TCP echo (each side's end of file is passed on).
pub const API: u16 = 8080;
/// Reads to end of file, then answers "<bytes>\n" and closes.
pub const DRAIN: u16 = 9001;
/// Says hello, shuts its write side, then counts what it still receives.
pub const SPEAK: u16 = 9002;
/// Reads until the connection ends and notes how: end of file or reset.
pub const OBSERVE: u16 = 9003;
/// Says hello, then resets the connection.
pub const RESET: u16 = 9004;
/// Reads nothing until released, then everything.
pub const STALL: u16 = 9005;
/// Python SHA-256 sink, started by the 1 GiB test only.
pub const SINK: u16 = 9000;
/// Nothing listens on the device.
pub const CLOSED: u16 = 8081;
/// Forward to DEAD_IP, connectTimeoutMs 500.
pub const DOWN: u16 = 8082;
/// UDP echo.
pub const UDP: u16 = 5000;
/// With `Opts::v6`: TCP to the device's echo over IPv6.
pub const API6: u16 = 8086;
/// With `Opts::v6`: UDP to the device's echo over IPv6.
pub const UDP6: u16 = 5006;

pub const HELLO: &[u8] = b"hello from the device\n";

pub fn pod_addr(port: u16) -> SocketAddr {
    format!("{POD_IP}:{port}").parse().unwrap()
}

pub fn device_addr(port: u16) -> SocketAddr {
    format!("{DEVICE_V4}:{port}").parse().unwrap()
}

pub fn pod_addr6(port: u16) -> SocketAddr {
    format!("[{POD_IP6}]:{port}").parse().unwrap()
}

/// Lab options.
pub struct Opts<'a> {
    /// Extra `edgelinkd run` flags (after the lab's defaults).
    pub flags: &'a [&'a str],
    /// Start the daemon before ADD.
    pub daemon: bool,
    /// Run ADD (else the test does, with `l.add()`).
    pub add: bool,
    /// The soft RLIMIT_NOFILE the daemon starts with (default: the test
    /// process's, raised to the hard limit).
    pub nofile: Option<u64>,
    /// Dual-stack net1 and two more forwards to the device over IPv6.
    pub v6: bool,
    /// `--reconcile-interval 1`, for the tests about the periodic pass
    /// (reclaiming a deleted netns, retrying a listener). Everything else
    /// runs with the default (30 s), so that a record must be picked up by
    /// the inotify watch or the plugin's `rescan` nudge, as on a node.
    pub fast_reconcile: bool,
}

impl Default for Opts<'_> {
    fn default() -> Self {
        Opts {
            flags: &[],
            daemon: true,
            add: true,
            nofile: None,
            v6: false,
            fast_reconcile: false,
        }
    }
}

pub struct DLab {
    // Dropped first: the daemon, then the threads that use the namespaces,
    // then the namespaces.
    pub daemon: Option<Edgelinkd>,
    pub dev: NsRuntime,
    pub cl: NsRuntime,
    pub pod: Netns,
    pub client: Netns,
    pub lab: Lab,
    pub logs: tempfile::TempDir,
    pub conf: Value,
    pub result: Value,
    /// What the device's servers saw.
    pub seen: Arc<Seen>,
    pub flags: Vec<String>,
    pub nofile: Option<u64>,
    pub fast_reconcile: bool,
    starts: u32,
}

/// The flags every lab daemon gets: no probes (so the counters hold only
/// the tests' own traffic). The reconcile interval stays the default
/// unless `Opts::fast_reconcile`.
const BASE_FLAGS: &[&str] = &["--probe-interval", "0"];

/// What `Opts::fast_reconcile` adds.
const FAST_RECONCILE: &[&str] = &["--reconcile-interval", "1"];

/// A veth from `pod`'s eth0 (`pod_cidr`) to `client`'s `client_if`
/// (`client_cidr`), both up: the cluster network of a proxy pod.
pub fn cable(pod: &Netns, client: &Netns, client_if: &str, pod_cidr: &str, client_cidr: &str) {
    pod.ip(&[
        "link",
        "add",
        "eth0",
        "type",
        "veth",
        "peer",
        "name",
        client_if,
        "netns",
        &client.name,
    ]);
    pod.ip(&["addr", "add", pod_cidr, "dev", "eth0"]);
    client.ip(&["addr", "add", client_cidr, "dev", client_if]);
    pod.ip(&["link", "set", "eth0", "up"]);
    client.ip(&["link", "set", client_if, "up"]);
}

pub fn forwards() -> Value {
    json!([
        {"name": "api", "protocol": "tcp", "port": API, "target": format!("{DEVICE_V4}:{API}")},
        {"name": "drain", "protocol": "tcp", "port": DRAIN, "target": format!("{DEVICE_V4}:{DRAIN}")},
        {"name": "speak", "protocol": "tcp", "port": SPEAK, "target": format!("{DEVICE_V4}:{SPEAK}")},
        {"name": "observe", "protocol": "tcp", "port": OBSERVE, "target": format!("{DEVICE_V4}:{OBSERVE}")},
        {"name": "reset", "protocol": "tcp", "port": RESET, "target": format!("{DEVICE_V4}:{RESET}")},
        {"name": "stall", "protocol": "tcp", "port": STALL, "target": format!("{DEVICE_V4}:{STALL}")},
        {"name": "sink", "protocol": "tcp", "port": SINK, "target": format!("{DEVICE_V4}:{SINK}")},
        {"name": "closed", "protocol": "tcp", "port": CLOSED, "target": format!("{DEVICE_V4}:{CLOSED}")},
        {"name": "down", "protocol": "tcp", "port": DOWN, "target": format!("{DEAD_IP}:{DOWN}"),
         "connectTimeoutMs": 500},
        {"name": "telemetry", "protocol": "udp", "port": UDP, "target": format!("{DEVICE_V4}:{UDP}")}
    ])
}

impl DLab {
    pub fn new() -> DLab {
        DLab::with(Opts::default())
    }

    /// The lab with the daemon's `flags` and `extra` forwards beside the
    /// default ones (a JSON array), added and served.
    pub fn with_forwards(flags: &[&str], extra: serde_json::Value) -> DLab {
        let mut l = DLab::with(Opts {
            flags,
            add: false,
            ..Default::default()
        });
        l.conf["forwards"]
            .as_array_mut()
            .expect("the lab's forwards")
            .extend(extra.as_array().expect("a JSON array").iter().cloned());
        l.add();
        l.wait_serving();
        l
    }

    /// The lab with the daemon's `flags`, nothing started: no daemon, no
    /// ADD (the test starts them, `start_daemon` and `add`).
    pub fn idle(flags: &[&str]) -> DLab {
        DLab::with(Opts {
            flags,
            daemon: false,
            add: false,
            ..Default::default()
        })
    }

    pub fn with(opts: Opts<'_>) -> DLab {
        raise_nofile();
        let lab = Lab::new();
        let pod = lab.pod();
        let client = Netns::new("cli");
        cable(
            &pod,
            &client,
            "eth0",
            &format!("{POD_IP}/24"),
            &format!("{CLIENT_IP}/24"),
        );
        pod.ip(&[
            "addr",
            "add",
            &format!("{POD_IP6}/64"),
            "dev",
            "eth0",
            "nodad",
        ]);
        client.ip(&[
            "addr",
            "add",
            &format!("{CLIENT_IP6}/64"),
            "dev",
            "eth0",
            "nodad",
        ]);

        let dev = NsRuntime::new(&lab.device, 2);
        let cl = NsRuntime::new(&client, 2);
        let seen = Arc::new(Seen::default());
        start_servers(&dev, seen.clone());

        let mut conf = lab.bridge_conf("1.0.0");
        conf["forwards"] = forwards();
        if opts.v6 {
            conf["ipam"]["ranges"]
                .as_array_mut()
                .unwrap()
                .push(json!([{"subnet": "fd00:e1::/64", "rangeStart": "fd00:e1::100", "rangeEnd": "fd00:e1::1ff"}]));
            let f = conf["forwards"].as_array_mut().unwrap();
            f.push(json!({"name": "api6", "protocol": "tcp", "port": API6, "target": format!("[{DEVICE_V6}]:{API}")}));
            f.push(json!({"name": "tel6", "protocol": "udp", "port": UDP6, "target": format!("[{DEVICE_V6}]:{UDP}")}));
        }
        let mut l = DLab {
            daemon: None,
            dev,
            cl,
            pod,
            client,
            lab,
            logs: tempfile::tempdir().expect("tempdir"),
            conf,
            result: Value::Null,
            seen,
            flags: opts.flags.iter().map(|s| s.to_string()).collect(),
            nofile: opts.nofile,
            fast_reconcile: opts.fast_reconcile,
            starts: 0,
        };
        if opts.daemon {
            l.start_daemon();
        }
        if opts.add {
            l.add();
            if opts.daemon {
                l.wait_serving();
            }
        }
        l
    }

    /// ADD the lab's pod.
    pub fn add(&mut self) {
        self.result = self.call("ADD").ok();
    }

    /// The plugin, run as Multus runs it, for this lab's pod.
    pub fn call(&self, command: &str) -> CniOutput {
        let conf = if command == "ADD" {
            self.conf.clone()
        } else {
            with_prev(&self.conf, &self.result)
        };
        Call::new(command, CID, Some(&self.pod.path()), "net1")
            .args("IgnoreUnknown=1;K8S_POD_NAMESPACE=hil;K8S_POD_NAME=proxy-0")
            .run(&self.lab.node, &conf)
    }

    /// The next daemon's log file, and the flags every lab daemon gets.
    fn next_daemon(&mut self) -> (PathBuf, Vec<String>) {
        self.starts += 1;
        let log = self
            .logs
            .path()
            .join(format!("edgelinkd-{}.log", self.starts));
        // A base flag the test sets itself is left out (clap refuses a
        // flag given twice).
        let mut flags: Vec<&str> = BASE_FLAGS
            .chunks(2)
            .filter(|f| !self.flags.iter().any(|t| t == f[0]))
            .flatten()
            .copied()
            .collect();
        if self.fast_reconcile && !self.flags.iter().any(|t| t == FAST_RECONCILE[0]) {
            flags.extend_from_slice(FAST_RECONCILE);
        }
        flags.extend(self.flags.iter().map(String::as_str));
        (log, flags.into_iter().map(String::from).collect())
    }

    pub fn start_daemon(&mut self) {
        let (log, flags) = self.next_daemon();
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let daemon = Edgelinkd::start_with_nofile(
            &self.lab.node,
            self.lab.state.path(),
            log,
            &flags,
            self.nofile,
        );
        self.daemon = Some(daemon);
    }

    /// Start another daemon with `--takeover` (and the lab's flags plus
    /// `extra`) and return it, the running one left in place: the caller
    /// checks how each ended.
    pub fn spawn_takeover(&mut self, extra: &[&str]) -> Edgelinkd {
        let (log, flags) = self.next_daemon();
        let mut flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        flags.extend_from_slice(extra);
        Edgelinkd::take_over(&self.lab.node, self.lab.state.path(), log, &flags)
    }

    /// Upgrade: a new daemon takes over, the old one must exit 0 (bounded)
    /// and the new one serves on as the lab's daemon.
    pub fn take_over(&mut self) {
        let new = self.spawn_takeover(&[]);
        let mut old = self
            .daemon
            .replace(new)
            .expect("a daemon to take over from");
        let st = old.wait_exit(Duration::from_secs(10));
        assert!(
            st.is_some_and(|s| s.success()),
            "the old daemon did not exit 0 ({st:?}): {}\n--- new:\n{}",
            old.log_text(),
            self.daemon().log_text()
        );
        assert!(
            self.daemon().running() && self.daemon().log_text().contains("took over"),
            "the new daemon did not take over: {}",
            self.daemon().log_text()
        );
        // How long it took, from both sides' logs.
        let new_log = self.daemon().log_text();
        for line in old
            .log_text()
            .lines()
            .filter(|l| l.contains("handed over: exiting"))
            .chain(
                new_log
                    .lines()
                    .filter(|l| l.contains("taking over") || l.contains("serving attachment")),
            )
        {
            eprintln!("take-over: {line}");
        }
    }

    pub fn daemon(&mut self) -> &mut Edgelinkd {
        self.daemon.as_mut().expect("daemon started")
    }

    /// The pod's net1 address (no prefix).
    pub fn net1_ip(&self) -> String {
        let a = self.result["ips"][0]["address"]
            .as_str()
            .expect("ADD gave an address");
        a.split('/').next().unwrap().to_string()
    }

    pub fn record_path(&self) -> PathBuf {
        self.lab
            .state
            .path()
            .join("attachments")
            .join(format!("{CID}_net1.json"))
    }

    // -- the daemon's HTTP endpoint ------------------------------------

    pub fn http(&self, method: &str, path: &str) -> (u16, String, String) {
        http_in(&self.lab.node, "127.0.0.1:9310", method, path, b"")
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        let (code, _, body) = self.http("GET", path);
        (code, body)
    }

    pub fn status(&self) -> Value {
        let (code, body) = self.get("/status");
        assert_eq!(code, 200, "/status: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("/status is not JSON ({e}): {body}"))
    }

    /// The forward `name` of the lab's attachment in /status (Null if the
    /// attachment is not served).
    pub fn forward(&self, name: &str) -> Value {
        forward_of(&self.status(), name)
    }

    /// Wait (bounded) until `cond(status)` holds; returns the last status.
    /// Kill worker 0 (debug builds: SIGUSR2, the way a panic would) and
    /// wait until it is replaced and every forward listens again.
    pub fn kill_worker_0(&self) {
        self.daemon
            .as_ref()
            .expect("a daemon")
            .signal(nix::sys::signal::Signal::SIGUSR2);
        self.wait_status(
            Duration::from_secs(10),
            "worker replaced, all listening",
            |s| {
                s["workerReplacementsTotal"] == 1
                    && s["attachments"][0]["forwards"]
                        .as_array()
                        .is_some_and(|f| f.iter().all(|f| f["listener"] == "listening"))
            },
        );
    }

    /// The listening TCP sockets on `port` in the pod (`ss`): one per
    /// address family, shared by the workers.
    pub fn tcp_listeners_on(&self, port: u16) -> usize {
        let out = self.pod.exec(&["ss", "-Hltn", &format!("sport = :{port}")]);
        String::from_utf8_lossy(&out.stdout).lines().count()
    }

    pub fn wait_status(
        &self,
        timeout: Duration,
        what: &str,
        cond: impl Fn(&Value) -> bool,
    ) -> Value {
        let start = Instant::now();
        loop {
            let s = self.status();
            if cond(&s) {
                return s;
            }
            assert!(
                start.elapsed() < timeout,
                "{what}: not within {timeout:?}; /status: {s:#}"
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Wait until every forward of the attachment is listening, and it is
    /// the attachment of the last ADD (its net1 MAC): right after a DEL and
    /// an ADD the daemon may still report the old one, whose listeners its
    /// next pass closes before it opens the new ones.
    pub fn wait_serving(&self) -> Value {
        let n = ["forwards", "reverse"]
            .iter()
            .map(|k| self.conf[k].as_array().map_or(0, Vec::len))
            .sum();
        let mac = self.result["interfaces"]
            .as_array()
            .and_then(|i| {
                i.iter()
                    .find(|i| i["name"] == "net1" && i.get("sandbox").is_some())
            })
            .and_then(|i| i["mac"].as_str())
            .map(str::to_string);
        self.wait_status(Duration::from_secs(10), "all forwards listening", |s| {
            all_listening(s, CID, n)
                && mac.as_deref().is_none_or(|m| {
                    s["attachments"]
                        .as_array()
                        .and_then(|a| a.iter().find(|a| a["containerId"] == CID))
                        .is_some_and(|a| a["interface"]["mac"] == m)
                })
        })
    }

    /// A /metrics sample: the value of `metric` for forward `fwd`.
    pub fn metric(&self, metric: &str, fwd: &str) -> f64 {
        let (code, body) = self.get("/metrics");
        assert_eq!(code, 200);
        metric_value(&body, metric, fwd)
            .unwrap_or_else(|| panic!("no {metric} for forward {fwd} in:\n{body}"))
    }

    /// A /metrics sample without labels.
    pub fn metric_plain(&self, metric: &str) -> f64 {
        let (code, body) = self.get("/metrics");
        assert_eq!(code, 200);
        body.lines()
            .find_map(|l| {
                l.strip_prefix(metric)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("no {metric} in:\n{body}"))
    }

    // -- clients -----------------------------------------------------------

    /// TCP connect from the client namespace to the pod's eth0.
    pub fn connect(&self, port: u16) -> std::io::Result<TcpStream> {
        let s = connect_in(&self.client, pod_addr(port), Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.set_write_timeout(Some(Duration::from_secs(10)))?;
        Ok(s)
    }

    /// Whether a connect from the client to `port` is refused now.
    pub fn refused(&self, port: u16) -> bool {
        matches!(self.connect(port), Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused)
    }

    /// One echo round trip through `api` on a new connection.
    pub fn echo_once(&self, msg: &[u8]) {
        let mut s = self.connect(API).expect("connect to the api forward");
        assert_eq!(echo(&mut s, msg), msg);
    }

    /// Whether the attachment's record is gone, its address released.
    pub fn released(&self) -> bool {
        self.lab.records().is_empty() && self.lab.reserved(NET).is_empty()
    }
}

impl Drop for DLab {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(d) = &self.daemon {
                let log = d.log_text();
                let tail: Vec<&str> = log.lines().rev().take(60).collect();
                eprintln!(
                    "---- edgelinkd log (last lines) ----\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
        }
        if let Some(mut d) = self.daemon.take() {
            d.kill9();
        }
    }
}

pub fn forward_of(status: &Value, name: &str) -> Value {
    status["attachments"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["containerId"] == CID))
        .and_then(|a| a["forwards"].as_array())
        .and_then(|f| f.iter().find(|f| f["name"] == name))
        .cloned()
        .unwrap_or(Value::Null)
}

/// Whether attachment `cid` is served with its `n` forwards all listening.
pub fn all_listening(s: &Value, cid: &str, n: usize) -> bool {
    let a = s["attachments"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["containerId"] == cid));
    a.and_then(|a| a["forwards"].as_array())
        .is_some_and(|f| f.len() == n && f.iter().all(|f| f["listener"] == "listening"))
}

/// A sample of `metric` (full name) whose labels include forward="fwd".
pub fn metric_value(text: &str, metric: &str, fwd: &str) -> Option<f64> {
    let label = format!("forward=\"{fwd}\"");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(&format!("{metric}{{")) && l.contains(&label))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A UDP client in a namespace: bound to `source` (port 0) there and
/// connected to `to`.
pub struct UdpClient(std::net::UdpSocket);

impl UdpClient {
    pub fn new(ns: &Netns, source: &str, to: SocketAddr) -> UdpClient {
        let source = format!("{source}:0");
        UdpClient(in_netns(ns, move || {
            let u = std::net::UdpSocket::bind(&source).unwrap();
            u.connect(to).unwrap();
            u.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            u
        }))
    }

    /// Send `msg`, expecting nothing.
    pub fn send(&self, msg: &[u8]) {
        self.0.send(msg).unwrap();
    }

    /// Send `msg`; the answer (within 3 s).
    pub fn echo(&self, msg: &[u8]) -> Vec<u8> {
        self.0.send(msg).unwrap();
        let mut b = [0u8; 2048];
        let n = again(|| self.0.recv(&mut b)).expect("UDP answer");
        b[..n].to_vec()
    }
}

/// Write `msg`, read as many bytes back.
pub fn echo(s: &mut TcpStream, msg: &[u8]) -> Vec<u8> {
    s.write_all(msg).expect("write");
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back).expect("read the echo");
    back
}

/// How a read ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    Data(usize),
    Eof,
    Reset,
    TimedOut,
    Other(String),
}

/// Connect from `ns` to `addr` and read until something happens: how the
/// connection ended and how long that took. A connect that fails with a
/// reset (the reset came before the handshake was seen) counts as a reset.
pub fn connect_and_read(ns: &Netns, addr: SocketAddr) -> (Ended, Duration) {
    let t = Instant::now();
    let end = match connect_in(ns, addr, Duration::from_secs(3)) {
        Ok(mut s) => {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            read_end(&mut s)
        }
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ended::Reset,
        Err(e) => Ended::Other(format!("connect: {e}")),
    };
    (end, t.elapsed())
}

pub fn read_end(s: &mut TcpStream) -> Ended {
    let mut buf = [0u8; 4096];
    match again(|| s.read(&mut buf)) {
        Ok(0) => Ended::Eof,
        Ok(n) => Ended::Data(n),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ended::Reset,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Ended::TimedOut
        }
        Err(e) => Ended::Other(e.to_string()),
    }
}

// -- the device's servers ----------------------------------------------------

/// What the device's servers saw, per connection.
#[derive(Default)]
pub struct Seen {
    /// SPEAK: bytes received after it shut its write side.
    pub speak: Mutex<Vec<u64>>,
    /// SPEAK: the address each connection came from.
    pub speak_peers: Mutex<Vec<std::net::IpAddr>>,
    /// OBSERVE: "eof <bytes>" or "reset <bytes>".
    pub observed: Mutex<Vec<String>>,
    /// STALL: bytes received once released.
    pub stall: Mutex<Vec<u64>>,
    pub stall_release: tokio::sync::Notify,
}

/// Read until the end; (bytes, how it ended).
async fn read_all(s: &mut tokio::net::TcpStream) -> (u64, &'static str) {
    let mut buf = vec![0u8; 64 << 10];
    let mut n = 0u64;
    loop {
        match s.read(&mut buf).await {
            Ok(0) => return (n, "eof"),
            Ok(k) => n += k as u64,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (n, "reset"),
            Err(_) => return (n, "error"),
        }
    }
}

fn start_servers(dev: &NsRuntime, seen: Arc<Seen>) {
    let bind_at = |addr: SocketAddr| {
        dev.run(async move { tokio::net::TcpListener::bind(addr).await })
            .unwrap_or_else(|e| panic!("bind {addr} in the device: {e}"))
    };
    let bind = |port: u16| bind_at(device_addr(port));
    let echo6 = format!("[{DEVICE_V6}]:{API}").parse().unwrap();
    for echo_l in [bind(API), bind_at(echo6)] {
        dev.spawn(async move {
            while let Ok((s, _)) = echo_l.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.into_split();
                    if tokio::io::copy(&mut r, &mut w).await.is_ok() {
                        let _ = w.shutdown().await;
                    }
                });
            }
        });
    }
    let drain_l = bind(DRAIN);
    dev.spawn(async move {
        while let Ok((mut s, _)) = drain_l.accept().await {
            tokio::spawn(async move {
                let (n, how) = read_all(&mut s).await;
                if how != "eof" {
                    return;
                }
                let _ = s.write_all(format!("{n}\n").as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    let speak_l = bind(SPEAK);
    let seen1 = seen.clone();
    dev.spawn(async move {
        while let Ok((mut s, peer)) = speak_l.accept().await {
            let seen = seen1.clone();
            seen.speak_peers.lock().unwrap().push(peer.ip());
            tokio::spawn(async move {
                if s.write_all(HELLO).await.is_err() || s.shutdown().await.is_err() {
                    return;
                }
                let (n, how) = read_all(&mut s).await;
                if how == "eof" {
                    seen.speak.lock().unwrap().push(n);
                }
            });
        }
    });
    let observe_l = bind(OBSERVE);
    let seen2 = seen.clone();
    dev.spawn(async move {
        while let Ok((mut s, _)) = observe_l.accept().await {
            let seen = seen2.clone();
            tokio::spawn(async move {
                let (n, how) = read_all(&mut s).await;
                seen.observed.lock().unwrap().push(format!("{how} {n}"));
            });
        }
    });
    let reset_l = bind(RESET);
    dev.spawn(async move {
        while let Ok((mut s, _)) = reset_l.accept().await {
            tokio::spawn(async move {
                let _ = s.write_all(HELLO).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
                let _ = s.set_zero_linger();
            });
        }
    });
    let stall_l = bind(STALL);
    let seen3 = seen.clone();
    dev.spawn(async move {
        while let Ok((mut s, _)) = stall_l.accept().await {
            let seen = seen3.clone();
            tokio::spawn(async move {
                seen.stall_release.notified().await;
                let (n, _) = read_all(&mut s).await;
                seen.stall.lock().unwrap().push(n);
            });
        }
    });
    let udp6: SocketAddr = format!("[{DEVICE_V6}]:{UDP}").parse().unwrap();
    for addr in [device_addr(UDP), udp6] {
        let udp = dev
            .run(async move { tokio::net::UdpSocket::bind(addr).await })
            .unwrap_or_else(|e| panic!("bind {addr} in the device: {e}"));
        dev.spawn(async move {
            let mut buf = vec![0u8; 65536];
            while let Ok((n, from)) = udp.recv_from(&mut buf).await {
                let _ = udp.send_to(&buf[..n], from).await;
            }
        });
    }
}

/// A Python helper (hashlib is OpenSSL's SHA-256, ~1.5 GB/s; the sha2 crate
/// in a debug build manages ~40 MB/s).
pub fn python(ns: &Netns, script: &str, args: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new("ip");
    c.args(["netns", "exec", &ns.name, "python3", "-c", script])
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    c
}

/// Accept one connection, hash everything until end of file, answer
/// "<bytes> <sha256>\n".
pub const SHA_SINK: &str = r#"
import hashlib, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(4)
s.settimeout(60)
print("ready", flush=True)
c, _ = s.accept()
c.settimeout(60)
h = hashlib.sha256()
buf = bytearray(1 << 20)
mv = memoryview(buf)
n = 0
while True:
    k = c.recv_into(buf)
    if k == 0:
        break
    h.update(mv[:k])
    n += k
c.sendall(("%d %s\n" % (n, h.hexdigest())).encode())
c.close()
"#;

/// Send argv[3] bytes of random data (each MiB numbered), hash them, shut
/// the write side, read the sink's answer; prints
/// "<sent> <sha256> <answer...> <seconds>".
pub const SHA_SENDER: &str = r#"
import hashlib, os, socket, struct, sys, time
total = int(sys.argv[3])
chunk = 1 << 20
buf = bytearray(os.urandom(chunk))
h = hashlib.sha256()
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
t = time.time()
sent = 0
i = 0
while sent < total:
    struct.pack_into("<Q", buf, 0, i)
    i += 1
    k = min(chunk, total - sent)
    mv = memoryview(buf)[:k]
    h.update(mv)
    s.sendall(mv)
    sent += k
s.shutdown(socket.SHUT_WR)
answer = b""
while True:
    d = s.recv(4096)
    if not d:
        break
    answer += d
print(sent, h.hexdigest(), answer.decode().strip(), "%.3f" % (time.time() - t))
"#;
