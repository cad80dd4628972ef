//! The daemon's settings, parsed completely before anything is bound.

use clap::{Args, Parser, Subcommand};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

mod audit_args;
mod layers;

pub use audit_args::AuditArgs;
pub use layers::{parse, ParseError};

pub const DEFAULT_STATE_DIR: &str = "/var/lib/edgelink";
pub const DEFAULT_STATUS_ADDR: &str = "127.0.0.1:9310";

#[derive(Debug, Parser)]
#[command(
    name = "edgelinkd",
    version = crate::VERSION,
    about = "The edgelink node daemon: relays each attachment's forwards from inside the pod's network namespace"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
// Parsed once per process: the size difference does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Serve every attachment recorded under the state directory.
    Run(RunArgs),
    /// Show a running daemon's attachments, forwards and counters.
    Status(StatusArgs),
    /// Show the last connections a running daemon relayed or refused (its
    /// audit trail, as kept in memory).
    Audit(AuditArgs),
}

/// Seconds (`20`, `0.5`), or a duration with units (`20s`, `500ms`,
/// `1h30m`, as humantime reads them).
fn duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if let Ok(v) = t.parse::<f64>() {
        // Bounded before the conversion, which panics on overflow.
        if !(0.0..=1e9).contains(&v) {
            return Err(format!("{s:?} is not a duration in seconds"));
        }
        return Ok(Duration::from_secs_f64(v));
    }
    humantime::parse_duration(t).map_err(|e| {
        format!("{s:?} is not a duration (seconds, or with units: 20s, 500ms, 1h): {e}")
    })
}

fn secs(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    if d > Duration::from_secs(86_400) {
        return Err(format!("{s} is above 86400 seconds (a day)"));
    }
    Ok(d)
}

/// A period that must not be zero: 0 would make a busy loop (reconcile) or
/// close every UDP session at once.
fn period(s: &str) -> Result<Duration, String> {
    let d = secs(s)?;
    if d < Duration::from_millis(100) {
        return Err(format!("{s} is below 0.1 seconds"));
    }
    Ok(d)
}

/// `--tcp-idle-timeout`: 0 (never) or at least a second, at most a week
/// (as `forwards[].idleTimeoutMs` in the plugin's config).
fn idle_timeout(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    if !d.is_zero() && !(Duration::from_secs(1)..=Duration::from_secs(604_800)).contains(&d) {
        return Err(format!("{s} is not 0 (never) or in 1..=604800 seconds"));
    }
    Ok(d)
}

/// A duration of whole seconds (`60`, `1m`).
fn whole(s: &str) -> Result<u64, String> {
    let d = duration(s)?;
    if d.subsec_nanos() != 0 {
        return Err(format!("{s:?} is not a whole number of seconds"));
    }
    Ok(d.as_secs())
}

/// `--tcp-keepalive`: 0 (off) or whole seconds the kernel accepts as
/// TCP_KEEPIDLE (1..=32767).
fn keepalive(s: &str) -> Result<Duration, String> {
    let v = whole(s)?;
    if v > 32767 {
        return Err(format!("{v} is not 0 (off) or in 1..=32767 seconds"));
    }
    Ok(Duration::from_secs(v))
}

/// The kernel path's conntrack timeouts: whole seconds, 1..=86400.
fn whole_secs(s: &str) -> Result<Duration, String> {
    match whole(s) {
        Ok(n) if (1..=86_400).contains(&n) => Ok(Duration::from_secs(n)),
        _ => Err(format!(
            "{s:?} is not a whole number of seconds in 1..=86400"
        )),
    }
}

/// `--workers`: 1..=1024 threads.
fn worker_count(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=1024).contains(&n) => Ok(n),
        _ => Err(format!("{s:?} is not a number of threads in 1..=1024")),
    }
}

/// `--connect-retry-backoff`: 0.01..=2 seconds.
fn backoff(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    if !(Duration::from_millis(10)..=Duration::from_secs(2)).contains(&d) {
        return Err(format!("{s} is outside 0.01..=2 seconds"));
    }
    Ok(d)
}

