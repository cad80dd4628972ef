//! What the lot holds, to the wire and back: [`pack`] writes the
//! inventory of parked [`Item`]s (with a second descriptor of each socket
//! and pipe: the originals stay with the items, should the hand-over
//! fail); [`unpack`] turns a received inventory into sockets and pipes,
//! filed by forward.

use crate::lot::{Adopted, ForwardId, Item, ParkedConn, Pending};
use crate::{Direction, Error, Fd, FdList, FdTable, State};
use edgelink_relay::{ParkedDirection, ParkedPipe, ParkedSession, ParkedTcp, UdpForward};
use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

/// How much a hand-over carries.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// TCP listeners and UDP forwards.
    pub listeners: usize,
    pub connections: usize,
    pub sessions: usize,
}

/// The wire state of `items` and of the control listener, in `protocol`,
/// with the descriptors to send after it.
pub fn pack(
    items: &[Item],
    control: BorrowedFd<'_>,
    instance: &str,
    protocol: u32,
) -> std::io::Result<(State, FdList, Counts)> {
    let mut fds = FdList::default();
    let mut counts = Counts::default();
    let mut state = State {
        instance: instance.into(),
        control: Some(dup(&mut fds, control)?),
        ..Default::default()
    };
    let mut forwards: BTreeMap<ForwardId, crate::Forward> = BTreeMap::new();
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
            Item::Status(l) => state.status = Some(dup(&mut fds, l.as_fd())?),
            Item::Listener(id, l) => {
                let fd = dup(&mut fds, l.as_fd())?;
                counts.listeners += 1;
                entry(&mut forwards, id).listeners.push(fd);
            }
            Item::Conn(id, c) => {
                counts.connections += 1;
                let conn = pack_conn(&mut fds, c, protocol)?;
                entry(&mut forwards, id).connections.push(conn);
            }
            Item::Udp(id, u) => {
                let listener = dup(&mut fds, u.listener.as_fd())?;
                let mut sessions = Vec::with_capacity(u.sessions.len());
                for s in &u.sessions {
                    sessions.push(crate::UdpSession {
                        peer: s.peer,
                        local: s.local,
                        socket: dup(&mut fds, s.socket.as_fd())?,
                        idle_ms: s.idle_ms,
                    });
                }
                counts.listeners += 1;
                counts.sessions += sessions.len();
                entry(&mut forwards, id)
                    .udp
                    .push(crate::Udp { listener, sessions });
            }
        }
    }
    state.forwards = forwards.into_values().collect();
    Ok((state, fds, counts))
}

fn dup(fds: &mut FdList, fd: BorrowedFd<'_>) -> std::io::Result<Fd> {
    Ok(fds.push(fd.try_clone_to_owned()?))
}

fn pack_conn(
    fds: &mut FdList,
    c: &ParkedConn,
    protocol: u32,
) -> std::io::Result<crate::Connection> {
    Ok(match c {
        ParkedConn::Pending(Pending {
            client,
            queued_since,
        }) => crate::Connection {
            client: dup(fds, client.as_fd())?,
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
            let client = dup(fds, p.client.as_fd())?;
            let upstream = Some(dup(fds, p.upstream.as_fd())?);
            let to_target = pack_direction(fds, &p.to_target)?;
            let to_client = pack_direction(fds, &p.to_client)?;
            crate::Connection {
                client,
                upstream,
                to_target,
                to_client,
                admitted: false,
                waited_ms: 0,
            }
        }
    })
}

fn pack_direction(fds: &mut FdList, d: &ParkedDirection) -> std::io::Result<Direction> {
    Ok(Direction {
        pipe: match &d.pipe {
            Some(pp) => Some(crate::Pipe {
                read: dup(fds, pp.read.as_fd())?,
                write: dup(fds, pp.write.as_fd())?,
                len: pp.len,
            }),
            None => None,
        },
        eof: d.eof,
        done: d.done,
    })
}

fn entry<'a>(
    m: &'a mut BTreeMap<ForwardId, crate::Forward>,
    id: &ForwardId,
) -> &'a mut crate::Forward {
    m.entry(id.clone()).or_insert_with(|| crate::Forward {
        container_id: id.0.clone(),
        ifname: id.1.clone(),
        name: id.2.clone(),
        listeners: Vec::new(),
        connections: Vec::new(),
        udp: Vec::new(),
    })
}

/// What an inventory unpacked to.
#[derive(Default)]
pub struct Unpacked {
    pub control: Option<std::os::unix::net::UnixListener>,
    pub status: Option<std::net::TcpListener>,
    pub adopted: HashMap<ForwardId, Adopted>,
    pub counts: Counts,
}

/// Turn the wire state into sockets and pipes, filed by forward.
pub fn unpack(state: State, mut t: FdTable) -> Result<Unpacked, Error> {
    let now = Instant::now();
    let mut take = |fd: Fd| -> Result<OwnedFd, Error> { t.take(fd) };
    let mut out = Unpacked {
        control: state
            .control
            .map(&mut take)
            .transpose()?
            .map(std::os::unix::net::UnixListener::from),
        status: state
            .status
            .map(&mut take)
            .transpose()?
            .map(std::net::TcpListener::from),
        ..Default::default()
    };
    for f in state.forwards {
        let mut a = Adopted::default();
        for l in f.listeners {
            a.listeners.push(std::net::TcpListener::from(take(l)?));
        }
        for c in f.connections {
            a.conns.push(unpack_conn(c, now, &mut take)?);
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
            out.counts.sessions += ss.len();
            a.udp.push(UdpForward {
                listener,
                sessions: ss,
            });
        }
        out.counts.listeners += a.listeners.len() + a.udp.len();
        out.counts.connections += a.conns.len();
        out.adopted.insert((f.container_id, f.ifname, f.name), a);
    }
    Ok(out)
}

fn unpack_conn(
    c: crate::Connection,
    now: Instant,
    take: &mut impl FnMut(Fd) -> Result<OwnedFd, Error>,
) -> Result<ParkedConn, Error> {
    let client = std::net::TcpStream::from(take(c.client)?);
    let Some(u) = c.upstream else {
        return Ok(ParkedConn::Pending(Pending {
            client,
            queued_since: (!c.admitted).then(|| {
                now.checked_sub(Duration::from_millis(c.waited_ms))
                    .unwrap_or(now)
            }),
        }));
    };
    let upstream = std::net::TcpStream::from(take(u)?);
    let mut dir = |d: Direction| -> Result<ParkedDirection, Error> {
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
    Ok(ParkedConn::Relaying(ParkedTcp {
        client,
        upstream,
        to_target,
        to_client,
    }))
}
