//! How a record reaches the daemon between periodic passes: the inotify
//! watch on `<stateDir>/attachments/`, and the control socket's `rescan`
//! (which the plugin sends after ADD). Each test runs the daemon with a
//! reconcile interval of an hour, so only the path under test can make it
//! re-read the records within the deadline.

use crate::lab::*;
use edgelink_attachment::DAEMON_SOCKET;
use serde_json::Value;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

/// Generous for a loaded 2-core machine; the daemon takes milliseconds.
const PROMPT: Duration = Duration::from_secs(2);

/// No periodic pass within any test's lifetime.
const NO_PERIODIC_PASS: &[&str] = &["--reconcile-interval", "3600"];

fn lab(add: bool) -> DLab {
    DLab::with(Opts {
        flags: NO_PERIODIC_PASS,
        add,
        ..Opts::default()
    })
}

fn n_forwards(l: &DLab) -> usize {
    l.conf["forwards"].as_array().map_or(0, Vec::len)
}

fn wait_gone(l: &DLab, what: &str) {
    l.wait_status(PROMPT, what, |s| {
        s["attachments"].as_array().is_some_and(|a| a.is_empty())
    });
    assert!(l.refused(API), "{what}: port {API} still open");
}

fn wait_back(l: &DLab, what: &str) {
    let n = n_forwards(l);
    l.wait_status(PROMPT, what, |s| all_listening(s, CID, n));
    l.echo_once(what.as_bytes());
}

/// The lab's one record file.
fn the_record(l: &DLab) -> PathBuf {
    let recs = l.lab.records();
    assert_eq!(recs.len(), 1, "{recs:?}");
    l.lab.state.path().join("attachments").join(&recs[0])
}

/// `rescan` on the control socket, as the plugin sends it; the answer.
fn rescan(l: &DLab) -> String {
    let mut s = std::os::unix::net::UnixStream::connect(l.lab.state.path().join(DAEMON_SOCKET))
        .expect("connect to the control socket");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"rescan\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    reply
}

/// ADD with the daemon already running: served within the deadline, not at
/// the next periodic pass (the plugin's nudge and the watch both fire; the
/// tests below take each alone).
#[test]
fn add_is_served_at_once_without_a_periodic_pass() {
    let mut l = lab(false);
    l.add();
    wait_back(&l, "served after ADD");
}

/// Records moved out of and back into the directory, with no nudge: only
/// the inotify watch can tell the daemon.
#[test]
fn the_inotify_watch_alone_picks_up_a_removed_and_a_returned_record() {
    let mut l = lab(true);
    let rec = the_record(&l);
    let parked = l.lab.state.path().join("parked.json");

    std::fs::rename(&rec, &parked).unwrap();
    wait_gone(&l, "a record moved away stops being served");

    std::fs::rename(&parked, &rec).unwrap();
    wait_back(&l, "a record moved back is served");

    // Deleted, then written in place the way the plugin writes (a dot-named
    // temporary file, renamed).
    let body = std::fs::read(&rec).unwrap();
    std::fs::remove_file(&rec).unwrap();
    wait_gone(&l, "a deleted record stops being served");
    let tmp = rec.with_file_name(".new.tmp");
    std::fs::write(&tmp, &body).unwrap();
    std::fs::rename(&tmp, &rec).unwrap();
    wait_back(&l, "a record written in place is served");
    assert!(l.daemon().running());
}

