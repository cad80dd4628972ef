//! The new daemon's half (`edgelinkd run --takeover`): [`take`] asks the
//! running one for everything it serves and unpacks what arrived;
//! [`Taken::confirm`] makes it the new daemon's. Nothing that arrived may
//! be served (no listener accepts, no connection is resumed) before the
//! old daemon acknowledged the Confirm: until then it may still take
//! everything back.

use crate::lot::{Adopted, ForwardId};
use crate::{
    blocking, peer, Channel, Error, FdTable, Message, Peer, RefusalCode, State, ACK, STEP,
};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Why a take-over got nothing; the running daemon serves on.
#[derive(Debug, thiserror::Error)]
pub enum TakeError {
    #[error("{path}: {source}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no answer from the running edgelinkd: {0}")]
    NoAnswer(std::io::Error),
    #[error(
        "the running edgelinkd does not hand over (it answered {0:?}; \
         it predates hand-overs: restart it instead)"
    )]
    NotAHandover(String),
    #[error("expected Welcome, got {0}")]
    NoWelcome(String),
    #[error("the running edgelinkd did not acknowledge the Confirm: nothing was taken over: {0}")]
    NotAcknowledged(Error),
    #[error(transparent)]
    Wire(#[from] Error),
    #[error("hand-over socket: {0}")]
    Io(#[from] std::io::Error),
}

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
    pub async fn confirm(mut self) -> Result<Self, TakeError> {
        let mut ch = self.channel;
        let protocol = self.protocol;
        let (r, ch) = blocking(move || {
            let r = commit(&mut ch, protocol);
            (r, ch)
        })
        .await?;
        self.channel = ch;
        r.map_err(TakeError::NotAcknowledged)?;
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

fn commit(ch: &mut Channel, protocol: u32) -> Result<(), Error> {
    if let Err(e) = ch.send(&Message::Confirm {}) {
        // The old daemon gave up and closed its end: its last word says why.
        return Err(match ch.expect("Ack") {
            Err(refused @ Error::Refused { .. }) => refused,
            _ => e,
        });
    }
    if protocol < 2 {
        return Ok(());
    }
    ch.set_read_timeout(None)?;
    match ch.expect("Ack")? {
        Message::Ack {} => Ok(()),
        m => Err(Error::Unexpected {
            expected: "Ack",
            got: m.name().into(),
        }),
    }
}

/// Ask the daemon whose control socket is `socket` for everything it
/// serves, in `protocol` (and again in the oldest one if it speaks only
/// that). Errors: it refused (other than [`Takeover::HandedOver`]) or the
/// hand-over failed on the way; the old daemon serves on then.
pub async fn take(socket: &Path, protocol: u32, instance: &str) -> Result<Takeover, TakeError> {
    let path = socket.to_path_buf();
    let hello = peer(protocol, instance);
    let started = Instant::now();
    let p = path.clone();
    let mut r = blocking(move || take_blocking(&p, hello)).await?;
    // A daemon of protocol 1 (before the Ack) refuses protocol 2: ask it
    // again in its own, so that an upgrade from it takes over too.
    if let Err(Refusal::Protocol(reason)) = &r {
        if protocol == crate::PROTOCOL {
            tracing::info!(%reason, "--takeover: asking again in hand-over protocol {}", crate::OLDEST_PROTOCOL);
            let hello = peer(crate::OLDEST_PROTOCOL, instance);
            r = blocking(move || take_blocking(&path, hello)).await?;
        }
    }
    let r = r.map_err(|e| match e {
        Refusal::Protocol(e) => TakeError::Wire(e),
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
    Protocol(Error),
    Other(TakeError),
}

impl<E: Into<TakeError>> From<E> for Refusal {
    fn from(e: E) -> Refusal {
        Refusal::Other(e.into())
    }
}

fn take_blocking(path: &Path, hello: Peer) -> Result<Takeover, Refusal> {
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
        Err(source) => {
            return Err(TakeError::Connect {
                path: path.to_path_buf(),
                source,
            }
            .into())
        }
    };
    s.set_read_timeout(Some(STEP))?;
    s.set_write_timeout(Some(STEP))?;
    s.write_all(format!("{}\n", crate::HANDOVER_LINE).as_bytes())?;
    let line = answer_line(&mut s)?;
    if line != ACK {
        return Err(TakeError::NotAHandover(line).into());
    }
    let mut ch = Channel::new(s, STEP)?;
    let protocol = hello.protocol;
    ch.send(&Message::Hello(hello))?;
    let from = match ch.expect("Welcome") {
        Ok(Message::Welcome(p)) => p,
        Ok(m) => return Err(TakeError::NoWelcome(m.name().into()).into()),
        Err(Error::Refused {
            reason,
            code: RefusalCode::HandedOver,
        }) => return Ok(Takeover::HandedOver(reason)),
        Err(
            e @ Error::Refused {
                code: RefusalCode::Protocol,
                ..
            },
        ) => return Err(Refusal::Protocol(e)),
        Err(e) => return Err(TakeError::Wire(e).into()),
    };
    let taken = receive(&mut ch).and_then(|(state, table)| adopt(state, table, protocol, &ch));
    match taken {
        Ok(mut t) => {
            t.from = from.instance;
            Ok(Takeover::Taken(t))
        }
        Err(e) => {
            let _ = ch.send(&Message::Abort {
                reason: e.to_string(),
            });
            Err(TakeError::Wire(e).into())
        }
    }
}

/// The answer line to `handover`, a byte at a time: the frames follow it.
fn answer_line(s: &mut UnixStream) -> Result<String, TakeError> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while line.len() < 256 {
        match s.read(&mut b) {
            Ok(0) => break,
            Ok(_) if b[0] == b'\n' => break,
            Ok(_) => line.push(b[0]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(TakeError::NoAnswer(e)),
        }
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

fn receive(ch: &mut Channel) -> Result<(State, FdTable), Error> {
    let (n, state) = match ch.expect("Inventory")? {
        Message::Inventory { fds, state } => (fds as usize, state),
        m => {
            return Err(Error::Unexpected {
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

/// What arrived, unpacked, with the channel to confirm on.
fn adopt(state: State, t: FdTable, protocol: u32, ch: &Channel) -> Result<Taken, Error> {
    let u = crate::pack::unpack(state, t)?;
    let channel = Channel::new(ch.socket().try_clone().map_err(Error::Io)?, STEP)?;
    Ok(Taken {
        channel,
        summary: format!(
            "taking over {} forwards: {} listeners, {} connections, {} UDP sessions",
            u.adopted.len(),
            u.counts.listeners,
            u.counts.connections,
            u.counts.sessions
        ),
        from: String::new(),
        protocol,
        control: u.control,
        status: u.status,
        adopted: u.adopted,
    })
}
