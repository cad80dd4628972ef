//! The records directory.
//!
//! ```text
//! <state_dir>/attachments/             0700
//!   <key>.json                         one record per (container ID, ifname), 0600;
//!                                      <key> is escaped and bounded (naming.rs)
//!   .<key>.<pid>.<n>.tmp               a write in progress (temp + fsync + rename);
//!                                      removed by `list` once older than STALE_TEMP
//! ```
//!
//! Records written under the old name `{cid}_{ifname}.json` are still found
//! by [`RecordStore::read`] and [`RecordStore::remove`], and moved to their
//! current name by [`RecordStore::list`] (which the daemon runs on every
//! pass and CNI GC runs too). A move is link(2) to the new name, then unlink
//! of the old one; `remove` unlinks the old name before the new one, so a
//! DEL that races a move never leaves a record behind.

use crate::naming::{self, RECORD_SUFFIX, TEMP_SUFFIX};
use crate::{Record, RecordError};
use std::collections::BTreeMap;
use std::fs;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

/// One entry of [`RecordStore::list`]: the file and its record, or why it
/// could not be read.
pub type Listed = (PathBuf, Result<Record, RecordError>);

/// A temp file older than this is a leftover of a writer that died (a write
/// takes milliseconds), and [`RecordStore::list`] removes it.
pub const STALE_TEMP: Duration = Duration::from_secs(60);

