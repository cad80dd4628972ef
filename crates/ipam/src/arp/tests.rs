use super::*;

use std::fs::File;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use nix::sched::{setns, CloneFlags};

/// A network namespace created for a test, deleted on drop (even on panic).
struct TestNetns {
    name: String,
}

impl TestNetns {
    fn add() -> TestNetns {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "elk-ipam-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        ip(&["netns", "add", &name]);
        TestNetns { name }
    }

    fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().expect("run ip(8)");
    assert!(status.success(), "ip {args:?} failed: {status}");
}

fn is_root() -> bool {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Run `f` on a fresh thread that has entered `ns` (the test thread itself
/// never changes namespace).
fn in_netns<T: Send + 'static>(ns: &TestNetns, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = ns.path();
    std::thread::spawn(move || {
        let file = File::open(&path).expect("open netns");
        setns(file, CloneFlags::CLONE_NEWNET).expect("setns");
        f()
    })
    .join()
    .expect("netns thread panicked")
}

#[test]
fn probe_packet_layout() {
    let mac = [2, 0, 0, 0, 0, 9];
    let p = probe_packet(mac, Ipv4Addr::new(10, 250, 0, 5));
    assert_eq!(&p[0..8], &[0, 1, 8, 0, 6, 4, 0, 1]);
    assert_eq!(&p[8..14], &mac);
    assert_eq!(&p[14..18], &[0, 0, 0, 0], "sender IP 0.0.0.0");
    assert_eq!(&p[18..24], &[0; 6]);
    assert_eq!(&p[24..28], &[10, 250, 0, 5]);
}

#[test]
fn in_use_detection_follows_rfc5227() {
    let me = [2, 0, 0, 0, 0, 1];
    let other = [2, 0, 0, 0, 0, 2];
    let cand = Ipv4Addr::new(10, 0, 0, 7);
    let pkt = |op: u16, sha: [u8; 6], spa: [u8; 4], tpa: [u8; 4]| {
        let mut p = probe_packet(sha, Ipv4Addr::from(tpa));
        p[6..8].copy_from_slice(&op.to_be_bytes());
        p[14..18].copy_from_slice(&spa);
        p
    };
    // A reply from the holder.
    assert!(shows_in_use(
        &pkt(2, other, [10, 0, 0, 7], [0, 0, 0, 0]),
        cand,
        me
    ));
    // The holder's own request for someone else.
    assert!(shows_in_use(
        &pkt(1, other, [10, 0, 0, 7], [10, 0, 0, 1]),
        cand,
        me
    ));
    // Another host probing the same candidate.
    assert!(shows_in_use(
        &pkt(1, other, [0; 4], [10, 0, 0, 7]),
        cand,
        me
    ));
    // Our own probe echoed back, other addresses, garbage.
    assert!(!shows_in_use(&pkt(1, me, [0; 4], [10, 0, 0, 7]), cand, me));
    assert!(!shows_in_use(
        &pkt(2, other, [10, 0, 0, 8], [0; 4]),
        cand,
        me
    ));
    assert!(!shows_in_use(
        &pkt(1, other, [10, 0, 0, 1], [10, 0, 0, 7]),
        cand,
        me
    ));
    assert!(!shows_in_use(&[0u8; 10], cand, me));
    let mut wrong_proto = pkt(2, other, [10, 0, 0, 7], [0; 4]);
    wrong_proto[2] = 0x86;
    assert!(!shows_in_use(&wrong_proto, cand, me));
}

#[test]
fn open_refuses_unknown_and_non_ethernet_interfaces() {
    if !is_root() {
        eprintln!("skipped: needs root for network namespaces");
        return;
    }
    let ns = TestNetns::add();
    let (missing, lo) = in_netns(&ns, || {
        (
            Prober::open("elk-nonexistent")
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Prober::open("lo").map(|_| ()).map_err(|e| e.kind()),
        )
    });
    let missing = missing.unwrap_err();
    assert!(missing.contains("elk-nonexistent"), "{missing}");
    assert_eq!(lo.unwrap_err(), io::ErrorKind::Unsupported);
}

#[test]
fn probe_sees_a_device_and_not_a_free_address() {
    if !is_root() {
        eprintln!("skipped: needs root for network namespaces");
        return;
    }
    let near = TestNetns::add();
    let far = TestNetns::add();
    ip(&[
        "-n", &near.name, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1", "netns",
        &far.name,
    ]);
    ip(&[
        "-n",
        &far.name,
        "addr",
        "add",
        "10.250.0.5/24",
        "dev",
        "veth1",
    ]);
    ip(&["-n", &far.name, "link", "set", "veth1", "up"]);
    ip(&["-n", &near.name, "link", "set", "veth0", "up"]);

    let (used, free, used_again, mac_ok) = in_netns(&near, || {
        let mut prober = Prober::open("veth0").expect("open prober on veth0");
        let used = prober.probe(Ipv4Addr::new(10, 250, 0, 5), Duration::from_millis(1000));
        let started = Instant::now();
        let free = prober.probe(Ipv4Addr::new(10, 250, 0, 6), Duration::from_millis(200));
        let waited = started.elapsed();
        // The one-shot helper works the same way.
        let used_again = probe(
            "veth0",
            Ipv4Addr::new(10, 250, 0, 5),
            Duration::from_millis(1000),
        );
        let mac_ok = prober.mac() != [0; 6] && waited >= Duration::from_millis(200);
        (used, free, used_again, mac_ok)
    });
    assert!(
        used.expect("probe 10.250.0.5"),
        "10.250.0.5 is configured on the far end and must answer"
    );
    assert!(
        !free.expect("probe 10.250.0.6"),
        "10.250.0.6 is not used by anyone"
    );
    assert!(used_again.expect("probe() helper"));
    assert!(
        mac_ok,
        "prober has the interface MAC and a free address waits the full timeout"
    );
}
