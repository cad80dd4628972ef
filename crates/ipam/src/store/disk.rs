//! The on-disk layout of one network's store and the primitive file
//! operations it is built from.
//!
//! ```text
//! <state_dir>/ipam/<network>/          0700
//!   lock                               flock(2) target, never removed
//!   <ip>                               one per reserved address, JSON Reservation,
//!                                      created by write-temp + link(2): never empty
//!   last_reserved_ip.<set>             round-robin cursor of range set <set>
//!   owners/<cid>_<ifname>              JSON OwnerIndex, written (temp + rename)
//!                                      BEFORE the address files it lists
//!   sticky/<ns>_<name>_<ifname>        JSON Sticky: what the pod held last
//!   .tmp.<pid>.<n> (any of the dirs)   in-flight temp files; leftovers of a
//!                                      crash, removed by GC
//! ```
//!
//! Name components are escaped (see [`escape_key`]) so they never contain
//! `/`, never start with `.` and stay short.
//!
//! No fsync: the store must survive the plugin being killed, which the page
//! cache already guarantees. After a power loss every pod restarts anyway,
//! and GC removes whatever was left unparsable.

use std::fmt::Write as _;
use std::fs::{self, OpenOptions};
use std::io::{ErrorKind, Write as _};
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::IpamError;

/// Prefix of temp files; escaped names never start with '.'.
pub(crate) const TMP_PREFIX: &str = ".tmp.";
pub(crate) const LOCK_FILE: &str = "lock";
pub(crate) const OWNERS_DIR: &str = "owners";
pub(crate) const STICKY_DIR: &str = "sticky";
pub(crate) const LAST_RESERVED_PREFIX: &str = "last_reserved_ip.";
/// Escaped names longer than this are cut and suffixed with a hash.
const MAX_KEY_LEN: usize = 200;
const KEPT_KEY_LEN: usize = 160;

/// Content of an address file: who holds the address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Reservation {
    pub container_id: String,
    pub ifname: String,
    #[serde(default)]
    pub pod_namespace: Option<String>,
    #[serde(default)]
    pub pod_name: Option<String>,
    #[serde(default)]
    pub pod_uid: Option<String>,
    #[serde(default)]
    pub reserved_at: String,
}

/// Content of `owners/<key>`: the addresses an attachment holds or is about to hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct OwnerIndex {
    pub container_id: String,
    pub ifname: String,
    pub ips: Vec<IpAddr>,
}

/// Content of `sticky/<key>`: the addresses a pod's interface held last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Sticky {
    pub pod_namespace: String,
    pub pod_name: String,
    pub ifname: String,
    pub ips: Vec<IpAddr>,
}

/// Paths of one network's store.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub dir: PathBuf,
}

impl Layout {
    pub fn lock_file(&self) -> PathBuf {
        self.dir.join(LOCK_FILE)
    }
    pub fn owners_dir(&self) -> PathBuf {
        self.dir.join(OWNERS_DIR)
    }
    pub fn sticky_dir(&self) -> PathBuf {
        self.dir.join(STICKY_DIR)
    }
    pub fn ip_file(&self, ip: IpAddr) -> PathBuf {
        self.dir.join(ip.to_string())
    }
    pub fn owner_file(&self, container_id: &str, ifname: &str) -> PathBuf {
        self.owners_dir().join(escape_key(&[container_id, ifname]))
    }
    pub fn sticky_file(&self, namespace: &str, name: &str, ifname: &str) -> PathBuf {
        self.sticky_dir()
            .join(escape_key(&[namespace, name, ifname]))
    }
    pub fn last_reserved_file(&self, set: usize) -> PathBuf {
        self.dir.join(format!("{LAST_RESERVED_PREFIX}{set}"))
    }
}

/// Create `dir` (and parents) with mode 0700 if missing. `dir` itself must
/// then be a directory, not a symbolic link to one: the store never writes
/// or removes files through a link that points elsewhere (issue 20,
/// item 1).
pub(crate) fn ensure_dir(dir: &Path) -> Result<(), IpamError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| IpamError::io(dir, e))?;
    real_dir(dir)
}

/// `dir` is a directory, not a symbolic link.
pub(crate) fn real_dir(dir: &Path) -> Result<(), IpamError> {
    let meta = fs::symlink_metadata(dir).map_err(|e| IpamError::io(dir, e))?;
    if meta.file_type().is_dir() {
        return Ok(());
    }
    Err(IpamError::io(
        dir,
        std::io::Error::new(
            ErrorKind::InvalidInput,
            if meta.file_type().is_symlink() {
                "is a symbolic link, not a directory of the store (refused)"
            } else {
                "is not a directory"
            },
        ),
    ))
}

