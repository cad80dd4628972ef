//! What a reverse forward adds to a forward: it listens on the edgelink
//! interface's addresses only, admits only its `allowedSources` arriving
//! on that interface, and its target may be a DNS name, followed here
//! (`follow`) with the pod's resolver. The data path is the forwards' own
//! (serve.rs); this module must not relay anything itself.

use edgelink_attachment::{Dns, Reverse, Target};
use ipnetwork::IpNetwork;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify};

/// How a name target stands (for the status).
#[derive(Debug, Clone, Default)]
pub struct Resolution {
    /// The address new connections go to now.
    pub addr: Option<SocketAddr>,
    /// The name that answered (after the search list).
    pub answered_as: Option<String>,
    /// Seconds since the epoch of the last answer.
    pub resolved_at: u64,
    /// Why the last lookup failed (the address above, if any, is the last
    /// good one and still used).
    pub error: Option<String>,
    /// Lookups sent so far.
    pub lookups: u64,
    /// Where the resolver configuration came from.
    pub resolver: Option<String>,
}

/// One reverse forward's own state, beside its `ForwardRuntime`.
#[derive(Debug)]
pub struct ReverseSide {
    pub spec: Reverse,
    /// The attachment's netns path (where the pod's resolv.conf is found).
    pub netns: String,
    /// The runtime's (or the config's) resolver settings, if any.
    pub dns: Option<Dns>,
    /// The pod's Kubernetes namespace (K8S_POD_NAMESPACE) and the daemon's
    /// own cluster resolv.conf: the cluster's resolver for a ClusterFirst
    /// pod of that namespace, when neither of the above is there.
    pub pod_namespace: Option<String>,
    pub cluster_resolv_conf: Option<PathBuf>,
    /// The interface's addresses with their prefixes: where it listens,
    /// and the segment a target must not lie in.
    pub segment: Vec<IpNetwork>,
    /// The attachment's virtual addresses: listened on too (bound before
    /// the pod holds them, so that taking one needs no new listener).
    pub virtual_addrs: Vec<IpAddr>,
    current: watch::Sender<Option<SocketAddr>>,
    resolution: Mutex<Resolution>,
    /// A connect to the current address failed: look the name up again.
    pub(crate) again: Notify,
    last_again: Mutex<Option<Instant>>,
}

impl ReverseSide {
    /// The cluster's resolver as the last resort for a name: the daemon's
    /// own resolv.conf at `own` (a kubelet's cluster file), with the search
    /// list of `pod_namespace`.
    pub fn cluster_resolver(mut self, pod_namespace: Option<String>, own: Option<PathBuf>) -> Self {
        self.pod_namespace = pod_namespace;
        self.cluster_resolv_conf = own;
        self
    }

    pub fn new(spec: Reverse, netns: String, dns: Option<Dns>, segment: Vec<IpNetwork>) -> Self {
        let first = spec.target.addr();
        ReverseSide {
            spec,
            netns,
            dns,
            pod_namespace: None,
            cluster_resolv_conf: None,
            segment,
            virtual_addrs: Vec::new(),
            current: watch::channel(first).0,
            resolution: Mutex::new(Resolution::default()),
            again: Notify::new(),
            last_again: Mutex::new(None),
        }
    }

    /// The attachment's virtual addresses (`virtualAddresses`).
    pub fn virtual_addresses(mut self, addrs: Vec<IpAddr>) -> Self {
        self.virtual_addrs = addrs;
        self
    }

    /// The interface's addresses with the forward's port: its listeners.
    pub fn listen_addrs(&self) -> Vec<SocketAddr> {
        self.segment
            .iter()
            .map(|n| SocketAddr::new(n.ip(), self.spec.port))
            .collect()
    }

    /// The virtual addresses with the forward's port: listeners bound
    /// with IP_FREEBIND, which take connections while the pod holds the
    /// address.
    pub fn virtual_listen_addrs(&self) -> Vec<SocketAddr> {
        self.virtual_addrs
            .iter()
            .map(|ip| SocketAddr::new(*ip, self.spec.port))
            .collect()
    }

    /// A device may connect: its address is in `allowedSources` and it
    /// came in on the edgelink interface (`ifindex`, when both are known).
    pub fn admits(&self, peer: SocketAddr, ingress: Option<u32>, ifindex: Option<u32>) -> bool {
        let on_interface = match (ingress, ifindex) {
            (Some(i), Some(want)) => i == want,
            _ => true,
        };
        on_interface && self.spec.source_allowed(peer.ip())
    }

    /// Whether `ip` lies in the segment: a target there is a loop.
    pub fn in_segment(&self, ip: IpAddr) -> Option<IpNetwork> {
        self.segment
            .iter()
            .map(|n| IpNetwork::new(n.network(), n.prefix()).unwrap_or(*n))
            .find(|n| n.contains(ip))
    }

    /// Where a new connection goes now.
    pub fn target(&self) -> io::Result<SocketAddr> {
        if let Some(a) = *self.current.borrow() {
            return Ok(a);
        }
        let why = self
            .lock()
            .error
            .clone()
            .unwrap_or_else(|| "not looked up yet".into());
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{} has no address: {why}", self.spec.target),
        ))
    }

    /// [`target`](Self::target), waiting up to `wait` for a first answer.
    pub async fn target_within(&self, wait: Duration) -> io::Result<SocketAddr> {
        let mut rx = self.current.subscribe();
        let _ = tokio::time::timeout(wait, rx.wait_for(Option::is_some)).await;
        self.target()
    }

    /// A connect to the target failed: ask for a new lookup, at most one a
    /// second (a target that is down must not turn into a query storm).
    pub fn connect_failed(&self) {
        if !matches!(self.spec.target, Target::Name { .. }) {
            return;
        }
        let mut last = self.last_again.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            *last = Some(Instant::now());
            self.again.notify_one();
        }
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, Resolution> {
        self.resolution.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A lookup answered `addr` (as `name`).
    pub(crate) fn resolved(&self, addr: SocketAddr, name: String) {
        {
            let mut r = self.lock();
            r.addr = Some(addr);
            r.answered_as = Some(name);
            r.resolved_at = edgelink_status::now();
            r.error = None;
        }
        self.current.send_if_modified(|c| {
            let changed = *c != Some(addr);
            *c = Some(addr);
            changed
        });
    }

    /// No address may be used: the name resolves into the segment.
    pub(crate) fn lost(&self, why: String) {
        {
            let mut r = self.lock();
            r.addr = None;
            r.error = Some(why);
        }
        self.current.send_if_modified(|c| c.take().is_some());
    }

    /// A lookup failed: the last good address stays in use.
    pub(crate) fn failed(&self, why: String) {
        self.lock().error = Some(why);
    }

    pub(crate) fn counted_lookup(&self) {
        self.lock().lookups += 1;
    }
}
