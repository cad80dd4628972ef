//! A power cut in the middle of a record write: the records directory on a
//! journaled ext4 (as a node's /var/lib) in a loop device, and at each point
//! of `write` (content written, content fsync'd, renamed) and after it
//! returns, the disk as a power cut would leave it: the image file copied
//! as the loop device has written it so far (the filesystem's dirty pages
//! are lost), once as it is and once after a journal commit of everything
//! pending (the commit timer firing just before the cut). Each copy is then
//! mounted (the journal replayed) and read.
//!
//! A control shows the method sees a torn write: a record renamed into
//! place without its fsync comes back empty after the same cut.
//!
//! Needs root, losetup and mkfs.ext4; skipped (and says why) without them.

use super::*;
use std::process::Command;

const POINTS: [&str; 4] = ["written", "synced", "renamed", "returned"];

fn run(args: &[&str]) -> Result<String, String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args[0]))?;
    if !out.status.success() {
        return Err(format!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Why this machine cannot run the test, if it cannot.
fn unable() -> Option<String> {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    if !status
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
    {
        return Some("not root".into());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("no loop devices (/dev/loop-control)".into());
    }
    for tool in ["losetup", "mkfs.ext4", "mount", "umount"] {
        if run(&["sh", "-c", &format!("command -v {tool}")]).is_err() {
            return Some(format!("no {tool}"));
        }
    }
    None
}

/// An image mounted through a loop device; unmounted and detached on drop,
/// whatever the test did.
struct Mounted {
    dev: String,
    at: PathBuf,
}

impl Mounted {
    fn new(image: &Path, at: &Path) -> Mounted {
        fs::create_dir_all(at).unwrap();
        let dev = run(&["losetup", "-f", "--show", image.to_str().unwrap()]).unwrap();
        // No commit timer within the test: only the test's fsyncs commit.
        if let Err(e) = run(&[
            "mount",
            "-t",
            "ext4",
            "-o",
            "commit=300",
            &dev,
            at.to_str().unwrap(),
        ]) {
            let _ = run(&["losetup", "-d", &dev]);
            panic!("{e}");
        }
        Mounted {
            dev,
            at: at.to_path_buf(),
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = run(&["umount", self.at.to_str().unwrap()]);
        let _ = run(&["losetup", "-d", &self.dev]);
    }
}

/// The disk as a power cut at this instant leaves it: the image as the loop
/// device has written it, after a journal commit of all that is pending
/// when `commit` (an fsync of another file commits the running
/// transaction, with the metadata of every write before it).
fn cut(image: &Path, mnt: &Path, to: &Path, commit: bool) {
    if commit {
        let other = fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(mnt.join("other"))
            .unwrap();
        (&other).write_all(b"x").unwrap();
        other.sync_all().unwrap();
    }
    fs::copy(image, to).unwrap();
}

/// What a cut's copy holds: the record of `cid` (None: no record) and the
/// malformed files among the records.
fn after_cut(copy: &Path, at: &Path, cid: &str) -> (Option<Record>, Vec<String>) {
    let _m = Mounted::new(copy, at);
    let store = RecordStore::new(at);
    let record = match store.read(cid, "net1") {
        Ok(r) => r,
        Err(e) => return (None, vec![format!("{cid}: {e}")]),
    };
    let bad = store
        .list()
        .unwrap()
        .into_iter()
        .filter_map(|(p, r)| r.err().map(|e| format!("{}: {e}", p.display())))
        .collect();
    (record, bad)
}

/// A work directory with a fresh journaled ext4 image in it (`disk.img`),
/// or None (the test is skipped, and says why) where this machine cannot
/// make one.
fn fresh_disk() -> Option<(tempfile::TempDir, PathBuf)> {
    if let Some(why) = unable() {
        eprintln!("skipped: {why}");
        return None;
    }
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("disk.img");
    fs::File::create(&image).unwrap().set_len(16 << 20).unwrap();
    run(&["mkfs.ext4", "-q", "-F", image.to_str().unwrap()]).unwrap();
    Some((work, image))
}

fn record_with_port(cid: &str, port: u16) -> Record {
    let mut r = rec(cid);
    r.forwards[0].port = port;
    r
}

#[test]
fn a_power_cut_anywhere_in_a_write_leaves_the_old_record_or_the_new_one_whole() {
    let Some((work, image)) = fresh_disk() else {
        return;
    };
    let mnt = work.path().join("node");
    // (case, the record written, the one it replaces)
    let old = record_with_port("c1", 8080);
    let cases: [(&'static str, Record, Option<Record>); 2] = [
        ("replace", record_with_port("c1", 9090), Some(old.clone())),
        ("new", record_with_port("c2", 8080), None),
    ];
    let mut cuts: Vec<(&'static str, &'static str, bool, PathBuf)> = Vec::new();
    {
        let disk = Mounted::new(&image, &mnt);
        let store = RecordStore::new(&disk.at);
        store.write(&old).unwrap();
        run(&["sync", "-f", disk.at.to_str().unwrap()]).unwrap();
        for (case, new, _) in &cases {
            let case: &'static str = case;
            let taken = std::rc::Rc::new(RefCell::new(Vec::new()));
            let (img, at, dir, t) = (
                image.clone(),
                disk.at.clone(),
                work.path().to_path_buf(),
                taken.clone(),
            );
            let take = move |point: &'static str| {
                for commit in [false, true] {
                    let to = dir.join(format!("cut-{case}-{point}-{commit}.img"));
                    cut(&img, &at, &to, commit);
                    t.borrow_mut().push((case, point, commit, to));
                }
            };
            CUT.with(|c| *c.borrow_mut() = Some(Box::new(take)));
            let written = store.write(new);
            cut_point("returned");
            CUT.with(|c| *c.borrow_mut() = None);
            written.unwrap();
            cuts.extend(taken.borrow_mut().drain(..));
        }
    }
    assert_eq!(cuts.len(), 2 * POINTS.len() * 2);
    let mut seen = Vec::new();
    for (case, point, commit, copy) in &cuts {
        let (_, new, before) = cases.iter().find(|c| c.0 == *case).unwrap();
        let (got, bad) = after_cut(copy, &work.path().join("after"), &new.container_id);
        let what = format!("{case} cut {point} (commit {commit})");
        assert!(bad.is_empty(), "{what}: torn records: {bad:?}");
        let state = if got.as_ref() == Some(new) {
            "new"
        } else if got == *before {
            "old"
        } else {
            panic!("{what}: neither the old record nor the new one: {got:?}");
        };
        // The untouched record of the other case is whole in every cut.
        if *case == "new" {
            let (other, _) = after_cut(copy, &work.path().join("after"), "c1");
            assert!(other.is_some(), "{what}: c1's record lost");
        }
        seen.push(format!("{case}/{point}/{commit}: {state}"));
    }
    // Both outcomes are reached: the old state until the rename is
    // committed, the new one from then on.
    for want in [
        "new/written/true: old",
        "new/returned/true: new",
        "replace/renamed/true: new",
    ] {
        assert!(seen.iter().any(|s| s == want), "{want} not in {seen:?}");
    }
}

#[test]
fn the_power_cut_method_sees_a_write_without_fsync_torn() {
    let Some((work, image)) = fresh_disk() else {
        return;
    };
    let copy = work.path().join("cut.img");
    {
        let disk = Mounted::new(&image, &work.path().join("node"));
        let store = RecordStore::new(&disk.at);
        store.write(&rec("c1")).unwrap();
        // The wrong way: content, rename, no fsync; then the journal commits.
        let body = rec("c3").encode().unwrap();
        let tmp = store.dir().join(".c3_net1.1.0.tmp");
        fs::write(&tmp, body).unwrap();
        fs::rename(&tmp, store.path("c3", "net1")).unwrap();
        cut(&image, &disk.at, &copy, true);
    }
    let (got, bad) = after_cut(&copy, &work.path().join("after"), "c3");
    assert!(
        got.is_none() && !bad.is_empty(),
        "a write without fsync came back whole ({got:?}): this cut does not model a power loss on this kernel"
    );
}
