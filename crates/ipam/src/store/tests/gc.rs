//! GC: release everything not valid, remove leftovers, keep going on errors.

use super::*;
use std::fs::{self, File};
use std::time::SystemTime;

#[test]
fn gc_releases_exactly_the_invalid_attachments() {
    let env = Env::new();
    let c = cfg(json!({"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/64"}]]}));
    let a = env.alloc(&c, &Owner::new("A", "net1")).unwrap();
    let b = env.alloc(&c, &pod("B", "net1", "ns", "b")).unwrap();
    let b2 = env.alloc(&c, &Owner::new("B", "net2")).unwrap();
    let report = env.gc(&valid(&[("A", "net1"), ("B", "net2"), ("Z", "net9")]));
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let mut released: Vec<_> = report.released.clone();
    released.sort();
    let mut want: Vec<_> = addrs(&b)
        .into_iter()
        .map(|ip| (NET.to_string(), ip, "B".to_string(), "net1".to_string()))
        .collect();
    want.sort();
    assert_eq!(released, want);
    assert!(!env.dir().join("owners/B_net1").exists());
    assert_eq!(env.store.reserved_by("A", "net1").unwrap(), addrs(&a));
    assert_eq!(env.store.reserved_by("B", "net2").unwrap(), addrs(&b2));
    assert!(
        env.dir().join("sticky/ns_b_net1").exists(),
        "young sticky memory is kept"
    );
    // A second run has nothing to do.
    let again = env.gc(&valid(&[("A", "net1"), ("B", "net2")]));
    assert!(again.released.is_empty() && again.errors.is_empty());
    // An empty valid set releases all.
    assert_eq!(env.gc(&valid(&[])).released.len(), 4);
    assert!(env.leftovers().is_empty(), "{:?}", env.leftovers());
}

#[test]
fn gc_removes_partial_leftovers_and_leaves_unknown_files_alone() {
    let env = Env::new();
    let c = small();
    env.take(&c, "A");
    for f in [".tmp.999.0", "owners/.tmp.999.1", "sticky/.tmp.999.2"] {
        env.write(f, b"partial");
    }
    env.write("10.0.0.12", b"{\"contai");
    env.write("owners/X_net1", b"not json");
    env.write("sticky/ns_x_net1", b"");
    env.write("last_reserved_ip.3", b"banana");
    env.write("README", b"operator notes");
    env.write("010.000.000.013", &reservation_json("Q", "net1"));
    let report = env.gc(&valid(&[("A", "net1")]));
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(
        report.released.is_empty(),
        "unparsable files have no owner to report: {:?}",
        report.released
    );
    for gone in [
        ".tmp.999.0",
        "owners/.tmp.999.1",
        "sticky/.tmp.999.2",
        "10.0.0.12",
        "owners/X_net1",
        "sticky/ns_x_net1",
        "last_reserved_ip.3",
    ] {
        assert!(!env.dir().join(gone).exists(), "{gone} should be removed");
    }
    for kept in [
        "README",
        "010.000.000.013",
        "lock",
        "10.0.0.10",
        "owners/A_net1",
        "last_reserved_ip.0",
    ] {
        assert!(env.dir().join(kept).exists(), "{kept} should be kept");
    }
}

#[test]
fn grace_keeps_young_reservations() {
    let env = Env::new();
    let c = small();
    env.take(&c, "A");
    let mut lock = env.store.lock(Duration::from_secs(1)).unwrap();
    let report = lock.release_all_except_with_grace(&valid(&[]), Duration::from_secs(3600));
    assert!(report.released.is_empty() && report.errors.is_empty());
    drop(lock);
    assert_eq!(
        env.store.reserved_by("A", "net1").unwrap(),
        vec![ip("10.0.0.10")]
    );
    // Once old enough (here: grace zero), it goes.
    let mut lock = env.store.lock(Duration::from_secs(1)).unwrap();
    let report = lock.release_all_except_with_grace(&valid(&[]), Duration::ZERO);
    assert_eq!(report.released.len(), 1);
    drop(lock);
    assert!(env.leftovers().is_empty());
}

#[test]
fn old_unused_sticky_records_are_forgotten() {
    let env = Env::new();
    let c = small();
    env.alloc(&c, &pod("A", "net1", "ns", "old")).unwrap(); // .10, released below
    env.alloc(&c, &pod("B", "net1", "ns", "live")).unwrap(); // .11, still held
    env.alloc(&c, &pod("C", "net1", "ns", "recent")).unwrap(); // .12, released below
    env.release("A", "net1").unwrap();
    env.release("C", "net1").unwrap();
    let long_ago = SystemTime::now() - STICKY_TTL - Duration::from_secs(60);
    for f in ["sticky/ns_old_net1", "sticky/ns_live_net1"] {
        File::options()
            .write(true)
            .open(env.dir().join(f))
            .unwrap()
            .set_modified(long_ago)
            .unwrap();
    }
    let report = env.gc(&valid(&[("B", "net1")]));
    assert!(report.errors.is_empty());
    assert!(
        !env.dir().join("sticky/ns_old_net1").exists(),
        "old and unused"
    );
    assert!(
        env.dir().join("sticky/ns_live_net1").exists(),
        "old but its pod holds the address"
    );
    assert!(env.dir().join("sticky/ns_recent_net1").exists(), "recent");
}

