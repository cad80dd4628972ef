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

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
}

pub(crate) fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |source| Error::Kube { what, source }
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
}