/// Open options that never follow a symbolic link in the last component.
fn no_follow() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    o
}

/// A file name for the joined components: bytes other than ASCII letters,
/// digits and '-' become `%XX` (so '/', '.', '_' never appear unescaped),
/// components are joined with '_', and a name longer than 200 bytes is cut to
/// 160 and suffixed with `~` and a 64-bit FNV-1a hash of the whole name.
/// Files keyed this way also store the unescaped key, which is compared on read.
pub(crate) fn escape_key(parts: &[&str]) -> String {
    let mut out = String::new();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            out.push('_');
        }
        for b in part.bytes() {
            if b.is_ascii_alphanumeric() || b == b'-' {
                out.push(char::from(b));
            } else {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    if out.len() > MAX_KEY_LEN {
        let hash = fnv1a(out.as_bytes());
        out.truncate(KEPT_KEY_LEN);
        let _ = write!(out, "~{hash:016x}");
    }
    out
}

/// FNV-1a, 64 bit: stable across builds (unlike std's hasher).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A temp path in `dir` unique within this process.
fn temp_path(dir: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    dir.join(format!("{TMP_PREFIX}{}.{n}", std::process::id()))
}

/// Write `bytes` to a new temp file in `dir` and return its path. The file
/// is created with O_EXCL: a leftover under the same name (a dead process
/// with the same pid) is unlinked first, never written through, so a temp
/// never shares an inode with a live file.
fn write_temp(dir: &Path, bytes: &[u8]) -> Result<PathBuf, IpamError> {
    let tmp = temp_path(dir);
    let open = || {
        no_follow()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
    };
    let file = match open() {
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            remove_if_exists(&tmp)?;
            open()
        }
        other => other,
    };
    if let Err(e) = file.and_then(|mut f| f.write_all(bytes)) {
        let _ = fs::remove_file(&tmp);
        return Err(IpamError::io(&tmp, e));
    }
    Ok(tmp)
}

/// Replace `dest` with `bytes` atomically (temp file in the same dir + rename).
pub(crate) fn write_atomic(dest: &Path, bytes: &[u8]) -> Result<(), IpamError> {
    let dir = parent(dest);
    let tmp = write_temp(dir, bytes)?;
    crate::store::failpoint::check("write_atomic:before_rename", &tmp)?;
    fs::rename(&tmp, dest).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        IpamError::io(dest, e)
    })
}

/// Overwrite a hint file (sticky memory, round-robin cursor) in place:
/// `bytes` padded with spaces to the old length, no truncate and no rename.
/// ext4 flushes a file that replaces another by rename or truncate-to-zero
/// (auto_da_alloc), which cost ~0.3 ms per ADD; a hint needs no such care:
/// under the store lock nobody reads it half-written, and after a crash a
/// torn hint parses as nothing and is ignored (readers trim whitespace).
pub(crate) fn write_hint(dest: &Path, bytes: &[u8]) -> Result<(), IpamError> {
    use std::os::unix::fs::FileExt;
    // Never through a symbolic link (a hint is written in place).
    let f = no_follow()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(dest)
        .map_err(|e| IpamError::io(dest, e))?;
    let old = f.metadata().map(|m| m.len() as usize).unwrap_or(0);
    let mut buf = bytes.to_vec();
    if buf.len() < old {
        buf.resize(old, b' ');
    }
    // Two writes, so the crash tests can tear a hint in the middle.
    let half = buf.len() / 2;
    f.write_all_at(&buf[..half], 0)
        .map_err(|e| IpamError::io(dest, e))?;
    crate::store::failpoint::check("write_hint:torn", dest)?;
    f.write_all_at(&buf[half..], half as u64)
        .map_err(|e| IpamError::io(dest, e))
}

/// Create `dest` with `bytes` only if it does not exist, atomically WITH its
/// content: temp file + link(2), so no reader ever sees an empty `dest`.
/// Returns `Ok(false)` when `dest` already exists.
pub(crate) fn create_exclusive(dest: &Path, bytes: &[u8]) -> Result<bool, IpamError> {
    let dir = parent(dest);
    let tmp = write_temp(dir, bytes)?;
    if let Err(e) = crate::store::failpoint::check("create_exclusive:before_link", &tmp) {
        if !crate::store::failpoint::crashed() {
            let _ = fs::remove_file(&tmp);
        }
        return Err(e);
    }
    let linked = fs::hard_link(&tmp, dest);
    crate::store::failpoint::check("create_exclusive:after_link", &tmp)?;
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(IpamError::io(dest, e)),
    }
}