/// The watch is taken out of the way (the watched directory is renamed and
/// a new, unwatched one takes its place: an inotify watch follows the
/// inode), so only `rescan` can make the daemon look.
#[test]
fn the_rescan_nudge_alone_makes_the_daemon_reread_the_records() {
    let mut l = lab(true);
    let rec = the_record(&l);
    let dir = rec.parent().unwrap().to_path_buf();
    let watched = l.lab.state.path().join("attachments.watched");
    std::fs::rename(&dir, &watched).unwrap();
    std::fs::create_dir(&dir).unwrap();

    // The records the daemon reads are now none.
    assert_eq!(rescan(&l).trim(), "ok");
    wait_gone(&l, "rescan with the record gone");

    // Copied (a read of the watched copy fires nothing the daemon watches
    // for) into the unwatched directory.
    let name = rec.file_name().unwrap();
    let body: Value = serde_json::from_slice(&std::fs::read(watched.join(name)).unwrap()).unwrap();
    std::fs::write(&rec, serde_json::to_vec(&body).unwrap()).unwrap();
    assert_eq!(rescan(&l).trim(), "ok");
    wait_back(&l, "rescan with the record back");

    assert!(l.daemon().running());
}

fn passes(l: &DLab) -> (f64, f64) {
    (
        l.metric_plain("edgelink_reconcile_full_passes_total"),
        l.metric_plain("edgelink_reconcile_record_passes_total"),
    )
}

fn wait_passes(l: &DLab, full: f64, what: &str) {
    let deadline = std::time::Instant::now() + PROMPT;
    while passes(l).0 < full {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {:?}",
            passes(l)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The plugin's ADD and DEL name their record (`rescan <containerID>
/// <ifname>`), and inotify names the file: the daemon serves and stops the
/// attachment with a pass over that record alone, not over every record (at
/// 500 attachments a full pass reads 500 records and opens 500 netns, and
/// ran beside the next ADD of a burst). What such a pass cannot settle
/// alone gets a full pass: a plain `rescan`, a record that does not parse.
#[test]
fn add_and_del_are_served_by_a_pass_over_their_record_alone() {
    let mut l = lab(false);
    wait_passes(&l, 1.0, "the first pass");
    assert_eq!(passes(&l), (1.0, 0.0), "only the first pass so far");

    l.add();
    wait_back(&l, "served after ADD");
    let (full, records) = passes(&l);
    assert_eq!(full, 1.0, "ADD made a full pass");
    assert!(records >= 1.0, "ADD made no pass over its record");

    // Removed and written back by hand, without a nudge: inotify names
    // the file.
    let rec = the_record(&l);
    let body = std::fs::read(&rec).unwrap();
    std::fs::remove_file(&rec).unwrap();
    wait_gone(&l, "stopped with its record removed");
    let tmp = rec.with_file_name(".back.tmp");
    std::fs::write(&tmp, &body).unwrap();
    std::fs::rename(&tmp, &rec).unwrap();
    wait_back(&l, "a record written back is served");
    assert_eq!(
        passes(&l).0,
        1.0,
        "a removed or written record made a full pass"
    );

    // A record that does not parse: a full pass, which keeps the served
    // attachment going and reports the file.
    std::fs::write(&tmp, b"{ torn").unwrap();
    std::fs::rename(&tmp, &rec).unwrap();
    l.wait_status(PROMPT, "the torn record reported", |s| {
        s["malformedRecords"]
            .as_array()
            .is_some_and(|m| m.len() == 1)
    });
    assert_eq!(passes(&l).0, 2.0, "a torn record made no full pass");
    l.echo_once(b"served on past a torn record");

    // Fixed: a pass over it alone takes it off the list.
    std::fs::write(&tmp, &body).unwrap();
    std::fs::rename(&tmp, &rec).unwrap();
    l.wait_status(PROMPT, "the fixed record no longer reported", |s| {
        s["malformedRecords"]
            .as_array()
            .is_some_and(|m| m.is_empty())
    });
    assert_eq!(passes(&l).0, 2.0);

    l.call("DEL").ok_empty();
    wait_gone(&l, "stopped after DEL");
    assert_eq!(passes(&l).0, 2.0, "DEL made a full pass");

    assert_eq!(rescan(&l).trim(), "ok");
    wait_passes(&l, 3.0, "a full pass after a plain rescan");
    assert!(l.daemon().running());
}
