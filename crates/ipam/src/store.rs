//! The crash-safe on-disk reservation store of one network, and the
//! allocator working on it.
//!
//! Every change happens under an exclusive `flock(2)` on `<dir>/lock`
//! ([`Store::lock`] → [`StoreLock`]); [`Store::reserved_by`] reads without it.
//! The layout and the file primitives are described in `disk.rs`. The write
//! order keeps every crash recoverable:
//!
//! * allocate: choose every address first (nothing written), then write the
//!   owner index listing them (intent), then create each address file
//!   atomically with its content (temp + link(2)), then the sticky record and
//!   round-robin cursors (best effort). A crash leaves at worst an index
//!   listing addresses that are not (or not yet) reserved, or temp files.
//! * release: unlink each listed address file whose content names the owner,
//!   then the index. A crash leaves an index that the next DEL or GC removes.
//!
//! So every address file is listed by its owner's index, DEL is O(1) in the
//! number of reservations, and GC (which lists the directory) removes all
//! that is left over, including temp files and unparsable files.
//!
//! The ADD path never lists a directory and never sleeps (unless the lock is
//! contended).

mod disk;
mod error;
pub(crate) mod failpoint;
mod gc;
mod owner;
mod pool;
mod writer;

use std::fs::{self, File, OpenOptions};
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ipnetwork::IpNetwork;
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::config::IpamConfig;
use disk::{Layout, OwnerIndex, Read, Reservation, Sticky};
use pool::Pool;
use writer::Pick;

pub use error::IpamError;
pub use gc::{
    release_all_but, release_all_except, release_all_except_with_grace, GcReport, GC_GRACE,
    STICKY_TTL,
};
pub use owner::Ownership;

/// Who holds a reservation: the attachment (container ID, ifname) and, for
/// sticky addresses and diagnostics, the pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Owner {
    pub container_id: String,
    pub ifname: String,
    pub pod_namespace: Option<String>,
    pub pod_name: Option<String>,
    pub pod_uid: Option<String>,
}

impl Owner {
    /// An owner without pod information (no sticky addresses).
    pub fn new(container_id: impl Into<String>, ifname: impl Into<String>) -> Owner {
        Owner {
            container_id: container_id.into(),
            ifname: ifname.into(),
            ..Owner::default()
        }
    }

    fn holds(&self, r: &Reservation) -> bool {
        r.container_id == self.container_id && r.ifname == self.ifname
    }

    /// (namespace, name) when both are known and non-empty.
    fn pod(&self) -> Option<(&str, &str)> {
        match (self.pod_namespace.as_deref(), self.pod_name.as_deref()) {
            (Some(ns), Some(name)) if !ns.is_empty() && !name.is_empty() => Some((ns, name)),
            _ => None,
        }
    }
}

/// One allocated address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// The address with the prefix length of its subnet.
    pub address: IpNetwork,
    /// The gateway of its range, if configured.
    pub gateway: Option<IpAddr>,
    /// Index of its range set in [`IpamConfig::range_sets`].
    pub range_set: usize,
}

/// The store of one network: `<state_dir>/ipam/<network>/`.
#[derive(Debug, Clone)]
pub struct Store {
    network: String,
    layout: Layout,
}

/// Network names as CNI allows them: `[A-Za-z0-9][A-Za-z0-9_.-]*`, at
/// most 255 bytes. [`Store::open`] refuses any other name.
pub fn valid_network_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphanumeric())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        && name.len() <= 255
}

