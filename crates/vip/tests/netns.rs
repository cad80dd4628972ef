//! A virtual address against a real kernel, in namespaces these tests
//! create and always delete: A is the holder (a proxy pod, interface
//! `net1`), B a device on the same segment (interface `dev0`), joined by a
//! veth. Nothing here touches the host's own namespace.

use edgelink_netlink::{Address, Handle};
use edgelink_netns::Netns;
use edgelink_vip::{announce, host_net};
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

const VIP4: &str = "172.31.250.50";
const VIP6: &str = "fd99:250::50";
const WRONG_MAC: &str = "02:00:00:00:00:99";

/// Skip (with the reason printed) unless the test can create namespaces.
macro_rules! require_root {
    () => {
        if !is_root() {
            eprintln!("skipped: needs root to create network namespaces");
            return;
        }
    };
}

/// The effective uid is 0 (the second field of /proc/self/status's `Uid:`).
fn is_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        == Some("0")
}

/// A named network namespace, deleted on drop (also when a test panics;
/// its links go with it).
struct TempNs(String);

impl TempNs {
    fn new(tag: &str) -> TempNs {
        let name = format!("elk-vip-{}-{tag}", std::process::id());
        // A leftover of an earlier run with the same pid would make `add` fail.
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        let ns = TempNs(name);
        ip(&["netns", "add", &ns.0]);
        ns
    }

    fn open(&self) -> Netns {
        Netns::open(format!("/var/run/netns/{}", self.0)).unwrap()
    }

    /// Run `ip -n <this> args...` and return its stdout; panics on failure.
    fn ip(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", &self.0];
        all.extend_from_slice(args);
        ip(&all)
    }
}

impl Drop for TempNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Holder A and device B on one veth, each with a v4 and a v6 address.
struct Segment {
    a: Netns,
    b: Netns,
    /// `net1`'s index in A and its MAC as `ip` prints it.
    net1: u32,
    mac: String,
    handle: Handle,
    b_ns: TempNs,
    a_ns: TempNs,
}

