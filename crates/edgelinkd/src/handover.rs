//! edgelinkd's side of a hand-over: [`give`] in the daemon that runs,
//! [`take`] in the one started with `--takeover`. The wire protocol is
//! `edgelink_handover`'s; what the tasks park is [`crate::parking`]'s.
//!
//! The running daemon parks everything (its accept loops stop, its
//! connections stop between two syscalls, its UDP forwards stop reading),
//! sends a second descriptor of each socket and pipe with the inventory,
//! and waits for the new daemon's Confirm: then it exits 0 without closing
//! anything. Anything else (a refusal, an error, a timeout, the peer
//! gone) and it takes its own parked state back and serves on.

use crate::config::RunArgs;
use crate::daemon::Daemon;
use crate::parking::{Adopted, ForwardId, Item, ParkedConn};
use edgelink_handover::{self as wire, Channel, FdList, FdTable, Message, Peer, RefusalCode};
use edgelink_relay::{ParkedDirection, ParkedPipe, ParkedSession, ParkedTcp, UdpForward};
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Each read and write of the conversation, at most.
const STEP: Duration = Duration::from_secs(10);
/// The tasks have this long to park.
const PARK_WITHIN: Duration = Duration::from_secs(10);
/// The old daemon's answer to the `handover` line, before the frames.
const ACK: &str = "ok handover";

fn peer(protocol: u32, instance: &str) -> Peer {
    Peer {
        protocol,
        version: env!("CARGO_PKG_VERSION").into(),
        instance: instance.into(),
    }
}

