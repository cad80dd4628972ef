//! /metrics: the counters of every forward, labelled by pod and forward,
//! encoded with prometheus-client (OpenMetrics text).

use crate::{AttachmentStatus, ForwardStatus, Gauges, LatencySnapshot, Source, Status};
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::info::Info;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;
use std::sync::Arc;

mod process;

type Labels = Vec<(String, String)>;

/// One family's series, encoded in the order they were pushed. A scrape
/// makes its families afresh from /status (series of gone attachments
/// must vanish): prometheus-client's `Family` would hash every label set
/// into a map and allocate each metric behind an `Arc`, which at 500
/// attachments was most of a scrape; a label set here is shared by every
/// family of its forward.
#[derive(Debug)]
struct Series<M> {
    rows: Vec<(Arc<Labels>, M)>,
}

impl<M> Default for Series<M> {
    fn default() -> Self {
        Series { rows: Vec::new() }
    }
}

impl<M> Series<M> {
    fn push(&mut self, labels: &Arc<Labels>, m: M) {
        self.rows.push((labels.clone(), m));
    }
}

impl<M: EncodeMetric + TypedMetric> EncodeMetric for Series<M> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (labels, m) in &self.rows {
            m.encode(encoder.encode_family(&**labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        M::TYPE
    }
}

type Counters = Series<ConstCounter<u64>>;
type Gauges64 = Series<ConstGauge<i64>>;
type GaugesF = Series<ConstGauge<f64>>;

/// A connect-latency histogram already counted by the forward
/// (edgelink-forward's `Latency`), encoded as an OpenMetrics histogram.
#[derive(Debug, Default)]
struct LatencyMetric(LatencySnapshot);

impl TypedMetric for LatencyMetric {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for LatencyMetric {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let s = &self.0;
        let buckets: Vec<(f64, u64)> = s
            .buckets
            .iter()
            .map(|(le, n)| (le.unwrap_or(f64::INFINITY), *n))
            .collect();
        encoder.encode_histogram::<NoLabelSet>(s.sum_seconds, s.count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// The families of every forward's counters (each `_total`), in the
/// order of [`counter_values`].
const COUNTERS: [(&str, &str); 31] = [
    (
        "connections",
        "Connections accepted (TCP) or sessions created (UDP), as TOTAL in edgelinkd status",
    ),
    (
        "bytes_to_target",
        "Bytes relayed from clients to the target",
    ),
    (
        "bytes_to_client",
        "Bytes relayed from the target to clients",
    ),
    (
        "connect_errors",
        "Connects to the target that failed or timed out",
    ),
    ("errors", "Connections that ended with an error"),
    (
        "splice_fallbacks",
        "Times splice was refused and a plain copy was used",
    ),
    ("refused", "Connections or datagrams refused (private side)"),
    (
        "udp_sessions",
        "UDP sessions created (also counted in edgelink_connections_total)",
    ),
    ("udp_evictions", "UDP sessions evicted from a full table"),
    (
        "udp_datagrams_to_target",
        "UDP datagrams relayed to the target",
    ),
    (
        "udp_datagrams_to_client",
        "UDP datagrams relayed back to clients",
    ),
    ("udp_drops", "UDP datagrams dropped"),
    (
        "connections_rejected",
        "TCP connections reset at once because the daemon's --max-connections was reached",
    ),
    (
        "queued",
        "TCP clients that waited for a place under maxConnections",
    ),
    (
        "queue_timeouts",
        "TCP clients closed after waiting longer than the queue timeout",
    ),
    (
        "queue_full",
        "TCP clients reset at once because the queue was full",
    ),
    ("queue_abandoned", "TCP clients that reset while waiting"),
    ("connect_retries", "Connects to the target tried again"),
    (
        "packets_to_target",
        "Kernel path: packets from clients to the target (nft counters)",
    ),
    (
        "packets_to_client",
        "Kernel path: packets from the target back to clients (nft counters)",
    ),
    (
        "idle_timeouts",
        "TCP connections reset because nothing moved for the idle timeout",
    ),
    (
        "refused_by_policy",
        "TCP clients refused: not among the Device's allowedClients",
    ),
    (
        "refused_by_lease",
        "TCP clients refused: the device is leased to another client",
    ),
    (
        "refused_from_node",
        "TCP clients the access rules refused that came from the node itself (the kubelet's probes)",
    ),
    (
        "access_resets",
        "Relayed TCP connections reset when the access rules changed (a lease taken)",
    ),
    ("lease_waits", "TCP clients that waited for their lease"),
    (
        "modbus_requests",
        "Multiplexed Modbus/TCP: requests taken from clients",
    ),
    (
        "modbus_responses",
        "Multiplexed Modbus/TCP: responses of the device passed to their clients",
    ),
    (
        "modbus_exceptions",
        "Multiplexed Modbus/TCP: exceptions edgelinkd answered itself (0x0A, 0x0B: /status has them by code)",
    ),
    (
        "modbus_reconnects",
        "Multiplexed Modbus/TCP: connections to the device made again after one was lost",
    ),
    (
        "lease_wait_timeouts",
        "TCP clients that waited for their lease longer than the queue timeout",
    ),
];

/// The families of every forward's gauges, in the order of
/// [`gauge_values`].
const GAUGES: [(&str, &str); 6] = [
    (
        "active_connections",
        "Connections being relayed (TCP) or sessions open (UDP) now, as ACTIVE in edgelinkd status",
    ),
    (
        "active_udp_sessions",
        "UDP sessions open now (also counted in edgelink_active_connections)",
    ),
    ("listener_up", "1 when the forward's listener is up"),
    ("target_reachable", "1 reachable, 0 unreachable, -1 unknown"),
    ("queue_length", "TCP clients waiting for a place now"),
    (
        "modbus_queue_length",
        "Multiplexed Modbus/TCP: requests waiting for a connection to the device now",
    ),
];

/// A forward's series: its pod, attachment and forward.
fn labels(a: &AttachmentStatus, f: &ForwardStatus) -> Labels {
    let mut l = labels_of(a);
    l.extend([
        ("forward".into(), f.name.clone()),
        ("protocol".into(), f.protocol.clone()),
        ("path".into(), f.path.clone()),
        // `forward` (cluster to device) or `reverse` (device to
        // cluster): the same families serve both directions.
        (
            "direction".into(),
            f.direction.clone().unwrap_or_else(|| "forward".into()),
        ),
    ]);
    l
}

fn counter_values(f: &ForwardStatus) -> [u64; COUNTERS.len()] {
    [
        f.total_connections,
        f.bytes_to_target,
        f.bytes_to_client,
        f.connect_errors,
        f.errors,
        f.splice_fallbacks,
        f.refused,
        f.udp_sessions_total,
        f.udp_evictions,
        f.udp_datagrams_to_target,
        f.udp_datagrams_to_client,
        f.udp_drops,
        f.connections_rejected_total,
        f.queued_total,
        f.queue_timeouts_total,
        f.queue_full_total,
        f.queue_abandoned_total,
        f.connect_retries_total,
        f.packets_to_target.unwrap_or(0),
        f.packets_to_client.unwrap_or(0),
        f.idle_timeouts_total,
        f.refused_by_policy_total,
        f.refused_by_lease_total,
        f.refused_from_node_total,
        f.access_resets_total,
        f.lease_waits_total,
        f.modbus.as_ref().map_or(0, |m| m.requests_total),
        f.modbus.as_ref().map_or(0, |m| m.responses_total),
        f.modbus
            .as_ref()
            .map_or(0, |m| m.exceptions_total.values().sum()),
        f.modbus.as_ref().map_or(0, |m| m.reconnects_total),
        f.lease_wait_timeouts_total,
    ]
}

fn gauge_values(f: &ForwardStatus) -> [i64; GAUGES.len()] {
    let reach = match f.reachability.state.as_str() {
        "reachable" => 1,
        "unreachable" => 0,
        _ => -1,
    };
    [
        f.active_connections as i64,
        f.udp_sessions as i64,
        i64::from(f.listener == "listening"),
        reach,
        f.queued as i64,
        f.modbus.as_ref().map_or(0, |m| m.queued as i64),
    ]
}

/// Every forward's series, one family per figure.
fn register_forwards(reg: &mut Registry, status: &Status) {
    let mut counters: Vec<Counters> = COUNTERS.iter().map(|_| Series::default()).collect();
    let mut gauges: Vec<Gauges64> = GAUGES.iter().map(|_| Series::default()).collect();
    let mut latency: Series<LatencyMetric> = Series::default();
    for a in &status.attachments {
        for f in &a.forwards {
            let labels = Arc::new(labels(a, f));
            for (fam, v) in counters.iter_mut().zip(counter_values(f)) {
                fam.push(&labels, ConstCounter::new(v));
            }
            for (fam, v) in gauges.iter_mut().zip(gauge_values(f)) {
                fam.push(&labels, ConstGauge::new(v));
            }
            if let Some(h) = &f.connect_latency {
                latency.push(&labels, LatencyMetric(h.clone()));
            }
        }
    }
    reg.register(
        "connect_latency_seconds",
        "How long successful connects to the target took",
        latency,
    );
    for ((n, h), fam) in COUNTERS.into_iter().zip(counters) {
        reg.register(n, h, fam);
    }
    for ((n, h), fam) in GAUGES.into_iter().zip(gauges) {
        reg.register(n, h, fam);
    }
}

/// An attachment's health series: its pod and attachment, the probe's
/// type and target.
fn health_labels(a: &AttachmentStatus, h: &crate::HealthStatus) -> Labels {
    let mut l = labels_of(a);
    l.push(("type".into(), h.kind.clone()));
    l.push(("target".into(), h.target.clone()));
    l
}

/// The attachment's own labels (those of [`labels`] before the forward's).
fn labels_of(a: &AttachmentStatus) -> Labels {
    vec![
        (
            "pod_namespace".into(),
            a.pod_namespace.clone().unwrap_or_default(),
        ),
        ("pod".into(), a.pod_name.clone().unwrap_or_default()),
        (
            "container_id".into(),
            a.container_id.chars().take(12).collect(),
        ),
        ("network".into(), a.network.clone()),
    ]
}

/// Every attachment's device health: up (absent while unknown), probes
/// by result, the last successful probe's latency.
fn register_health(reg: &mut Registry, status: &Status) {
    let mut up: Gauges64 = Series::default();
    let mut probes: Counters = Series::default();
    let mut latency: GaugesF = Series::default();
    for a in &status.attachments {
        let Some(h) = &a.health else { continue };
        let labels = Arc::new(health_labels(a, h));
        match h.state.as_str() {
            "reachable" => up.push(&labels, ConstGauge::new(1)),
            "unreachable" => up.push(&labels, ConstGauge::new(0)),
            _ => {}
        };
        let ok = h.probes_total.saturating_sub(h.failures_total);
        for (result, n) in [
            ("success", ok),
            ("failure", h.failures_total),
            ("skipped", h.skipped_total),
        ] {
            let mut l = (*labels).clone();
            l.push(("result".into(), result.into()));
            probes.push(&Arc::new(l), ConstCounter::new(n));
        }
        if let Some(ms) = h.latency_ms {
            latency.push(&labels, ConstGauge::new(ms / 1000.0));
        }
    }
    reg.register(
        "health_up",
        "1 when the attachment's device health probe says reachable, 0 unreachable; absent while unknown",
        up,
    );
    reg.register(
        "health_probes",
        "Device health probes by result (skipped: no free place under the target forward's maxConnections)",
        probes,
    );
    reg.register(
        "health_latency_seconds",
        "How long the last successful device health probe took",
        latency,
    );
}

/// Every attachment's virtual addresses: held or not, moves, announcements.
fn register_virtual(reg: &mut Registry, status: &Status) {
    let mut held: Gauges64 = Series::default();
    let mut moves: Counters = Series::default();
    let mut announced: Counters = Series::default();
    for a in &status.attachments {
        let Some(v) = &a.virtual_addresses else {
            continue;
        };
        let mut labels = labels_of(a);
        labels.push(("addresses".into(), v.addresses.join(",")));
        let labels = Arc::new(labels);
        held.push(&labels, ConstGauge::new(i64::from(v.held)));
        for (what, n) in [("taken", v.taken_total), ("released", v.released_total)] {
            let mut l = (*labels).clone();
            l.push(("change".into(), what.into()));
            moves.push(&Arc::new(l), ConstCounter::new(n));
        }
        announced.push(&labels, ConstCounter::new(v.announcements_total));
    }
    reg.register(
        "virtual_address_held",
        "1 while the attachment holds its virtual addresses on its interface",
        held,
    );
    reg.register(
        "virtual_address_changes",
        "Virtual addresses taken and released by the attachment",
        moves,
    );
    reg.register(
        "virtual_address_announcements",
        "Gratuitous ARPs and unsolicited neighbour advertisements sent",
        announced,
    );
}

/// A figure of the node as a whole.
enum Figure {
    Gauge(i64),
    Counter(u64),
}

/// What was sent to edgelink-operator (`crate::sent`).
fn register_sent(reg: &mut Registry) {
    let (reports, report_bytes) = crate::sent::REPORTS.get();
    let (beats, beat_bytes) = crate::sent::HEARTBEATS.get();
    for (name, help, v) in [
        (
            "webhook_reports",
            "Status reports posted to the webhook (edgelink-operator)",
            reports,
        ),
        (
            "webhook_report_bytes",
            "Body bytes of the status reports posted",
            report_bytes,
        ),
        (
            "webhook_heartbeats",
            "Heartbeats posted beside the webhook",
            beats,
        ),
        (
            "webhook_heartbeat_bytes",
            "Body bytes of the heartbeats posted",
            beat_bytes,
        ),
    ] {
        let c: Counter = Counter::default();
        c.inc_by(v);
        reg.register(name, help, c);
    }
}

/// The reconcile passes: how long the last full one took, how many of each.
fn register_passes(reg: &mut Registry, node: Gauges) {
    let pass: Gauge<f64, std::sync::atomic::AtomicU64> = Gauge::default();
    pass.set(node.last_pass_seconds);
    reg.register(
        "reconcile_pass_seconds",
        "How long the last full reconcile pass took (every record listed, each attachment checked)",
        pass,
    );
    for (name, help, v) in [
        (
            "reconcile_full_passes",
            "Reconcile passes over every record (the first, the periodic one, a plain rescan)",
            node.full_passes,
        ),
        (
            "reconcile_record_passes",
            "Passes over only the records that changed (the plugin's ADD and DEL, inotify)",
            node.record_passes,
        ),
    ] {
        let c: Counter = Counter::default();
        c.inc_by(v);
        reg.register(name, help, c);
    }
}

/// The node's own series, and the binary's build.
fn register_node(reg: &mut Registry, status: &Status, node: Gauges, commit: &str) {
    use Figure::{Counter as C, Gauge as G};
    let figures = [
        (
            "attachments",
            "Attachments served",
            G(status.attachments.len() as i64),
        ),
        (
            "malformed_records",
            "Attachment records that could not be read",
            G(status.malformed_records.len() as i64),
        ),
        (
            "reclaimed_attachments",
            "Attachments reclaimed because their netns was gone",
            C(status.reclaimed_total),
        ),
        (
            "retired_links_deleted",
            "Pod interfaces retired by the plugin's DEL and deleted by the daemon",
            C(status.retired_links_deleted_total),
        ),
        (
            "warnings",
            "Warnings in /status (the node's conntrack table too small for the kernel path)",
            G(status.warnings.len() as i64),
        ),
        (
            "workers",
            "Worker threads serving connections",
            G(status.workers as i64),
        ),
        (
            "worker_replacements",
            "Worker threads that died and were replaced",
            C(status.worker_replacements_total),
        ),
        (
            "socket_pool_taken",
            "Upstream TCP sockets taken ready from the --socket-pool",
            C(node.socket_pool_taken),
        ),
        (
            "pipes_in_use",
            "Splice pipes holding data in flight",
            G(node.pipes_in_use),
        ),
    ];
    for (name, help, v) in figures {
        match v {
            G(v) => {
                let g: Gauge = Gauge::default();
                g.set(v);
                reg.register(name, help, g);
            }
            C(v) => {
                let c: Counter = Counter::default();
                c.inc_by(v);
                reg.register(name, help, c);
            }
        }
    }
    register_passes(reg, node);
    register_sent(reg);
    reg.register(
        "build",
        "The edgelinkd binary: its version and the commit it was built from",
        Info::new(vec![
            ("version".to_string(), env!("CARGO_PKG_VERSION").to_string()),
            ("commit".to_string(), commit.to_string()),
        ]),
    );
}

/// Render the current state. A fresh registry per scrape: the set of
/// attachments changes as pods come and go, and stale series must vanish.
pub fn render(d: &dyn Source, commit: &str) -> String {
    let status = d.status();
    let mut reg = Registry::with_prefix("edgelink");
    register_forwards(&mut reg, &status);
    register_health(&mut reg, &status);
    register_virtual(&mut reg, &status);
    register_node(&mut reg, &status, d.gauges(), commit);
    let mut out = String::new();
    let _ = encode(&mut out, &reg);
    // The process_* metrics have no prefix: one registry of their own,
    // in the same exposition (one `# EOF`, at the end).
    let mut process = Registry::default();
    process::Process::read().register(&mut process);
    if let Some(body) = out.strip_suffix("# EOF\n") {
        out.truncate(body.len());
    }
    let _ = encode(&mut out, &process);
    out
}
