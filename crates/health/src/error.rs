//! Why a probe failed, naming the target and the step: the text /status
//! shows as the health's `error`.

use edgelink_attachment::{HealthKind, HealthTarget};
use std::io;
use std::net::SocketAddr;

/// Why a probe failed, naming the target and the step.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{kind} {target}: no answer within {ms} ms")]
    Timeout {
        kind: HealthKind,
        target: HealthTarget,
        ms: u64,
    },
    #[error("socket for {target} in the pod's netns: {source}")]
    Socket {
        target: HealthTarget,
        source: io::Error,
    },
    #[error("icmp {target}: no ICMP socket in the pod's netns: datagram: {datagram} (the pod's net.ipv4.ping_group_range must include edgelinkd's group), raw: {raw} (edgelinkd needs CAP_NET_RAW)")]
    IcmpSocket {
        target: HealthTarget,
        datagram: io::Error,
        raw: io::Error,
    },
    #[error("connect {target}: {source}")]
    Connect {
        target: SocketAddr,
        source: io::Error,
    },
    /// Sending or receiving after the connect.
    #[error("{kind} {target}: {source}")]
    Io {
        kind: HealthKind,
        target: HealthTarget,
        source: io::Error,
    },
    #[error("http {target}{path}: status {got}, expected {want}")]
    Status {
        target: SocketAddr,
        path: String,
        got: u16,
        want: String,
    },
    /// An answer that is not what the protocol says.
    #[error("{kind} {target}: {what}")]
    Malformed {
        kind: HealthKind,
        target: HealthTarget,
        what: String,
    },
    #[error("modbus {target}: exception {code} ({name}) from unit {unit}")]
    Exception {
        target: SocketAddr,
        unit: u8,
        code: u8,
        name: &'static str,
    },
}
