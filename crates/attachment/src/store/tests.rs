//! Unit tests of the records directory.

use super::*;
use crate::{Forward, Protocol, RecordInterface, RECORD_VERSION};
use std::cell::RefCell;
use std::os::unix::fs::PermissionsExt;

mod power_cut;

/// A test's hook at a named point of `write`, on this thread.
type CutHook = Box<dyn FnMut(&'static str)>;

thread_local! {
    /// What `sync` fsync'd on this thread.
    pub(super) static SYNCED: RefCell<Vec<PathBuf>> = const { RefCell::new(Vec::new()) };
    static CUT: RefCell<Option<CutHook>> = const { RefCell::new(None) };
}

/// `write` passed `point` ("written", "synced", "renamed"): the hook a test
/// set runs there (power_cut.rs takes the disk's image).
pub(super) fn cut_point(point: &'static str) {
    CUT.with(|c| {
        if let Some(hook) = c.borrow_mut().as_mut() {
            hook(point);
        }
    });
}

fn rec(cid: &str) -> Record {
    Record {
        pid_namespace: None,
        netns_id: None,
        boot_id: None,
        version: RECORD_VERSION,
        container_id: cid.into(),
        ifname: "net1".into(),
        netns: "/var/run/netns/pod".into(),
        network: "plant-floor".into(),
        mode: "bridge".into(),
        pod_namespace: Some("hil".into()),
        pod_name: Some("proxy-0".into()),
        pod_uid: None,
        interface: RecordInterface {
            name: "net1".into(),
            mac: "02:00:00:00:00:01".into(),
            ips: vec!["172.17.16.200/24".parse().unwrap()],
        },
        forwards: vec![Forward {
            name: "api".into(),
            protocol: Protocol::Tcp,
            port: 8080,
            target: "172.17.16.120:8080".parse().unwrap(),
            connect_timeout_ms: 5000,
            idle_timeout_ms: None,
            max_connections: None,
            queue_timeout_ms: None,
            connect_retries: None,
            proxy_protocol: None,
            path: Default::default(),
            modbus: None,
        }],
        allowed_targets: vec!["172.17.16.0/24".parse().unwrap()],
        reverse: vec![],
        dns: None,
        health: None,
        virtual_addresses: Vec::new(),
        created_at: 1,
        cni_config: None,
    }
}

#[test]
fn write_read_list_remove() {
    let d = tempfile::tempdir().unwrap();
    let s = RecordStore::new(d.path());
    assert!(s.list().unwrap().is_empty());
    let p = s.write(&rec("c1")).unwrap();
    assert_eq!(
        fs::metadata(s.dir()).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert_eq!(
        fs::metadata(&p).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(s.read("c1", "net1").unwrap().unwrap(), rec("c1"));
    s.write(&rec("c2")).unwrap();
    fs::write(s.dir().join("junk.json"), b"{").unwrap();
    fs::write(s.dir().join(".c3_net1.json.123.tmp"), b"{").unwrap();
    let all = s.list().unwrap();
    assert_eq!(all.len(), 3);
    assert_eq!(all.iter().filter(|(_, r)| r.is_err()).count(), 1);
    assert!(s.remove("c1", "net1").unwrap());
    assert!(!s.remove("c1", "net1").unwrap());
    assert!(s.read("c1", "net1").unwrap().is_none());
}

#[test]
fn nudge_and_query_without_daemon_are_harmless() {
    let d = tempfile::tempdir().unwrap();
    crate::nudge_daemon(d.path(), "c1", "net1");
    let q = crate::query_daemon(
        d.path(),
        "c1",
        "net1",
        std::time::Duration::from_millis(100),
    );
    assert!(q.unwrap().is_none());
    let sock = std::os::unix::net::UnixListener::bind(d.path().join(crate::DAEMON_SOCKET)).unwrap();
    crate::nudge_daemon(d.path(), "c1", "net1");
    let (s, _) = sock.accept().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(s), &mut line).unwrap();
    assert_eq!(line, "rescan c1 net1\n");
}

fn rec_if(cid: &str, ifname: &str) -> Record {
    let mut r = rec(cid);
    r.ifname = ifname.into();
    r
}

fn names(s: &RecordStore) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(s.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn attachments_whose_old_names_collide_keep_two_records() {
    let d = tempfile::tempdir().unwrap();
    let s = RecordStore::new(d.path());
    let ab_c = rec_if("a_b", "c");
    let a_bc = rec_if("a", "b_c");
    s.write(&ab_c).unwrap();
    s.write(&a_bc).unwrap();
    assert_eq!(s.read("a_b", "c").unwrap(), Some(ab_c.clone()));
    assert_eq!(s.read("a", "b_c").unwrap(), Some(a_bc.clone()));
    assert_eq!(s.list().unwrap().len(), 2);
    // DEL of one leaves the other.
    assert!(s.remove("a", "b_c").unwrap());
    assert_eq!(s.read("a", "b_c").unwrap(), None);
    assert_eq!(s.read("a_b", "c").unwrap(), Some(ab_c.clone()));
    let all = s.list().unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].1.as_ref().unwrap(), &ab_c);
}

#[test]
fn long_container_ids_write_read_and_remove() {
    let d = tempfile::tempdir().unwrap();
    let s = RecordStore::new(d.path());
    for cid in ["a".repeat(256), format!("c{}", "_.".repeat(127) + "x")] {
        assert_eq!(cid.len(), 256);
        let r = rec(&cid);
        let p = s.write(&r).unwrap();
        assert!(p.file_name().unwrap().len() <= 255);
        assert_eq!(s.read(&cid, "net1").unwrap(), Some(r));
        assert!(s.remove(&cid, "net1").unwrap());
        assert!(!s.remove(&cid, "net1").unwrap(), "DEL stays idempotent");
        assert_eq!(s.read(&cid, "net1").unwrap(), None);
    }
    assert!(s.list().unwrap().is_empty());
    assert!(names(&s).is_empty(), "{:?}", names(&s));
}

#[test]
fn old_format_records_are_found_migrated_and_removed() {
    let d = tempfile::tempdir().unwrap();
    let s = RecordStore::new(d.path());
    fs::create_dir_all(s.dir()).unwrap();
    let body = |r: &Record| serde_json::to_vec_pretty(r).unwrap();
    // Written by an older plugin: `{cid}_{ifname}.json`. "a_b_c.json"
    // could be (a_b, c) or (a, b_c): its content says which.
    let ab_c = rec_if("a_b", "c");
    fs::write(s.dir().join("a_b_c.json"), body(&ab_c)).unwrap();
    let dotted = rec("pod.1");
    fs::write(s.dir().join("pod.1_net1.json"), body(&dotted)).unwrap();
    let gone = rec("gone.1");
    fs::write(s.dir().join("gone.1_net1.json"), body(&gone)).unwrap();

    // Found under the old name before any migration; the other
    // reading of the ambiguous name is not given someone else's record.
    assert_eq!(s.read("a_b", "c").unwrap(), Some(ab_c.clone()));
    assert_eq!(s.read("a", "b_c").unwrap(), None);
    assert!(!s.remove("a", "b_c").unwrap());
    assert!(s.dir().join("a_b_c.json").exists());
    // DEL before migration removes the old-format file.
    assert!(s.remove("gone.1", "net1").unwrap());
    assert!(!s.remove("gone.1", "net1").unwrap());

    // list moves the others to their new names, content unchanged.
    let all = s.list().unwrap();
    let listed: Vec<_> = all
        .iter()
        .map(|(p, r)| (p.clone(), r.as_ref().unwrap().clone()))
        .collect();
    assert_eq!(
        listed,
        vec![
            (s.path("a_b", "c"), ab_c.clone()),
            (s.path("pod.1", "net1"), dotted.clone()),
        ]
    );
    assert_eq!(names(&s), vec!["a%5Fb_c.json", "pod%2E1_net1.json"]);
    assert_eq!(s.read("pod.1", "net1").unwrap(), Some(dotted.clone()));
    // Idempotent.
    assert_eq!(s.list().unwrap().len(), 2);

    // An old-format file next to a newer record of the same attachment
    // is dropped: the newer one wins.
    let mut older = dotted.clone();
    older.created_at = 0;
    fs::write(s.dir().join("pod.1_net1.json"), body(&older)).unwrap();
    let all = s.list().unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(s.read("pod.1", "net1").unwrap(), Some(dotted.clone()));
    assert_eq!(names(&s), vec!["a%5Fb_c.json", "pod%2E1_net1.json"]);
    // A write removes the old-format file of its attachment.
    fs::write(s.dir().join("pod.1_net1.json"), body(&older)).unwrap();
    s.write(&dotted).unwrap();
    assert_eq!(names(&s), vec!["a%5Fb_c.json", "pod%2E1_net1.json"]);
}

#[test]
fn unreadable_old_format_records() {
    let d = tempfile::tempdir().unwrap();
    let s = RecordStore::new(d.path());
    fs::create_dir_all(s.dir()).unwrap();
    // One split only: it is this attachment's, reported and removed.
    fs::write(s.dir().join("pod.1_net1.json"), b"{").unwrap();
    assert!(matches!(
        s.read("pod.1", "net1"),
        Err(RecordError::Malformed { .. })
    ));
    assert!(s.remove("pod.1", "net1").unwrap());
    // Ambiguous: neither reading may remove it.
    fs::write(s.dir().join("a_b_c.json"), b"{").unwrap();
    assert_eq!(s.read("a", "b_c").unwrap(), None);
    assert!(!s.remove("a", "b_c").unwrap());
    assert!(!s.remove("a_b", "c").unwrap());
    let all = s.list().unwrap();
    assert_eq!(all.len(), 1);
    assert!(all[0].1.is_err());
    // May it hold a record of ...?
    assert!(RecordStore::may_name("a_b_c.json", "a", "b_c"));
    assert!(RecordStore::may_name("a_b_c.json", "a_b", "c"));
    assert!(RecordStore::may_name("a%5Fb_c.json", "a_b", "c"));
    assert!(!RecordStore::may_name("a%5Fb_c.json", "a", "b_c"));
    assert!(!RecordStore::may_name("junk.json", "junk", ""));
}

#[test]
fn stale_temp_files_are_removed_by_list() {
    let d = tempfile::tempdir().unwrap();
    let s = RecordStore::new(d.path());
    s.write(&rec("c1")).unwrap();
    let old = SystemTime::now() - STALE_TEMP - Duration::from_secs(5);
    // Leftovers of crashed writers, in the current and the old naming.
    for n in [".c1_net1.123.0.tmp", ".c2_net1.456.tmp"] {
        let f = fs::File::create(s.dir().join(n)).unwrap();
        f.set_modified(old).unwrap();
    }
    // A write in progress.
    fs::write(s.dir().join(".c3_net1.789.0.tmp"), b"{").unwrap();
    // Not a temp file: left alone.
    let f = fs::File::create(s.dir().join(".keep")).unwrap();
    f.set_modified(old).unwrap();
    assert_eq!(s.list().unwrap().len(), 1);
    assert_eq!(
        names(&s),
        vec![".c3_net1.789.0.tmp", ".keep", "c1_net1.json"]
    );
}

/// What `write` fsync'd for `r`, and the store's names afterwards.
fn synced_by_write(r: &Record) -> (Vec<PathBuf>, Vec<String>, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let s = RecordStore::new(d.path());
    SYNCED.with(|v| v.borrow_mut().clear());
    let p = s.write(r).unwrap();
    let synced = SYNCED.with(|v| v.borrow().clone());
    assert_eq!(
        serde_json::from_slice::<Record>(&fs::read(p).unwrap()).unwrap(),
        *r
    );
    (synced, names(&s), s.dir().to_path_buf())
}

fn is_temp_of(path: &Path, cid: &str) -> bool {
    let name = path.file_name().unwrap().to_string_lossy();
    name.starts_with(&format!(".{cid}_net1.")) && name.ends_with(".tmp")
}

#[test]
fn write_fsyncs_the_record_once_before_the_rename_and_leaves_no_temp() {
    // The built-in IPAM: one sync per ADD, the content before the rename.
    let (synced, names, _) = synced_by_write(&rec("c1"));
    assert_eq!(synced.len(), 1, "{synced:?}");
    assert!(is_temp_of(&synced[0], "c1"), "{synced:?}");
    assert_eq!(names, vec!["c1_net1.json"]);
}

#[test]
fn a_delegated_ipams_record_has_its_directory_fsynced_too() {
    // DEL with a stripped config finds the delegated IPAM only in the
    // record: its name must survive a power loss as well.
    let mut r = rec("c1");
    r.cni_config = Some(serde_json::json!({"type": "edgelink", "ipam": {"type": "host-local"}}));
    assert_eq!(r.delegated_ipam(), Some("host-local"));
    let (synced, names, dir) = synced_by_write(&r);
    assert_eq!(synced.len(), 2, "{synced:?}");
    assert!(is_temp_of(&synced[0], "c1"), "{synced:?}");
    assert_eq!(synced[1], dir);
    assert_eq!(names, vec!["c1_net1.json"]);
    // The built-in IPAM, named or by default, is not a delegate.
    for ipam in [
        serde_json::json!({"type": "edgelink"}),
        serde_json::json!({"ranges": []}),
    ] {
        r.cni_config = Some(serde_json::json!({"ipam": ipam}));
        assert_eq!(r.delegated_ipam(), None);
    }
}

#[test]
fn a_del_racing_a_migration_leaves_no_record() {
    // list moves an old-format file (link, then unlink) while DEL removes
    // the attachment's record under both names: whatever the interleaving,
    // nothing may be left (a record brought back to life after its DEL).
    let d = tempfile::tempdir().unwrap();
    let s = RecordStore::new(d.path());
    fs::create_dir_all(s.dir()).unwrap();
    let r = rec("pod.1");
    let body = serde_json::to_vec_pretty(&r).unwrap();
    for _ in 0..300 {
        fs::write(s.dir().join("pod.1_net1.json"), &body).unwrap();
        let lister = {
            let s = s.clone();
            std::thread::spawn(move || s.list().unwrap().len())
        };
        s.remove("pod.1", "net1").unwrap();
        let listed = lister.join().unwrap();
        assert!(listed <= 1);
        assert!(names(&s).is_empty(), "{:?}", names(&s));
        assert_eq!(s.read("pod.1", "net1").unwrap(), None);
    }
}

/// Found by the `record` fuzz target's round trip (docs/reliability.md,
/// Fuzzing): serde_json's default float parsing is not correctly rounded,
/// so a number in `cniConfig` (the config DEL hands a delegated IPAM)
/// changed by one unit in the last place at every write and read:
/// 1.0715660391465826e-75 was read back as ...825e-75, then ...823e-75.
#[test]
fn numbers_in_cni_config_survive_write_and_read_exactly() {
    let d = tempfile::tempdir().unwrap();
    let s = RecordStore::new(d.path());
    let text = r#"{"cniVersion": "1.0.0", "name": "n", "type": "edgelink",
        "ipam": {"type": "dhcp", "leaseRatio": 1.0715660391465826e-75, "big": -1.603964615428183e143}}"#;
    let mut r = rec("c1");
    r.cni_config = Some(serde_json::from_str(text).unwrap());
    let ipam = &r.cni_config.as_ref().unwrap()["ipam"];
    assert_eq!(ipam["leaseRatio"].as_f64(), Some(1.0715660391465826e-75));
    assert_eq!(ipam["big"].as_f64(), Some(-1.603964615428183e143));
    s.write(&r).unwrap();
    let back = s.read("c1", "net1").unwrap().unwrap();
    assert_eq!(back, r);
    // And again: nothing drifts from one write to the next.
    s.write(&back).unwrap();
    assert_eq!(
        s.read("c1", "net1").unwrap().unwrap().encode().unwrap(),
        r.encode().unwrap()
    );
}

