//! Which namespace a network's store belongs to: `<dir>/namespace`, JSON
//! [`StoreOwner`], written under the store lock after the first allocation
//! for a pod of a namespace. The store is keyed by the network name alone,
//! and any namespace can write a config with any name: without an owner,
//! a copied NetworkAttachmentDefinition in another namespace hands out
//! (and exhausts) the addresses of the original's segment.
//!
//! A pod of another namespace is refused ([`IpamError::NotOwner`]) while
//! any address of the store is held by a pod of a namespace other than its
//! own; a store whose addresses are all released (or held by callers
//! without a namespace: a runtime outside Kubernetes) passes to the next
//! namespace that allocates from it. Whether a network may be shared by
//! several namespaces is the caller's decision (it then does not ask).

use std::collections::BTreeSet;
use std::fs;

use serde::{Deserialize, Serialize};

use super::disk::{self, Read, Reservation};
use super::{disk_ip_name, IpamError, StoreLock};

/// The owner file's name in the store's directory.
pub(crate) const OWNER_FILE: &str = "namespace";

/// Content of `<dir>/namespace`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StoreOwner {
    pub pod_namespace: String,
}

/// What [`StoreLock::check_owner`] found: the store is the namespace's
/// already, or may become it ([`StoreLock::record_owner`] after the
/// allocation succeeded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    Owned,
    Claimable,
}

impl StoreLock<'_> {
    /// Whether a pod of `namespace` may allocate from this store (nothing
    /// is written). The ADD path lists the directory only when the recorded
    /// owner is missing or another namespace.
    pub fn check_owner(&self, namespace: &str) -> Result<Ownership, IpamError> {
        let path = self.store.layout.dir.join(OWNER_FILE);
        let recorded = match disk::read_json::<StoreOwner>(&path)? {
            Read::Found(o) if o.pod_namespace == namespace => return Ok(Ownership::Owned),
            Read::Found(o) => Some(o.pod_namespace),
            Read::Missing | Read::Unparsable(_) => None,
        };
        let holders = self.holder_namespaces()?;
        let other = holders.iter().find(|ns| ns.as_str() != namespace);
        match other {
            None => Ok(Ownership::Claimable),
            Some(holder) => Err(IpamError::NotOwner {
                network: self.store.network.clone(),
                owner: recorded.unwrap_or_else(|| holder.clone()),
                namespace: namespace.to_string(),
            }),
        }
    }

    /// Record `namespace` as the store's owner.
    pub fn record_owner(&self, namespace: &str) -> Result<(), IpamError> {
        let path = self.store.layout.dir.join(OWNER_FILE);
        let owner = StoreOwner {
            pod_namespace: namespace.to_string(),
        };
        disk::write_atomic(&path, &disk::to_json(&owner, &path)?)
    }

    /// The namespace recorded as the owner, if any.
    pub fn owner(&self) -> Result<Option<String>, IpamError> {
        let path = self.store.layout.dir.join(OWNER_FILE);
        Ok(match disk::read_json::<StoreOwner>(&path)? {
            Read::Found(o) => Some(o.pod_namespace),
            _ => None,
        })
    }

    /// The pod namespaces named by the store's reservations.
    fn holder_namespaces(&self) -> Result<BTreeSet<String>, IpamError> {
        let dir = &self.store.layout.dir;
        let mut out = BTreeSet::new();
        for entry in fs::read_dir(dir).map_err(|e| IpamError::io(dir, e))? {
            let entry = entry.map_err(|e| IpamError::io(dir, e))?;
            let Some(ip) = entry.file_name().to_str().and_then(disk_ip_name) else {
                continue;
            };
            if let Read::Found(r) = disk::read_json::<Reservation>(&self.store.layout.ip_file(ip))?
            {
                if let Some(ns) = r.pod_namespace.filter(|ns| !ns.is_empty()) {
                    out.insert(ns);
                }
            }
        }
        Ok(out)
    }
}
