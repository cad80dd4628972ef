//! [`Node`]: the set of attachments this node serves, and what acts on
//! all of them at once (stop accepting, close, count).

use crate::attachment::{Attachment, Key};
use crate::reclaim::Reclaimer;
use edgelink_fd_reserve::{FdReserve, FD_RESERVE};
use edgelink_forward::workers::Workers;
use edgelink_forward::{ForwardDefaults, Shared};
use edgelink_relay::PipePool;
use edgelink_status::grants::{Grants, Mode};
use edgelink_status::{now, MalformedRecord};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Notify};

/// The daemon's settings for the attachments (its flags).
#[derive(Debug, Clone)]
pub struct Settings {
    /// `--state-dir`: the plugin's records and the built-in IPAM's store.
    pub state_dir: PathBuf,
    /// `--reconcile-interval` (what /healthz judges a pass's age by).
    pub reconcile_interval: Duration,
    /// What every forward gets.
    pub forward: edgelink_forward::Settings,
    /// What a forward gets where its record sets nothing.
    pub defaults: ForwardDefaults,
    /// Splice pipes in use at once at most (0: no bound).
    pub pipes_at_most: usize,
    /// `--socket-pool`: upstream TCP sockets kept ready per attachment.
    pub socket_pool: u32,
    /// How the kernel path runs nft and tunes conntrack.
    pub kernel: edgelink_kernel_path::Options,
    /// `--kernel-counters-interval`.
    pub kernel_counters_interval: Duration,
    /// `--conntrack-min`: the node's conntrack table size to warn below.
    pub conntrack_min: u64,
    /// `--cni-path` (delegated IPAM releases).
    pub cni_path: Vec<PathBuf>,
    /// `--ipam-gc-grace`.
    pub ipam_gc_grace: Duration,
    /// `--cluster-resolv-conf`: the daemon's own cluster resolver, for
    /// reverse targets' names where the pod's is out of sight.
    pub cluster_resolv_conf: Option<PathBuf>,
    /// The operator grants the virtual addresses (a heartbeat is sent):
    /// none is held until it answers. Otherwise each attachment holds its
    /// own ([`edgelink_status::grants`]).
    pub operator_grants: bool,
    /// The audit trail (a line per connection), started by the daemon.
    pub audit: edgelink_access::Audit,
}

/// The passes asked for since the last one began (asked.rs).
#[derive(Debug, Default)]
pub(crate) struct Asked {
    /// A full pass (a plain `rescan`, a hand-over that failed, a worker
    /// replaced, inotify overflowed).
    pub(crate) all: bool,
    /// Record file names that changed.
    pub(crate) names: std::collections::BTreeSet<String>,
}

/// Every attachment this node serves, kept equal to the records on disk
/// by [`Node::reconcile`].
pub struct Node {
    pub settings: Settings,
    /// The node's name (in /status and the webhook).
    pub name: String,
    pub started_at: u64,
    pub pipes: Arc<PipePool>,
    /// What every forward gets (settings, pipes, fd reserve, caps).
    pub shared: Arc<Shared>,
    pub(crate) attachments: Mutex<HashMap<Key, Attachment>>,
    pub(crate) malformed: Mutex<Vec<MalformedRecord>>,
    pub(crate) reclaimer: Reclaimer,
    pub last_reconcile: AtomicU64,
    /// How long the last full pass took (µs).
    pub last_pass_micros: AtomicU64,
    /// Full passes, and passes over the records that changed.
    pub full_passes: AtomicU64,
    pub record_passes: AtomicU64,
    /// Links the plugin's DEL retired and this daemon deleted.
    pub reaped: AtomicU64,
    /// Upstream TCP sockets taken ready from a `--socket-pool`.
    pub pool_taken: Arc<AtomicU64>,
    pub draining: AtomicBool,
    /// Workers replaced, counted once their forwards are marked to listen
    /// again: /status never shows a replacement with listeners that are
    /// still gone but reported `listening`.
    pub(crate) worker_replacements: AtomicU64,
    /// Wakes the reconcile loop (inotify, control socket), for what
    /// `asked` holds.
    pub nudge: Notify,
    pub(crate) asked: Mutex<Asked>,
    /// Bumped whenever attachments or forward states change (webhook).
    pub changes: watch::Sender<u64>,
    /// One reconcile pass at a time.
    pub(crate) pass: tokio::sync::Mutex<()>,
    /// Who may hold the attachments' virtual addresses (the heartbeat's
    /// answers, or each its own).
    pub grants: Arc<Grants>,
    /// Who may connect through each attachment (the heartbeat's answers;
    /// kept in the state directory across restarts and hand-overs).
    pub access: Arc<edgelink_access::Access>,
    /// What /status warns of (set by each pass).
    pub(crate) warnings: Mutex<Vec<String>>,
}