impl Store {
    /// `<state_dir>/ipam/<network>/`, created (0700, with `owners/` and
    /// `sticky/`) if missing. Cheap. A network name that is not
    /// `[A-Za-z0-9][A-Za-z0-9_.-]*` is refused as an `InvalidInput` I/O error.
    pub fn open(state_dir: &Path, network: &str) -> Result<Store, IpamError> {
        let dir = state_dir.join("ipam").join(network);
        if !valid_network_name(network) {
            return Err(IpamError::io(
                dir,
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("network name {network:?} is not [A-Za-z0-9][A-Za-z0-9_.-]*"),
                ),
            ));
        }
        let layout = Layout { dir };
        // Below the state directory (root's), no component may be a
        // symbolic link: writes and GC's unlinks stay inside the store.
        // Each is checked before anything is created inside it.
        disk::ensure_dir(&state_dir.join("ipam"))?;
        disk::ensure_dir(&layout.dir)?;
        disk::ensure_dir(&layout.owners_dir())?;
        disk::ensure_dir(&layout.sticky_dir())?;
        Ok(Store {
            network: network.to_string(),
            layout,
        })
    }

    /// The network name.
    pub fn network(&self) -> &str {
        &self.network
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.layout.dir
    }

    /// Exclusive flock on `<dir>/lock`, waiting at most `timeout` (then
    /// [`IpamError::LockTimeout`]). Uncontended, this is two syscalls; under
    /// contention it retries with a short backoff (50 µs doubling to 5 ms).
    /// The lock belongs to this call's open file description, so threads of
    /// one process exclude each other as processes do.
    pub fn lock(&self, timeout: Duration) -> Result<StoreLock<'_>, IpamError> {
        let path = self.layout.lock_file();
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| IpamError::io(&path, e))?;
        let started = Instant::now();
        let mut backoff = Duration::from_micros(50);
        loop {
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => {
                    return Ok(StoreLock {
                        store: self,
                        _lock: lock,
                    })
                }
                Err((f, Errno::EAGAIN | Errno::EINTR)) => file = f,
                Err((_, errno)) => return Err(IpamError::io(&path, errno.into())),
            }
            let waited = started.elapsed();
            if waited >= timeout {
                return Err(IpamError::LockTimeout { path, waited });
            }
            std::thread::sleep(backoff.min(timeout - waited));
            backoff = (backoff * 2).min(Duration::from_millis(5));
        }
    }

    /// Lock-free read for CHECK: the addresses held by (container_id,
    /// ifname), i.e. listed in its index AND whose files name it.
    pub fn reserved_by(&self, container_id: &str, ifname: &str) -> Result<Vec<IpAddr>, IpamError> {
        let path = self.layout.owner_file(container_id, ifname);
        let index = match disk::read_json::<OwnerIndex>(&path)? {
            Read::Missing => return Ok(Vec::new()),
            Read::Unparsable(reason) => return Err(IpamError::Corrupt { path, reason }),
            Read::Found(idx) => idx,
        };
        if index.container_id != container_id || index.ifname != ifname {
            return Ok(Vec::new());
        }
        let owner = Owner::new(container_id, ifname);
        let mut held = Vec::with_capacity(index.ips.len());
        for ip in index.ips {
            if self.holder(ip)?.is_some_and(|r| owner.holds(&r)) {
                held.push(ip);
            }
        }
        Ok(held)
    }

    /// The reservation of `ip`, if its file exists and parses.
    fn holder(&self, ip: IpAddr) -> Result<Option<Reservation>, IpamError> {
        match disk::read_json::<Reservation>(&self.layout.ip_file(ip))? {
            Read::Found(r) => Ok(Some(r)),
            Read::Missing | Read::Unparsable(_) => Ok(None),
        }
    }

    /// Every address whose file names `owner` (lists the directory; only
    /// used when an owner index is unreadable).
    fn scan_owned(&self, owner: &Owner) -> Result<Vec<IpAddr>, IpamError> {
        let dir = &self.layout.dir;
        let mut out = Vec::new();
        for entry in fs::read_dir(dir).map_err(|e| IpamError::io(dir, e))? {
            let entry = entry.map_err(|e| IpamError::io(dir, e))?;
            let Some(ip) = entry.file_name().to_str().and_then(disk_ip_name) else {
                continue;
            };
            if self.holder(ip)?.is_some_and(|r| owner.holds(&r)) {
                out.push(ip);
            }
        }
        Ok(out)
    }
}

/// The address a file name stands for, when it is one in canonical form.
fn disk_ip_name(name: &str) -> Option<IpAddr> {
    name.parse::<IpAddr>()
        .ok()
        .filter(|ip| ip.to_string() == name)
}

/// The exclusive lock on a network's store; every change goes through it.
/// Dropping it unlocks.
#[derive(Debug)]
pub struct StoreLock<'a> {
    store: &'a Store,
    _lock: Flock<File>,
}