fn parent(path: &Path) -> &Path {
    path.parent().unwrap_or(Path::new("."))
}

/// Remove a file; a missing file is success.
pub(crate) fn remove_if_exists(path: &Path) -> Result<(), IpamError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(IpamError::io(path, e)),
    }
}

/// What reading a JSON record found.
#[derive(Debug)]
pub(crate) enum Read<T> {
    Missing,
    Found(T),
    /// The file exists but does not parse (reason).
    Unparsable(String),
}

/// Read and parse a JSON record.
/// A symbolic link is not followed: it reads as unparsable (GC then
/// removes the link itself, never what it points to).
pub(crate) fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Read<T>, IpamError> {
    match read_no_follow(path) {
        Ok(bytes) => Ok(match serde_json::from_slice(&bytes) {
            Ok(v) => Read::Found(v),
            Err(e) if bytes.is_empty() => Read::Unparsable(format!("empty file ({e})")),
            Err(e) => Read::Unparsable(e.to_string()),
        }),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(Read::Missing),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            Ok(Read::Unparsable("a symbolic link (not followed)".into()))
        }
        Err(e) => Err(IpamError::io(path, e)),
    }
}

/// The whole file, opened without following a symbolic link.
fn read_no_follow(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut f = no_follow().read(true).open(path)?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Serialize a record; our record types cannot fail to serialize.
pub(crate) fn to_json<T: Serialize>(value: &T, path: &Path) -> Result<Vec<u8>, IpamError> {
    serde_json::to_vec(value).map_err(|e| IpamError::Corrupt {
        path: path.to_path_buf(),
        reason: format!("cannot serialize record: {e}"),
    })
}

/// Whether `path` exists (without following symlinks).
pub(crate) fn exists(path: &Path) -> Result<bool, IpamError> {
    match fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(IpamError::io(path, e)),
    }
}

/// Read a round-robin cursor; missing or unparsable = none.
pub(crate) fn read_cursor(path: &Path) -> Option<IpAddr> {
    let bytes = read_no_follow(path).ok()?;
    std::str::from_utf8(&bytes).ok()?.trim().parse().ok()
}

/// The current time as RFC 3339 UTC, second precision.
pub(crate) fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    rfc3339(secs)
}

/// Seconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ` (civil-from-days, H. Hinnant).
pub(crate) fn rfc3339(secs: u64) -> String {
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_is_safe_and_injective_for_separators() {
        assert_eq!(escape_key(&["abc123", "net1"]), "abc123_net1");
        assert_eq!(escape_key(&["a_b", "c"]), "a%5Fb_c");
        assert_ne!(escape_key(&["a_b", "c"]), escape_key(&["a", "b_c"]));
        let k = escape_key(&["..", "../../etc/passwd"]);
        assert!(
            !k.contains('/') && !k.contains('.') && !k.starts_with('.'),
            "{k}"
        );
        assert_eq!(
            escape_key(&["default", "web-0.x", "net1"]),
            "default_web-0%2Ex_net1"
        );
        let long = "é".repeat(300);
        let k = escape_key(&[&long, "net1"]);
        assert!(k.len() <= KEPT_KEY_LEN + 17, "{}", k.len());
        assert_ne!(
            k,
            escape_key(&[&long, "net2"]),
            "hash distinguishes cut names"
        );
    }

    #[test]
    fn rfc3339_known_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_767_225_599), "2025-12-31T23:59:59Z");
    }

    #[test]
    fn create_exclusive_never_overwrites() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("10.0.0.1");
        assert!(create_exclusive(&p, b"first").unwrap());
        assert!(!create_exclusive(&p, b"second").unwrap());
        assert_eq!(fs::read(&p).unwrap(), b"first");
        // No temp left behind.
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1);
    }

    #[test]
    fn hints_are_overwritten_in_place_and_read_back_trimmed() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("last_reserved_ip.0");
        write_hint(&p, b"fd00::1:ffff").unwrap();
        write_hint(&p, b"10.0.0.9").unwrap();
        assert_eq!(read_cursor(&p), Some("10.0.0.9".parse().unwrap()));
        assert_eq!(fs::read(&p).unwrap().len(), "fd00::1:ffff".len());
        let s = d.path().join("sticky");
        write_hint(&s, br#"{"ips":["10.0.0.100","fd00::100"]}"#).unwrap();
        write_hint(&s, br#"{"ips":["10.0.0.1"]}"#).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&fs::read(&s).unwrap()).unwrap();
        assert_eq!(v["ips"][0], "10.0.0.1");
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 2);
    }
}