#[test]
fn health_is_absent_from_records_without_it_and_round_trips_with_it() {
    // A record written before `health` existed (or without the key) reads
    // as no health, and one without health is written without the key: a
    // daemon of either side of an upgrade reads the same bytes.
    let plain = rec("c1");
    let text = String::from_utf8(plain.encode().unwrap()).unwrap();
    assert!(!text.contains("health"), "{text}");
    let back = Record::parse(Path::new("x"), text.as_bytes()).unwrap();
    assert_eq!(back.health, None);
    let mut with = rec("c2");
    with.health = Some(crate::Health {
        kind: crate::HealthKind::Http,
        target: "172.17.16.120:8080".parse().unwrap(),
        path: Some("/healthz".into()),
        expect_status: Some(200),
        payload: None,
        unit_id: None,
        register: None,
        interval_ms: 2000,
        timeout_ms: 1000,
        failure_threshold: 2,
        success_threshold: 2,
    });
    let text = with.encode().unwrap();
    assert_eq!(Record::parse(Path::new("x"), &text).unwrap(), with);
    // What an older daemon does with it: the record as it knew records,
    // the key ignored (records are read without deny_unknown_fields).
    let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
    assert_eq!(v["health"]["type"], "http");
    assert_eq!(v["health"]["expectStatus"], 200);
}