/// Run blocking channel work off the runtime's threads.
async fn blocking<T: Send + 'static>(
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
    let refusal = if hello.protocol != wire::PROTOCOL {
        Some((
            RefusalCode::Protocol,
            format!(
                "edgelinkd {} speaks hand-over protocol {}, the new edgelinkd ({}) protocol {}",
                env!("CARGO_PKG_VERSION"),
                wire::PROTOCOL,
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
    } else if d.draining.load(Ordering::Relaxed) || d.handing_over.swap(true, Ordering::AcqRel) {
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
    tracing::info!(to = %hello.instance, version = %hello.version, "handing over: parking every forward");
    let pass = d.hold_passes().await;
    let lot = d.shared.lot.clone();
    let welcome = peer(wire::PROTOCOL, &d.instance);
    let sent = blocking(move || ch.send(&Message::Welcome(welcome)).map(|()| ch))
        .await
        .and_then(|r| r);
    let Ok(mut ch) = sent else {
        d.handing_over.store(false, Ordering::Release);
        return tracing::warn!("hand-over: the new daemon went away before parking: serving on");
    };

    lot.start_parking();
    let parked = lot.wait_parked(PARK_WITHIN).await;
    let items = lot.take_items();
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
        match inventory(&items, control, &d.instance) {
            Err(e) => failed(ch, format!("cannot list what to hand over: {e}")).await,
            Ok((state, fds, counts)) => {
                let n = fds.len() as u32;
                let sent = blocking(move || -> Result<(), wire::Error> {
                    ch.send(&Message::Inventory { fds: n, state })?;
                    ch.send_fds(fds.as_slice())?;
                    match ch.expect("Confirm")? {
                        Message::Confirm {} => Ok(()),
                        m => Err(wire::Error::Unexpected {
                            expected: "Confirm",
                            got: m.name().into(),
                        }),
                    }
                })
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
    d.handing_over.store(false, Ordering::Release);
    drop(pass);
    d.nudge.notify_one();
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
                tokio::spawn(crate::http::serve(l, d.clone()));
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
                    ParkedConn::Pending(s) => wire::Connection {
                        client: dup(s.as_fd())?,
                        upstream: None,
                        to_target: Default::default(),
                        to_client: Default::default(),
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

// ---------------------------------------------------------------------
// The daemon that takes over.

/// What `--takeover` found.
pub enum Takeover {
    /// No daemon answers on the control socket: start afresh.
    Fresh,
    /// Everything it served, to serve on.
    Taken(Taken),
    /// The running daemon took over from this very instance earlier (a
    /// container restarted after its hand-over): it is not taken back.
    HandedOver(String),
}

/// What arrived, until [`Taken::confirm`] tells the old daemon to go.
pub struct Taken {
    channel: Channel,
    /// The instance it came from.
    pub from: String,
    pub control: Option<std::os::unix::net::UnixListener>,
    pub status: Option<std::net::TcpListener>,
    pub adopted: HashMap<ForwardId, Adopted>,
    pub summary: String,
}

impl Taken {
    /// Tell the old daemon everything was taken: it exits. From now on
    /// this daemon alone serves what arrived.
    pub async fn confirm(self) {
        let mut ch = self.channel;
        match blocking(move || ch.send(&Message::Confirm {}))
            .await
            .and_then(|r| r)
        {
            Ok(()) => tracing::info!(from = %self.from, "took over"),
            Err(e) => {
                tracing::warn!(error = %e, "took over, but the old daemon did not get the Confirm")
            }
        }
    }
}

/// Ask the daemon running on `args.state_dir` for everything it serves.
/// Errors: it refused (other than [`Takeover::HandedOver`]) or the
/// hand-over failed on the way; the old daemon serves on then.
pub async fn take(args: &RunArgs, instance: &str) -> anyhow::Result<Takeover> {
    let path = args.state_dir.join(edgelink_attachment::DAEMON_SOCKET);
    let hello = peer(args.handover_protocol, instance);
    let started = Instant::now();
    let r = blocking(move || take_blocking(&path, hello)).await;
    let r = r.map_err(|e| anyhow::anyhow!("{e}"))??;
    if let Takeover::Taken(t) = &r {
        tracing::info!(from = %t.from, took_ms = started.elapsed().as_millis() as u64, "{}", t.summary);
    }
    Ok(r)
}

fn take_blocking(path: &std::path::Path, hello: Peer) -> anyhow::Result<Takeover> {
    let mut s = match UnixStream::connect(path) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            tracing::info!(socket = %path.display(), "--takeover: no edgelinkd answers here: starting afresh");
            return Ok(Takeover::Fresh);
        }
        Err(e) => anyhow::bail!("--takeover: {}: {e}", path.display()),
    };
    s.set_read_timeout(Some(STEP))?;
    s.set_write_timeout(Some(STEP))?;
    s.write_all(format!("{}\n", wire::HANDOVER_LINE).as_bytes())?;
    // The answer line, a byte at a time: the frames follow it.
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while line.len() < 256 {
        match s.read(&mut b) {
            Ok(0) => break,
            Ok(_) if b[0] == b'\n' => break,
            Ok(_) => line.push(b[0]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => anyhow::bail!("--takeover: no answer from the running edgelinkd: {e}"),
        }
    }
    let line = String::from_utf8_lossy(&line).into_owned();
    if line != ACK {
        anyhow::bail!(
            "--takeover: the running edgelinkd does not hand over (it answered {line:?}; \
             it predates hand-overs: restart it instead)"
        );
    }
    let mut ch = Channel::new(s, STEP)?;
    ch.send(&Message::Hello(hello))?;
    let from = match ch.expect("Welcome") {
        Ok(Message::Welcome(p)) => p,
        Ok(m) => anyhow::bail!("--takeover: expected Welcome, got {}", m.name()),
        Err(wire::Error::Refused {
            reason,
            code: RefusalCode::HandedOver,
        }) => return Ok(Takeover::HandedOver(reason)),
        Err(e) => anyhow::bail!("--takeover: {e}"),
    };
    match receive(&mut ch) {
        Ok((state, table)) => {
            let taken = adopt(state, table, from.instance.clone(), &mut ch);
            match taken {
                Ok(mut t) => {
                    t.from = from.instance;
                    Ok(Takeover::Taken(t))
                }
                Err(e) => {
                    let _ = ch.send(&Message::Abort {
                        reason: e.to_string(),
                    });
                    anyhow::bail!("--takeover: {e}")
                }
            }
        }
        Err(e) => {
            let _ = ch.send(&Message::Abort {
                reason: e.to_string(),
            });
            anyhow::bail!("--takeover: {e}")
        }
    }
}

fn receive(ch: &mut Channel) -> Result<(wire::State, FdTable), wire::Error> {
    let (n, state) = match ch.expect("Inventory")? {
        Message::Inventory { fds, state } => (fds as usize, state),
        m => {
            return Err(wire::Error::Unexpected {
                expected: "Inventory",
                got: m.name().into(),
            })
        }
    };
    // Checked before a descriptor is taken: no index is missing, used
    // twice or left over.
    state.check(n)?;
    let fds = ch.recv_fds(n)?;
    Ok((state, FdTable::new(fds)))
}

/// Turn the wire state into sockets and pipes, filed by forward.
fn adopt(
    state: wire::State,
    mut t: FdTable,
    from: String,
    ch: &mut Channel,
) -> Result<Taken, wire::Error> {
    let mut take = |fd: wire::Fd| -> Result<OwnedFd, wire::Error> { t.take(fd) };
    let control = state
        .control
        .map(&mut take)
        .transpose()?
        .map(std::os::unix::net::UnixListener::from);
    let status = state
        .status
        .map(&mut take)
        .transpose()?
        .map(std::net::TcpListener::from);
    let mut adopted = HashMap::new();
    let (mut listeners, mut conns, mut sessions) = (0, 0, 0);
    for f in state.forwards {
        let mut a = Adopted::default();
        for l in f.listeners {
            a.listeners.push(std::net::TcpListener::from(take(l)?));
        }
        for c in f.connections {
            let client = std::net::TcpStream::from(take(c.client)?);
            let conn = match c.upstream {
                None => ParkedConn::Pending(client),
                Some(u) => {
                    let upstream = std::net::TcpStream::from(take(u)?);
                    let mut dir = |d: wire::Direction| -> Result<ParkedDirection, wire::Error> {
                        Ok(ParkedDirection {
                            pipe: match d.pipe {
                                Some(p) => Some(ParkedPipe {
                                    read: take(p.read)?,
                                    write: take(p.write)?,
                                    len: p.len,
                                }),
                                None => None,
                            },
                            eof: d.eof,
                            done: d.done,
                        })
                    };
                    let to_target = dir(c.to_target)?;
                    let to_client = dir(c.to_client)?;
                    ParkedConn::Relaying(ParkedTcp {
                        client,
                        upstream,
                        to_target,
                        to_client,
                    })
                }
            };
            a.conns.push(conn);
        }
        for u in f.udp {
            let listener = std::net::UdpSocket::from(take(u.listener)?);
            let mut ss = Vec::with_capacity(u.sessions.len());
            for s in u.sessions {
                ss.push(ParkedSession {
                    peer: s.peer,
                    local: s.local,
                    socket: std::net::UdpSocket::from(take(s.socket)?),
                    idle_ms: s.idle_ms,
                });
            }
            sessions += ss.len();
            a.udp.push(UdpForward {
                listener,
                sessions: ss,
            });
        }
        listeners += a.listeners.len() + a.udp.len();
        conns += a.conns.len();
        adopted.insert((f.container_id, f.ifname, f.name), a);
    }
    let channel = Channel::new(ch.socket().try_clone().map_err(wire::Error::Io)?, STEP)?;
    Ok(Taken {
        channel,
        summary: format!(
            "taking over {} forwards: {listeners} listeners, {conns} connections, {sessions} UDP sessions",
            adopted.len()
        ),
        from,
        control,
        status,
        adopted,
    })
}
