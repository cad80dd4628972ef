//! The daemon started with `--takeover`: [`take`] asks the running one for
//! everything it serves and files what arrived; [`Taken::confirm`] makes it
//! this daemon's. Nothing that arrived is served (no listener accepts, no
//! connection is resumed) before the old daemon acknowledged the Confirm:
//! until then the old one may still take everything back.

use crate::config::RunArgs;
use crate::handover::{blocking, peer, ACK, STEP};
use crate::parking::{Adopted, ForwardId, ParkedConn, Pending};
use anyhow::Context;
use edgelink_handover::{self as wire, Channel, FdTable, Message, Peer, RefusalCode};
use edgelink_relay::{ParkedDirection, ParkedPipe, ParkedSession, ParkedTcp, UdpForward};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

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
    /// The protocol spoken: 1 has no Ack.
    protocol: u32,
    /// The instance it came from.
    pub from: String,
    pub control: Option<std::os::unix::net::UnixListener>,
    pub status: Option<std::net::TcpListener>,
    pub adopted: HashMap<ForwardId, Adopted>,
    pub summary: String,
}

impl Taken {
    /// Tell the old daemon everything was taken, and wait for its Ack
    /// (however long: until it answers or ends): it exits, and from then on
    /// this daemon alone serves what arrived. An error (the old daemon gave
    /// up waiting and serves on, or is gone without an Ack) means that
    /// nothing that arrived may be served: the caller exits.
    ///
    /// With a protocol-1 daemon there is no Ack: the Confirm written is
    /// all there is to go by.
    pub async fn confirm(mut self) -> anyhow::Result<Self> {
        let mut ch = self.channel;
        let protocol = self.protocol;
        let (r, ch) = blocking(move || {
            let r = commit(&mut ch, protocol);
            (r, ch)
        })
        .await
        .map_err(|e| anyhow::anyhow!("--takeover: {e}"))?;
        self.channel = ch;
        r.context("--takeover: the running edgelinkd did not acknowledge the Confirm: nothing was taken over")?;
        tracing::info!(from = %self.from, protocol, "took over");
        Ok(self)
    }

    /// Give it all back (this daemon is stopping before it served any of
    /// it): the old daemon serves on.
    pub async fn abort(self, reason: String) {
        let mut ch = self.channel;
        let _ = blocking(move || ch.send(&Message::Abort { reason })).await;
    }
}

fn commit(ch: &mut Channel, protocol: u32) -> Result<(), wire::Error> {
    if let Err(e) = ch.send(&Message::Confirm {}) {
        // The old daemon gave up and closed its end: its last word says why.
        return Err(match ch.expect("Ack") {
            Err(refused @ wire::Error::Refused { .. }) => refused,
            _ => e,
        });
    }
    if protocol < 2 {
        return Ok(());
    }
    ch.set_read_timeout(None)?;
    match ch.expect("Ack")? {
        Message::Ack {} => Ok(()),
        m => Err(wire::Error::Unexpected {
            expected: "Ack",
            got: m.name().into(),
        }),
    }
}

/// Debug builds only, for the tests of a new daemon that is slow to
/// confirm: `--test-stall-confirm-ms`.
#[cfg(debug_assertions)]
pub async fn test_stall(args: &RunArgs) {
    if let Some(ms) = args.test_stall_confirm_ms {
        tracing::warn!(ms, "test hook: stalling before the Confirm");
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

/// Ask the daemon running on `args.state_dir` for everything it serves.
/// Errors: it refused (other than [`Takeover::HandedOver`]) or the
/// hand-over failed on the way; the old daemon serves on then.
pub async fn take(args: &RunArgs, instance: &str) -> anyhow::Result<Takeover> {
    let path = args.state_dir.join(edgelink_attachment::DAEMON_SOCKET);
    let hello = peer(args.handover_protocol, instance);
    let started = Instant::now();
    let p = path.clone();
    let r = blocking(move || take_blocking(&p, hello)).await;
    let mut r = r.map_err(|e| anyhow::anyhow!("{e}"))?;
    // A daemon of protocol 1 (before the Ack) refuses protocol 2: ask it
    // again in its own, so that an upgrade from it takes over too.
    if let Err(Refusal::Protocol(reason)) = &r {
        if args.handover_protocol == wire::PROTOCOL {
            tracing::info!(%reason, "--takeover: asking again in hand-over protocol {}", wire::OLDEST_PROTOCOL);
            let hello = peer(wire::OLDEST_PROTOCOL, instance);
            r = blocking(move || take_blocking(&path, hello))
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
    }
    let r = r.map_err(|e| match e {
        Refusal::Protocol(reason) => anyhow::anyhow!("--takeover: {reason}"),
        Refusal::Other(e) => e,
    })?;
    if let Takeover::Taken(t) = &r {
        tracing::info!(from = %t.from, took_ms = started.elapsed().as_millis() as u64, "{}", t.summary);
    }
    Ok(r)
}

/// Why [`take_blocking`] got nothing.
enum Refusal {
    /// The running daemon does not speak the protocol asked in.
    Protocol(String),
    Other(anyhow::Error),
}

impl<E: Into<anyhow::Error>> From<E> for Refusal {
    fn from(e: E) -> Refusal {
        Refusal::Other(e.into())
    }
}

fn take_blocking(path: &std::path::Path, hello: Peer) -> Result<Takeover, Refusal> {
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
        Err(e) => return Err(anyhow::anyhow!("--takeover: {}: {e}", path.display()).into()),
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
            Err(e) => {
                return Err(anyhow::anyhow!(
                    "--takeover: no answer from the running edgelinkd: {e}"
                )
                .into())
            }
        }
    }
    let line = String::from_utf8_lossy(&line).into_owned();
    if line != ACK {
        return Err(anyhow::anyhow!(
            "--takeover: the running edgelinkd does not hand over (it answered {line:?}; \
             it predates hand-overs: restart it instead)"
        )
        .into());
    }
    let mut ch = Channel::new(s, STEP)?;
    let protocol = hello.protocol;
    ch.send(&Message::Hello(hello))?;
    let from = match ch.expect("Welcome") {
        Ok(Message::Welcome(p)) => p,
        Ok(m) => {
            return Err(anyhow::anyhow!("--takeover: expected Welcome, got {}", m.name()).into())
        }
        Err(wire::Error::Refused {
            reason,
            code: RefusalCode::HandedOver,
        }) => return Ok(Takeover::HandedOver(reason)),
        Err(
            e @ wire::Error::Refused {
                code: RefusalCode::Protocol,
                ..
            },
        ) => return Err(Refusal::Protocol(e.to_string())),
        Err(e) => return Err(anyhow::anyhow!("--takeover: {e}").into()),
    };
    let taken = receive(&mut ch).and_then(|(state, table)| adopt(state, table, protocol, &mut ch));
    match taken {
        Ok(mut t) => {
            t.from = from.instance;
            Ok(Takeover::Taken(t))
        }
        Err(e) => {
            let _ = ch.send(&Message::Abort {
                reason: e.to_string(),
            });
            Err(anyhow::anyhow!("--takeover: {e}").into())
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
    protocol: u32,
    ch: &mut Channel,
) -> Result<Taken, wire::Error> {
    let now = Instant::now();
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
                None => ParkedConn::Pending(Pending {
                    client,
                    queued_since: (!c.admitted).then(|| {
                        now.checked_sub(Duration::from_millis(c.waited_ms))
                            .unwrap_or(now)
                    }),
                }),
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
        from: String::new(),
        protocol,
        control,
        status,
        adopted,
    })
}
