//! The kernel path against a real kernel and a real nft, in namespaces each
//! test builds for itself (see `lab`). Every test skips, saying why, where
//! nft, ip or root is missing.

mod datapath;
mod lab;
mod lifecycle;
mod review3;
mod security;
mod settings;

use edgelink_kernel_path::{KernelForward, Plan, Protocol};
use lab::{DEVICE, DEVICE6, TCP_ECHO, UDP_ECHO};

pub const TABLE: &str = "edgelink";

/// `api` tcp/8080 and `dns` udp/5353 to the device's IPv4 address,
/// `api6` tcp/8086 and `dns6` udp/5356 to its IPv6 address.
pub fn full_plan() -> Plan {
    let fwd = |name: &str, protocol, port, ip: &str, target_port| KernelForward {
        name: name.into(),
        protocol,
        port,
        target: lab::addr(ip, target_port),
    };
    Plan {
        table: TABLE.into(),
        private_ifname: "net1".into(),
        cluster_ifname: Some("eth0".into()),
        forwards: vec![
            fwd("api", Protocol::Tcp, 8080, DEVICE, TCP_ECHO),
            fwd("dns", Protocol::Udp, 5353, DEVICE, UDP_ECHO),
            fwd("api6", Protocol::Tcp, 8086, DEVICE6, TCP_ECHO),
            fwd("dns6", Protocol::Udp, 5356, DEVICE6, UDP_ECHO),
        ],
        allowed: vec![
            "172.31.50.0/24".parse().unwrap(),
            "fd00:50::/64".parse().unwrap(),
        ],
    }
}