impl StoreLock<'_> {
    /// The locked store.
    pub fn store(&self) -> &Store {
        self.store
    }

    /// One address per range set of `cfg`.
    ///
    /// * Idempotent: addresses (container_id, ifname) already holds are
    ///   returned for their range sets (a requested address for such a set is
    ///   then ignored); only sets without one get a new address.
    /// * `requested`: each must lie in a range of some set and be allocatable
    ///   (not network/broadcast/gateway/excluded), else
    ///   [`IpamError::RequestedOutOfRange`]; and be free or held by this owner,
    ///   else [`IpamError::RequestedTaken`] naming the holder. A set with a
    ///   requested address takes no other. Requested addresses are not probed.
    /// * Otherwise: the address the same pod (namespace, name, ifname) held
    ///   last if it is free, then round-robin from the set's last reserved
    ///   address, skipping network, IPv4 broadcast, gateways, excluded and
    ///   reserved addresses, and every candidate for which `probe` returns
    ///   true (it answered an ARP probe). `probe` is called for each free
    ///   candidate; pass `|_| false` when probing is disabled.
    /// * All or nothing: if a set is exhausted ([`IpamError::Exhausted`]) or a
    ///   write fails, nothing reserved by this call is kept.
    pub fn allocate(
        &mut self,
        cfg: &IpamConfig,
        owner: &Owner,
        requested: &[IpAddr],
        probe: &mut dyn FnMut(IpAddr) -> bool,
    ) -> Result<Vec<Allocation>, IpamError> {
        let layout = &self.store.layout;
        let index_path = layout.owner_file(&owner.container_id, &owner.ifname);
        let mut held = self.held_by(owner, &index_path)?;

        let pools = (0..cfg.range_sets.len())
            .map(|s| Pool::new(cfg, s))
            .collect::<Vec<_>>();
        let mut picks: Vec<Option<Pick>> = vec![None; pools.len()];
        for &ip in &held {
            if let Some((s, _)) = cfg.range_for(ip) {
                picks[s].get_or_insert(Pick { ip, fresh: false });
            }
        }
        if picks.iter().all(Option::is_some) {
            return allocations(cfg, &picks);
        }

        for &ip in requested {
            let Some((s, _)) = cfg.range_for(ip) else {
                return Err(IpamError::RequestedOutOfRange { ip });
            };
            if !pools[s].as_ref().is_some_and(|p| p.allocatable(ip)) {
                return Err(IpamError::RequestedOutOfRange { ip });
            }
            match picks[s] {
                Some(p) if p.ip == ip || !p.fresh => continue,
                Some(_) => return Err(IpamError::RequestedOutOfRange { ip }),
                None => {}
            }
            let path = layout.ip_file(ip);
            match disk::read_json::<Reservation>(&path)? {
                Read::Missing => picks[s] = Some(Pick { ip, fresh: true }),
                Read::Found(r) if owner.holds(&r) => {
                    // Held but not indexed (older layout, or tampering): adopt it.
                    held.push(ip);
                    picks[s] = Some(Pick { ip, fresh: false });
                }
                Read::Found(r) => {
                    return Err(IpamError::RequestedTaken {
                        ip,
                        container_id: r.container_id,
                        ifname: r.ifname,
                    })
                }
                Read::Unparsable(reason) => return Err(IpamError::Corrupt { path, reason }),
            }
        }

        let sticky = self.sticky_of(owner);
        for (s, pick) in picks.iter_mut().enumerate() {
            if pick.is_some() {
                continue;
            }
            let Some(pool) = pools[s].as_ref() else {
                return Err(IpamError::Exhausted {
                    network: self.store.network.clone(),
                    ranges: format!("range set {s} (it has no range)"),
                });
            };
            let mut usable = |ip: IpAddr| -> Result<bool, IpamError> {
                Ok(!disk::exists(&layout.ip_file(ip))? && !probe(ip))
            };
            let mut found = None;
            for &ip in sticky.iter().filter(|ip| pool.allocatable(**ip)) {
                if usable(ip)? {
                    found = Some(ip);
                    break;
                }
            }
            if found.is_none() {
                let cursor = disk::read_cursor(&layout.last_reserved_file(s));
                found = pool.find(cursor, &mut usable)?;
            }
            match found {
                Some(ip) => *pick = Some(Pick { ip, fresh: true }),
                None => {
                    return Err(IpamError::Exhausted {
                        network: self.store.network.clone(),
                        ranges: pool.describe(),
                    })
                }
            }
        }

        self.commit(owner, &index_path, &held, &picks)?;
        allocations(cfg, &picks)
    }

    /// The addresses `owner` verifiably holds (listed by its index and
    /// named by their files).
    fn held_by(&self, owner: &Owner, index_path: &Path) -> Result<Vec<IpAddr>, IpamError> {
        let listed = match disk::read_json::<OwnerIndex>(index_path)? {
            Read::Missing => return Ok(Vec::new()),
            Read::Found(idx)
                if idx.container_id == owner.container_id && idx.ifname == owner.ifname =>
            {
                idx.ips
            }
            Read::Found(idx) => {
                return Err(IpamError::Corrupt {
                    path: index_path.to_path_buf(),
                    reason: format!(
                        "it indexes container {:?} interface {:?}, not container {:?} interface {:?} (file name collision)",
                        idx.container_id, idx.ifname, owner.container_id, owner.ifname
                    ),
                })
            }
            Read::Unparsable(reason) => {
                tracing::warn!(path = %index_path.display(), %reason, "unreadable owner index; scanning the store for the owner's addresses");
                return self.store.scan_owned(owner);
            }
        };
        let mut held = Vec::with_capacity(listed.len());
        for ip in listed {
            if self.store.holder(ip)?.is_some_and(|r| owner.holds(&r)) && !held.contains(&ip) {
                held.push(ip);
            }
        }
        Ok(held)
    }

    /// The addresses the owner's pod held last (empty without pod info).
    fn sticky_of(&self, owner: &Owner) -> Vec<IpAddr> {
        let Some((ns, name)) = owner.pod() else {
            return Vec::new();
        };
        let path = self.store.layout.sticky_file(ns, name, &owner.ifname);
        match disk::read_json::<Sticky>(&path) {
            Ok(Read::Found(s))
                if s.pod_namespace == ns && s.pod_name == name && s.ifname == owner.ifname =>
            {
                s.ips
            }
            Ok(_) => Vec::new(),
            Err(e) => {
                tracing::debug!(error = %e, "sticky record unreadable; ignoring it");
                Vec::new()
            }
        }
    }

    /// Release what (container_id, ifname) holds; nothing held = `Ok(vec![])`.
    /// An address file that names another owner is never removed. If a file
    /// cannot be removed, the index is kept (so a repeated DEL finishes the
    /// job) and the first error is returned.
    pub fn release(&mut self, container_id: &str, ifname: &str) -> Result<Vec<IpAddr>, IpamError> {
        let owner = Owner::new(container_id, ifname);
        let index_path = self.store.layout.owner_file(container_id, ifname);
        let listed = match disk::read_json::<OwnerIndex>(&index_path)? {
            Read::Missing => return Ok(Vec::new()),
            Read::Found(idx) if idx.container_id == container_id && idx.ifname == ifname => idx.ips,
            Read::Found(_) => return Ok(Vec::new()),
            Read::Unparsable(reason) => {
                tracing::warn!(path = %index_path.display(), %reason, "unreadable owner index; scanning the store for the owner's addresses");
                self.store.scan_owned(&owner)?
            }
        };
        let mut released = Vec::with_capacity(listed.len());
        let mut first_error = None;
        for ip in listed {
            match self.release_one(&owner, ip) {
                Ok(true) => released.push(ip),
                Ok(false) => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
            failpoint::check("release:after_ip", &index_path)?;
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        disk::remove_if_exists(&index_path)?;
        Ok(released)
    }

    /// Remove `ip`'s file if it names `owner` (or names nobody: unparsable).
    fn release_one(&self, owner: &Owner, ip: IpAddr) -> Result<bool, IpamError> {
        let path = self.store.layout.ip_file(ip);
        match disk::read_json::<Reservation>(&path)? {
            Read::Missing => Ok(false),
            Read::Found(r) if owner.holds(&r) => disk::remove_if_exists(&path).map(|()| true),
            Read::Found(r) => {
                tracing::debug!(%ip, holder = %r.container_id, "address listed by a stale index belongs to another owner; kept");
                Ok(false)
            }
            Read::Unparsable(reason) => {
                tracing::warn!(path = %path.display(), %reason, "removing an unparsable reservation listed by its owner's index");
                disk::remove_if_exists(&path).map(|()| true)
            }
        }
    }
}

/// The result of `allocate`, in range-set order.
fn allocations(cfg: &IpamConfig, picks: &[Option<Pick>]) -> Result<Vec<Allocation>, IpamError> {
    let mut out = Vec::with_capacity(picks.len());
    for (s, pick) in picks.iter().enumerate() {
        let Some(pick) = pick else { continue };
        let Some((_, range)) = cfg.range_for(pick.ip) else {
            continue;
        };
        let address =
            IpNetwork::new(pick.ip, range.subnet.prefix()).map_err(|e| IpamError::Corrupt {
                path: PathBuf::new(),
                reason: format!(
                    "address {} with prefix {}: {e}",
                    pick.ip,
                    range.subnet.prefix()
                ),
            })?;
        out.push(Allocation {
            address,
            gateway: range.gateway,
            range_set: s,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