/// `<stateDir>/attachments/`.
#[derive(Debug, Clone)]
pub struct RecordStore {
    dir: PathBuf,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RecordError + '_ {
    move |source| RecordError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What an old-format file holds for one attachment.
enum Legacy {
    /// No old-format file of this attachment.
    None,
    /// Its record.
    Mine(PathBuf, Box<Record>),
    /// A file that can only be this attachment's, and does not parse.
    Unreadable(PathBuf, RecordError),
}

impl RecordStore {
    /// The store under `state_dir`; nothing is created until a write.
    pub fn new(state_dir: &Path) -> RecordStore {
        RecordStore {
            dir: state_dir.join("attachments"),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the record of (container ID, ifname) lives: an escaped name,
    /// distinct for distinct pairs and at most 205 bytes whatever their
    /// length (see `naming.rs`).
    pub fn path(&self, container_id: &str, ifname: &str) -> PathBuf {
        self.dir.join(naming::record_name(container_id, ifname))
    }

    /// Whether a record file called `file_name` could hold the record of
    /// (container ID, ifname), under the current or the old naming. For
    /// keeping what an unreadable record may protect.
    pub fn may_name(file_name: &str, container_id: &str, ifname: &str) -> bool {
        file_name == naming::record_name(container_id, ifname)
            || naming::legacy_name(container_id, ifname).is_some_and(|n| n == file_name)
    }

    /// Write a record atomically: a temp file in the same directory, its
    /// content fsync'd, then renamed over the final name. After a kill or a
    /// power loss at any point the name holds the old record or the new one,
    /// whole: the content is on disk before the name can point at it.
    ///
    /// The directory is fsync'd after the rename (a second sync, which makes
    /// the new name itself survive a power loss) only for a record that DEL
    /// needs after one: a delegated IPAM's ([`Record::delegated_ipam`]),
    /// whose addresses may live in a store that outlives the node. Otherwise
    /// a power loss within the filesystem's commit interval (ext4: 5 s)
    /// after ADD may bring back the old state (no record); the pod's netns
    /// and interfaces are gone with the boot, and DEL and GC release the
    /// built-in IPAM's addresses by (container ID, ifname) without it.
    ///
    /// An old-format file of the same attachment is removed afterwards.
    pub fn write(&self, rec: &Record) -> Result<PathBuf, RecordError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(io(&self.dir))?;
        let path = self.path(&rec.container_id, &rec.ifname);
        let tmp = self.dir.join(naming::temp_name(
            &rec.container_id,
            &rec.ifname,
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed),
        ));
        let body = rec.encode().map_err(|e| RecordError::Malformed {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let open = || {
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
        };
        let result = (|| {
            // A leftover under this name (a dead process with the same pid)
            // is unlinked, never written through.
            let mut f = match open() {
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    fs::remove_file(&tmp)?;
                    open()?
                }
                other => other?,
            };
            f.write_all(&body)?;
            #[cfg(test)]
            tests::cut_point("written");
            sync(&f, &tmp)?;
            #[cfg(test)]
            tests::cut_point("synced");
            fs::rename(&tmp, &path)
        })();
        if let Err(e) = result {
            let _ = fs::remove_file(&tmp);
            return Err(RecordError::Io { path, source: e });
        }
        #[cfg(test)]
        tests::cut_point("renamed");
        if rec.delegated_ipam().is_some() {
            let dir = fs::File::open(&self.dir).map_err(io(&self.dir))?;
            sync(&dir, &self.dir).map_err(io(&self.dir))?;
        }
        // Best effort: `list` drops a leftover old-format file as well.
        if let Ok(Legacy::Mine(old, _)) = self.legacy(&rec.container_id, &rec.ifname) {
            let _ = remove_if_exists(&old);
        }
        Ok(path)
    }

    /// Read the record of (container ID, ifname), if any.
    pub fn read(&self, container_id: &str, ifname: &str) -> Result<Option<Record>, RecordError> {
        let path = self.path(container_id, ifname);
        match fs::read(&path) {
            Ok(bytes) => {
                let rec = parse(&path, &bytes)?;
                if rec.container_id == container_id && rec.ifname == ifname {
                    Ok(Some(rec))
                } else {
                    Ok(None)
                }
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {
                match self.legacy(container_id, ifname)? {
                    Legacy::None => Ok(None),
                    Legacy::Mine(_, rec) => Ok(Some(*rec)),
                    Legacy::Unreadable(_, e) => Err(e),
                }
            }
            Err(e) => Err(RecordError::Io { path, source: e }),
        }
    }

    /// The file name of (container ID, ifname)'s record in the directory.
    pub fn file_name(container_id: &str, ifname: &str) -> String {
        naming::record_name(container_id, ifname)
    }

    /// Whether `file_name` is a record's (not a temp file of a write in
    /// progress, nor anything else in the directory).
    pub fn is_record_name(file_name: &str) -> bool {
        !file_name.starts_with('.') && file_name.ends_with(RECORD_SUFFIX)
    }

    /// The record in the file `file_name` of the directory as it is now
    /// (`None`: no such file). A record under its old name is returned as
    /// it is, not moved ([`RecordStore::list`] moves it): the caller
    /// compares the name with [`RecordStore::file_name`] of its content.
    pub fn read_file(&self, file_name: &str) -> Result<Option<Record>, RecordError> {
        let path = self.dir.join(file_name);
        match fs::read(&path) {
            Ok(bytes) => parse(&path, &bytes).map(Some),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(RecordError::Io { path, source: e }),
        }
    }

    /// Remove the record of (container ID, ifname), under its old name too.
    /// Absent is fine: returns false.
    pub fn remove(&self, container_id: &str, ifname: &str) -> Result<bool, RecordError> {
        // The old name first: `list` may be moving it to the new one.
        let old = match self.legacy(container_id, ifname)? {
            Legacy::None => false,
            Legacy::Mine(p, _) | Legacy::Unreadable(p, _) => remove_if_exists(&p)?,
        };
        let new = remove_if_exists(&self.path(container_id, ifname))?;
        Ok(old || new)
    }

    /// The old-format file of (container ID, ifname), when there is one
    /// that belongs to it: its content names it, or it does not parse and
    /// its name splits only one way.
    fn legacy(&self, container_id: &str, ifname: &str) -> Result<Legacy, RecordError> {
        let Some(name) = naming::legacy_name(container_id, ifname) else {
            return Ok(Legacy::None);
        };
        let path = self.dir.join(&name);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Legacy::None),
            Err(e) => return Err(RecordError::Io { path, source: e }),
        };
        Ok(match parse(&path, &bytes) {
            Ok(rec) if rec.container_id == container_id && rec.ifname == ifname => {
                Legacy::Mine(path, Box::new(rec))
            }
            Ok(_) => Legacy::None,
            Err(e) if naming::legacy_is_unambiguous(&name) => Legacy::Unreadable(path, e),
            Err(_) => Legacy::None,
        })
    }

