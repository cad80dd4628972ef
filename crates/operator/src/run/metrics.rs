//! /metrics of the operator (OpenMetrics text, prometheus-client):
//! reconciles by outcome, reconcile errors by reason, reconcile duration,
//! reports taken, and whether this replica leads.

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

pub struct Metrics {
    registry: Mutex<Registry>,
    pub reconciles: Family<Outcome, Counter>,
    pub errors: Family<Reason, Counter>,
    pub duration: Histogram,
    pub reports: Counter,
    pub reports_refused: Counter,
    pub leader: Gauge,
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