/// `host:port` or `ip:port`: a name (`localhost:9310`) is resolved once,
/// at start, to its first address.
fn socket_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let mut addrs = s.to_socket_addrs().map_err(|e| {
        format!("{s:?} is not an address:port, nor a host name:port that resolves: {e}")
    })?;
    addrs
        .next()
        .ok_or_else(|| format!("{s:?}: the host name resolves to no address"))
}

fn absolute(s: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(s);
    if p.is_absolute() {
        Ok(p)
    } else {
        Err(format!("{s:?} is not an absolute path"))
    }
}

/// An absolute path, or none (given as "").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptionalPath(pub Option<PathBuf>);

fn absolute_or_empty(s: &str) -> Result<OptionalPath, String> {
    if s.is_empty() {
        Ok(OptionalPath(None))
    } else {
        absolute(s).map(|p| OptionalPath(Some(p)))
    }
}

/// `--cni-path`: directories of delegated IPAM plugins, `:`-separated as
/// CNI_PATH; empty: none (the daemon runs no delegate).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniPath(pub Vec<PathBuf>);

fn cni_path(s: &str) -> Result<CniPath, String> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for d in s.split(':').filter(|d| !d.is_empty()) {
        let p = absolute(d).map_err(|e| format!("{e} (in {s:?})"))?;
        if !p.is_dir() {
            return Err(format!("{d:?} is not a directory (in {s:?})"));
        }
        if !dirs.contains(&p) {
            dirs.push(p);
        }
    }
    Ok(CniPath(dirs))
}

fn pipe_size(s: &str) -> Result<usize, String> {
    let v: usize = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of bytes"))?;
    if !(4096..=64 << 20).contains(&v) {
        return Err(format!("{v} is outside 4096..=67108864 bytes"));
    }
    Ok(v)
}

fn pipe_budget(s: &str) -> Result<usize, String> {
    let v: usize = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of bytes"))?;
    if v > 1 << 40 {
        return Err(format!("{v} is above 1099511627776 bytes"));
    }
    Ok(v)
}

fn socket_buffer(s: &str) -> Result<usize, String> {
    let v: usize = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of bytes"))?;
    if v != 0 && !(4096..=64 << 20).contains(&v) {
        return Err(format!("{v} is neither 0 nor in 4096..=67108864 bytes"));
    }
    Ok(v)
}

impl RunArgs {
    /// Splice pipes in use at once at most (`--pipe-budget`; 0: no bound).
    pub fn pipes_at_most(&self) -> usize {
        match self.pipe_budget {
            0 => 0,
            b => (b / self.pipe_size.max(1)).max(1),
        }
    }
}

fn bulk_lowat(s: &str) -> Result<usize, String> {
    let v: usize = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of bytes"))?;
    if v > 16 << 20 {
        return Err(format!("{v} is above 16777216 bytes"));
    }
    Ok(v)
}

