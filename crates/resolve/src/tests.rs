//! End-to-end tests of the resolver against the test DNS server on
//! 127.0.0.1 (loopback only), through a `DnsSockets` that makes ordinary
//! sockets; and `pod_resolv_conf` against a namespace the test creates.

use crate::testing::DnsServer;
use crate::{pod_resolv_conf, DnsSockets, ResolvConf, ResolveError, Resolver};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Ordinary sockets in the test's own namespace; counts what it made.
#[derive(Default)]
struct LocalSockets {
    udp: AtomicUsize,
    tcp: AtomicUsize,
}

impl DnsSockets for LocalSockets {
    fn udp(&self, server: SocketAddr) -> BoxFuture<'static, io::Result<std::net::UdpSocket>> {
        self.udp.fetch_add(1, Ordering::SeqCst);
        async move {
            let any: SocketAddr = if server.is_ipv4() {
                "0.0.0.0:0".parse().expect("addr")
            } else {
                "[::]:0".parse().expect("addr")
            };
            let s = std::net::UdpSocket::bind(any)?;
            s.set_nonblocking(true)?;
            Ok(s)
        }
        .boxed()
    }

    fn tcp(&self, server: SocketAddr) -> BoxFuture<'static, io::Result<socket2::Socket>> {
        self.tcp.fetch_add(1, Ordering::SeqCst);
        async move {
            let s = socket2::Socket::new(
                socket2::Domain::for_address(server),
                socket2::Type::STREAM,
                Some(socket2::Protocol::TCP),
            )?;
            s.set_nonblocking(true)?;
            Ok(s)
        }
        .boxed()
    }
}

fn conf(servers: &[SocketAddr], search: &[&str], ndots: u8) -> ResolvConf {
    ResolvConf {
        nameservers: servers.to_vec(),
        search: search.iter().map(|s| s.to_string()).collect(),
        ndots,
        timeout: Duration::from_secs(2),
        attempts: 2,
    }
}

