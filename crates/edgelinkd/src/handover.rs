//! edgelinkd's side of a hand-over: [`give`] in the daemon that runs,
//! [`take`] in the one started with `--takeover`. The wire protocol is
//! `edgelink_handover`'s; what the tasks park is [`crate::parking`]'s.
//!
//! The running daemon parks everything (its accept loops stop, its
//! connections stop between two syscalls, its UDP forwards stop reading),
//! sends a second descriptor of each socket and pipe with the inventory,
//! and waits for the new daemon's Confirm (`--handover-timeout` at most):
//! then it answers Ack and exits 0 without closing anything. Anything else
//! (a refusal, an error, no Confirm in time, the peer gone) and it says so,
//! takes its own parked state back and serves on. The new daemon serves
//! nothing before the Ack, so the two never serve the same sockets.
//!
//! One hand-over at a time, and none once the daemon is stopping: a
//! SIGTERM during a hand-over waits for its outcome ([`Gate`]).

use crate::daemon::Daemon;
use crate::parking::{ForwardId, Item, ParkedConn, Pending};
use edgelink_handover::{self as wire, Channel, FdList, Message, Peer, RefusalCode};
use edgelink_relay::ParkedDirection;
use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use crate::takeover::{take, Taken, Takeover};

/// Each read and write of the conversation, at most.
pub(crate) const STEP: Duration = Duration::from_secs(10);
/// The tasks have this long to park.
const PARK_WITHIN: Duration = Duration::from_secs(10);
/// The old daemon's answer to the `handover` line, before the frames.
pub(crate) const ACK: &str = "ok handover";

/// Whether the daemon serves, hands over, or stops: a hand-over and a
/// shutdown never run at once.
#[derive(Default)]
pub struct Gate {
    phase: Mutex<Phase>,
    changed: tokio::sync::Notify,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Phase {
    #[default]
    Serving,
    HandingOver,
    Stopping,
}

impl Gate {
    fn set(&self, from: Phase, to: Phase) -> bool {
        let mut p = self.phase.lock().unwrap_or_else(|e| e.into_inner());
        if *p != from {
            return false;
        }
        *p = to;
        drop(p);
        self.changed.notify_waiters();
        true
    }

    /// Start a hand-over; `false` if one runs or the daemon is stopping.
    fn begin(&self) -> bool {
        self.set(Phase::Serving, Phase::HandingOver)
    }

    /// The hand-over failed: this daemon serves on.
    fn served_on(&self) {
        self.set(Phase::HandingOver, Phase::Serving);
    }

    /// Stop (SIGTERM): no hand-over starts from now on, and one under way
    /// ends first: if it succeeds this process exits from it; if it fails,
    /// this returns `true` once its state was taken back (a pass serves it
    /// again, so that its connections drain rather than close).
    pub async fn stop(&self) -> bool {
        let mut waited = false;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.set(Phase::Serving, Phase::Stopping) {
                return waited;
            }
            if *self.phase.lock().unwrap_or_else(|e| e.into_inner()) == Phase::Stopping {
                return waited;
            }
            if !waited {
                tracing::info!("stopping: waiting for the hand-over under way to end");
            }
            waited = true;
            changed.await;
        }
    }
}

pub(crate) fn peer(protocol: u32, instance: &str) -> Peer {
    Peer {
        protocol,
        version: env!("CARGO_PKG_VERSION").into(),
        instance: instance.into(),
    }
}

/// Run blocking channel work off the runtime's threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, wire::Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| wire::Error::Io(std::io::Error::other(e)))
}

// ---------------------------------------------------------------------
// The running daemon.