fn webhook(s: &str) -> Result<String, String> {
    if s.starts_with("http://") && s.len() > 7 {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not an http:// URL"))
    }
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// A YAML file of settings, each key a flag's long name
    /// (`state-dir: /var/lib/edgelink`); flags and EDGELINKD_* variables
    /// override it.
    #[arg(long, env = "EDGELINKD_CONFIG")]
    pub config: Option<PathBuf>,
    /// Where the plugin writes attachment records and the IPAM store.
    #[arg(long, default_value = DEFAULT_STATE_DIR, value_parser = absolute)]
    pub state_dir: PathBuf,
    /// Address of the read-only HTTP endpoint (/healthz, /livez, /metrics,
    /// /status); `host:port` is resolved at start.
    #[arg(long, default_value = DEFAULT_STATUS_ADDR, value_parser = socket_addr)]
    pub status_addr: SocketAddr,
    /// A second HTTP endpoint with /metrics, /healthz and /livez only, no
    /// /status (it names pods and netns paths): for a Prometheus off the
    /// node, e.g. 0.0.0.0:9311. None by default.
    #[arg(long, value_parser = socket_addr)]
    pub metrics_addr: Option<SocketAddr>,
    /// error, warn, info, debug or trace.
    #[arg(long, default_value = "info", value_parser = ["error", "warn", "info", "debug", "trace"])]
    pub log_level: String,
    /// text (one line per event) or json (one object per line).
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
    /// How often to look for attachments whose netns is gone (seconds).
    #[arg(long, default_value = "30", value_parser = period)]
    pub reconcile_interval: Duration,
    /// Take over from the edgelinkd running on this state dir, if one
    /// answers on its control socket: its listeners, live connections and
    /// UDP sessions move to this process, which serves them on, and it
    /// exits. Without one, start afresh.
    #[arg(long)]
    pub takeover: bool,
    /// Who this daemon is, for hand-overs (a DaemonSet passes the pod's
    /// UID): a daemon never takes back what it handed over. Default: the
    /// process ID and start time.
    #[arg(long, env = "EDGELINKD_INSTANCE_ID")]
    pub instance_id: Option<String>,
    /// The newest hand-over protocol to speak, announcing it when taking
    /// over and refusing newer ones when handing over (tests of a mismatch
    /// and of a protocol-1 peer only).
    #[arg(long, hide = true, default_value_t = edgelink_handover::PROTOCOL)]
    pub handover_protocol: u32,
    /// Handing over: how long to wait for the new daemon's Confirm once it
    /// has everything (seconds). Past it, this daemon takes everything
    /// back and serves on, and the new one, told so, exits without serving.
    #[arg(long, default_value = "10", value_parser = period)]
    pub handover_timeout: Duration,
    /// Test hook (debug builds only): wait this long before confirming a
    /// take-over (milliseconds).
    #[cfg(debug_assertions)]
    #[arg(long, hide = true)]
    pub test_stall_confirm_ms: Option<u64>,
    /// On SIGTERM, how long existing connections may drain (seconds).
    #[arg(long, default_value = "20", value_parser = secs)]
    pub grace_period: Duration,
    /// Size of each splice pipe, in bytes.
    #[arg(long, default_value = "1048576", value_parser = pipe_size)]
    pub pipe_size: usize,
    /// In-flight byte budget of all TCP relays: splice pipes in use at once
    /// at most times `--pipe-size` (bytes; 0: no budget). A direction that
    /// finds it spent copies its bytes through a 16 KiB buffer instead.
    #[arg(long, default_value = "268435456", value_parser = pipe_budget)]
    pub pipe_budget: usize,
    /// SO_SNDBUF and SO_RCVBUF of both legs of every relayed TCP
    /// connection (bytes; the kernel doubles it for its bookkeeping; 0:
    /// the kernel's autotuning, up to net.ipv4.tcp_rmem/tcp_wmem). 1 MiB
    /// keeps a single stream's CPU per GB level with autotuning (256 KiB
    /// cost 1.6-1.8x; docs/configuration.md, "Memory").
    #[arg(long, default_value = "1048576", value_parser = socket_buffer)]
    pub socket_buffer: usize,
    /// Bulk mode of TCP relays: once a wakeup finds this many bytes waiting,
    /// wait for this many (SO_RCVLOWAT, at most 1 ms) before the next one
    /// (bytes; 0: off).
    #[arg(long, default_value = "65536", value_parser = bulk_lowat)]
    pub bulk_lowat: usize,
    /// UDP sessions idle this long are closed (seconds).
    #[arg(long, default_value = "60", value_parser = period)]
    pub udp_idle_timeout: Duration,
    /// UDP sessions per forward; the oldest is evicted beyond this.
    #[arg(long, default_value = "4096", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub udp_max_sessions: u32,
    /// Send runs of same-size UDP datagrams as one UDP_SEGMENT (GSO) message
    /// (turned off by itself where the path refuses it).
    #[arg(long, default_value = "true", action = clap::ArgAction::Set, value_parser = clap::value_parser!(bool))]
    pub udp_gso: bool,
    /// Ready upstream TCP sockets kept per pod namespace (0: make each on demand).
    #[arg(long, default_value = "0", value_parser = clap::value_parser!(u32).range(0..=4096))]
    pub socket_pool: u32,
    /// How often to probe TCP targets that saw no connection (seconds, 0:
    /// never); attachments with `health` in their config probe that way
    /// instead.
    #[arg(long, default_value = "30", value_parser = secs)]
    pub probe_interval: Duration,
    /// POST the status JSON here when attachments, forward states or device
    /// health change, and every --status-webhook-interval
    /// (edgelink-operator's /v1/status).
    #[arg(long, env = "EDGELINKD_STATUS_WEBHOOK", value_parser = webhook)]
    pub status_webhook: Option<String>,
    /// The webhook's URL is this file's content, read again before each
    /// POST and each second while idle (the DaemonSet mounts
    /// edgelink-operator's ConfigMap here): missing or empty, no webhook.
    #[arg(long, value_parser = absolute, conflicts_with = "status_webhook")]
    pub status_webhook_file: Option<PathBuf>,
    /// Each status POST carries `Authorization: Bearer <this file's content>`.
    #[arg(long, env = "EDGELINKD_STATUS_WEBHOOK_TOKEN_FILE", value_parser = absolute)]
    pub status_webhook_token_file: Option<PathBuf>,
    /// POST the status at least this often, changed or not (seconds, 0: only on changes).
    #[arg(long, default_value = "10", value_parser = secs)]
    pub status_webhook_interval: Duration,
    /// POST a heartbeat beside the webhook (its path's last segment
    /// `heartbeat`) this often (0: none): edgelink-operator takes this node
    /// as lost within its --node-lost-after of the last one.
    #[arg(long, env = "EDGELINKD_STATUS_WEBHOOK_HEARTBEAT", default_value = "0.5", value_parser = secs)]
    pub status_webhook_heartbeat: Duration,
    /// The audit trail, a JSON line per relayed connection (and per refused
    /// client): on stdout (`stdout`), or not (`off`; --audit-files still
    /// writes files).
    #[arg(long, default_value = "stdout", value_parser = ["stdout", "off"])]
    pub audit: String,
    /// Also write the audit lines to <state-dir>/audit/audit.log, rotated
    /// at --audit-file-size into audit.log.1, .2, ...
    #[arg(long, default_value = "false", action = clap::ArgAction::Set, value_parser = clap::value_parser!(bool))]
    pub audit_files: bool,
    /// Rotate the audit file once it is this long (bytes).
    #[arg(long, default_value = "16777216", value_parser = clap::value_parser!(u64).range(4096..))]
    pub audit_file_size: u64,
    /// Rotated audit files kept beside the current one.
    #[arg(long, default_value = "4", value_parser = clap::value_parser!(u32).range(0..=100))]
    pub audit_files_kept: u32,
    /// This node's name in /status (default: $NODE_NAME, else the hostname).
    #[arg(long)]
    pub node_name: Option<String>,
    /// Keep IPAM reservations this long after ADD before GC may take an
    /// address without a record (seconds).
    #[arg(long, default_value = "120", value_parser = secs)]
    pub ipam_gc_grace: Duration,
    /// TCP connections with no byte either way for this long are closed,
    /// unless their forward sets `idleTimeoutMs` (seconds, 0: never).
    #[arg(long, default_value = "3600", value_parser = idle_timeout)]
    pub tcp_idle_timeout: Duration,
    /// TCP keepalive on both sockets of each relayed connection: first
    /// probe after this much silence (whole seconds, 0: off).
    #[arg(long, default_value = "60", value_parser = keepalive)]
    pub tcp_keepalive: Duration,
    /// TCP connections relayed at once over all forwards; beyond it new
    /// ones are reset as soon as accepted (0: no cap).
    #[arg(long, default_value = "0", value_parser = clap::value_parser!(u32).range(0..=10_000_000))]
    pub max_connections: u32,
    /// TCP connections to the target of one forward at once, unless the
    /// forward sets `maxConnections`; beyond it clients wait in a queue
    /// (0: no bound).
    #[arg(long, default_value = "0", value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub forward_max_connections: u32,
    /// How long a client may wait for a place under `maxConnections`,
    /// unless the forward sets `queueTimeoutMs` (seconds).
    #[arg(long, default_value = "30", value_parser = period)]
    pub queue_timeout: Duration,
    /// Clients waiting per forward at most; beyond it new ones are reset
    /// at once.
    #[arg(long, default_value = "4096", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_queue: u32,
    /// Connects to a target tried again after a timeout or a refusal,
    /// unless the forward sets `connectRetries`.
    #[arg(long, default_value = "2", value_parser = clap::value_parser!(u32).range(0..=10))]
    pub connect_retries: u32,
    /// The wait before the first retry, doubled for each next one, at
    /// most 2 s (seconds).
    #[arg(long, default_value = "0.1", value_parser = backoff)]
    pub connect_retry_backoff: Duration,
    /// Worker threads serving connections, each with its own runtime and
    /// its own SO_REUSEPORT listener per forward (default: the CPUs this
    /// process may use).
    #[arg(long, default_value_t = edgelink_forward::workers::default_count(), value_parser = worker_count)]
    pub workers: usize,
    /// The nft program the kernel path runs in pods' namespaces (a path, or
    /// a name looked up in PATH).
    #[arg(long, default_value = "nft")]
    pub nft: PathBuf,
    /// Kernel path: where the pods' net sysctls (ip_forward, conntrack
    /// timeouts) are written. A container's /proc/sys is read-only: the
    /// DaemonSet mounts the node's /proc/sys/net read-write at
    /// /host/proc/sys/net (a thread inside a pod's namespace sees that
    /// namespace's values through it).
    #[arg(long, default_value = "/proc/sys/net", value_parser = absolute)]
    pub proc_sys_net: PathBuf,
    /// Kernel path: conntrack's TIME_WAIT timeout in the pod's namespace
    /// (whole seconds; the kernel's default is 120). At least a device's
    /// own TIME_WAIT (Linux: 60 s): the masquerade never gives a new
    /// connection a port the device still holds for another one.
    #[arg(long, default_value = "65", value_parser = whole_secs)]
    pub kernel_tcp_time_wait: Duration,
    /// Kernel path: conntrack's UDP timeout in the pod's namespace (whole
    /// seconds).
    #[arg(long, default_value = "30", value_parser = whole_secs)]
    pub kernel_udp_timeout: Duration,
    /// Kernel path: conntrack's timeout of UDP flows that saw replies
    /// (whole seconds).
    #[arg(long, default_value = "60", value_parser = whole_secs)]
    pub kernel_udp_stream_timeout: Duration,
    /// Kernel path: warn in /status when the node's nf_conntrack_max is
    /// below this (kube-proxy's --conntrack-min default).
    #[arg(long, default_value = "131072", value_parser = clap::value_parser!(u64).range(0..=1 << 32))]
    pub conntrack_min: u64,
    /// Kernel path: how often the table's counters are read (seconds).
    #[arg(long, default_value = "5", value_parser = period)]
    pub kernel_counters_interval: Duration,
    /// A connection to the status endpoint is closed this long after it was
    /// accepted, whatever it is doing (seconds).
    #[arg(long, default_value = "30", value_parser = period)]
    pub status_conn_timeout: Duration,
    /// A connection to the status endpoint must send its whole request head
    /// within this long (after accept, and after each answer) or is closed
    /// (seconds).
    #[arg(long, default_value = "5", value_parser = period)]
    pub status_header_timeout: Duration,
    /// At most this many connections to the status endpoint are held; a
    /// new one beyond takes the place of the oldest that is still waiting
    /// for its request head.
    #[arg(long, default_value = "64", value_parser = clap::value_parser!(u16).range(1..))]
    pub status_max_connections: u16,
    /// Directories of delegated IPAM plugins (`:`-separated, as CNI_PATH).
    /// When set, reclaiming an attachment whose pod went without a DEL
    /// runs its delegate's DEL from there, and keeps the record while that
    /// fails. Empty (the default): a delegate's reservation is left to its
    /// own GC. Set it only where the delegate sees its own state
    /// (docs/configuration.md).
    #[arg(long, default_value = "", value_parser = cni_path)]
    pub cni_path: CniPath,
    /// Reverse forwards to names: the daemon's own resolv.conf, which the
    /// kubelet writes for `dnsPolicy: ClusterFirstWithHostNet` as for a
    /// ClusterFirst pod. Used, with the search list of the proxy pod's
    /// namespace, where the pod's own file is out of sight (no hostPID)
    /// and the network config gives no `dns`. Empty: never.
    #[arg(long, default_value = "/etc/resolv.conf", value_parser = absolute_or_empty)]
    pub cluster_resolv_conf: OptionalPath,
}

