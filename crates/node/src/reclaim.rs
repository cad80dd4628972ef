//! Releasing what a pod left behind when it went without a DEL (the GC
//! Multus never sends to a secondary plugin): its address (the built-in
//! IPAM, or the delegated plugin's DEL with `--cni-path`), its record; and
//! reservations no record stands for. It decides nothing about which
//! attachments are served.

use edgelink_attachment::{Record, RecordStore};
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What reclaiming needs, and what it counted.
#[derive(Debug)]
pub struct Reclaimer {
    pub state_dir: PathBuf,
    /// `--cni-path`: where a delegated IPAM plugin is found (empty: its
    /// reservations are left to its own GC).
    pub cni_path: Vec<PathBuf>,
    /// `--ipam-gc-grace`: a reservation without a record is released once
    /// older than this (an ADD in flight holds one before its record).
    pub gc_grace: Duration,
    /// Reservations are collected at most this often (the reconcile
    /// interval): a pass woken by a record change or the plugin skips it.
    pub gc_every: Duration,
    /// When they were last collected.
    pub gc_last: Mutex<Option<Instant>>,
    /// Attachments reclaimed because their netns was gone.
    pub reclaimed: AtomicU64,
}

impl Reclaimer {
    /// The pod is gone without a DEL and its IPAM is delegated: with
    /// `--cni-path`, run the delegate's DEL. False when that failed: the
    /// record is kept (it holds the only configuration that can release the
    /// address) and the next pass tries again. Without `--cni-path`, the
    /// delegate's reservation is left to its own GC, as documented.
    pub async fn release_delegated(&self, rec: &Record) -> bool {
        let Some(plugin) = crate::delegate::plugin_of(rec).map(str::to_string) else {
            return true;
        };
        let dirs = self.cni_path.clone();
        if dirs.is_empty() {
            tracing::info!(container = %rec.container_id, ifname = %rec.ifname, %plugin,
                "delegated IPAM: its reservation is left to its own GC (--cni-path is not set)");
            return true;
        }
        let r = rec.clone();
        let done = tokio::task::spawn_blocking(move || crate::delegate::release(&r, &dirs)).await;
        match done {
            Ok(Ok(_)) => {
                tracing::info!(container = %rec.container_id, ifname = %rec.ifname, %plugin,
                    "the delegated IPAM released the reservation");
                true
            }
            Ok(Err(e)) => {
                tracing::warn!(container = %rec.container_id, ifname = %rec.ifname, %plugin, error = %e,
                    "cannot release the delegated IPAM's reservation: the record is kept and the next pass tries again");
                false
            }
            Err(e) => {
                tracing::warn!(container = %rec.container_id, ifname = %rec.ifname, %plugin, error = %e,
                    "the delegated IPAM's DEL did not complete: the record is kept and the next pass tries again");
                false
            }
        }
    }

    /// The pod is gone without a DEL: release its address, drop its record.
    pub fn reclaim(&self, rec: &Record) {
        tracing::info!(container = %rec.container_id, ifname = %rec.ifname, netns = %rec.netns,
            "netns is gone: releasing the attachment's address and record");
        match edgelink_ipam::Store::open(&self.state_dir, &rec.network).and_then(|s| {
            let mut l = s.lock(Duration::from_secs(10))?;
            l.release(&rec.container_id, &rec.ifname)
        }) {
            Ok(ips) if !ips.is_empty() => {
                tracing::info!(addresses = %edgelink_ipam::show_ips(&ips), "released")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "cannot release the reservation"),
        }
        if let Err(e) = RecordStore::new(&self.state_dir).remove(&rec.container_id, &rec.ifname) {
            tracing::warn!(error = %e, "cannot remove the record");
        }
        self.reclaimed.fetch_add(1, Ordering::Relaxed);
    }

    /// [`Reclaimer::gc_reservations`] when `gc_every` has passed since the
    /// last time. A collection reads every record and every reservation and
    /// holds each network's IPAM lock meanwhile: on every pass, at 500
    /// attachments it was half of each pass, and a pass follows every ADD
    /// (the plugin asks for one), whose next ADD waited for the lock.
    pub fn gc_reservations_when_due(&self) {
        {
            let mut last = self.gc_last.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|t| t.elapsed() < self.gc_every) {
                return;
            }
            *last = Some(Instant::now());
        }
        self.gc_reservations();
    }

    /// Reservations with no record (an ADD killed before it wrote one) are
    /// released once older than the grace period.
    ///
    /// A record file that cannot be read (torn, hand-edited, unreadable)
    /// does not stop GC: nobody knows which attachment it stands for, so the
    /// reservations of every (container ID, ifname) whose record would be
    /// stored under that file name (current or old naming) are kept, and
    /// only those. Names are a function of (container ID, ifname), so this
    /// keeps exactly what the record could protect if it were readable. A
    /// file under a name no attachment's record has (`junk.json`) protects
    /// nothing. If the directory itself cannot be listed, nothing is freed.
    pub fn gc_reservations(&self) {
        let listed = match RecordStore::new(&self.state_dir).list() {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "IPAM GC skipped: cannot list attachment records");
                return;
            }
        };
        let mut valid: HashSet<(String, String)> = HashSet::new();
        let mut unreadable: Vec<String> = Vec::new();
        for (path, r) in listed {
            match r {
                Ok(r) => {
                    valid.insert((r.container_id, r.ifname));
                }
                Err(_) => {
                    unreadable.extend(path.file_name().map(|n| n.to_string_lossy().into_owned()))
                }
            }
        }
        let keep = |cid: &str, ifname: &str| {
            valid.contains(&(cid.to_string(), ifname.to_string()))
                || unreadable
                    .iter()
                    .any(|n| RecordStore::may_name(n, cid, ifname))
        };
        let report = edgelink_ipam::release_all_but(
            &self.state_dir,
            &keep,
            Duration::from_secs(5),
            self.gc_grace,
        );
        for (net, ip, cid, ifname) in &report.released {
            tracing::info!(network = %net, %ip, container = %cid, %ifname, "released a reservation without attachment record");
        }
        for e in &report.errors {
            tracing::warn!(error = %e, "IPAM GC");
        }
    }
}
