//! Attachment record file names: attachments whose old names collided,
//! container IDs as long as CNI allows, records written under the old name,
//! and what a stripped-config DEL meets under `ipam/`.

use edgelink_attachment::RecordStore;
use edgelink_tests::*;
use serde_json::json;

const NET: &str = "plant-floor";

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

fn file_name(p: std::path::PathBuf) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn attachments_whose_old_record_names_collide_keep_two_records() {
    // Both were "a_b_c.json": the second ADD overwrote the first's record,
    // and a DEL of either removed the record of both.
    let lab = Lab::new();
    let _d = lab.daemon();
    let conf = lab.bridge_conf("1.0.0");
    let store = RecordStore::new(lab.state.path());
    let (p1, p2) = (lab.pod(), lab.pod());
    let r1 = Call::new("ADD", "a_b", Some(&p1.path()), "c")
        .run(&lab.node, &conf)
        .ok();
    let r2 = Call::new("ADD", "a", Some(&p2.path()), "b_c")
        .run(&lab.node, &conf)
        .ok();
    assert_eq!(lab.reserved(NET).len(), 2);
    assert_eq!(
        sorted(lab.records()),
        sorted(vec![
            file_name(store.path("a_b", "c")),
            file_name(store.path("a", "b_c"))
        ])
    );
    assert_eq!(store.read("a_b", "c").unwrap().unwrap().netns, p1.path());
    assert_eq!(store.read("a", "b_c").unwrap().unwrap().netns, p2.path());

    // DEL of one leaves the other's record, reservation and CHECK.
    Call::new("DEL", "a", Some(&p2.path()), "b_c")
        .run(&lab.node, &with_prev(&conf, &r2))
        .ok_empty();
    assert_eq!(lab.records(), vec![file_name(store.path("a_b", "c"))]);
    let ip1 = r1["ips"][0]["address"].as_str().unwrap();
    assert_eq!(lab.reserved(NET), vec![ip1.split('/').next().unwrap()]);
    Call::new("CHECK", "a_b", Some(&p1.path()), "c")
        .run(&lab.node, &with_prev(&conf, &r1))
        .ok_empty();
    Call::new("DEL", "a_b", Some(&p1.path()), "c")
        .run(&lab.node, &conf)
        .ok_empty();
    assert!(lab.records().is_empty(), "{:?}", lab.records());
    assert!(lab.reserved_all().is_empty(), "{:?}", lab.reserved_all());
}

