//! /metrics of the operator (OpenMetrics text, prometheus-client):
//! reconciles by outcome, reconcile errors by reason, reconcile duration,
//! reports and heartbeats taken, whether this replica leads, and per
//! Device and node whether the node reaches the device, its transitions,
//! and what the operator did about them (readiness gates set, pods of
//! lost nodes marked not Ready, virtual addresses moved), and the API
//! requests made: by verb and resource, and per reconcile and per report
//! (`run::requests`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::Mutex;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Reason {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeviceNode {
    pub namespace: String,
    pub device: String,
    pub node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeviceKey {
    pub namespace: String,
    pub device: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Transition {
    pub namespace: String,
    pub device: String,
    pub node: String,
    /// `True`, `False` or `Unknown`: the state entered.
    pub to: String,
}

pub struct Metrics {
    registry: Mutex<Registry>,
    pub reconciles: Family<Outcome, Counter>,
    pub errors: Family<Reason, Counter>,
    pub duration: Histogram,
    pub reports: Counter,
    pub reports_refused: Counter,
    pub leader: Gauge,
    pub heartbeats: Counter,
    /// 1 reaches, 0 does not, -1 unknown.
    pub reachable: Family<DeviceNode, Gauge>,
    pub transitions: Family<Transition, Counter>,
    pub gates_set: Counter,
    pub marked_not_ready: Counter,
    /// A Device's virtual address taken by another proxy.
    pub vip_moves: Family<DeviceKey, Counter>,
    /// Every request to the API server, by verb and resource.
    pub api_requests: Family<crate::run::requests::ApiRequest, Counter>,
    /// API requests made by one reconcile.
    pub reconcile_requests: Histogram,
    /// API requests made while taking one report or heartbeat.
    pub report_requests: Histogram,
    /// Devices a report asked to reconcile (its proxies' states changed).
    pub report_triggers: Counter,
}

/// Buckets for a count of API requests.
fn request_buckets() -> Histogram {
    Histogram::new([0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0])
}

impl Metrics {
    pub fn new() -> Metrics {
        let m = Metrics {
            registry: Mutex::new(Registry::with_prefix("edgelink_operator")),
            reconciles: Family::default(),
            errors: Family::default(),
            duration: Histogram::new([
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
            reports: Counter::default(),
            reports_refused: Counter::default(),
            leader: Gauge::default(),
            heartbeats: Counter::default(),
            reachable: Family::default(),
            transitions: Family::default(),
            gates_set: Counter::default(),
            marked_not_ready: Counter::default(),
            vip_moves: Family::default(),
            api_requests: Family::default(),
            reconcile_requests: request_buckets(),
            report_requests: request_buckets(),
            report_triggers: Counter::default(),
        };
        {
            let mut r = m.registry.lock().unwrap_or_else(|e| e.into_inner());
            r.register(
                "reconciles",
                "Device reconciles, by outcome (ok, invalid, conflict, error)",
                m.reconciles.clone(),
            );
            r.register(
                "reconcile_errors",
                "Reconciles that failed, by reason",
                m.errors.clone(),
            );
            r.register(
                "reconcile_duration_seconds",
                "How long a reconcile took",
                m.duration.clone(),
            );
            r.register(
                "reports",
                "Status reports taken from edgelinkd",
                m.reports.clone(),
            );
            r.register(
                "reports_refused",
                "Status reports refused (bad token, bad body, not the leader)",
                m.reports_refused.clone(),
            );
            r.register(
                "leader",
                "1 while this replica holds the lease",
                m.leader.clone(),
            );
            r.register(
                "heartbeats",
                "Heartbeats taken from edgelinkd",
                m.heartbeats.clone(),
            );
            r.register(
                "device_node_reachable",
                "Whether the node reaches the device: 1 yes, 0 no, -1 unknown",
                m.reachable.clone(),
            );
            r.register(
                "device_node_transitions",
                "Changes of a node's reachability of a device, by the state entered",
                m.transitions.clone(),
            );
            r.register(
                "readiness_gates_set",
                "Writes of the edgelink.io/device-reachable pod condition",
                m.gates_set.clone(),
            );
            r.register(
                "pods_marked_not_ready",
                "Proxy pods of lost nodes marked not Ready by the operator",
                m.marked_not_ready.clone(),
            );
            r.register(
                "virtual_address_moves",
                "A Device's virtual address granted to another proxy pod",
                m.vip_moves.clone(),
            );
            r.register(
                "api_requests",
                "Requests to the API server, by verb and resource",
                m.api_requests.clone(),
            );
            r.register(
                "reconcile_api_requests",
                "API requests made by one reconcile (a Device left alone: none)",
                m.reconcile_requests.clone(),
            );
            r.register(
                "report_api_requests",
                "API requests made while taking one report or heartbeat",
                m.report_requests.clone(),
            );
            r.register(
                "report_triggered_reconciles",
                "Devices a report asked to reconcile (a report that changes nothing asks none)",
                m.report_triggers.clone(),
            );
        }
        m
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let r = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let _ = prometheus_client::encoding::text::encode(&mut out, &r);
        out
    }
}
