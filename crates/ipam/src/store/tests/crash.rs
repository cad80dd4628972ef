//! A kill -9 at any point of ADD or DEL leaves a state that DEL or GC cleans
//! completely, and that never breaks later allocations. Crashes are simulated
//! with failpoints: the operation stops at the named point, without rollback.

use super::*;
use crate::store::failpoint;

fn dual() -> IpamConfig {
    cfg(json!({"ranges": [[{"subnet": "10.0.0.0/29"}], [{"subnet": "fd00::/125"}]]}))
}

/// Every crash point of an ADD of a dual-stack pod, in write order:
/// (point, passing hits before the crash).
const ADD_POINTS: &[(&str, usize)] = &[
    ("write_atomic:before_rename", 0), // index temp written, not renamed
    ("allocate:after_index", 0),       // intent written, no address file
    ("create_exclusive:before_link", 0), // address temp written, not linked
    ("create_exclusive:after_link", 0), // first address linked, temp not removed
    ("create_exclusive:before_link", 1), // first address done, second temp only
    ("create_exclusive:after_link", 1), // both linked, second temp left
    ("allocate:after_ip_files", 0),    // reservations done, no sticky/cursor
    ("write_hint:torn", 0),            // sticky record half written
    ("write_hint:torn", 1),            // first cursor half written
    ("write_hint:torn", 2),            // second cursor half written
];

/// Run an ADD for pod A that "crashes" at `point`, then restart.
fn crashed_add(env: &Env, point: &'static str, skip: usize) {
    failpoint::arm(point, skip);
    let r = env.alloc(&dual(), &pod("A", "net1", "ns", "a"));
    let crashed = failpoint::crashed();
    failpoint::reset();
    assert!(crashed, "{point}#{skip} was not reached (result {r:?})");
}

#[test]
fn del_after_any_add_crash_releases_everything() {
    for &(point, skip) in ADD_POINTS {
        let env = Env::new();
        crashed_add(&env, point, skip);
        env.release("A", "net1")
            .unwrap_or_else(|e| panic!("{point}#{skip}: DEL failed: {e}"));
        assert!(
            env.reserved().is_empty(),
            "{point}#{skip}: {:?}",
            env.reserved()
        );
        assert!(!env.dir().join("owners/A_net1").exists(), "{point}#{skip}");
        // Only temp files can be left; GC removes them.
        assert!(
            env.leftovers().iter().all(|f| f.contains(".tmp.")),
            "{point}#{skip}: {:?}",
            env.leftovers()
        );
        let report = env.gc(&valid(&[]));
        assert!(
            report.errors.is_empty(),
            "{point}#{skip}: {:?}",
            report.errors
        );
        assert!(
            env.leftovers().is_empty(),
            "{point}#{skip}: {:?}",
            env.leftovers()
        );
    }
}

#[test]
fn gc_after_any_add_crash_cleans_everything() {
    for &(point, skip) in ADD_POINTS {
        let env = Env::new();
        crashed_add(&env, point, skip);
        let report = env.gc(&valid(&[]));
        assert!(
            report.errors.is_empty(),
            "{point}#{skip}: {:?}",
            report.errors
        );
        assert!(report
            .released
            .iter()
            .all(|(n, _, c, i)| n == NET && c == "A" && i == "net1"));
        assert!(
            env.leftovers().is_empty(),
            "{point}#{skip}: {:?}",
            env.leftovers()
        );
        // A later DEL of the crashed attachment is still fine.
        assert_eq!(env.release("A", "net1").unwrap(), Vec::<IpAddr>::new());
    }
}