impl RunArgs {
    /// How the kernel path runs nft and tunes conntrack.
    pub fn kernel_options(&self) -> edgelink_kernel_path::Options {
        edgelink_kernel_path::Options {
            nft: self.nft.clone(),
            tcp_time_wait: self.kernel_tcp_time_wait,
            udp_timeout: self.kernel_udp_timeout,
            udp_stream_timeout: self.kernel_udp_stream_timeout,
            proc_sys_net: self.proc_sys_net.clone(),
        }
    }

    /// What a forward gets of these flags where it sets nothing itself.
    pub fn forward_defaults(&self) -> edgelink_forward::ForwardDefaults {
        edgelink_forward::ForwardDefaults {
            idle_timeout: self.tcp_idle_timeout,
            max_connections: self.forward_max_connections,
            queue_timeout: self.queue_timeout,
            max_queue: self.max_queue,
            connect_retries: self.connect_retries,
            retry_backoff: self.connect_retry_backoff,
        }
    }

    /// What every forward gets of these flags.
    pub fn forward_settings(&self) -> edgelink_forward::Settings {
        edgelink_forward::Settings {
            pipe_size: self.pipe_size,
            bulk_lowat: self.bulk_lowat,
            max_connections: self.max_connections,
            probe_interval: self.probe_interval,
            socket_buffer: self.socket_buffer,
            tcp_keepalive: self.tcp_keepalive,
            udp_gso: self.udp_gso,
            udp_idle_timeout: self.udp_idle_timeout,
            udp_max_sessions: self.udp_max_sessions,
        }
    }