impl Node {
    pub fn new(settings: Settings, name: String, workers: Arc<Workers>) -> Arc<Node> {
        let pipes = PipePool::bounded(settings.forward.pipe_size, 256, settings.pipes_at_most);
        let shared = Arc::new(Shared {
            settings: settings.forward.clone(),
            pipes: pipes.clone(),
            fds: FdReserve::new(FD_RESERVE),
            connections: AtomicU64::new(0),
            workers,
            lot: Arc::default(),
            audit: settings.audit.clone(),
        });
        let access = Arc::new(edgelink_access::Access::default());
        if let Err(e) = access.load(&settings.state_dir) {
            tracing::warn!(error = %e, "the access rules an earlier daemon kept cannot be read: none until the operator's next answer");
        }
        let reclaimer = Reclaimer {
            state_dir: settings.state_dir.clone(),
            cni_path: settings.cni_path.clone(),
            gc_grace: settings.ipam_gc_grace,
            gc_every: settings.reconcile_interval,
            gc_last: Mutex::new(None),
            reclaimed: AtomicU64::new(0),
        };
        let grants = Arc::new(Grants::new(if settings.operator_grants {
            Mode::Unknown
        } else {
            Mode::Unmanaged
        }));
        Arc::new(Node {
            grants,
            access,
            settings,
            name,
            started_at: now(),
            pipes,
            shared,
            attachments: Mutex::new(HashMap::new()),
            malformed: Mutex::new(Vec::new()),
            reclaimer,
            last_reconcile: AtomicU64::new(0),
            last_pass_micros: AtomicU64::new(0),
            full_passes: AtomicU64::new(0),
            record_passes: AtomicU64::new(0),
            reaped: AtomicU64::new(0),
            pool_taken: Arc::new(AtomicU64::new(0)),
            draining: AtomicBool::new(false),
            worker_replacements: AtomicU64::new(0),
            nudge: Notify::new(),
            asked: Mutex::default(),
            changes: watch::channel(0).0,
            pass: tokio::sync::Mutex::new(()),
            warnings: Mutex::new(Vec::new()),
        })
    }

    /// Every relay forward that was listening starts again on the next
    /// pass (from what the hand-over lot holds for it, if anything).
    pub fn listen_again(&self, why: &str) {
        self.listen_again_on(None, why);
    }

    /// No reconcile pass runs while this is held (a hand-over).
    pub async fn hold_passes(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.pass.lock().await
    }

    pub(crate) fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Attachment>> {
        self.attachments.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn changed(&self) {
        self.changes.send_modify(|v| *v += 1);
    }

    /// Active TCP connections and UDP sessions over all forwards.
    pub fn active(&self) -> u64 {
        self.map()
            .values()
            .flat_map(|a| a.forwards.iter())
            .map(|f| {
                edgelink_relay::Counters::get(&f.counters.active)
                    + edgelink_relay::Counters::get(&f.counters.udp_sessions)
            })
            .sum()
    }

    /// Stop accepting on every forward (SIGTERM); connections go on.
    pub fn stop_listening(&self) {
        self.draining.store(true, Ordering::Relaxed);
        for a in self.map().values() {
            let _ = a.stop.send(true);
        }
        self.changed();
    }

    /// End every relayed connection, with a reset (the grace period of a
    /// SIGTERM is over: what is still in flight is lost).
    pub fn close_connections(&self) {
        for a in self.map().values() {
            a.close_connections();
        }
    }
}
