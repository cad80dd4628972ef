//! Issue 20, items 1 and 11: the store never writes, reads or removes
//! through a symbolic link planted in it, and a store belongs to the
//! namespace of its first pod.

use std::os::unix::fs::PermissionsExt;

use super::*;

/// A root 0600 file and a directory of files outside the store, which
/// links inside it point at.
struct Victims {
    _dir: TempDir,
    file: std::path::PathBuf,
    chosen: std::path::PathBuf,
}

impl Victims {
    fn new() -> Victims {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secret");
        std::fs::write(&file, b"root's own").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let chosen = dir.path().join("chosen");
        std::fs::create_dir(&chosen).unwrap();
        for n in ["a", "b", "not json"] {
            std::fs::write(chosen.join(n), b"{ unparsable").unwrap();
        }
        Victims {
            _dir: dir,
            file,
            chosen,
        }
    }

    fn intact(&self) {
        assert_eq!(std::fs::read(&self.file).unwrap(), b"root's own");
        let mut left: Vec<_> = std::fs::read_dir(&self.chosen)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, vec!["a", "b", "not json"]);
    }
}

#[test]
fn hints_and_reads_never_follow_a_link_and_gc_removes_only_the_link() {
    let env = Env::new();
    let v = Victims::new();
    // The round-robin cursor and the sticky record of the pod that comes.
    let cursor = env.dir().join("last_reserved_ip.0");
    std::os::unix::fs::symlink(&v.file, &cursor).unwrap();
    let owner = pod("c1", "net1", "hil", "proxy-0");
    let sticky = env.store.layout.sticky_file("hil", "proxy-0", "net1");
    std::os::unix::fs::symlink(&v.file, &sticky).unwrap();
    // An address file and an owner index that are links.
    std::os::unix::fs::symlink(&v.file, env.dir().join("10.0.0.14")).unwrap();
    std::os::unix::fs::symlink(&v.file, env.store.layout.owner_file("c9", "net1")).unwrap();

    let got = env.alloc(&small(), &owner).unwrap();
    assert_eq!(addrs(&got), vec![ip("10.0.0.10")]);
    v.intact();
    // GC: the links are leftovers; it removes them, not their targets.
    let report = env.gc(&valid(&[("c1", "net1")]));
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    v.intact();
    for l in [&cursor, &sticky, &env.dir().join("10.0.0.14")] {
        assert!(
            std::fs::symlink_metadata(l).is_err(),
            "{} left",
            l.display()
        );
    }
}

#[test]
fn a_store_directory_that_is_a_link_is_refused() {
    let state = tempfile::tempdir().unwrap();
    let v = Victims::new();
    let dir = state.path().join("ipam").join(NET);
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(&v.chosen, dir.join("sticky")).unwrap();
    let e = Store::open(state.path(), NET).unwrap_err();
    assert!(e.to_string().contains("symbolic link"), "{e}");
    // The daemon's GC of every store: the same refusal, nothing removed.
    let report = release_all_except(state.path(), &HashSet::new(), Duration::from_secs(1));
    assert_eq!(report.errors.len(), 1, "{:?}", report.errors);
    v.intact();
    // The network's directory itself a link.
    std::fs::remove_dir_all(state.path().join("ipam")).unwrap();
    std::fs::create_dir(state.path().join("ipam")).unwrap();
    std::os::unix::fs::symlink(&v.chosen, &dir).unwrap();
    assert!(Store::open(state.path(), NET).is_err());
    v.intact();
}

#[test]
fn a_store_belongs_to_the_namespace_of_its_first_pod() {
    let env = Env::new();
    let lock = env.store.lock(Duration::from_secs(5)).unwrap();
    assert_eq!(lock.check_owner("hil").unwrap(), Ownership::Claimable);
    drop(lock);
    env.alloc(&small(), &pod("c1", "net1", "hil", "p1"))
        .unwrap();
    let lock = env.store.lock(Duration::from_secs(5)).unwrap();
    lock.record_owner("hil").unwrap();
    assert_eq!(lock.owner().unwrap().as_deref(), Some("hil"));
    assert_eq!(lock.check_owner("hil").unwrap(), Ownership::Owned);
    let e = lock.check_owner("evil").unwrap_err();
    assert!(
        matches!(&e, IpamError::NotOwner { owner, namespace, .. } if owner == "hil" && namespace == "evil"),
        "{e}"
    );
    drop(lock);
    // Once hil holds nothing, the name passes to the next namespace.
    env.release("c1", "net1").unwrap();
    let lock = env.store.lock(Duration::from_secs(5)).unwrap();
    assert_eq!(lock.check_owner("evil").unwrap(), Ownership::Claimable);
    drop(lock);
    // A store from before owners were recorded: its holders decide.
    let env = Env::new();
    env.alloc(&small(), &pod("c2", "net1", "hil", "p2"))
        .unwrap();
    let lock = env.store.lock(Duration::from_secs(5)).unwrap();
    assert!(lock.check_owner("evil").is_err());
    assert_eq!(lock.check_owner("hil").unwrap(), Ownership::Claimable);
}
