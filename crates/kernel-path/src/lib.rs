//! The kernel fast path of a forward: nftables NAT in a pod's network
//! namespace instead of edgelinkd's user-space relay. This crate owns only
//! that kernel state: one `inet` table per attachment (DNAT of the declared
//! ports to their targets, masquerade out of the private interface, a
//! forward chain that drops everything else), the forwarding and conntrack
//! sysctls of that namespace, and reading the table's counters back.
//!
//! It also renders and installs the node-side guard of a bridge that
//! carries gateway addresses ([`ensure_gateway_guard`], the plugin's
//! `isGateway`): a table of its own in the namespace it is handed, which
//! is then the node's.
//!
//! It must not: touch any namespace but the one it is handed, nor any
//! table but its own, link libnftnl or any other C library (it runs the
//! `nft` binary and speaks nft's JSON API, see [`Options::nft`]), use an
//! async runtime (the daemon calls it from `spawn_blocking`), or decide
//! which forwards take this path (the daemon does).
//!
//! Every call that changes the namespace is one `nft -j -f -` transaction,
//! which the kernel applies whole or not at all. Namespaces are entered
//! only on short-lived threads of their own ([`Netns::run_on_thread`]); a
//! child process spawned there inherits that namespace.
//!
//! Only traffic that arrives on the plan's cluster interface (or, when it
//! names none, that does not arrive on the private interface) is DNATed,
//! and only to targets inside the plan's allowed networks: a device on the
//! private segment, or on another segment the pod is attached to, can
//! never use this path to reach into the cluster or that segment.
//! Clients inside the pod itself (its loopback) are not served: the NAT
//! hooks here see packets routed through the pod, not the pod's own.

#![forbid(unsafe_code)]

mod counters;
mod gateway;
mod nft;
mod render;
mod sysctl;

pub use edgelink_attachment::Protocol;
pub use gateway::{ensure_gateway_guard, gateway_table, remove_gateway_guard, render_gateway};
pub use render::render;
pub use sysctl::conntrack_headroom;

use edgelink_netns::{Netns, NetnsError};
use ipnetwork::IpNetwork;
use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// One forward served by the kernel: `protocol` `port` on the pod's
/// addresses, DNATed to `target`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelForward {
    /// The forward's name; its counters are `<name>-conn`, `-up`, `-down`.
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
    /// IPv4 or IPv6: only clients of the same family reach it (NAT does not
    /// translate between families).
    pub target: SocketAddr,
}

/// Everything one attachment's table holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The table's name (family `inet`), e.g. "edgelink".
    pub table: String,
    /// The edgelink interface in the pod, e.g. "net1".
    pub private_ifname: String,
    /// The pod's cluster interface, e.g. "eth0": when set, only what
    /// arrives there is DNATed (not what arrives on any other attachment's
    /// interface, another segment); when None, all but `private_ifname`.
    pub cluster_ifname: Option<String>,
    pub forwards: Vec<KernelForward>,
    /// The attachment's allowedTargets: [`render`] refuses any target
    /// outside them.
    pub allowed: Vec<IpNetwork>,
}

/// How to reach nft, and the conntrack tuning of the pod's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The nft program: a path, or a name looked up in `PATH`.
    pub nft: PathBuf,
    /// net.netfilter.nf_conntrack_tcp_timeout_time_wait (whole seconds).
    pub tcp_time_wait: Duration,
    /// net.netfilter.nf_conntrack_udp_timeout (whole seconds).
    pub udp_timeout: Duration,
    /// net.netfilter.nf_conntrack_udp_timeout_stream (whole seconds).
    pub udp_stream_timeout: Duration,
    /// Where the net sysctls are written: /proc/sys/net, or a read-write
    /// bind mount of it (a container's /proc/sys is read-only; a thread
    /// inside the pod's namespace sees that namespace's values through the
    /// mount too).
    pub proc_sys_net: PathBuf,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            nft: PathBuf::from("nft"),
            tcp_time_wait: Duration::from_secs(65),
            udp_timeout: Duration::from_secs(30),
            udp_stream_timeout: Duration::from_secs(60),
            proc_sys_net: PathBuf::from("/proc/sys/net"),
        }
    }
}