    /// What the set of attachments gets of these flags.
    pub fn node_settings(&self) -> edgelink_node::Settings {
        edgelink_node::Settings {
            state_dir: self.state_dir.clone(),
            reconcile_interval: self.reconcile_interval,
            forward: self.forward_settings(),
            defaults: self.forward_defaults(),
            pipes_at_most: self.pipes_at_most(),
            socket_pool: self.socket_pool,
            kernel: self.kernel_options(),
            kernel_counters_interval: self.kernel_counters_interval,
            conntrack_min: self.conntrack_min,
            cni_path: self.cni_path.0.clone(),
            ipam_gc_grace: self.ipam_gc_grace,
            cluster_resolv_conf: self.cluster_resolv_conf.0.clone(),
            operator_grants: (self.status_webhook.is_some() || self.status_webhook_file.is_some())
                && !self.status_webhook_heartbeat.is_zero(),
            // Started by the daemon (a thread): `run`.
            audit: edgelink_access::Audit::off(),
        }
    }

    /// Where the audit lines go; `None`: nowhere.
    pub fn audit_settings(&self) -> Option<edgelink_access::audit::Settings> {
        let stdout = self.audit == "stdout";
        if !stdout && !self.audit_files {
            return None;
        }
        Some(edgelink_access::audit::Settings {
            stdout,
            dir: self.audit_files.then(|| self.state_dir.join("audit")),
            max_file_bytes: self.audit_file_size,
            keep_files: self.audit_files_kept as usize,
            ..Default::default()
        })
    }

    /// The status server's bounds.
    pub fn status_limits(&self) -> edgelink_http_limits::Limits {
        edgelink_http_limits::Limits {
            max_connections: self.status_max_connections.into(),
            header_timeout: self.status_header_timeout,
            conn_timeout: self.status_conn_timeout,
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// Address of the daemon's HTTP endpoint (`host:port` resolved).
    #[arg(long, env = "EDGELINKD_STATUS_ADDR", default_value = DEFAULT_STATUS_ADDR, value_parser = socket_addr)]
    pub status_addr: SocketAddr,
    /// Print the JSON (what the filters kept) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Only the pods of this namespace.
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Only this pod (its name, or namespace/name).
    #[arg(long)]
    pub pod: Option<String>,
    /// Only forwards of this name (and the pods that have one).
    #[arg(long)]
    pub forward: Option<String>,
}
