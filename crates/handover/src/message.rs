//! The messages and the state they carry.

use crate::{Error, MAX_FDS};
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, SocketAddr};

/// One frame's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase", deny_unknown_fields)]
pub enum Message {
    /// New to old: who asks.
    Hello(Peer),
    /// Old to new: the hand-over goes ahead.
    Welcome(Peer),
    /// Old to new: it does not, and why. The old daemon keeps serving.
    Refused { reason: String, code: RefusalCode },
    /// Old to new: everything it served, then `fds` descriptors.
    Inventory { fds: u32, state: State },
    /// The next `count` descriptors ride on this frame.
    Fds { count: u32 },
    /// New to old: everything was taken. Protocol 1: the old daemon
    /// exits. Protocol 2: it answers `Ack` (and exits) or, when it gave up
    /// waiting, `Refused` (and serves on).
    Confirm {},
    /// New to old: something was wrong; the old daemon serves on.
    Abort { reason: String },
    /// Old to new (protocol 2), the answer to `Confirm`: everything is the
    /// new daemon's, the old one exits. The new daemon serves nothing
    /// before it has this.
    Ack {},
}

impl Message {
    /// Its name, for errors.
    pub fn name(&self) -> &'static str {
        match self {
            Message::Hello(_) => "Hello",
            Message::Welcome(_) => "Welcome",
            Message::Refused { .. } => "Refused",
            Message::Inventory { .. } => "Inventory",
            Message::Fds { .. } => "Fds",
            Message::Confirm {} => "Confirm",
            Message::Abort { .. } => "Abort",
            Message::Ack {} => "Ack",
        }
    }

    /// Parse one frame's bytes.
    pub fn decode(bytes: &[u8]) -> Result<Message, Error> {
        serde_json::from_slice(bytes).map_err(|e| Error::Malformed(e.to_string()))
    }

    pub fn encode(&self) -> Vec<u8> {
        // Serializing these types cannot fail (no maps with non-string
        // keys, no custom serializers).
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// A daemon's side of the greeting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Peer {
    /// [`crate::PROTOCOL`] of its build.
    pub protocol: u32,
    /// Its edgelinkd version, for logs.
    pub version: String,
    /// Who it is (a pod's UID in a DaemonSet): a daemon never takes back
    /// what it handed over.
    pub instance: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RefusalCode {
    /// The peers speak different protocols.
    Protocol,
    /// The asking instance handed everything to this daemon earlier (a
    /// container restarted after its hand-over): it must not take it back.
    HandedOver,
    /// A hand-over or a shutdown is under way already.
    Busy,
    /// Anything else (the daemon could not park its forwards, ...).
    Failed,
}

/// A descriptor: its place in the sequence sent after the inventory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Fd(pub u32);

/// Everything a daemon served.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct State {
    /// The instance that handed this over.
    pub instance: String,
    /// The control socket's listener (`<stateDir>/edgelinkd.sock`).
    pub control: Option<Fd>,
    /// The status server's listener (`--status-addr`).
    pub status: Option<Fd>,
    pub forwards: Vec<Forward>,
}

/// One forward of one attachment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Forward {
    pub container_id: String,
    pub ifname: String,
    /// The forward's name in the record.
    pub name: String,
    /// TCP listeners (one per worker and address family).
    #[serde(default)]
    pub listeners: Vec<Fd>,
    #[serde(default)]
    pub connections: Vec<Connection>,
    /// UDP: one per address family.
    #[serde(default)]
    pub udp: Vec<Udp>,
}

/// A TCP connection: relayed, or accepted and not yet connected to the
/// target (`upstream` None: the new daemon connects it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Connection {
    pub client: Fd,
    pub upstream: Option<Fd>,
    #[serde(default)]
    pub to_target: Direction,
    #[serde(default)]
    pub to_client: Direction,
    /// Without an upstream: it had its place under `maxConnections` and was
    /// connecting (the new daemon gives it a place before any waiting
    /// client). Protocol 2; left out when false, as protocol 1 has it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub admitted: bool,
    /// Without an upstream and not admitted: how long it had waited in the
    /// forward's queue (the new daemon queues the waiting clients longest
    /// wait first, and counts the queue timeout from their first arrival).
    /// Protocol 2; left out when 0, as protocol 1 has it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub waited_ms: u64,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One direction of a relayed connection.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Direction {
    /// The bytes in flight.
    pub pipe: Option<Pipe>,
    /// The source's end of file was read.
    #[serde(default)]
    pub eof: bool,
    /// The end of file was passed on: the direction is over.
    #[serde(default)]
    pub done: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Pipe {
    pub read: Fd,
    pub write: Fd,
    /// Bytes in it (checked against the kernel's count on arrival).
    pub len: usize,
}

