//! Garbage collection: release every reservation whose (container ID,
//! ifname) is not in a set of valid attachments, and remove what crashes
//! left behind (temp files, unparsable files, indexes of dead owners, old
//! sticky records). GC lists directories; it runs from CNI GC and from the
//! node daemon's reconciliation, never on the ADD path.

use std::collections::{HashMap, HashSet};
use std::fs::{self, DirEntry};
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, SystemTime};

use super::disk::{self, OwnerIndex, Read, Reservation, Sticky, LAST_RESERVED_PREFIX, TMP_PREFIX};
use super::{disk_ip_name, valid_network_name, IpamError, Store, StoreLock};

/// A sticky record is forgotten by GC once it is older than this and none of
/// its addresses is held by the same pod.
pub const STICKY_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// How long a reservation is safe from CNI GC after it was made, whether
/// or not its attachment is listed as valid: an ADD reserves its addresses
/// before it returns (and may then wait for the bridge port, up to 10 s),
/// and the runtime lists an attachment only after ADD returned. The age is
/// the file's mtime, as for the node daemon's `--ipam-gc-grace`.
pub const GC_GRACE: Duration = Duration::from_secs(30);

/// What a GC run did.
#[derive(Debug, Default)]
pub struct GcReport {
    /// (network, address, container ID, ifname) of every released reservation.
    pub released: Vec<(String, IpAddr, String, String)>,
    /// Every error met; GC keeps going after each.
    pub errors: Vec<IpamError>,
}

impl GcReport {
    /// Append another report.
    pub fn merge(&mut self, other: GcReport) {
        self.released.extend(other.released);
        self.errors.extend(other.errors);
    }
}

/// Whether an entry was modified less than `grace` ago (a file with an
/// unreadable or future mtime counts as young: it is kept).
fn is_young(entry: &DirEntry, grace: Duration, now: SystemTime) -> bool {
    if grace.is_zero() {
        return false;
    }
    let age = entry
        .metadata()
        .and_then(|m| m.modified())
        .ok()
        .and_then(|m| now.duration_since(m).ok());
    age.is_none_or(|age| age < grace)
}

/// Entries of a directory; a missing directory has none.
fn entries(dir: &Path, report: &mut GcReport) -> Vec<DirEntry> {
    match fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| {
                e.map_err(|e| report.errors.push(IpamError::io(dir, e)))
                    .ok()
            })
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            report.errors.push(IpamError::io(dir, e));
            Vec::new()
        }
    }
}

fn remove(path: &Path, report: &mut GcReport) -> bool {
    match disk::remove_if_exists(path) {
        Ok(()) => true,
        Err(e) => {
            report.errors.push(e);
            false
        }
    }
}