/// Hand everything over to the daemon that wrote `handover` on `stream`
/// (a control-socket connection; `control` is that socket's listener,
/// handed over too). Returns only if this daemon serves on.
pub async fn give(
    d: &Arc<Daemon>,
    stream: tokio::net::UnixStream,
    control: &tokio::net::UnixListener,
) {
    let started = Instant::now();
    let ch = async {
        let mut s = stream.into_std()?;
        s.set_nonblocking(false)?;
        s.set_write_timeout(Some(STEP))?;
        s.write_all(format!("{ACK}\n").as_bytes())?;
        Channel::new(s, STEP)
    };
    let mut ch = match ch.await {
        Ok(c) => c,
        Err(e) => return tracing::warn!(error = %e, "hand-over: the connection failed"),
    };
    let hello = blocking(move || ch.expect("Hello").map(|m| (m, ch)))
        .await
        .and_then(|r| r);
    let (hello, mut ch) = match hello {
        Ok((Message::Hello(h), ch)) => (h, ch),
        Ok((m, _)) => return tracing::warn!(got = m.name(), "hand-over: expected Hello"),
        Err(e) => return tracing::warn!(error = %e, "hand-over: no Hello"),
    };
    let taken_from = d
        .taken_from
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    // `--handover-protocol` (tests): the newest this daemon speaks.
    let newest = d.args.handover_protocol;
    let refusal = if !(wire::OLDEST_PROTOCOL..=newest).contains(&hello.protocol) {
        Some((
            RefusalCode::Protocol,
            format!(
                "edgelinkd {} speaks hand-over protocol {}, the new edgelinkd ({}) protocol {}",
                env!("CARGO_PKG_VERSION"),
                newest,
                hello.version,
                hello.protocol
            ),
        ))
    } else if taken_from.as_deref() == Some(hello.instance.as_str()) {
        Some((
            RefusalCode::HandedOver,
            format!(
                "instance {} handed everything to this daemon ({}): it does not take it back",
                hello.instance, d.instance
            ),
        ))
    } else if !d.gate.begin() {
        Some((
            RefusalCode::Busy,
            "this daemon is stopping or handing over already".into(),
        ))
    } else {
        None
    };
    if let Some((code, reason)) = refusal {
        tracing::warn!(instance = %hello.instance, version = %hello.version, %reason, "hand-over refused: serving on");
        let _ = blocking(move || ch.send(&Message::Refused { reason, code })).await;
        return;
    }
    tracing::info!(to = %hello.instance, version = %hello.version, protocol = hello.protocol,
        "handing over: parking every forward");
    let pass = d.hold_passes().await;
    let lot = d.shared.lot.clone();
    let welcome = peer(hello.protocol, &d.instance);
    let sent = blocking(move || ch.send(&Message::Welcome(welcome)).map(|()| ch))
        .await
        .and_then(|r| r);
    let Ok(ch) = sent else {
        d.gate.served_on();
        return tracing::warn!("hand-over: the new daemon went away before parking: serving on");
    };

    lot.start_parking();
    let parked = lot.wait_parked(PARK_WITHIN).await;
    // With what a hand-over that failed took back and no pass has served
    // again yet.
    let items = lot.take_all();
    let parked_in = started.elapsed();
    // A failure after the Welcome: tell the new daemon, serve on.
    let failed = |mut ch: Channel, reason: String| async move {
        let r = reason.clone();
        let refused = Message::Refused {
            reason: r,
            code: RefusalCode::Failed,
        };
        let _ = blocking(move || ch.send(&refused)).await;
        Err(reason)
    };
    let outcome: Result<(), String> = if !parked {
        let reason = format!(
            "{} tasks did not park within {PARK_WITHIN:?}",
            lot.running()
        );
        failed(ch, reason).await
    } else {
        match inventory(&items, control, &d.instance, hello.protocol) {
            Err(e) => failed(ch, format!("cannot list what to hand over: {e}")).await,
            Ok((state, fds, counts)) => {
                let n = fds.len() as u32;
                let wait = d.args.handover_timeout;
                let protocol = hello.protocol;
                let sent = blocking(move || send_and_commit(ch, state, fds, wait, protocol))
                    .await
                    .and_then(|r| r);
                match sent {
                    Ok(()) => {
                        tracing::info!(to = %hello.instance, descriptors = n, listeners = counts.listeners,
                            connections = counts.connections, udp_sessions = counts.sessions,
                            parked_ms = parked_in.as_millis() as u64, total_ms = started.elapsed().as_millis() as u64,
                            "handed over: exiting");
                        // Nothing is closed: the new daemon holds every
                        // socket now, and the control socket's file is its.
                        std::process::exit(0);
                    }
                    Err(e) => Err(e.to_string()),
                }
            }
        }
    };
    if let Err(reason) = outcome {
        tracing::warn!(%reason, "hand-over failed: serving on");
    }
    take_back(d, items);
    drop(pass);
    d.gate.served_on();
    d.nudge.notify_one();
}

/// Send the inventory and the descriptors, then wait for the new daemon's
/// Confirm, Abort or end, `wait` at most. `Ok` once the new daemon has it
/// all: it confirmed and (protocol 2) the Ack is written; this daemon must
/// exit then, serving nothing more. Any error: the new daemon will not
/// serve (it was told, when it can still hear it).
fn send_and_commit(
    mut ch: Channel,
    state: wire::State,
    fds: FdList,
    wait: Duration,
    protocol: u32,
) -> Result<(), wire::Error> {
    ch.send(&Message::Inventory {
        fds: fds.len() as u32,
        state,
    })?;
    ch.send_fds(fds.as_slice())?;
    ch.set_read_timeout(Some(wait))?;
    let answer = ch.expect("Confirm");
    match answer {
        Ok(Message::Confirm {}) if protocol < 2 => Ok(()),
        // Written, or this daemon serves on: the new one serves only once
        // it has read this.
        Ok(Message::Confirm {}) => ch.send(&Message::Ack {}),
        Ok(m) => Err(wire::Error::Unexpected {
            expected: "Confirm",
            got: m.name().into(),
        }),
        Err(wire::Error::Io(e))
            if matches!(
                e.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            ) =>
        {
            // A Confirm that comes later is answered by this refusal (or,
            // once this daemon's end is closed, by nothing): the new daemon
            // gives up without serving.
            let reason = format!("no Confirm within {wait:?}: the old edgelinkd serves on");
            let _ = ch.send(&Message::Refused {
                reason: reason.clone(),
                code: RefusalCode::Failed,
            });
            Err(wire::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                reason,
            )))
        }
        Err(e) => Err(e),
    }
}