    /// Every record file, parsed or with the reason it could not be.
    /// Records under their old name are moved to the current one (and
    /// listed there); temp files of writes in progress are skipped, and
    /// removed once older than [`STALE_TEMP`].
    pub fn list(&self) -> Result<Vec<Listed>, RecordError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(RecordError::Io {
                    path: self.dir.clone(),
                    source: e,
                })
            }
        };
        let now = SystemTime::now();
        let mut out = BTreeMap::new();
        let mut moved = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io(&self.dir))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let path = entry.path();
            if name.starts_with('.') {
                if name.ends_with(TEMP_SUFFIX) && is_stale(&entry, now) {
                    // Best effort: another lister may have taken it already.
                    let _ = remove_if_exists(&path);
                }
                continue;
            }
            if !name.ends_with(RECORD_SUFFIX) {
                continue;
            }
            let rec = fs::read(&path)
                .map_err(|e| RecordError::Io {
                    path: path.clone(),
                    source: e,
                })
                .and_then(|b| parse(&path, &b));
            match rec {
                Ok(r)
                    if naming::legacy_name(&r.container_id, &r.ifname)
                        .is_some_and(|n| *name == n) =>
                {
                    moved.push((path, r));
                }
                rec => {
                    out.insert(path, rec);
                }
            }
        }
        for (old, rec) in moved {
            let new = self.path(&rec.container_id, &rec.ifname);
            match migrate(&old, &new) {
                // The file under the new name is the record now (a newer
                // write may have put it there first).
                Ok(()) => match fs::read(&new) {
                    Ok(b) => {
                        let parsed = parse(&new, &b);
                        out.insert(new, parsed);
                    }
                    // Removed meanwhile (a DEL).
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(e) => {
                        out.insert(
                            new.clone(),
                            Err(RecordError::Io {
                                path: new,
                                source: e,
                            }),
                        );
                    }
                },
                // Gone meanwhile (a DEL, or another lister moved it).
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                // Cannot move it: serve it from where it is.
                Err(_) => {
                    out.insert(old, Ok(rec));
                }
            }
        }
        Ok(out.into_iter().collect())
    }
}

/// Give `old`'s file the name `new` unless `new` exists (then it is the
/// newer record: a write, or another lister's move), and drop `old`.
fn migrate(old: &Path, new: &Path) -> std::io::Result<()> {
    match fs::hard_link(old, new) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    match fs::remove_file(old) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Whether a temp file was last written more than [`STALE_TEMP`] ago.
fn is_stale(entry: &fs::DirEntry, now: SystemTime) -> bool {
    entry
        .metadata()
        .and_then(|m| m.modified())
        .ok()
        .and_then(|m| now.duration_since(m).ok())
        .is_some_and(|age| age > STALE_TEMP)
}

/// Remove a file; `Ok(false)` when it was not there.
fn remove_if_exists(path: &Path) -> Result<bool, RecordError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(RecordError::Io {
            path: path.to_path_buf(),
            source: e,
        }),
    }
}

/// fsync(2) a file or directory.
fn sync(f: &fs::File, path: &Path) -> std::io::Result<()> {
    f.sync_all()?;
    #[cfg(test)]
    tests::SYNCED.with(|s| s.borrow_mut().push(path.to_path_buf()));
    #[cfg(not(test))]
    let _ = path;
    Ok(())
}

fn parse(path: &Path, bytes: &[u8]) -> Result<Record, RecordError> {
    Record::parse(path, bytes)
}

#[cfg(test)]
mod tests;
