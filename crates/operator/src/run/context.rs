//! What every step of a Device's reconcile is given ([`Ctx`]: the client,
//! the proxy pods' settings, the nodes' reports, the caches, the metrics,
//! the timing)
//! and the one way it fails ([`Error`]: an API call, named).

use crate::run::grants::Holds;
use crate::run::metrics::Metrics;
use crate::run::reports::Reports;
use edgelink_operator::render::ProxyPodSettings;
use kube::Client;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) use crate::run::error::{kube_err, Error};

/// When each Device's status was last written: (namespace, name) → when.
#[derive(Default)]
pub struct Written(std::sync::Mutex<std::collections::HashMap<(String, String), Instant>>);

impl Written {
    /// Whether `every` has passed since the last write (or none was made
    /// by this process).
    pub fn due(&self, key: &(String, String), every: Duration) -> bool {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.get(key).is_none_or(|t| t.elapsed() >= every)
    }

    pub fn wrote(&self, key: (String, String)) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.insert(key, Instant::now());
    }

    pub fn forget(&self, key: &(String, String)) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.remove(key);
    }

    /// Keep only the Devices `keep` says exist.
    pub fn retain(&self, keep: impl Fn(&(String, String)) -> bool) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.retain(|k, _| keep(k));
    }
}

pub struct Ctx {
    pub client: Client,
    pub settings: ProxyPodSettings,
    pub reports: Arc<Reports>,
    /// Who holds each Device's virtual address.
    pub holds: Arc<Holds>,
    pub metrics: Arc<Metrics>,
    /// Reconcile every Device at least this often.
    pub resync: Duration,
    /// Write a status whose live fields alone moved at most this often.
    pub status_refresh: Duration,
    /// When each Device's status was last written.
    pub written: Written,
    /// Reconciles at once, at most.
    pub concurrency: u16,
    /// A report older than this tells nothing.
    pub stale_after: Duration,
    /// Reports may not have arrived yet this soon after taking the lead:
    /// keep the DeviceReachable the Device has.
    pub started: Instant,
    /// A node not heard this long after taking the lead is taken as lost
    /// (heartbeats come every 0.5 s, an older edgelinkd's reports every 10 s).
    pub fresh_for: Duration,
    /// The cluster's DNS domain, for a headless Service a reverse entry
    /// names.
    pub cluster_domain: String,
    /// Events on Devices (a node's reachability changed).
    pub recorder: kube::runtime::events::Recorder,
    /// The controller's cache of every Device (set when it starts): the
    /// other Devices a virtual address must not clash with.
    pub devices:
        std::sync::OnceLock<kube::runtime::reflector::Store<edgelink_operator::crd::Device>>,
    /// What a reconcile reads instead of asking the API.
    pub caches: crate::run::caches::Caches,
    /// Who may use each Device: the nodes' rules, the Devices' access
    /// state (`run::rules`, kept by `run::access`).
    pub access: Arc<crate::run::rules::Access>,
}