#[test]
fn gc_of_every_network_under_the_state_dir() {
    let state = tempfile::tempdir().unwrap();
    let c = small();
    let n1 = Store::open(state.path(), "net-a").unwrap();
    let n2 = Store::open(state.path(), "net-b").unwrap();
    let n3 = Store::open(state.path(), "net-c").unwrap();
    for (store, cid) in [(&n1, "A"), (&n2, "B"), (&n3, "C")] {
        let mut lock = store.lock(Duration::from_secs(1)).unwrap();
        lock.allocate(&c, &Owner::new(cid, "net1"), &[], &mut |_| false)
            .unwrap();
    }
    fs::create_dir(state.path().join("ipam/lost+found")).unwrap();
    fs::write(state.path().join("ipam/stray-file"), b"x").unwrap();
    // net-c is busy: reported, the others are still collected.
    let busy = n3.lock(Duration::from_secs(1)).unwrap();
    let report = release_all_except(
        state.path(),
        &valid(&[("A", "net1")]),
        Duration::from_millis(20),
    );
    drop(busy);
    assert_eq!(
        report.released,
        vec![(
            "net-b".to_string(),
            ip("10.0.0.10"),
            "B".to_string(),
            "net1".to_string()
        )]
    );
    assert_eq!(report.errors.len(), 1, "{:?}", report.errors);
    assert!(
        matches!(&report.errors[0], IpamError::LockTimeout { path, .. } if path.ends_with("net-c/lock"))
    );
    assert_eq!(n1.reserved_by("A", "net1").unwrap(), vec![ip("10.0.0.10")]);
    assert_eq!(n3.reserved_by("C", "net1").unwrap(), vec![ip("10.0.0.10")]);
    // Nothing there at all is fine.
    let empty = tempfile::tempdir().unwrap();
    let r = release_all_except(empty.path(), &valid(&[]), Duration::from_millis(20));
    assert!(r.released.is_empty() && r.errors.is_empty());
}

#[test]
fn gc_reports_errors_and_keeps_going() {
    let env = Env::new();
    let c = small();
    env.take(&c, "A");
    env.take(&c, "B");
    // A directory where an address file should be: reading it fails.
    fs::create_dir(env.dir().join("10.0.0.14")).unwrap();
    let report = env.gc(&valid(&[]));
    assert_eq!(report.errors.len(), 1, "{:?}", report.errors);
    assert!(report.errors[0].to_string().contains("10.0.0.14"));
    assert_eq!(
        report.released.len(),
        2,
        "the other reservations are still released"
    );
}

/// CNI GC's grace ([`GC_GRACE`]): a reservation just made (an ADD in
/// flight) survives a GC that does not list it; once its file is older than
/// the grace, the same GC releases it.
#[test]
fn cni_gc_grace_keeps_an_add_in_flight_and_collects_an_old_reservation() {
    let env = Env::new();
    let c = small();
    let young = env.take(&c, "young");
    let old = env.take(&c, "old");
    // Age "old": its reservation files (and owner index) written an hour ago.
    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    for dir in [env.dir().to_path_buf(), env.dir().join("owners")] {
        for e in fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            let is_old = super::super::disk_ip_name(&name).is_some_and(|ip| old.contains(&ip))
                || name.starts_with("old_");
            if is_old {
                File::options()
                    .write(true)
                    .open(e.path())
                    .unwrap()
                    .set_modified(hour_ago)
                    .unwrap();
            }
        }
    }
    let mut lock = env.store.lock(Duration::from_secs(1)).unwrap();
    let report = lock.release_all_except_with_grace(&valid(&[]), GC_GRACE);
    drop(lock);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let released: Vec<IpAddr> = report.released.iter().map(|r| r.1).collect();
    assert_eq!(released, old);
    assert_eq!(env.store.reserved_by("young", "net1").unwrap(), young);
    assert!(env.store.reserved_by("old", "net1").unwrap().is_empty());
}

#[test]
fn release_all_but_keeps_what_the_predicate_keeps() {
    let env = Env::new();
    let c = small();
    let a = env.take(&c, "A");
    let b = env.take(&c, "B");
    let d = env.take(&c, "D");
    let mut lock = env.store.lock(Duration::from_secs(5)).unwrap();
    let keep = |cid: &str, ifname: &str| ifname == "net1" && (cid == "A" || cid == "D");
    let report = lock.release_all_but(&keep, Duration::ZERO);
    drop(lock);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(
        report.released,
        vec![(NET.to_string(), b[0], "B".to_string(), "net1".to_string())]
    );
    assert_eq!(env.store.reserved_by("A", "net1").unwrap(), a);
    assert_eq!(env.store.reserved_by("D", "net1").unwrap(), d);
}

#[test]
fn container_ids_of_256_characters_reserve_check_gc_and_release() {
    // CNI allows 256-character container IDs; every file keyed by one
    // (owner index, sticky memory) must stay a legal file name.
    let env = Env::new();
    let c = small();
    let long_a = "a".repeat(256);
    let long_b = format!("b{}", "_.".repeat(127) + "x");
    assert_eq!(long_b.len(), 256);
    let pa = pod(&long_a, "net1", &"n".repeat(63), &"p".repeat(253));
    let a = addrs(&env.alloc(&c, &pa).unwrap());
    let b = env.take(&c, &long_b);
    assert_eq!(env.store.reserved_by(&long_a, "net1").unwrap(), a);
    assert_eq!(env.store.reserved_by(&long_b, "net1").unwrap(), b);
    for sub in ["owners", "sticky"] {
        for e in fs::read_dir(env.dir().join(sub)).unwrap() {
            assert!(e.unwrap().file_name().len() <= 255);
        }
    }
    let report = env.gc(&valid(&[(&long_a, "net1")]));
    assert_eq!(report.released.len(), 1, "{:?}", report.released);
    assert_eq!(env.release(&long_a, "net1").unwrap(), a);
    assert!(env.release(&long_a, "net1").unwrap().is_empty());
    assert!(env.leftovers().is_empty(), "{:?}", env.leftovers());
}