impl StoreLock<'_> {
    /// GC for this network: release every reservation whose (container_id,
    /// ifname) is not in `valid`; keep going on errors, report them all. Also
    /// removes unparsable/partial leftovers. `valid` is taken as
    /// authoritative (CNI GC); see [`Self::release_all_except_with_grace`].
    pub fn release_all_except(&mut self, valid: &HashSet<(String, String)>) -> GcReport {
        self.release_all_except_with_grace(valid, Duration::ZERO)
    }

    /// As [`Self::release_all_except`], but reservations (and unparsable
    /// files) younger than `grace` are kept even when not in `valid`. The
    /// node daemon needs this: an ADD reserves its addresses before it writes
    /// the attachment record the daemon builds `valid` from.
    pub fn release_all_except_with_grace(
        &mut self,
        valid: &HashSet<(String, String)>,
        grace: Duration,
    ) -> GcReport {
        self.release_all_but(
            &|cid: &str, ifname: &str| valid.contains(&(cid.to_string(), ifname.to_string())),
            grace,
        )
    }

    /// As [`Self::release_all_except_with_grace`], keeping the reservations
    /// of every (container_id, ifname) for which `keep` returns true.
    pub fn release_all_but(
        &mut self,
        keep: &dyn Fn(&str, &str) -> bool,
        grace: Duration,
    ) -> GcReport {
        let mut report = GcReport::default();
        let store = self.store;
        let layout = &store.layout;
        let now = SystemTime::now();
        let is_valid = keep;

        // Address files, temp files and cursors.
        let mut kept: HashMap<IpAddr, Reservation> = HashMap::new();
        for entry in entries(&layout.dir, &mut report) {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let path = entry.path();
            if name.starts_with(TMP_PREFIX) {
                remove(&path, &mut report);
            } else if name.starts_with(LAST_RESERVED_PREFIX) {
                if disk::read_cursor(&path).is_none() {
                    remove(&path, &mut report);
                }
            } else if let Some(ip) = disk_ip_name(&name) {
                match disk::read_json::<Reservation>(&path) {
                    Err(e) => report.errors.push(e),
                    Ok(Read::Missing) => {}
                    Ok(Read::Unparsable(reason)) => {
                        if !is_young(&entry, grace, now) {
                            tracing::warn!(path = %path.display(), %reason, "GC removes an unparsable reservation");
                            remove(&path, &mut report);
                        }
                    }
                    Ok(Read::Found(r)) => {
                        if is_valid(&r.container_id, &r.ifname) || is_young(&entry, grace, now) {
                            kept.insert(ip, r);
                        } else if remove(&path, &mut report) {
                            tracing::info!(network = %store.network, %ip, container_id = %r.container_id, ifname = %r.ifname, "GC released a reservation");
                            report.released.push((
                                store.network.clone(),
                                ip,
                                r.container_id,
                                r.ifname,
                            ));
                        } else {
                            kept.insert(ip, r);
                        }
                    }
                }
            }
        }

        // Owner indexes of owners that hold nothing and are not valid.
        for entry in entries(&layout.owners_dir(), &mut report) {
            let path = entry.path();
            if entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                remove(&path, &mut report);
                continue;
            }
            match disk::read_json::<OwnerIndex>(&path) {
                Err(e) => report.errors.push(e),
                Ok(Read::Missing) => {}
                Ok(Read::Unparsable(_)) => {
                    if !is_young(&entry, grace, now) {
                        remove(&path, &mut report);
                    }
                }
                Ok(Read::Found(idx)) => {
                    let holds = idx.ips.iter().any(|ip| {
                        kept.get(ip).is_some_and(|r| {
                            r.container_id == idx.container_id && r.ifname == idx.ifname
                        })
                    });
                    if !holds
                        && !is_valid(&idx.container_id, &idx.ifname)
                        && !is_young(&entry, grace, now)
                    {
                        remove(&path, &mut report);
                    }
                }
            }
        }

        // Sticky records: leftovers, and memories nobody will use.
        for entry in entries(&layout.sticky_dir(), &mut report) {
            let path = entry.path();
            if entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                remove(&path, &mut report);
                continue;
            }
            match disk::read_json::<Sticky>(&path) {
                Err(e) => report.errors.push(e),
                Ok(Read::Missing) => {}
                Ok(Read::Unparsable(_)) => {
                    remove(&path, &mut report);
                }
                Ok(Read::Found(s)) => {
                    let in_use = s.ips.iter().any(|ip| {
                        kept.get(ip).is_some_and(|r| {
                            r.pod_namespace.as_deref() == Some(s.pod_namespace.as_str())
                                && r.pod_name.as_deref() == Some(s.pod_name.as_str())
                        })
                    });
                    if !in_use && !is_young(&entry, STICKY_TTL, now) {
                        remove(&path, &mut report);
                    }
                }
            }
        }
        report
    }
}

/// Library entry point for the node daemon: GC every network under
/// `<state_dir>/ipam/`, each under its own lock (waiting at most
/// `lock_timeout` for each). `valid` is authoritative.
pub fn release_all_except(
    state_dir: &Path,
    valid: &HashSet<(String, String)>,
    lock_timeout: Duration,
) -> GcReport {
    release_all_except_with_grace(state_dir, valid, lock_timeout, Duration::ZERO)
}

/// As [`release_all_except`], keeping reservations younger than `grace`
/// (see [`StoreLock::release_all_except_with_grace`]).
pub fn release_all_except_with_grace(
    state_dir: &Path,
    valid: &HashSet<(String, String)>,
    lock_timeout: Duration,
    grace: Duration,
) -> GcReport {
    release_all_but(
        state_dir,
        &|cid: &str, ifname: &str| valid.contains(&(cid.to_string(), ifname.to_string())),
        lock_timeout,
        grace,
    )
}

/// As [`release_all_except_with_grace`], keeping the reservations of every
/// (container ID, ifname) for which `keep` returns true (the node daemon
/// keeps those an unreadable attachment record may belong to).
pub fn release_all_but(
    state_dir: &Path,
    keep: &dyn Fn(&str, &str) -> bool,
    lock_timeout: Duration,
    grace: Duration,
) -> GcReport {
    let mut report = GcReport::default();
    let root = state_dir.join("ipam");
    for entry in entries(&root, &mut report) {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(network) = entry.file_name().into_string() else {
            continue;
        };
        if !valid_network_name(&network) {
            tracing::debug!(dir = %entry.path().display(), "not a network's store; skipped");
            continue;
        }
        let store = match Store::open(state_dir, &network) {
            Ok(s) => s,
            Err(e) => {
                report.errors.push(e);
                continue;
            }
        };
        match store.lock(lock_timeout) {
            Ok(mut lock) => report.merge(lock.release_all_but(keep, grace)),
            Err(e) => report.errors.push(e),
        }
    }
    report
}
