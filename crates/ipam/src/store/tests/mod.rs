//! Store and allocator tests, on temp dirs.

mod alloc;
mod concurrency;
mod crash;
mod gc;
mod links;

use std::collections::{BTreeSet, HashSet};
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use tempfile::TempDir;

use super::*;
use crate::config::IpamConfig;

pub(super) const NET: &str = "plant-floor";

pub(super) fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub(super) fn cfg(v: Value) -> IpamConfig {
    IpamConfig::from_json(&v, "kedge1").unwrap()
}

/// A small IPv4 pool: 10.0.0.0/24, start .10, end .14, gateway .1.
pub(super) fn small() -> IpamConfig {
    cfg(
        json!({"ranges": [[{"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.10", "rangeEnd": "10.0.0.14", "gateway": "10.0.0.1"}]]}),
    )
}

pub(super) fn pod(cid: &str, ifname: &str, ns: &str, name: &str) -> Owner {
    Owner {
        container_id: cid.into(),
        ifname: ifname.into(),
        pod_namespace: Some(ns.into()),
        pod_name: Some(name.into()),
        pod_uid: Some(format!("uid-{name}")),
    }
}

pub(super) fn addrs(allocs: &[Allocation]) -> Vec<IpAddr> {
    allocs.iter().map(|a| a.address.ip()).collect()
}

pub(super) fn valid(pairs: &[(&str, &str)]) -> HashSet<(String, String)> {
    pairs
        .iter()
        .map(|(c, i)| (c.to_string(), i.to_string()))
        .collect()
}

/// A store in a temp state dir.
pub(super) struct Env {
    _state: TempDir,
    pub store: Store,
}

impl Env {
    pub fn new() -> Env {
        let state = tempfile::tempdir().unwrap();
        let store = Store::open(state.path(), NET).unwrap();
        Env {
            _state: state,
            store,
        }
    }

    pub fn alloc_with(
        &self,
        cfg: &IpamConfig,
        owner: &Owner,
        requested: &[IpAddr],
        probe: &mut dyn FnMut(IpAddr) -> bool,
    ) -> Result<Vec<Allocation>, IpamError> {
        let mut lock = self.store.lock(Duration::from_secs(5)).unwrap();
        lock.allocate(cfg, owner, requested, probe)
    }

    pub fn alloc(&self, cfg: &IpamConfig, owner: &Owner) -> Result<Vec<Allocation>, IpamError> {
        self.alloc_with(cfg, owner, &[], &mut |_| false)
    }

    /// Allocate for an owner without pod info and return the addresses.
    pub fn take(&self, cfg: &IpamConfig, cid: &str) -> Vec<IpAddr> {
        addrs(&self.alloc(cfg, &Owner::new(cid, "net1")).unwrap())
    }

    pub fn release(&self, cid: &str, ifname: &str) -> Result<Vec<IpAddr>, IpamError> {
        self.store
            .lock(Duration::from_secs(5))
            .unwrap()
            .release(cid, ifname)
    }

    pub fn gc(&self, valid: &HashSet<(String, String)>) -> GcReport {
        self.store
            .lock(Duration::from_secs(5))
            .unwrap()
            .release_all_except(valid)
    }

    pub fn dir(&self) -> &Path {
        self.store.dir()
    }

    /// Reserved addresses, from the directory.
    pub fn reserved(&self) -> BTreeSet<IpAddr> {
        std::fs::read_dir(self.dir())
            .unwrap()
            .filter_map(|e| disk_ip_name(e.unwrap().file_name().to_str()?))
            .collect()
    }

    /// The holder (container ID) of `ip` per its file.
    pub fn holder(&self, ip: IpAddr) -> Option<String> {
        self.store.holder(ip).unwrap().map(|r| r.container_id)
    }

    /// Every file of the store that is state about reservations: address
    /// files, owner indexes and temp files anywhere (not the lock, the
    /// cursors and sticky records, which are memory, not reservations).
    pub fn leftovers(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for sub in ["", "owners", "sticky"] {
            for e in std::fs::read_dir(self.dir().join(sub)).unwrap() {
                let name = e.unwrap().file_name().into_string().unwrap();
                let keep = match sub {
                    "" => name.starts_with(disk::TMP_PREFIX) || disk_ip_name(&name).is_some(),
                    "owners" => true,
                    _ => name.starts_with(disk::TMP_PREFIX),
                };
                if keep {
                    out.insert(format!("{sub}/{name}"));
                }
            }
        }
        out
    }

    pub fn write(&self, rel: &str, content: &[u8]) {
        std::fs::write(self.dir().join(rel), content).unwrap();
    }
}

/// The JSON of an address file for (cid, ifname).
pub(super) fn reservation_json(cid: &str, ifname: &str) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"containerId": cid, "ifname": ifname, "podNamespace": null,
        "podName": null, "podUid": null, "reservedAt": "2026-01-01T00:00:00Z"}),
    )
    .unwrap()
}