#[test]
fn a_container_id_of_256_characters_adds_checks_and_deletes_twice() {
    // CNI_CONTAINERID may be 256 characters; escaped ('_' and '.' take
    // three bytes each) it is far longer than a file name may be.
    let lab = Lab::new();
    let _d = lab.daemon();
    let conf = lab.bridge_conf("1.1.0");
    for cid in ["f".repeat(256), format!("k{}", "8_.".repeat(85))] {
        assert_eq!(cid.len(), 256);
        let pod = lab.pod();
        let r = Call::new("ADD", &cid, Some(&pod.path()), "net1")
            .run(&lab.node, &conf)
            .ok();
        assert_eq!(lab.reserved(NET).len(), 1);
        let records = lab.records();
        assert_eq!(records.len(), 1);
        assert!(records[0].len() <= 255, "{}", records[0]);
        Call::new("CHECK", &cid, Some(&pod.path()), "net1")
            .run(&lab.node, &with_prev(&conf, &r))
            .ok_empty();
        for _ in 0..2 {
            Call::new("DEL", &cid, Some(&pod.path()), "net1")
                .run(&lab.node, &with_prev(&conf, &r))
                .ok_empty();
            assert!(lab.records().is_empty(), "{:?}", lab.records());
            assert!(lab.reserved_all().is_empty(), "{:?}", lab.reserved_all());
            assert_eq!(pod.links_sorted(), vec!["lo"]);
        }
    }
    // Nothing half-written is left in the records directory either.
    let left: Vec<_> = std::fs::read_dir(lab.state.path().join("attachments"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_record_under_its_old_name_is_deleted_or_migrated() {
    // An older plugin named records "{cid}_{ifname}.json"; one written
    // before an upgrade must still be removed by DEL (also with a stripped
    // config), and the daemon moves it to its new name.
    let lab = Lab::new();
    let conf = lab.bridge_conf("1.0.0");
    let store = RecordStore::new(lab.state.path());
    let old_name = |cid: &str| {
        lab.state
            .path()
            .join(format!("attachments/{cid}_net1.json"))
    };
    for (i, stripped) in [false, true].into_iter().enumerate() {
        let cid = format!("pod.{i}");
        let pod = lab.pod();
        let r = Call::new("ADD", &cid, Some(&pod.path()), "net1")
            .run(&lab.node, &conf)
            .ok();
        std::fs::rename(store.path(&cid, "net1"), old_name(&cid)).unwrap();
        let del_conf = if stripped {
            json!({"cniVersion": "1.0.0", "type": "edgelink", "stateDir": lab.state_dir()})
        } else {
            with_prev(&conf, &r)
        };
        Call::new("DEL", &cid, Some(&pod.path()), "net1")
            .run(&lab.node, &del_conf)
            .ok_empty();
        assert!(!old_name(&cid).exists());
        assert!(lab.records().is_empty(), "{:?}", lab.records());
        assert!(lab.reserved_all().is_empty(), "{:?}", lab.reserved_all());
    }

    // The daemon moves it to its new name and serves it; CHECK agrees.
    let pod = lab.pod();
    let r = Call::new("ADD", "pod.9", Some(&pod.path()), "net1")
        .run(&lab.node, &conf)
        .ok();
    let new = store.path("pod.9", "net1");
    std::fs::rename(&new, old_name("pod.9")).unwrap();
    let _d = lab.daemon();
    assert!(
        wait_until(std::time::Duration::from_secs(20), || new.exists()
            && !old_name("pod.9").exists()),
        "not migrated: {:?}",
        lab.records()
    );
    assert_eq!(lab.records(), vec![file_name(new.clone())]);
    assert!(
        wait_until(std::time::Duration::from_secs(20), || {
            Call::new("CHECK", "pod.9", Some(&pod.path()), "net1")
                .run(&lab.node, &with_prev(&conf, &r))
                .status
                == Some(0)
        }),
        "CHECK fails after the migration"
    );

    // Moved to its old name again while the daemon serves it: inotify
    // names both files, and the one gone is not taken for a DEL while the
    // other holds the record. Never stopped; moved back by a full pass.
    std::fs::rename(&new, old_name("pod.9")).unwrap();
    assert!(
        wait_until(std::time::Duration::from_secs(20), || new.exists()
            && !old_name("pod.9").exists()),
        "not migrated again: {:?}",
        lab.records()
    );
    let log = _d.log_text();
    assert!(
        !log.contains("attachment removed"),
        "the attachment was stopped when its record moved:\n{log}"
    );
    Call::new("DEL", "pod.9", Some(&pod.path()), "net1")
        .run(&lab.node, &with_prev(&conf, &r))
        .ok_empty();
    assert!(lab.records().is_empty(), "{:?}", lab.records());
    assert!(lab.reserved_all().is_empty(), "{:?}", lab.reserved_all());
}

#[test]
fn a_stripped_del_skips_directories_under_ipam_that_are_not_network_stores() {
    let lab = Lab::new();
    let conf = lab.bridge_conf("1.0.0");
    // Not network names: Store::open refuses them.
    for bad in ["not a network", ".hidden", "-dash", "x:y"] {
        std::fs::create_dir_all(lab.state.path().join("ipam").join(bad)).unwrap();
    }
    let pod = lab.pod();
    Call::new("ADD", "strip-bad", Some(&pod.path()), "net1")
        .run(&lab.node, &conf)
        .ok();
    assert_eq!(lab.reserved(NET).len(), 1);
    let stripped = json!({"cniVersion": "1.0.0", "type": "edgelink", "stateDir": lab.state_dir()});
    Call::new("DEL", "strip-bad", Some(&pod.path()), "net1")
        .run(&lab.node, &stripped)
        .ok_empty();
    assert!(lab.reserved(NET).is_empty());
    assert!(lab.records().is_empty(), "{:?}", lab.records());
    // And again, with nothing left to release.
    Call::new("DEL", "strip-bad", None, "net1")
        .run(&lab.node, &stripped)
        .ok_empty();
    // The directories are not the plugin's: left alone.
    assert!(lab.state.path().join("ipam/not a network").is_dir());
}

#[test]
fn a_del_over_a_torn_record_cleans_up_and_succeeds() {
    // The plugin writes records atomically; a disk or a hand edit can still
    // leave one cut short. DEL used to do all of its work, then fail with
    // code 5 naming the record, so the runtime retried it.
    let lab = Lab::new();
    let _d = lab.daemon();
    let conf = lab.bridge_conf("1.0.0");
    let pod = lab.pod();
    let r = Call::new("ADD", "torn", Some(&pod.path()), "net1")
        .run(&lab.node, &conf)
        .ok();
    let path = RecordStore::new(lab.state.path()).path("torn", "net1");
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len / 2)
        .unwrap();

    Call::new("DEL", "torn", Some(&pod.path()), "net1")
        .run(&lab.node, &with_prev(&conf, &r))
        .ok_empty();
    assert!(lab.records().is_empty(), "{:?}", lab.records());
    assert!(lab.reserved_all().is_empty(), "{:?}", lab.reserved_all());
    assert!(!pod.has_link("net1"));

    // Without CNI_NETNS the record was the only way to the pod's
    // interface: a torn one is still an error there (code 5, naming it).
    let r = Call::new("ADD", "torn2", Some(&pod.path()), "net1")
        .run(&lab.node, &conf)
        .ok();
    let path = RecordStore::new(lab.state.path()).path("torn2", "net1");
    std::fs::write(&path, b"{\"containerId\": \"torn2\"").unwrap();
    let out = Call::new("DEL", "torn2", None, "net1").run(&lab.node, &with_prev(&conf, &r));
    assert_eq!(out.status, Some(1), "{out:?}");
    let err = out.json();
    assert_eq!(err["code"], 5, "{err}");
    assert!(
        err["msg"]
            .as_str()
            .unwrap()
            .contains("not a valid attachment record"),
        "{err}"
    );
    // The runtime's next DEL, with the netns, finishes the job.
    Call::new("DEL", "torn2", Some(&pod.path()), "net1")
        .run(&lab.node, &with_prev(&conf, &r))
        .ok_empty();
    assert!(lab.records().is_empty() && lab.reserved_all().is_empty());
}
