//! A small synchronous rtnetlink client: just the link, address, route and
//! bridge-port operations edgelink needs, one request and its answer at a
//! time.
//!
//! A [`Handle`] talks to the network namespace its socket was opened in:
//! open one inside a pod's namespace (see `edgelink-netns`) and keep using
//! it from anywhere. This crate must not switch namespaces itself, spawn
//! processes or depend on an async runtime.
#![forbid(unsafe_code)]

mod addr;
mod link;
mod route;

pub use addr::Address;
pub use link::{BridgePortState, Link, LinkKind, MacvlanMode, NewLink};
pub use route::RouteSpec;

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use std::io;

/// What went wrong, with the operation and the object it was about.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("cannot open a netlink socket: {0}")]
    Socket(io::Error),
    #[error("{op}: {source}")]
    Kernel { op: String, source: io::Error },
    #[error("{op}: cannot decode the kernel's answer: {reason}")]
    Decode { op: String, reason: String },
    #[error("link {0:?} not found")]
    LinkNotFound(String),
}

impl NetlinkError {
    /// The errno the kernel answered with, if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NetlinkError::Kernel { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, NetlinkError::LinkNotFound(_))
            || matches!(
                self.errno(),
                Some(libc::ENODEV) | Some(libc::ENOENT) | Some(libc::ESRCH)
            )
    }

    pub fn is_exists(&self) -> bool {
        self.errno() == Some(libc::EEXIST)
    }

    pub fn is_not_supported(&self) -> bool {
        matches!(self.errno(), Some(libc::EOPNOTSUPP))
    }
}

pub type Result<T> = std::result::Result<T, NetlinkError>;

/// A route netlink socket bound to the namespace it was opened in.
pub struct Handle {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl Handle {
    /// Open a socket in the calling thread's current network namespace.
    pub fn new() -> Result<Handle> {
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(NetlinkError::Socket)?;
        socket.bind_auto().map_err(NetlinkError::Socket)?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(NetlinkError::Socket)?;
        // Extended acks give readable kernel messages; not fatal if absent.
        let _ = socket.set_ext_ack(true);
        Ok(Handle {
            socket,
            seq: 0,
            buf: vec![0; 64 * 1024],
        })
    }

    fn send(&mut self, msg: RouteNetlinkMessage, flags: u16, op: &str) -> Result<u32> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = self.seq;
        let mut nl = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        nl.finalize();
        let mut out = vec![0u8; nl.buffer_len()];
        nl.serialize(&mut out);
        self.socket
            .send(&out, 0)
            .map_err(|source| NetlinkError::Kernel {
                op: op.to_string(),
                source,
            })?;
        Ok(self.seq)
    }

    /// Send a request that changes something and wait for its ack.
    fn request(&mut self, msg: RouteNetlinkMessage, flags: u16, op: &str) -> Result<()> {
        let seq = self.send(msg, NLM_F_REQUEST | NLM_F_ACK | flags, op)?;
        loop {
            for m in self.recv(op)? {
                if m.header.sequence_number != seq {
                    continue;
                }
                match m.payload {
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            None => Ok(()),
                            Some(_) => Err(NetlinkError::Kernel {
                                op: op.to_string(),
                                source: e.to_io(),
                            }),
                        }
                    }
                    NetlinkPayload::Done(_) => return Ok(()),
                    _ => {}
                }
            }
        }
    }

    /// Send a get (dump or single) and collect every answer.
    fn query(
        &mut self,
        msg: RouteNetlinkMessage,
        dump: bool,
        op: &str,
    ) -> Result<Vec<RouteNetlinkMessage>> {
        let flags = if dump {
            NLM_F_REQUEST | NLM_F_DUMP
        } else {
            NLM_F_REQUEST
        };
        let seq = self.send(msg, flags, op)?;
        let mut out = Vec::new();
        loop {
            for m in self.recv(op)? {
                if m.header.sequence_number != seq {
                    continue;
                }
                match m.payload {
                    NetlinkPayload::InnerMessage(inner) => {
                        out.push(inner);
                        if !dump {
                            return Ok(out);
                        }
                    }
                    NetlinkPayload::Done(_) => return Ok(out),
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            None => Ok(out),
                            Some(_) => Err(NetlinkError::Kernel {
                                op: op.to_string(),
                                source: e.to_io(),
                            }),
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    fn recv(&mut self, op: &str) -> Result<Vec<NetlinkMessage<RouteNetlinkMessage>>> {
        let n = loop {
            match self.socket.recv(&mut &mut self.buf[..], 0) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    return Err(NetlinkError::Kernel {
                        op: op.to_string(),
                        source,
                    })
                }
            }
        };
        let mut msgs = Vec::new();
        let mut offset = 0;
        while offset < n {
            let bytes = &self.buf[offset..n];
            let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(bytes).map_err(|e| {
                NetlinkError::Decode {
                    op: op.to_string(),
                    reason: e.to_string(),
                }
            })?;
            let len = msg.header.length as usize;
            if len == 0 {
                break;
            }
            offset += (len + 3) & !3;
            msgs.push(msg);
        }
        Ok(msgs)
    }
}
