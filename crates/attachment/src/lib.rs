//! Attachment records: the contract between the plugin and the node daemon.
//!
//! One JSON file per (container ID, ifname) under `<stateDir>/attachments/`,
//! named unambiguously within 255 bytes, written atomically (temp file +
//! fsync + rename; the directory fsync'd too where DEL needs the record
//! after a power loss) by the plugin on ADD and removed on DEL; the daemon reads them to know which forwards to serve in which
//! network namespace. This crate owns the record's format, the forward types
//! and their target checks, and the directory; it must not touch the kernel
//! or know about CNI.
#![forbid(unsafe_code)]

pub mod control;
mod forward;
mod health;
mod naming;
mod reverse;
mod store;

pub use control::{
    nudge_daemon, query_daemon, CheckReply, ForwardLive, Reaper, Request, RequestError,
    DAEMON_SOCKET, RETIRED_ALIAS,
};
pub use forward::{Forward, ForwardPath, ModbusMux, Protocol, ProxyProtocol};
pub use health::{Health, HealthKind, HealthTarget};
pub use reverse::{Dns, Reverse, Target, TargetError};
pub use store::{Listed, RecordStore, STALE_TEMP};

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Current record format version.
pub const RECORD_VERSION: u32 = 1;

/// The pod-side interface an attachment made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordInterface {
    pub name: String,
    pub mac: String,
    pub ips: Vec<IpNetwork>,
}

/// One attachment: what the daemon needs to serve its forwards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    pub version: u32,
    pub container_id: String,
    pub ifname: String,
    pub netns: String,
    pub network: String,
    /// `bridge` or `macvlan`.
    pub mode: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    pub interface: RecordInterface,
    #[serde(default)]
    pub forwards: Vec<Forward>,
    #[serde(default)]
    pub allowed_targets: Vec<IpNetwork>,
    /// Ports on the interface that devices dial, relayed into the cluster.
    /// Absent in records written before reverse forwards existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reverse: Vec<Reverse>,
    /// The resolver settings the runtime (or the network config) gave,
    /// for reverse targets that are names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<Dns>,
    /// The device health probe (`health`), run by the daemon. Absent in
    /// records written before it existed, and when none is configured
    /// (an older daemon ignores the key: it serves the forwards as before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<Health>,
    /// `virtualAddresses`: the addresses devices dial for the reverse
    /// forwards, held on the interface by one attachment at a time (the
    /// daemon adds and announces them while it holds them). Absent in
    /// records written before they existed, and when none are configured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub virtual_addresses: Vec<std::net::IpAddr>,
    /// Seconds since the Unix epoch.
    pub created_at: u64,
    /// The network configuration ADD ran with (without `prevResult`), so a
    /// DEL that gets a stripped config can still release a delegated IPAM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni_config: Option<serde_json::Value>,
    /// The PID namespace (inode of /proc/self/ns/pid) of the plugin that
    /// wrote the record: a `/proc/<pid>/ns/net` netns path means something
    /// only there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_namespace: Option<u64>,
    /// The network namespace `netns` named when the plugin wrote the
    /// record. A path can come to name another one (a `/proc/<pid>` whose
    /// PID was reused, after a reboot or not): the daemon serves a record
    /// only in the namespace it was written for. Absent in records written
    /// before it existed (served wherever the path points, as before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns_id: Option<NetnsId>,
    /// The boot the record was written in ([`boot_id`]): a record of an
    /// earlier boot names a pod that is gone, whatever its path names now.
    /// Absent in records written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
}

/// A network namespace as the kernel tells them apart: the device and
/// inode of its nsfs file (`stat` of `/proc/<pid>/ns/net` or of a bind
/// mount of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetnsId {
    pub dev: u64,
    pub ino: u64,
}

impl Record {
    /// A record file's content, as the daemon (and DEL, CHECK, GC) read it;
    /// `path` is only for the error.
    pub fn parse(path: &std::path::Path, bytes: &[u8]) -> Result<Record, RecordError> {
        serde_json::from_slice(bytes).map_err(|e| RecordError::Malformed {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
    }

    /// The IPAM plugin this attachment's addresses came from when it is not
    /// the built-in one (`cni_config.ipam.type`). DEL with a config that
    /// lacks its `ipam` finds that plugin, and the config to call it with,
    /// only in the record.
    pub fn delegated_ipam(&self) -> Option<&str> {
        self.cni_config.as_ref()?["ipam"]["type"]
            .as_str()
            .filter(|t| !t.is_empty() && *t != "edgelink")
    }

    /// The content [`RecordStore::write`] gives a record file: pretty JSON
    /// and a newline.
    pub fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        let mut body = serde_json::to_vec_pretty(self)?;
        body.push(b'\n');
        Ok(body)
    }
}

/// The inode of this process's PID namespace (see [`Record::pid_namespace`]).
pub fn own_pid_namespace() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino())
}

/// This boot's ID (`/proc/sys/kernel/random/boot_id`, one per boot of the
/// kernel, the same in every namespace); `None` where it cannot be read.
pub fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a valid attachment record: {reason}")]
    Malformed { path: PathBuf, reason: String },
}