#[test]
fn retried_add_after_any_crash_completes_and_gc_keeps_it() {
    for &(point, skip) in ADD_POINTS {
        let env = Env::new();
        crashed_add(&env, point, skip);
        let a = env.alloc(&dual(), &pod("A", "net1", "ns", "a")).unwrap();
        assert_eq!(a.len(), 2, "{point}#{skip}");
        assert_eq!(a[0].address.ip(), ip("10.0.0.1"), "{point}#{skip}");
        assert_eq!(a[1].address.ip(), ip("fd00::1"), "{point}#{skip}");
        assert_eq!(
            env.reserved(),
            addrs(&a).into_iter().collect(),
            "{point}#{skip}"
        );
        // Another pod is not given A's addresses.
        let b = env.alloc(&dual(), &Owner::new("B", "net1")).unwrap();
        assert_eq!(
            addrs(&b),
            vec![ip("10.0.0.2"), ip("fd00::2")],
            "{point}#{skip}"
        );
        // GC with both valid only removes temp files.
        let report = env.gc(&valid(&[("A", "net1"), ("B", "net1")]));
        assert!(
            report.released.is_empty() && report.errors.is_empty(),
            "{point}#{skip}: {report:?}"
        );
        let want: BTreeSet<String> = [
            "/10.0.0.1",
            "/10.0.0.2",
            "/fd00::1",
            "/fd00::2",
            "owners/A_net1",
            "owners/B_net1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(env.leftovers(), want, "{point}#{skip}");
        assert_eq!(env.store.reserved_by("A", "net1").unwrap(), addrs(&a));
    }
}

#[test]
fn crash_in_the_middle_of_del_is_finished_by_the_next_del() {
    let env = Env::new();
    let a = env.alloc(&dual(), &Owner::new("A", "net1")).unwrap();
    failpoint::arm("release:after_ip", 0);
    assert!(env.release("A", "net1").is_err());
    failpoint::reset();
    assert_eq!(
        env.reserved().len(),
        1,
        "one address released before the crash"
    );
    assert_eq!(
        env.store.reserved_by("A", "net1").unwrap(),
        vec![a[1].address.ip()]
    );
    assert_eq!(env.release("A", "net1").unwrap(), vec![a[1].address.ip()]);
    assert!(env.leftovers().is_empty(), "{:?}", env.leftovers());
}

#[test]
fn address_file_without_index_is_left_to_gc() {
    // Not produced by this crate's write order, but possible after tampering
    // or an older layout: DEL (O(1), no listing) cannot see it; GC can.
    let env = Env::new();
    env.write("10.0.0.3", &reservation_json("A", "net1"));
    env.write("10.0.0.4", &reservation_json("B", "net1"));
    assert_eq!(env.release("A", "net1").unwrap(), Vec::<IpAddr>::new());
    // The allocator never hands it out meanwhile.
    let c = cfg(
        json!({"ranges": [[{"subnet": "10.0.0.0/29", "rangeStart": "10.0.0.3", "rangeEnd": "10.0.0.5"}]]}),
    );
    assert_eq!(env.take(&c, "C"), vec![ip("10.0.0.5")]);
    let report = env.gc(&valid(&[("B", "net1"), ("C", "net1")]));
    assert_eq!(
        report.released,
        vec![(
            NET.to_string(),
            ip("10.0.0.3"),
            "A".to_string(),
            "net1".to_string()
        )]
    );
    assert_eq!(
        env.reserved(),
        [ip("10.0.0.4"), ip("10.0.0.5")].into_iter().collect()
    );
}

#[test]
fn unparsable_files_are_cleaned_by_del_and_gc() {
    let env = Env::new();
    let c = cfg(json!({"ranges": [[{"subnet": "10.0.0.0/29"}]]}));
    // An empty address file (power loss) listed by A's index.
    env.write(
        "owners/A_net1",
        br#"{"containerId":"A","ifname":"net1","ips":["10.0.0.1"]}"#,
    );
    env.write("10.0.0.1", b"");
    // An empty address file nobody lists: taken until GC removes it.
    env.write("10.0.0.2", b"");
    assert_eq!(env.take(&c, "B"), vec![ip("10.0.0.3")]);
    assert_eq!(env.release("A", "net1").unwrap(), vec![ip("10.0.0.1")]);
    assert!(!env.dir().join("10.0.0.1").exists());
    let report = env.gc(&valid(&[("B", "net1")]));
    assert!(report.errors.is_empty());
    assert!(!env.dir().join("10.0.0.2").exists());
    assert_eq!(env.reserved(), [ip("10.0.0.3")].into_iter().collect());
}

#[test]
fn unparsable_index_falls_back_to_a_scan() {
    let env = Env::new();
    let c = cfg(json!({"ranges": [[{"subnet": "10.0.0.0/29"}], [{"subnet": "fd00::/125"}]]}));
    let a = env.alloc(&c, &Owner::new("A", "net1")).unwrap();
    env.take(&c, "B");
    env.write("owners/A_net1", b"{\"containerId\":");
    assert!(matches!(
        env.store.reserved_by("A", "net1"),
        Err(IpamError::Corrupt { .. })
    ));
    // ADD is still idempotent, DEL still complete.
    assert_eq!(env.alloc(&c, &Owner::new("A", "net1")).unwrap(), a);
    env.write("owners/A_net1", b"garbage");
    let mut released = env.release("A", "net1").unwrap();
    released.sort();
    assert_eq!(released, addrs(&a));
    assert_eq!(env.reserved().len(), 2, "B keeps its addresses");
}

#[test]
fn stray_temp_linked_to_a_live_reservation_is_harmless() {
    let env = Env::new();
    let c = small();
    failpoint::arm("create_exclusive:after_link", 0);
    let _ = env.alloc(&c, &Owner::new("A", "net1"));
    failpoint::reset();
    let temps: Vec<String> = env
        .leftovers()
        .into_iter()
        .filter(|f| f.contains(".tmp."))
        .collect();
    assert_eq!(temps.len(), 1, "{temps:?}");
    let report = env.gc(&valid(&[("A", "net1")]));
    assert!(report.released.is_empty() && report.errors.is_empty());
    assert_eq!(
        env.holder(ip("10.0.0.10")).as_deref(),
        Some("A"),
        "content intact after the temp link is removed"
    );
    assert_eq!(
        env.store.reserved_by("A", "net1").unwrap(),
        vec![ip("10.0.0.10")]
    );
}

#[test]
fn io_error_on_the_second_address_rolls_back_the_first() {
    let env = Env::new();
    failpoint::arm_error("create_exclusive:before_link", 1);
    let err = env
        .alloc(&dual(), &pod("A", "net1", "ns", "a"))
        .unwrap_err();
    failpoint::reset();
    assert!(matches!(err, IpamError::Io { .. }), "{err:?}");
    assert!(env.leftovers().is_empty(), "{:?}", env.leftovers());
    assert!(!env.dir().join("last_reserved_ip.0").exists());
    assert!(!env.dir().join("sticky/ns_a_net1").exists());

    // A re-ADD that already holds set 0 keeps it when set 1 fails.
    let c0 = cfg(json!({"ranges": [[{"subnet": "10.0.0.0/29"}]]}));
    let held = env.alloc(&c0, &Owner::new("B", "net1")).unwrap();
    failpoint::arm_error("create_exclusive:before_link", 0);
    assert!(env.alloc(&dual(), &Owner::new("B", "net1")).is_err());
    failpoint::reset();
    assert_eq!(env.store.reserved_by("B", "net1").unwrap(), addrs(&held));
    let want: BTreeSet<String> = ["/10.0.0.1", "owners/B_net1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(env.leftovers(), want);
    let index: Value =
        serde_json::from_slice(&std::fs::read(env.dir().join("owners/B_net1")).unwrap()).unwrap();
    assert_eq!(
        index["ips"],
        json!(["10.0.0.1"]),
        "index restored to what B holds"
    );
}