/// What one forward's counters read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowCounters {
    /// New flows DNATed (the nat chain sees only a flow's first packet).
    pub connections: u64,
    pub packets_to_target: u64,
    pub bytes_to_target: u64,
    pub packets_to_client: u64,
    pub bytes_to_client: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("table {table}: {reason}")]
    InvalidPlan { table: String, reason: String },
    #[error("table {table}: forward {forward}: target {target} is outside the allowed targets [{allowed}]")]
    TargetNotAllowed {
        table: String,
        forward: String,
        target: SocketAddr,
        allowed: String,
    },
    #[error("option {option}: {reason}")]
    InvalidOption {
        option: &'static str,
        reason: String,
    },
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("cannot run {nft} in {netns}: {source}")]
    Spawn {
        nft: PathBuf,
        netns: PathBuf,
        source: io::Error,
    },
    #[error("{nft} failed to {action} table inet {table} in {netns}: {stderr}")]
    Nft {
        nft: PathBuf,
        netns: PathBuf,
        table: String,
        action: &'static str,
        stderr: String,
    },
    #[error("no table inet {table} in {netns}")]
    NoTable { netns: PathBuf, table: String },
    #[error("cannot parse what {nft} listed of table inet {table} in {netns}: {reason}")]
    Parse {
        nft: PathBuf,
        netns: PathBuf,
        table: String,
        reason: String,
    },
    #[error("cannot set {} to {value} in {netns}: {source}", path.display())]
    SetSysctl {
        netns: PathBuf,
        path: PathBuf,
        value: String,
        source: io::Error,
    },
    #[error("cannot read {path}: {source}")]
    ReadSysctl { path: PathBuf, source: io::Error },
}

/// Install `plan` in `netns`, replacing whatever the table held, then turn
/// on forwarding there (`ip_forward` and the private interface's own, which
/// the plugin's ADD turned off) and set the conntrack timeouts of `opts`.
/// When any step fails, forwarding in `netns` is turned off again: the pod
/// routes only while the table that drops what it did not DNAT is in.
///
/// Idempotent: one transaction adds the table, deletes it and adds it anew
/// with everything in it, so no rule is ever doubled and the same plan
/// always lists the same. The table's counters start again from zero.
/// Flows already tracked keep their NAT; those of a forward no longer in
/// the plan are dropped by the new forward chain.
pub fn ensure(netns: &Netns, plan: &Plan, opts: &Options) -> Result<(), Error> {
    let doc = render(plan)?;
    let timeouts = sysctl::ConntrackTimeouts::from_options(opts)?;
    let needs_ipv6 = plan.forwards.iter().any(|f| f.target.is_ipv6());
    let nft = nft::Nft::new(opts, netns, &plan.table);
    let ifname = plan.private_ifname.as_str();
    netns.run_on_thread(|| {
        let installed = nft.apply(&doc, "replace").and_then(|()| {
            // Forwarding only once the drop-by-default table is in. After
            // the transaction too: on a kernel with conntrack as a module
            // the nf_conntrack sysctls appear only once a ct rule loaded it.
            sysctl::set_forwarding(netns, &opts.proc_sys_net, Some(ifname), needs_ipv6)?;
            timeouts.apply(netns)
        });
        if installed.is_err() {
            // Not serving: the pod must not route either, whatever it
            // inherited from the node (best effort: the error that
            // matters is the one above).
            let _ = sysctl::set_forwarding(netns, &opts.proc_sys_net, None, false);
        }
        installed
    })?
}

/// Delete the table, and turn forwarding in `netns` off again first (the
/// pod must not stay a router once the drop-by-default chain is gone).
/// Ok(false) when there was no such table: then nothing is touched.
pub fn remove(netns: &Netns, table: &str, opts: &Options) -> Result<bool, Error> {
    render::check_table_name(table)?;
    let nft = nft::Nft::new(opts, netns, table);
    netns.run_on_thread(|| {
        if nft.list_table()?.is_none() {
            return Ok(false);
        }
        sysctl::set_forwarding(netns, &opts.proc_sys_net, None, false)?;
        nft.apply(&render::delete(table), "delete")?;
        Ok(true)
    })?
}

/// The counters of every forward in the table, by forward name.
pub fn counters(
    netns: &Netns,
    table: &str,
    opts: &Options,
) -> Result<BTreeMap<String, FlowCounters>, Error> {
    render::check_table_name(table)?;
    let nft = nft::Nft::new(opts, netns, table);
    let listing = netns.run_on_thread(|| nft.list_counters())??;
    counters::parse(&listing).map_err(|reason| nft.parse_error(reason))
}

/// The table as `nft list table` prints it (text), or None when there is
/// none: what an operator would compare, and what the tests compare.
pub fn list_table(netns: &Netns, table: &str, opts: &Options) -> Result<Option<String>, Error> {
    render::check_table_name(table)?;
    let nft = nft::Nft::new(opts, netns, table);
    netns.run_on_thread(|| nft.list_table())?
}