/// A UDP listener and its sessions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Udp {
    pub listener: Fd,
    #[serde(default)]
    pub sessions: Vec<UdpSession>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UdpSession {
    pub peer: SocketAddr,
    pub local: Option<IpAddr>,
    pub socket: Fd,
    pub idle_ms: u64,
}

impl State {
    /// Every descriptor the state refers to, in the order of the fields.
    pub fn fds(&self) -> Vec<Fd> {
        let mut all: Vec<Fd> = self.control.iter().chain(&self.status).copied().collect();
        for f in &self.forwards {
            all.extend(&f.listeners);
            for c in &f.connections {
                all.push(c.client);
                all.extend(c.upstream);
                for d in [&c.to_target, &c.to_client] {
                    if let Some(p) = &d.pipe {
                        all.extend([p.read, p.write]);
                    }
                }
            }
            for u in &f.udp {
                all.push(u.listener);
                all.extend(u.sessions.iter().map(|s| s.socket));
            }
        }
        all
    }

    /// Every descriptor index is below `count` and used once, and every
    /// one of the `count` is used: no socket can be served twice, none is
    /// left over.
    pub fn check(&self, count: usize) -> Result<(), Error> {
        if count > MAX_FDS {
            return Err(Error::Malformed(format!(
                "{count} descriptors announced, at most {MAX_FDS}"
            )));
        }
        let mut seen = vec![false; count];
        for Fd(i) in self.fds() {
            let i = i as usize;
            match seen.get_mut(i) {
                None => {
                    return Err(Error::Malformed(format!(
                        "descriptor #{i} of {count} does not exist"
                    )))
                }
                Some(true) => {
                    return Err(Error::Malformed(format!("descriptor #{i} is used twice")))
                }
                Some(s) => *s = true,
            }
        }
        if let Some(i) = seen.iter().position(|s| !s) {
            return Err(Error::Malformed(format!(
                "descriptor #{i} of {count} is not used"
            )));
        }
        for f in &self.forwards {
            for c in &f.connections {
                if c.upstream.is_some() && (c.admitted || c.waited_ms > 0) {
                    return Err(Error::Malformed(format!(
                        "forward {}: a relayed connection has queue state",
                        f.name
                    )));
                }
                if c.upstream.is_none()
                    && (c.to_target != Direction::default() || c.to_client != Direction::default())
                {
                    return Err(Error::Malformed(format!(
                        "forward {}: a connection without an upstream has relay state",
                        f.name
                    )));
                }
                for d in [&c.to_target, &c.to_client] {
                    if d.done && (!d.eof || d.pipe.is_some()) {
                        return Err(Error::Malformed(format!(
                            "forward {}: a direction that is done has bytes or no end of file",
                            f.name
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Builds a [`State`]'s descriptor sequence: each pushed descriptor gets
/// the next index.
#[derive(Debug, Default)]
pub struct FdList {
    fds: Vec<std::os::fd::OwnedFd>,
}

impl FdList {
    pub fn push(&mut self, fd: impl Into<std::os::fd::OwnedFd>) -> Fd {
        self.fds.push(fd.into());
        Fd((self.fds.len() - 1) as u32)
    }

    pub fn len(&self) -> usize {
        self.fds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.fds.is_empty()
    }

    pub fn as_slice(&self) -> &[std::os::fd::OwnedFd] {
        &self.fds
    }
}

/// The received descriptors, each taken once by its [`Fd`].
#[derive(Debug, Default)]
pub struct FdTable {
    fds: Vec<Option<std::os::fd::OwnedFd>>,
}

impl FdTable {
    pub fn new(fds: Vec<std::os::fd::OwnedFd>) -> FdTable {
        FdTable {
            fds: fds.into_iter().map(Some).collect(),
        }
    }

    /// Descriptor `fd`; an error if there is none or it was taken already
    /// ([`State::check`] rules both out beforehand).
    pub fn take(&mut self, fd: Fd) -> Result<std::os::fd::OwnedFd, Error> {
        self.fds
            .get_mut(fd.0 as usize)
            .and_then(Option::take)
            .ok_or_else(|| Error::Malformed(format!("descriptor #{} is not there", fd.0)))
    }

    /// Descriptors nobody took.
    pub fn left(&self) -> usize {
        self.fds.iter().filter(|f| f.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> State {
        State {
            instance: "pod-a".into(),
            control: Some(Fd(0)),
            status: Some(Fd(1)),
            forwards: vec![Forward {
                container_id: "c".into(),
                ifname: "net1".into(),
                name: "api".into(),
                listeners: vec![Fd(2)],
                connections: vec![
                    Connection {
                        client: Fd(3),
                        upstream: Some(Fd(4)),
                        to_target: Direction {
                            pipe: Some(Pipe {
                                read: Fd(5),
                                write: Fd(6),
                                len: 10,
                            }),
                            eof: false,
                            done: false,
                        },
                        to_client: Direction {
                            pipe: None,
                            eof: true,
                            done: true,
                        },
                        admitted: false,
                        waited_ms: 0,
                    },
                    Connection {
                        client: Fd(7),
                        upstream: None,
                        to_target: Direction::default(),
                        to_client: Direction::default(),
                        admitted: false,
                        waited_ms: 1500,
                    },
                ],
                udp: vec![Udp {
                    listener: Fd(8),
                    sessions: vec![UdpSession {
                        peer: "10.0.0.1:5000".parse().unwrap(),
                        local: Some("10.0.0.2".parse().unwrap()),
                        socket: Fd(9),
                        idle_ms: 12,
                    }],
                }],
            }],
        }
    }

    #[test]
    fn messages_round_trip() {
        for m in [
            Message::Hello(Peer {
                protocol: 1,
                version: "0.1.0".into(),
                instance: "x".into(),
            }),
            Message::Refused {
                reason: "no".into(),
                code: RefusalCode::Protocol,
            },
            Message::Inventory {
                fds: 10,
                state: sample(),
            },
            Message::Fds { count: 3 },
            Message::Confirm {},
            Message::Abort { reason: "r".into() },
            Message::Ack {},
        ] {
            assert_eq!(Message::decode(&m.encode()).unwrap(), m);
        }
    }

    #[test]
    fn a_sample_state_checks_out() {
        sample().check(10).unwrap();
    }

    #[test]
    fn descriptors_missing_twice_or_left_over_are_refused() {
        let s = sample();
        let e = s.check(9).unwrap_err().to_string();
        assert!(e.contains("#9 of 9 does not exist"), "{e}");
        let e = s.check(11).unwrap_err().to_string();
        assert!(e.contains("#10 of 11 is not used"), "{e}");
        let mut twice = sample();
        twice.forwards[0].listeners.push(Fd(3));
        let e = twice.check(10).unwrap_err().to_string();
        assert!(e.contains("#3 is used twice"), "{e}");
        let e = s.check(MAX_FDS + 1).unwrap_err().to_string();
        assert!(e.contains("at most"), "{e}");
    }

    #[test]
    fn impossible_relay_states_are_refused() {
        let mut s = sample();
        s.forwards[0].connections[1].to_client.eof = true;
        assert!(s.check(10).is_err());
        let mut s = sample();
        s.forwards[0].connections[0].to_client.eof = false;
        assert!(s.check(10).is_err());
    }

    #[test]
    fn impossible_queue_states_are_refused() {
        let mut s = sample();
        s.forwards[0].connections[0].waited_ms = 1;
        let e = s.check(10).unwrap_err().to_string();
        assert!(e.contains("relayed connection has queue state"), "{e}");
        let mut s = sample();
        s.forwards[0].connections[0].admitted = true;
        assert!(s.check(10).is_err());
    }

    /// Protocol 1 has neither `admitted` nor `waitedMs` and refuses
    /// unknown fields: a connection without them is written as protocol 1
    /// writes it, and protocol 1's connections read as not admitted, not
    /// waiting.
    #[test]
    fn queue_fields_are_left_out_when_unset_and_default_when_absent() {
        let mut s = sample();
        s.forwards[0].connections[1].waited_ms = 0;
        let json = serde_json::to_string(&s).unwrap();
        assert!(
            !json.contains("admitted") && !json.contains("waitedMs"),
            "{json}"
        );
        let v1 = r#"{"client":7,"upstream":null}"#;
        let c: Connection = serde_json::from_str(v1).unwrap();
        assert!(!c.admitted && c.waited_ms == 0);
        let v2 = serde_json::to_string(&sample().forwards[0].connections[1]).unwrap();
        assert!(v2.contains(r#""waitedMs":1500"#), "{v2}");
    }

    #[test]
    fn unknown_fields_and_types_are_refused() {
        for bad in [
            r#"{"type":"confirm","extra":1}"#,
            r#"{"type":"takeEverything"}"#,
            r#"{"type":"fds","count":-1}"#,
            r#"{"type":"hello","protocol":1,"version":"x"}"#,
            "",
            "[]",
        ] {
            assert!(Message::decode(bad.as_bytes()).is_err(), "{bad}");
        }
    }
}