/// A hand-over failed: serve on with what was parked.
fn take_back(d: &Arc<Daemon>, items: Vec<Item>) {
    let lot = &d.shared.lot;
    lot.reopen();
    let (adopted, status) = Item::regroup(items);
    for (id, a) in adopted {
        lot.adopt(id, a);
    }
    if let Some(l) = status {
        let l = l
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpListener::from_std(l));
        match l {
            Ok(l) => {
                tokio::spawn(crate::http::serve(l, d.clone(), crate::http::Scope::Status));
            }
            Err(e) => tracing::error!(error = %e, "the status listener cannot be served again"),
        }
    }
    // Every relay forward starts again on the next pass, from the lot.
    d.listen_again("a hand-over failed: serving on");
}

#[derive(Default)]
struct Counts {
    listeners: usize,
    connections: usize,
    sessions: usize,
}

/// The wire state of `items`, with a second descriptor of each socket and
/// pipe (the originals stay with the items, should the hand-over fail).
fn inventory(
    items: &[Item],
    control: &tokio::net::UnixListener,
    instance: &str,
    protocol: u32,
) -> std::io::Result<(wire::State, FdList, Counts)> {
    let mut fds = FdList::default();
    let mut dup = |fd: std::os::fd::BorrowedFd<'_>| -> std::io::Result<wire::Fd> {
        Ok(fds.push(fd.try_clone_to_owned()?))
    };
    let mut counts = Counts::default();
    let mut state = wire::State {
        instance: instance.into(),
        control: Some(dup(control.as_fd())?),
        ..Default::default()
    };
    let mut forwards: BTreeMap<ForwardId, wire::Forward> = BTreeMap::new();
    // Connections in the order a queue serves them: those with a place,
    // then the longest wait first (all a protocol-1 peer goes by).
    let mut items: Vec<&Item> = items.iter().collect();
    items.sort_by_key(|i| match i {
        Item::Conn(_, ParkedConn::Pending(p)) => {
            (1 + u8::from(p.queued_since.is_some()), p.queued_since)
        }
        _ => (0, None),
    });
    for item in items {
        match item {
            Item::Status(l) => state.status = Some(dup(l.as_fd())?),
            Item::Listener(id, l) => {
                let fd = dup(l.as_fd())?;
                counts.listeners += 1;
                entry(&mut forwards, id).listeners.push(fd);
            }
            Item::Conn(id, c) => {
                counts.connections += 1;
                let conn = match c {
                    ParkedConn::Pending(Pending {
                        client,
                        queued_since,
                    }) => wire::Connection {
                        client: dup(client.as_fd())?,
                        upstream: None,
                        to_target: Default::default(),
                        to_client: Default::default(),
                        // Protocol 1 has neither: its peer would refuse them.
                        admitted: protocol >= 2 && queued_since.is_none(),
                        waited_ms: match queued_since {
                            Some(t) if protocol >= 2 => u64::try_from(t.elapsed().as_millis())
                                .unwrap_or(u64::MAX)
                                .max(1),
                            _ => 0,
                        },
                    },
                    ParkedConn::Relaying(p) => {
                        let client = dup(p.client.as_fd())?;
                        let upstream = Some(dup(p.upstream.as_fd())?);
                        let mut dir = |d: &ParkedDirection| -> std::io::Result<wire::Direction> {
                            Ok(wire::Direction {
                                pipe: match &d.pipe {
                                    Some(pp) => Some(wire::Pipe {
                                        read: dup(pp.read.as_fd())?,
                                        write: dup(pp.write.as_fd())?,
                                        len: pp.len,
                                    }),
                                    None => None,
                                },
                                eof: d.eof,
                                done: d.done,
                            })
                        };
                        let to_target = dir(&p.to_target)?;
                        let to_client = dir(&p.to_client)?;
                        wire::Connection {
                            client,
                            upstream,
                            to_target,
                            to_client,
                            admitted: false,
                            waited_ms: 0,
                        }
                    }
                };
                entry(&mut forwards, id).connections.push(conn);
            }
            Item::Udp(id, u) => {
                let listener = dup(u.listener.as_fd())?;
                let mut sessions = Vec::with_capacity(u.sessions.len());
                for s in &u.sessions {
                    sessions.push(wire::UdpSession {
                        peer: s.peer,
                        local: s.local,
                        socket: dup(s.socket.as_fd())?,
                        idle_ms: s.idle_ms,
                    });
                }
                counts.listeners += 1;
                counts.sessions += sessions.len();
                entry(&mut forwards, id)
                    .udp
                    .push(wire::Udp { listener, sessions });
            }
        }
    }
    state.forwards = forwards.into_values().collect();
    Ok((state, fds, counts))
}

fn entry<'a>(
    m: &'a mut BTreeMap<ForwardId, wire::Forward>,
    id: &ForwardId,
) -> &'a mut wire::Forward {
    m.entry(id.clone()).or_insert_with(|| wire::Forward {
        container_id: id.0.clone(),
        ifname: id.1.clone(),
        name: id.2.clone(),
        listeners: Vec::new(),
        connections: Vec::new(),
        udp: Vec::new(),
    })
}
