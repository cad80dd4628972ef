//! What a forward's tasks are given: [`Ctx`] (the attachment, the
//! forward, its sockets' factory, the stop signals) and [`Shared`] (what
//! every forward of the node shares: settings, pipes, the descriptor
//! reserve, the worker threads, the hand-over lot).

use crate::cutoff::Cutoff;
use crate::factory::Factory;
use crate::private_side::PrivateSide;
use crate::runtime::ForwardRuntime;
use crate::workers::Workers;
use edgelink_access::{Audit, Slot};
use edgelink_fd_reserve::FdReserve;
use edgelink_handover::lot::{ForwardId, Lot};
use edgelink_relay::PipePool;
use ipnetwork::IpNetwork;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The node daemon's settings for every forward (its flags).
#[derive(Debug, Clone)]
pub struct Settings {
    /// `--pipe-size`: bytes of each splice pipe.
    pub pipe_size: usize,
    /// `--bulk-lowat`: SO_RCVLOWAT on bulk TCP connections (0: off).
    pub bulk_lowat: usize,
    /// `--max-connections`: TCP connections relayed at once, node-wide.
    pub max_connections: u32,
    /// `--probe-interval` (zero: no probes).
    pub probe_interval: Duration,
    /// `--socket-buffer`: a cap on socket buffers (0: the kernel's).
    pub socket_buffer: usize,
    /// `--tcp-keepalive` (zero: off).
    pub tcp_keepalive: Duration,
    /// `--udp-gso`.
    pub udp_gso: bool,
    /// `--udp-idle-timeout`.
    pub udp_idle_timeout: Duration,
    /// `--udp-max-sessions`, per UDP forward.
    pub udp_max_sessions: u32,
}

/// What the forwards of every attachment share.
pub struct Shared {
    pub settings: Settings,
    pub pipes: Arc<PipePool>,
    /// Descriptors kept back for the control socket and the status server.
    pub fds: Arc<FdReserve>,
    /// TCP connections relayed now, over all forwards (`--max-connections`).
    pub connections: AtomicU64,
    /// The runtimes that serve connections, one per worker thread.
    pub workers: Arc<Workers>,
    /// Where a hand-over parks what the forwards hold, and where the
    /// forwards find what was handed to this daemon.
    pub lot: Arc<Lot>,
    /// The audit trail: a line per connection.
    pub audit: Audit,
}

pub struct Ctx {
    /// The attachment's container ID and interface.
    pub attachment: (String, String),
    pub shared: Arc<Shared>,
    pub factory: Arc<Factory>,
    pub forward: Arc<ForwardRuntime>,
    pub allowed: Vec<IpNetwork>,
    pub private: PrivateSide,
    pub stop: watch::Receiver<bool>,
    /// Set when the attachment is gone: its connections end too.
    pub close: watch::Receiver<bool>,
    /// The attachment's: where each relayed connection gets the one token
    /// it waits on, for a hand-over and for `close` alike.
    pub cutoff: Arc<Cutoff>,
    /// The attachment's access rules: who may connect.
    pub access: Arc<Slot>,
    /// A multiplexed Modbus/TCP forward's multiplexer (`modbus.rs`), made
    /// when the forward starts.
    pub modbus: std::sync::OnceLock<Arc<edgelink_modbus::Mux>>,
    /// Where its audit lines come from, made at the first one.
    pub audit_origin: std::sync::OnceLock<Arc<edgelink_access::audit::Origin>>,
    /// The relay's configs, made at the first connection: [prepared, not].
    pub relay_cfg: std::sync::OnceLock<[edgelink_relay::TcpRelayConfig; 2]>,
    /// Whether the forward's reachability probe runs (`--probe-interval`):
    /// not when the attachment has a `health` probe, which replaces it.
    pub reachability_probe: bool,
}

impl Ctx {
    pub fn id(&self) -> ForwardId {
        (
            self.attachment.0.clone(),
            self.attachment.1.clone(),
            self.forward.spec.name.clone(),
        )
    }