fn resolver(conf: ResolvConf) -> (Resolver, Arc<LocalSockets>) {
    let sockets = Arc::new(LocalSockets::default());
    (Resolver::new(conf, sockets.clone()), sockets)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

fn server() -> DnsServer {
    DnsServer::start("127.0.0.1:0".parse().expect("addr"))
}

#[test]
fn answers_a_and_aaaa_ipv4_first_and_caches() {
    let dns = server();
    dns.set(
        "mqtt.hil.svc.cluster.local",
        &[ip("2001:db8::5"), ip("192.0.2.5"), ip("192.0.2.6")],
        300,
    );
    let (r, sockets) = resolver(conf(
        &[dns.addr()],
        &["hil.svc.cluster.local", "svc.cluster.local"],
        5,
    ));
    rt().block_on(async {
        let before = Instant::now();
        let got = r.lookup("mqtt").await.expect("lookup");
        assert_eq!(
            got.addrs,
            vec![ip("192.0.2.5"), ip("192.0.2.6"), ip("2001:db8::5")]
        );
        assert_eq!(got.name, "mqtt.hil.svc.cluster.local");
        assert!(got.valid_until >= before + Duration::from_secs(299));
        assert!(got.valid_until <= Instant::now() + Duration::from_secs(300));
        // A and AAAA, one query each.
        assert_eq!(dns.queries("mqtt.hil.svc.cluster.local"), 2);
        // From the cache: no new query, no new socket.
        let made = sockets.udp.load(Ordering::SeqCst);
        assert_eq!(r.lookup("mqtt").await.expect("cached"), got);
        assert_eq!(r.lookup("MQTT").await.expect("cached"), got);
        assert_eq!(dns.queries("mqtt.hil.svc.cluster.local"), 2);
        assert_eq!(sockets.udp.load(Ordering::SeqCst), made);
    });
}

#[test]
fn search_order_is_followed_to_the_answer() {
    let dns = server();
    dns.set("broker.svc.cluster.local", &[ip("192.0.2.9")], 60);
    let (r, _) = resolver(conf(
        &[dns.addr()],
        &[
            "hil.svc.cluster.local",
            "svc.cluster.local",
            "cluster.local",
        ],
        5,
    ));
    rt().block_on(async {
        let got = r.lookup("broker").await.expect("lookup");
        assert_eq!(got.name, "broker.svc.cluster.local");
        assert_eq!(got.addrs, vec![ip("192.0.2.9")]);
    });
    // The first search domain was tried first and failed; the ones after
    // the answer and the bare name never were.
    assert_eq!(dns.queries("broker.hil.svc.cluster.local"), 2);
    assert_eq!(dns.queries("broker.cluster.local"), 0);
    assert_eq!(dns.queries("broker"), 0);
    // An absolute name skips the search list.
    dns.set("broker", &[ip("192.0.2.10")], 60);
    rt().block_on(async {
        let got = r.lookup("broker.").await.expect("absolute");
        assert_eq!(got.addrs, vec![ip("192.0.2.10")]);
        assert_eq!(got.name, "broker");
    });
    assert_eq!(dns.queries("broker.hil.svc.cluster.local"), 2);
}

#[test]
fn ip_literal_needs_no_query() {
    let (r, sockets) = resolver(conf(&["127.0.0.1:9".parse().expect("addr")], &[], 1));
    rt().block_on(async {
        for (host, want) in [("192.0.2.1", "192.0.2.1"), ("[2001:db8::1]", "2001:db8::1")] {
            let got = r.lookup(host).await.expect("literal");
            assert_eq!(got.addrs, vec![ip(want)]);
            assert!(got.valid_until > Instant::now() + Duration::from_secs(86400 * 365));
        }
    });
    assert_eq!(sockets.udp.load(Ordering::SeqCst), 0);
}

#[test]
fn ttl_expiry_causes_a_new_query_and_sees_the_change() {
    let dns = server();
    dns.set("plc.lab", &[ip("192.0.2.20")], 1);
    let (r, _) = resolver(conf(&[dns.addr()], &[], 1));
    rt().block_on(async {
        let first = r.lookup("plc.lab").await.expect("lookup");
        assert_eq!(first.addrs, vec![ip("192.0.2.20")]);
        assert_eq!(dns.queries("plc.lab"), 2);
        dns.set("plc.lab", &[ip("192.0.2.21")], 1);
        // Until the TTL ends: the cached address, no query.
        if Instant::now() < first.valid_until {
            let again = r.lookup("plc.lab").await.expect("cached");
            if Instant::now() < first.valid_until {
                assert_eq!(again.addrs, vec![ip("192.0.2.20")]);
            }
        }
        tokio::time::sleep_until(first.valid_until.into()).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let second = r.lookup("plc.lab").await.expect("lookup after expiry");
        assert_eq!(second.addrs, vec![ip("192.0.2.21")]);
        assert!(dns.queries("plc.lab") >= 4, "{}", dns.queries("plc.lab"));
    });
}

#[test]
fn ttl_is_clamped() {
    let dns = server();
    dns.set("zero.lab", &[ip("192.0.2.30")], 0);
    dns.set("week.lab", &[ip("192.0.2.31")], 7 * 86400);
    let (r, _) = resolver(conf(&[dns.addr()], &[], 1));
    rt().block_on(async {
        let t0 = Instant::now();
        let zero = r.lookup("zero.lab").await.expect("zero");
        assert!(zero.valid_until >= t0 + Duration::from_secs(1));
        let week = r.lookup("week.lab").await.expect("week");
        assert!(week.valid_until <= Instant::now() + Duration::from_secs(3600));
        assert!(week.valid_until >= t0 + Duration::from_secs(3599));
    });
}

#[test]
fn answers_for_another_id_or_question_are_ignored() {
    let dns = server();
    dns.set("plc.lab", &[ip("192.0.2.25")], 60);
    dns.set_decoy(true);
    let (r, _) = resolver(conf(&[dns.addr()], &[], 1));
    let got = rt().block_on(r.lookup("plc.lab")).expect("lookup");
    assert_eq!(got.addrs, vec![ip("192.0.2.25")]);
    assert_eq!(dns.queries("plc.lab"), 2);
}

#[test]
fn concurrent_lookups_share_one_resolution() {
    let dns = server();
    dns.set("telemetry.lab", &[ip("192.0.2.26")], 60);
    let (r, _) = resolver(conf(&[dns.addr()], &[], 1));
    let r = Arc::new(r);
    let all = rt().block_on(async {
        let lookups = (0..20).map(|_| {
            let r = r.clone();
            async move { r.lookup("telemetry.lab").await }
        });
        futures_util::future::join_all(lookups).await
    });
    for got in all {
        assert_eq!(got.expect("lookup").addrs, vec![ip("192.0.2.26")]);
    }
    assert_eq!(dns.queries("telemetry.lab"), 2);
    // Failures are shared too, and not kept: the next lookup asks again.
    dns.set_silent(true);
    let mut c = conf(&[dns.addr()], &[], 1);
    c.timeout = Duration::from_millis(200);
    c.attempts = 1;
    let r = Arc::new(resolver(c).0);
    let all = rt().block_on(async {
        let lookups = (0..10).map(|_| {
            let r = r.clone();
            async move { r.lookup("quiet.lab").await }
        });
        futures_util::future::join_all(lookups).await
    });
    for got in all {
        assert!(matches!(got, Err(ResolveError::Timeout { .. })), "{got:?}");
    }
    assert_eq!(dns.queries("quiet.lab"), 2);
    let _ = rt().block_on(r.lookup("quiet.lab"));
    assert_eq!(dns.queries("quiet.lab"), 4);
}

#[test]
fn an_abandoned_lookup_still_fills_the_cache() {
    let dns = server();
    dns.set("late.lab", &[ip("192.0.2.27")], 60);
    let (r, _) = resolver(conf(&[dns.addr()], &[], 1));
    let rt = rt();
    rt.block_on(async {
        // Given up on at once (before its first poll ends).
        let _ = tokio::time::timeout(Duration::ZERO, r.lookup("late.lab")).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while dns.queries("late.lab") < 2 {
            assert!(Instant::now() < deadline, "the resolution never ran");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let got = r.lookup("late.lab").await.expect("lookup");
        assert_eq!(got.addrs, vec![ip("192.0.2.27")]);
    });
    assert_eq!(dns.queries("late.lab"), 2);
}

#[test]
fn forget_causes_a_new_query() {
    let dns = server();
    dns.set("collector.lab", &[ip("192.0.2.40")], 600);
    let (r, _) = resolver(conf(&[dns.addr()], &[], 1));
    rt().block_on(async {
        r.lookup("collector.lab").await.expect("lookup");
        r.lookup("collector.lab").await.expect("cached");
        assert_eq!(dns.queries("collector.lab"), 2);
        dns.set("collector.lab", &[ip("192.0.2.41")], 600);
        r.forget("Collector.lab");
        let got = r.lookup("collector.lab").await.expect("after forget");
        assert_eq!(got.addrs, vec![ip("192.0.2.41")]);
        assert_eq!(dns.queries("collector.lab"), 4);
    });
}

#[test]
fn nxdomain_names_the_host_and_is_cached_briefly() {
    let dns = server();
    let (r, _) = resolver(conf(&[dns.addr()], &["lab.example"], 1));
    rt().block_on(async {
        let e = r.lookup("nosuch").await.unwrap_err();
        assert!(matches!(e, ResolveError::NxDomain { .. }), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("\"nosuch\"") && text.contains("nosuch.lab.example."),
            "{text}"
        );
        assert_eq!(dns.queries("nosuch.lab.example"), 2);
        assert_eq!(dns.queries("nosuch"), 2);
        // The server's negative TTL is 1 s: a lookup right after is
        // answered from the cache (when still within that second)...
        let t = Instant::now();
        let again = r.lookup("nosuch").await.unwrap_err();
        assert!(again.is_negative());
        if t.elapsed() < Duration::from_millis(500) {
            assert_eq!(dns.queries("nosuch"), 2);
        }
        // ... and asked again once it passed: the name now exists.
        dns.set("nosuch", &[ip("192.0.2.50")], 60);
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let got = r.lookup("nosuch").await.expect("exists now");
        assert_eq!(got.addrs, vec![ip("192.0.2.50")]);
    });
}

#[test]
fn name_without_addresses_is_no_records() {
    let dns = server();
    dns.set("empty.lab", &[], 60);
    let (r, _) = resolver(conf(&[dns.addr()], &[], 1));
    let e = rt().block_on(r.lookup("empty.lab")).unwrap_err();
    assert!(matches!(e, ResolveError::NoRecords { .. }), "{e:?}");
    assert!(e.to_string().contains("empty.lab"), "{e}");
}

#[test]
fn silent_server_times_out_after_every_attempt() {
    let dns = server();
    dns.set("quiet.lab", &[ip("192.0.2.60")], 60);
    dns.set_silent(true);
    let mut c = conf(&[dns.addr()], &[], 1);
    c.timeout = Duration::from_millis(300);
    c.attempts = 3;
    let (r, _) = resolver(c);
    let e = rt().block_on(r.lookup("quiet.lab")).unwrap_err();
    assert!(matches!(e, ResolveError::Timeout { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("quiet.lab") && text.contains(&dns.addr().to_string()),
        "{text}"
    );
    // attempts x (A + AAAA).
    assert_eq!(dns.queries("quiet.lab"), 6);
    // Not cached: once the server answers again, so does the lookup.
    dns.set_silent(false);
    let got = rt().block_on(r.lookup("quiet.lab")).expect("answers again");
    assert_eq!(got.addrs, vec![ip("192.0.2.60")]);
}

#[test]
fn next_server_after_a_silent_or_failing_one() {
    let quiet = server();
    quiet.set_silent(true);
    let failing = server();
    failing.set_servfail(true);
    let good = server();
    good.set("rig.lab", &[ip("192.0.2.70")], 60);
    let mut c = conf(&[quiet.addr(), failing.addr(), good.addr()], &[], 1);
    c.timeout = Duration::from_millis(300);
    let (r, _) = resolver(c);
    let got = rt()
        .block_on(r.lookup("rig.lab"))
        .expect("the third answers");
    assert_eq!(got.addrs, vec![ip("192.0.2.70")]);
    assert_eq!(quiet.queries("rig.lab"), 2);
    assert_eq!(failing.queries("rig.lab"), 2);
    // Only SERVFAIL: an error naming the server and the reason.
    let mut c = conf(&[failing.addr()], &[], 1);
    c.timeout = Duration::from_millis(300);
    let (r, _) = resolver(c);
    let e = rt().block_on(r.lookup("rig.lab")).unwrap_err();
    assert!(matches!(e, ResolveError::BadAnswer { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains(&failing.addr().to_string()) && text.contains("Server Failure"),
        "{text}"
    );
}

#[test]
fn truncated_udp_answer_is_asked_again_over_tcp() {
    let dns = server();
    dns.set("big.lab", &[ip("192.0.2.80"), ip("2001:db8::80")], 60);
    dns.set_truncate_udp(true);
    let (r, sockets) = resolver(conf(&[dns.addr()], &[], 1));
    let got = rt().block_on(r.lookup("big.lab")).expect("over tcp");
    assert_eq!(got.addrs, vec![ip("192.0.2.80"), ip("2001:db8::80")]);
    assert_eq!(dns.tcp_queries(), 2);
    assert_eq!(dns.queries("big.lab"), 4);
    assert_eq!(sockets.tcp.load(Ordering::SeqCst), 2);
}

#[test]
fn cname_is_followed() {
    let dns = server();
    dns.set_cname("mqtt.lab", "broker-0.lab", 30);
    dns.set("broker-0.lab", &[ip("192.0.2.90")], 300);
    let (r, _) = resolver(conf(&[dns.addr()], &[], 1));
    rt().block_on(async {
        let t0 = Instant::now();
        let got = r.lookup("mqtt.lab").await.expect("through the cname");
        assert_eq!(got.addrs, vec![ip("192.0.2.90")]);
        assert_eq!(got.name, "mqtt.lab");
        // The CNAME's TTL (30 s) is the least of the chain.
        assert!(got.valid_until <= Instant::now() + Duration::from_secs(30));
        assert!(got.valid_until >= t0 + Duration::from_secs(29));
    });
    // A CNAME to nowhere is NXDOMAIN.
    dns.set_cname("dangling.lab", "gone.lab", 30);
    let e = rt().block_on(r.lookup("dangling.lab")).unwrap_err();
    assert!(matches!(e, ResolveError::NxDomain { .. }), "{e:?}");
}

#[test]
fn refused_port_is_a_query_error() {
    // A UDP port nobody listens on (a server bound and dropped): the
    // kernel's port-unreachable comes back as a socket error.
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("free port");
    let mut c = conf(&[port], &[], 1);
    c.timeout = Duration::from_millis(500);
    let (r, _) = resolver(c);
    let e = rt().block_on(r.lookup("any.lab")).unwrap_err();
    assert!(
        matches!(e, ResolveError::Query { .. } | ResolveError::Timeout { .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("any.lab"), "{e}");
}

/// A netns made for a test, deleted on drop (with its /etc/netns files).
struct TestNetns {
    name: String,
}

impl TestNetns {
    fn new(tag: &str) -> TestNetns {
        let name = format!("elres-{tag}-{}", std::process::id());
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &name])
            .output();
        let ok = std::process::Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .expect("run ip")
            .success();
        assert!(ok, "ip netns add {name}");
        TestNetns { name }
    }

    fn path(&self) -> std::path::PathBuf {
        std::path::PathBuf::from(format!("/var/run/netns/{}", self.name))
    }

    fn etc(&self) -> std::path::PathBuf {
        std::path::PathBuf::from(format!("/etc/netns/{}", self.name))
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.etc());
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// A child killed and reaped on drop.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn pod_resolv_conf_reads_the_conf_of_a_process_in_the_netns() {
    let ns = TestNetns::new("pod");
    // Nobody in it yet.
    assert!(pod_resolv_conf(&ns.path()).expect("scan").is_none());
    // `ip netns exec` bind-mounts /etc/netns/<name>/resolv.conf over
    // /etc/resolv.conf in the mount namespace of the process it starts:
    // the stand-in for a pod's container with its own resolv.conf.
    std::fs::create_dir_all(ns.etc()).expect("mkdir /etc/netns/x");
    std::fs::write(
        ns.etc().join("resolv.conf"),
        "search hil.svc.cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n",
    )
    .expect("write resolv.conf");
    let child = Child(
        std::process::Command::new("ip")
            .args(["netns", "exec", &ns.name, "sleep", "30"])
            .spawn()
            .expect("spawn"),
    );
    let pid = child.0.id();
    // ip execs sleep in place: once the process is in the netns with
    // the file mounted, the scan finds it (bounded wait; for a moment ip
    // is in the netns with the host's file still in place).
    let deadline = Instant::now() + Duration::from_secs(10);
    let found = loop {
        if let Some(found) = pod_resolv_conf(&ns.path()).expect("scan") {
            if found.1.search == ["hil.svc.cluster.local"] {
                break found;
            }
        }
        assert!(Instant::now() < deadline, "pid {pid} never found");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(found.0, pid);
    assert_eq!(
        found.1.nameservers,
        vec!["10.96.0.10:53".parse::<SocketAddr>().expect("addr")]
    );
    assert_eq!(found.1.search, ["hil.svc.cluster.local"]);
    assert_eq!(found.1.ndots, 5);
    // A netns path that does not exist is an error naming it.
    let e = pod_resolv_conf(std::path::Path::new("/var/run/netns/elres-none")).unwrap_err();
    assert!(e.to_string().contains("elres-none"), "{e}");
    drop(child);
}

#[test]
fn pod_resolv_conf_reports_an_unusable_file() {
    let ns = TestNetns::new("bad");
    std::fs::create_dir_all(ns.etc()).expect("mkdir /etc/netns/x");
    std::fs::write(ns.etc().join("resolv.conf"), "search only.example\n").expect("write");
    let _child = Child(
        std::process::Command::new("ip")
            .args(["netns", "exec", &ns.name, "sleep", "30"])
            .spawn()
            .expect("spawn"),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let e = loop {
        match pod_resolv_conf(&ns.path()) {
            Err(e) => break e,
            Ok(_) => {
                assert!(Instant::now() < deadline, "never saw the process");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    let text = e.to_string();
    assert!(
        text.contains("resolv.conf") && text.contains("no nameserver"),
        "{text}"
    );
}

/// Sockets made inside a netns by a short-lived thread (as the daemon's
/// per-netns socket factory does).
struct NetnsSockets {
    netns: std::path::PathBuf,
}

impl NetnsSockets {
    fn make<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> io::Result<T> + Send + 'static,
    ) -> BoxFuture<'static, io::Result<T>> {
        let path = self.netns.clone();
        async move {
            let made = std::thread::spawn(move || {
                let file = std::fs::File::open(&path)?;
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(io::Error::from)?;
                f()
            })
            .join();
            made.unwrap_or_else(|_| Err(io::Error::other("socket thread panicked")))
        }
        .boxed()
    }
}

impl DnsSockets for NetnsSockets {
    fn udp(&self, _server: SocketAddr) -> BoxFuture<'static, io::Result<std::net::UdpSocket>> {
        self.make(|| {
            let s = std::net::UdpSocket::bind("0.0.0.0:0")?;
            s.set_nonblocking(true)?;
            Ok(s)
        })
    }

    fn tcp(&self, server: SocketAddr) -> BoxFuture<'static, io::Result<socket2::Socket>> {
        self.make(move || {
            let s = socket2::Socket::new(
                socket2::Domain::for_address(server),
                socket2::Type::STREAM,
                None,
            )?;
            s.set_nonblocking(true)?;
            Ok(s)
        })
    }
}

#[test]
fn queries_leave_from_the_netns_of_the_sockets() {
    let ns = TestNetns::new("srv");
    let up = std::process::Command::new("ip")
        .args(["-n", &ns.name, "link", "set", "lo", "up"])
        .status()
        .expect("run ip")
        .success();
    assert!(up, "lo up in {}", ns.name);
    let path = ns.path();
    let dns = DnsServer::start_in(
        path.to_str().expect("utf-8 path"),
        "127.0.0.1:0".parse().expect("addr"),
    );
    dns.set("mqtt.hil.svc.cluster.local", &[ip("192.0.2.100")], 60);
    let mut c = conf(&[dns.addr()], &["hil.svc.cluster.local"], 5);
    c.timeout = Duration::from_millis(500);
    let inside = Resolver::new(c.clone(), Arc::new(NetnsSockets { netns: path }));
    let got = rt().block_on(inside.lookup("mqtt")).expect("from inside");
    assert_eq!(got.addrs, vec![ip("192.0.2.100")]);
    // Over TCP too.
    dns.set_truncate_udp(true);
    inside.forget("mqtt");
    let got = rt()
        .block_on(inside.lookup("mqtt"))
        .expect("tcp from inside");
    assert_eq!(got.addrs, vec![ip("192.0.2.100")]);
    assert_eq!(dns.tcp_queries(), 2);
    dns.set_truncate_udp(false);
    // The same address from the test's own namespace is another
    // loopback, where no such server listens (or not this one).
    let before = dns.queries("mqtt.hil.svc.cluster.local");
    let (outside, _) = resolver(c);
    let _ = rt().block_on(outside.lookup("mqtt"));
    assert_eq!(dns.queries("mqtt.hil.svc.cluster.local"), before);
}
