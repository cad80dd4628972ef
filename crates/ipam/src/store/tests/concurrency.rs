//! Concurrent allocation (threads and processes) and scale.

use super::*;
use std::process::Command;
use std::sync::{Arc, Barrier};

fn pool_24() -> IpamConfig {
    cfg(json!({"ranges": [[{"subnet": "10.9.0.0/24", "gateway": "10.9.0.1"}]]}))
}

#[test]
fn thirty_two_threads_get_thirty_two_distinct_addresses() {
    let state = tempfile::tempdir().unwrap();
    let c = Arc::new(pool_24());
    let barrier = Arc::new(Barrier::new(32));
    let handles: Vec<_> = (0..32)
        .map(|n| {
            let (state, c, barrier) = (
                state.path().to_path_buf(),
                Arc::clone(&c),
                Arc::clone(&barrier),
            );
            std::thread::spawn(move || {
                // Each thread opens its own store and lock file description.
                let store = Store::open(&state, NET).unwrap();
                barrier.wait();
                let mut lock = store.lock(Duration::from_secs(20)).unwrap();
                let a = lock
                    .allocate(&c, &Owner::new(format!("c{n}"), "net1"), &[], &mut |_| {
                        false
                    })
                    .unwrap();
                (format!("c{n}"), a[0].address.ip())
            })
        })
        .collect();
    let got: Vec<(String, IpAddr)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let distinct: BTreeSet<IpAddr> = got.iter().map(|(_, ip)| *ip).collect();
    assert_eq!(distinct.len(), 32, "{got:?}");
    assert!(
        !distinct.contains(&ip("10.9.0.1")),
        "gateway never handed out"
    );
    // What the store says agrees with what each thread was given.
    let store = Store::open(state.path(), NET).unwrap();
    for (cid, ip) in &got {
        assert_eq!(store.reserved_by(cid, "net1").unwrap(), vec![*ip]);
    }
    let want: BTreeSet<IpAddr> = (2..34).map(|o| ip(&format!("10.9.0.{o}"))).collect();
    assert_eq!(distinct, want, "round-robin packs them from the start");
}

const CHILD_ENV: &str = "EDGELINK_IPAM_TEST_CHILD_STATE";

/// Not a test on its own: the body of each child process of
/// `sixteen_processes_get_distinct_addresses` (does nothing without the env).
#[test]
fn child_allocates_once() {
    let Ok(state) = std::env::var(CHILD_ENV) else {
        return;
    };
    let cid = std::env::var("EDGELINK_IPAM_TEST_CHILD_ID").unwrap();
    let store = Store::open(Path::new(&state), NET).unwrap();
    let mut lock = store.lock(Duration::from_secs(20)).unwrap();
    lock.allocate(&pool_24(), &Owner::new(cid, "net1"), &[], &mut |_| false)
        .unwrap();
}

#[test]
fn sixteen_processes_get_distinct_addresses() {
    let state = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..16)
        .map(|n| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "store::tests::concurrency::child_allocates_once",
                    "--test-threads",
                    "1",
                    "--quiet",
                ])
                .env(CHILD_ENV, state.path())
                .env("EDGELINK_IPAM_TEST_CHILD_ID", format!("p{n}"))
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    let store = Store::open(state.path(), NET).unwrap();
    let mut all = BTreeSet::new();
    for n in 0..16 {
        let held = store.reserved_by(&format!("p{n}"), "net1").unwrap();
        assert_eq!(held.len(), 1, "p{n}: {held:?}");
        all.insert(held[0]);
    }
    assert_eq!(all.len(), 16);
}

#[test]
fn five_thousand_reservations_in_a_slash_16() {
    let env = Env::new();
    let c = cfg(json!({"ranges": [[{"subnet": "10.20.0.0/16", "gateway": "10.20.0.1"}]]}));
    let nth = |n: u32| {
        IpAddr::V4(std::net::Ipv4Addr::from(
            u32::from(std::net::Ipv4Addr::new(10, 20, 0, 0)) + n,
        ))
    };
    {
        let mut lock = env.store.lock(Duration::from_secs(5)).unwrap();
        for n in 0..5000 {
            let a = lock
                .allocate(&c, &Owner::new(format!("c{n}"), "net1"), &[], &mut |_| {
                    false
                })
                .unwrap();
            assert_eq!(a[0].address.ip(), nth(n + 2), "c{n}");
        }
    }
    assert_eq!(env.reserved().len(), 5000);
    // The next one continues right after the last reserved.
    assert_eq!(env.take(&c, "next"), vec![nth(5002)]);
    // A released address in the middle is not handed out again at once.
    assert_eq!(env.release("c100", "net1").unwrap(), vec![nth(102)]);
    assert_eq!(env.take(&c, "after-release"), vec![nth(5003)]);
    // DEL and CHECK of one among thousands.
    assert_eq!(
        env.store.reserved_by("c4000", "net1").unwrap(),
        vec![nth(4002)]
    );
    assert_eq!(env.release("c4000", "net1").unwrap(), vec![nth(4002)]);
    assert_eq!(
        env.store.reserved_by("c4000", "net1").unwrap(),
        Vec::<IpAddr>::new()
    );
    // Starting the walk inside the taken block skips it and still finds the first free one.
    env.write("last_reserved_ip.0", b"10.20.0.2");
    assert_eq!(env.take(&c, "walk"), vec![nth(102)]);
    assert_eq!(env.reserved().len(), 5001);
}