    /// Whether an accepted connection must be reset: a forward refuses
    /// the private side; a reverse forward admits only its sources, on
    /// the interface.
    pub(crate) fn refuses(
        &self,
        peer: SocketAddr,
        local: Option<SocketAddr>,
        ingress: Option<u32>,
    ) -> bool {
        match &self.forward.reverse {
            Some(r) => !r.admits(peer, ingress, self.private.ifindex),
            None => self.private.refuses(peer, local, ingress),
        }
    }

    /// Where the next connect goes. A reverse target that is a name and
    /// has no address yet is waited for, up to the connect timeout.
    pub(crate) async fn target(&self) -> std::io::Result<SocketAddr> {
        match &self.forward.reverse {
            Some(r) => {
                let wait = Duration::from_millis(self.forward.spec.connect_timeout_ms);
                r.target_within(wait).await
            }
            None => Ok(self.forward.spec.target),
        }
    }

    /// How the relay of one of this forward's connections moves bytes;
    /// `prepared`: its sockets carry the relay's options (false: one the
    /// daemon before a hand-over accepted). Made once per context and
    /// borrowed: a config in each connection's task was 56 bytes of every
    /// idle connection.
    pub(crate) fn relay_config(&self, prepared: bool) -> &edgelink_relay::TcpRelayConfig {
        let both = self.relay_cfg.get_or_init(|| {
            let p = self.make_relay_config();
            let unprepared = edgelink_relay::TcpRelayConfig {
                prepared: false,
                ..p.clone()
            };
            [p, unprepared]
        });
        &both[usize::from(!prepared)]
    }

    /// What this forward's audit lines share.
    pub(crate) fn audit_origin(&self) -> Arc<edgelink_access::audit::Origin> {
        let f = &self.forward;
        let o = self.audit_origin.get_or_init(|| {
            Arc::new(edgelink_access::audit::Origin {
                slot: self.access.clone(),
                forward: f.spec.name.clone(),
                protocol: match f.spec.protocol {
                    edgelink_attachment::Protocol::Tcp => "tcp",
                    edgelink_attachment::Protocol::Udp => "udp",
                },
                direction: if f.reverse.is_some() {
                    "from-device"
                } else {
                    "to-device"
                },
            })
        });
        o.clone()
    }

    fn make_relay_config(&self) -> edgelink_relay::TcpRelayConfig {
        let args = &self.shared.settings;
        edgelink_relay::TcpRelayConfig {
            pipe_size: args.pipe_size,
            bulk_lowat: args.bulk_lowat,
            set_nodelay: false,
            idle_timeout: self.forward.idle_timeout,
            keepalive: (!args.tcp_keepalive.is_zero()).then_some(args.tcp_keepalive),
            // The listener (listen.rs) and the factory set them.
            prepared: true,
            ..Default::default()
        }
    }

    pub(crate) fn clone_for(&self) -> Ctx {
        Ctx {
            attachment: self.attachment.clone(),
            shared: self.shared.clone(),
            factory: self.factory.clone(),
            forward: self.forward.clone(),
            allowed: self.allowed.clone(),
            private: self.private.clone(),
            stop: self.stop.clone(),
            close: self.close.clone(),
            cutoff: self.cutoff.clone(),
            access: self.access.clone(),
            relay_cfg: self.relay_cfg.clone(),
            audit_origin: self.audit_origin.clone(),
            modbus: self.modbus.clone(),
            reachability_probe: self.reachability_probe,
        }
    }
}

/// A client's address and the one it dialed, as they were at accept.
#[derive(Clone, Copy, Debug)]
pub struct Ends {
    pub peer: SocketAddr,
    pub local: SocketAddr,
}

impl Ends {
    /// Both ends of `s`; an error when the client is gone already.
    pub fn of(s: &tokio::net::TcpStream) -> std::io::Result<Ends> {
        Ok(Ends {
            peer: s.peer_addr()?,
            local: s.local_addr()?,
        })
    }
}

/// The target as the status names it: a reverse forward's as configured
/// (a name, maybe).
pub(crate) fn target_name(f: &ForwardRuntime) -> String {
    match &f.reverse {
        Some(r) => r.spec.target.to_string(),
        None => f.spec.target.to_string(),
    }
}