impl Segment {
    fn new(tag: &str) -> Segment {
        let a_ns = TempNs::new(&format!("{tag}-a"));
        let b_ns = TempNs::new(&format!("{tag}-b"));
        a_ns.ip(&[
            "link", "add", "net1", "type", "veth", "peer", "name", "dev0", "netns", &b_ns.0,
        ]);
        for (ns, dev, host) in [(&a_ns, "net1", "1"), (&b_ns, "dev0", "2")] {
            ns.ip(&["addr", "add", &format!("172.31.250.{host}/24"), "dev", dev]);
            let v6 = format!("fd99:250::{host}/64");
            ns.ip(&["addr", "add", &v6, "dev", dev, "nodad"]);
            ns.ip(&["link", "set", dev, "up"]);
            ns.ip(&["link", "set", "lo", "up"]);
        }
        // A fresh link takes a moment after carrier to route multicast
        // (the kernel adds IPv6's ff00::/8 route then): B dropped an NA
        // sent ~0.3 s after `up` as "no route". Wait for it on both sides.
        for (ns, dev) in [(&a_ns, "net1"), (&b_ns, "dev0")] {
            let started = Instant::now();
            while !ns
                .ip(&["-6", "route", "show", "table", "local", "dev", dev])
                .contains("multicast ff00::/8")
            {
                assert!(
                    started.elapsed() < Duration::from_secs(5),
                    "{dev} not ready"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let a = a_ns.open();
        let mut handle = a.run(Handle::new).unwrap().unwrap();
        let link = handle.require_link("net1").unwrap();
        let mac = link.mac.expect("a veth has a MAC");
        let mac = mac.map(|b| format!("{b:02x}")).join(":");
        Segment {
            a,
            b: b_ns.open(),
            net1: link.index,
            mac,
            handle,
            b_ns,
            a_ns,
        }
    }

    /// The address `ip` on A's `net1`, as the kernel lists it.
    fn addr(&mut self, ip: IpAddr) -> Option<Address> {
        let addrs = self.handle.addrs(Some(self.net1)).unwrap();
        addrs.into_iter().find(|a| a.network.ip() == ip)
    }

    /// The held (host) address `ip` on A's `net1`.
    fn held(&mut self, ip: IpAddr) -> Option<Address> {
        self.addr(ip).filter(|a| a.network == host_net(ip))
    }

    /// Wait until the kernel has removed `ip`, held for `lifetime` since
    /// `held_at`; how long that took. It counts age in whole seconds on a
    /// timer rounded to whole seconds: measured 0.0-0.4 s late; allow 2 s.
    fn wait_expired(&mut self, ip: IpAddr, held_at: Instant, lifetime: Duration) -> Duration {
        loop {
            if self.held(ip).is_none() {
                let took = held_at.elapsed();
                assert!(took >= lifetime - Duration::from_millis(50), "{took:?}");
                return took;
            }
            assert!(
                held_at.elapsed() < lifetime + Duration::from_secs(2),
                "{ip} still held {lifetime:?} + 2 s after it was last renewed"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// B's neighbour entry for `ip`, as `ip neigh` prints it.
    fn neighbour(&self, ip: &str) -> String {
        self.b_ns.ip(&["neigh", "show", ip, "dev", "dev0"])
    }

    /// Connect from B to `ip:port` in A.
    fn connect_from_b(&self, ip: IpAddr, port: u16) -> io::Result<TcpStream> {
        let to = SocketAddr::new(ip, port);
        self.b
            .run_on_thread(|| TcpStream::connect_timeout(&to, Duration::from_secs(1)))
            .unwrap()
    }

    /// Announce `ip` on `net1` from a thread inside A, as the daemon does.
    fn announce(&self, ip: IpAddr) -> io::Result<()> {
        let net1 = self.net1;
        self.a.run_on_thread(|| announce(net1, ip)).unwrap()
    }

    /// Point B's entry for `ip` at a wrong MAC, as if another pod had held
    /// it; check that nothing but an announcement would repair it soon.
    fn make_stale(&self, ip: &str) {
        self.b_ns.ip(&[
            "neigh", "replace", ip, "lladdr", WRONG_MAC, "dev", "dev0", "nud", "stale",
        ]);
        std::thread::sleep(Duration::from_millis(300));
        let entry = self.neighbour(ip);
        assert!(entry.contains(WRONG_MAC), "{entry}");
    }

    /// Poll B's entry for `ip` until it names A's MAC; how long it took.
    fn wait_repointed(&self, ip: &str, within: Duration) -> Duration {
        let started = Instant::now();
        loop {
            let entry = self.neighbour(ip);
            if entry.contains(&self.mac) {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < within,
                "B's entry for {ip} still {entry:?} after {within:?}, want {}",
                self.mac
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn held_address_is_reachable_renewed_and_removed_by_the_kernel() {
    require_root!();
    let mut seg = Segment::new("hold");
    let vip: IpAddr = VIP4.parse().unwrap();
    let lifetime = Duration::from_secs(2);
    seg.handle
        .hold_addr(seg.net1, &host_net(vip), lifetime)
        .unwrap();

    let held = seg.held(vip).expect("the address is on net1");
    let left = held.valid_lft.expect("a held address has a lifetime");
    assert!((1..=2).contains(&left), "{held:?}");
    let own = seg.addr("172.31.250.1".parse().unwrap()).unwrap();
    assert_eq!(own.valid_lft, None, "a plain address is forever: {own:?}");

    let listener = seg
        .a
        .run(|| TcpListener::bind("0.0.0.0:0"))
        .unwrap()
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    seg.connect_from_b(vip, port)
        .expect("B reaches the held address");
    let (conn, _) = listener.accept().unwrap();
    assert_eq!(conn.local_addr().unwrap().ip(), vip);

    std::thread::sleep(Duration::from_millis(1200));
    let before = seg.held(vip).unwrap().valid_lft.unwrap();
    seg.handle
        .hold_addr(seg.net1, &host_net(vip), lifetime)
        .unwrap();
    let renewed_at = Instant::now();
    let after = seg.held(vip).unwrap().valid_lft.unwrap();
    assert!(
        after > before,
        "renewing did not raise {before} s (got {after} s)"
    );
    assert_eq!(after, 2);

    // Left alone, it goes.
    let gone_after = seg.wait_expired(vip, renewed_at, lifetime);
    eprintln!("IPv4, {lifetime:?} lifetime: the kernel removed the address after {gone_after:?}");
    assert!(
        seg.connect_from_b(vip, port).is_err(),
        "B still reaches {vip} after it expired"
    );
}

#[test]
fn gratuitous_arp_repoints_a_stale_ipv4_neighbour() {
    require_root!();
    let mut seg = Segment::new("garp");
    let vip: IpAddr = VIP4.parse().unwrap();
    seg.handle
        .hold_addr(seg.net1, &host_net(vip), Duration::from_secs(30))
        .unwrap();
    seg.make_stale(VIP4);
    seg.announce(vip).unwrap();
    let took = seg.wait_repointed(VIP4, Duration::from_secs(1));
    eprintln!("B's ARP entry named A's MAC {took:?} after the announcement");

    // A second announcement within locktime (1 s) is applied too: both
    // frames are gratuitous, which Linux lets override at any time.
    seg.make_stale(VIP4);
    seg.announce(vip).unwrap();
    seg.wait_repointed(VIP4, Duration::from_secs(1));
}

#[test]
fn unsolicited_na_repoints_a_stale_ipv6_neighbour() {
    require_root!();
    let mut seg = Segment::new("na");
    let vip: IpAddr = VIP6.parse().unwrap();
    seg.handle
        .hold_addr(seg.net1, &host_net(vip), Duration::from_secs(30))
        .unwrap();
    let held = seg.held(vip).expect("the address is on net1");
    assert!(!held.tentative, "no duplicate address detection: {held:?}");
    assert!(held.valid_lft.is_some_and(|s| s <= 30), "{held:?}");
    // A's own connections onto the segment do not leave from the address
    // that moves (it is deprecated, so source selection passes it over).
    let route = seg.a_ns.ip(&["-6", "route", "get", "fd99:250::2"]);
    assert!(route.contains("src fd99:250::1 "), "{route}");

    // B resolves the held address by itself (A answers its solicitation).
    let listener = seg.a.run(|| TcpListener::bind("[::]:0")).unwrap().unwrap();
    let port = listener.local_addr().unwrap().port();
    seg.connect_from_b(vip, port)
        .expect("B reaches the held IPv6 address");
    let (conn, _) = listener.accept().unwrap();
    assert_eq!(conn.local_addr().unwrap().ip(), vip);

    seg.make_stale(VIP6);
    seg.announce(vip).unwrap();
    let took = seg.wait_repointed(VIP6, Duration::from_secs(1));
    eprintln!("B's IPv6 neighbour entry named A's MAC {took:?} after the advertisement");

    // Held for a short while, it goes by itself too.
    let lifetime = Duration::from_secs(1);
    seg.handle
        .hold_addr(seg.net1, &host_net(vip), lifetime)
        .unwrap();
    let gone_after = seg.wait_expired(vip, Instant::now(), lifetime);
    eprintln!("IPv6, {lifetime:?} lifetime: the kernel removed the address after {gone_after:?}");
}

#[test]
fn announcing_needs_an_ethernet_interface_that_is_up() {
    require_root!();
    let ns = TempNs::new("lo");
    ns.ip(&[
        "link", "add", "net1", "type", "veth", "peer", "name", "peer1",
    ]);
    let a = ns.open();
    let vip: IpAddr = VIP4.parse().unwrap();

    // Loopback is index 1 in every namespace.
    let err = a.run(|| announce(1, vip)).unwrap().unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::Unsupported, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("lo (#1)") && msg.contains("not an Ethernet interface"),
        "{msg}"
    );

    let net1 = a
        .run(|| Handle::new().unwrap().require_link("net1").unwrap().index)
        .unwrap();
    let err = a.run(|| announce(net1, vip)).unwrap().unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NetworkDown, "{err}");
    assert!(err.to_string().contains("net1"), "{err}");

    let err = a.run(|| announce(999, vip)).unwrap().unwrap_err();
    assert!(err.to_string().contains("#999"), "{err}");
}
