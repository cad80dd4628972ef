//! Frames over a Unix stream socket, with descriptors as SCM_RIGHTS.

use crate::{Error, Message, MAX_FDS, MAX_FDS_PER_FRAME, MAX_FRAME};
use nix::errno::Errno;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// One end of a hand-over connection. Blocking, with a timeout on every
/// read and write; EINTR is retried.
#[derive(Debug)]
pub struct Channel {
    sock: UnixStream,
}

/// A message and the descriptors that came with it.
#[derive(Debug)]
pub struct Received {
    pub message: Message,
    pub fds: Vec<OwnedFd>,
}

impl Channel {
    /// Frames over `sock`, each read and write bounded by `timeout`.
    pub fn new(sock: UnixStream, timeout: Duration) -> Result<Channel, Error> {
        sock.set_nonblocking(false)?;
        sock.set_read_timeout(Some(timeout))?;
        sock.set_write_timeout(Some(timeout))?;
        Ok(Channel { sock })
    }

    /// Send one message (no descriptors).
    pub fn send(&mut self, m: &Message) -> Result<(), Error> {
        self.send_frame(&m.encode(), &[])
    }

    /// Send `fds` in `Fds` frames of at most [`MAX_FDS_PER_FRAME`].
    pub fn send_fds<F: AsFd>(&mut self, fds: &[F]) -> Result<(), Error> {
        for chunk in fds.chunks(MAX_FDS_PER_FRAME) {
            let raw: Vec<RawFd> = chunk.iter().map(|f| f.as_fd().as_raw_fd()).collect();
            let m = Message::Fds {
                count: chunk.len() as u32,
            };
            self.send_frame(&m.encode(), &raw)?;
        }
        Ok(())
    }

    fn send_frame(&mut self, body: &[u8], fds: &[RawFd]) -> Result<(), Error> {
        if body.len() > MAX_FRAME {
            return Err(Error::TooLarge(body.len()));
        }
        let len = (body.len() as u32).to_be_bytes();
        let iov = [IoSlice::new(&len), IoSlice::new(body)];
        let cmsg = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
        // The descriptors go with the first byte sent; what the kernel did
        // not take of the frame follows as plain bytes.
        let sent = loop {
            match sendmsg::<()>(
                self.sock.as_raw_fd(),
                &iov,
                cmsgs,
                MsgFlags::MSG_NOSIGNAL,
                None,
            ) {
                Err(Errno::EINTR) => continue,
                r => break r.map_err(std::io::Error::from)?,
            }
        };
        let mut frame = Vec::with_capacity(4 + body.len());
        frame.extend_from_slice(&len);
        frame.extend_from_slice(body);
        if sent < frame.len() {
            self.sock.write_all(&frame[sent..])?;
        }
        Ok(())
    }

    /// The next message, with the descriptors that rode on it.
    pub fn recv(&mut self) -> Result<Received, Error> {
        let mut head = [0u8; 4];
        let mut fds = Vec::new();
        let mut got = 0;
        // The descriptors arrive with the frame's first byte; the kernel
        // never merges bytes of two sends that carry descriptors.
        while got < head.len() {
            let mut cmsg = nix::cmsg_space!([RawFd; MAX_FDS_PER_FRAME]);
            let mut iov = [IoSliceMut::new(&mut head[got..])];
            let msg = match recvmsg::<()>(
                self.sock.as_raw_fd(),
                &mut iov,
                Some(&mut cmsg),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => {
                    return Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into())
                }
                r => r.map_err(std::io::Error::from)?,
            };
            for c in msg.cmsgs().map_err(std::io::Error::from)? {
                if let ControlMessageOwned::ScmRights(raw) = c {
                    // SAFETY: SCM_RIGHTS just installed these descriptors
                    // in this process; nothing else owns them.
                    fds.extend(
                        raw.into_iter()
                            .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                    );
                }
            }
            if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
                return Err(Error::Malformed(
                    "descriptors were cut off (more than one frame's worth)".into(),
                ));
            }
            if msg.bytes == 0 {
                return Err(Error::Closed(if got == 0 {
                    "between two messages"
                } else {
                    "inside a frame"
                }));
            }
            got += msg.bytes;
        }
        let len = u32::from_be_bytes(head) as usize;
        if len > MAX_FRAME {
            return Err(Error::TooLarge(len));
        }
        let mut body = vec![0u8; len];
        self.sock.read_exact(&mut body).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                Error::Closed("inside a frame")
            } else {
                e.into()
            }
        })?;
        let message = Message::decode(&body)?;
        match &message {
            Message::Fds { count } if *count as usize != fds.len() => {
                return Err(Error::Malformed(format!(
                    "an Fds frame announced {count} descriptors and carried {}",
                    fds.len()
                )))
            }
            Message::Fds { .. } => {}
            other if !fds.is_empty() => {
                return Err(Error::Malformed(format!(
                    "descriptors rode on a {} frame",
                    other.name()
                )))
            }
            _ => {}
        }
        Ok(Received { message, fds })
    }

    /// The next message, which must carry no descriptors; `Refused` and
    /// `Abort` become errors.
    pub fn expect(&mut self, what: &'static str) -> Result<Message, Error> {
        let r = self.recv()?;
        match r.message {
            Message::Refused { reason, code } => Err(Error::Refused { reason, code }),
            Message::Abort { reason } => Err(Error::Aborted(reason)),
            Message::Fds { .. } => Err(Error::Unexpected {
                expected: what,
                got: "Fds".into(),
            }),
            m => Ok(m),
        }
    }

    /// `count` descriptors, from `Fds` frames.
    pub fn recv_fds(&mut self, count: usize) -> Result<Vec<OwnedFd>, Error> {
        if count > MAX_FDS {
            return Err(Error::Malformed(format!(
                "{count} descriptors announced, at most {MAX_FDS}"
            )));
        }
        let mut all = Vec::with_capacity(count);
        while all.len() < count {
            let r = self.recv()?;
            match r.message {
                Message::Fds { .. } if all.len() + r.fds.len() <= count => all.extend(r.fds),
                Message::Fds { .. } => {
                    return Err(Error::Malformed(format!(
                        "more than the {count} descriptors announced"
                    )))
                }
                m => {
                    return Err(Error::Unexpected {
                        expected: "Fds",
                        got: m.name().into(),
                    })
                }
            }
        }
        Ok(all)
    }

    /// Bound each read by `timeout` from now on (`None`: wait until the
    /// peer writes or closes).
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> Result<(), Error> {
        Ok(self.sock.set_read_timeout(timeout)?)
    }

    /// The socket, e.g. to wait for the peer to close it.
    pub fn socket(&self) -> &UnixStream {
        &self.sock
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Fd, Peer, State, PROTOCOL};
    use std::io::Seek;

    fn pair() -> (Channel, Channel) {
        let (a, b) = UnixStream::pair().unwrap();
        (
            Channel::new(a, Duration::from_secs(5)).unwrap(),
            Channel::new(b, Duration::from_secs(5)).unwrap(),
        )
    }

    #[test]
    fn a_thousand_descriptors_cross_in_frames_of_253() {
        let (mut a, mut b) = pair();
        // Files with known contents: the received descriptors must be the
        // same open files, in order.
        let files: Vec<std::fs::File> = (0..1000)
            .map(|i| {
                let mut f = tempfile();
                write!(f, "{i}").unwrap();
                f
            })
            .collect();
        let sender = std::thread::spawn(move || {
            a.send(&Message::Inventory {
                fds: 1000,
                state: State::default(),
            })
            .unwrap();
            a.send_fds(&files).unwrap();
            a
        });
        let r = b.recv().unwrap();
        assert!(matches!(r.message, Message::Inventory { fds: 1000, .. }));
        let fds = b.recv_fds(1000).unwrap();
        sender.join().unwrap();
        assert_eq!(fds.len(), 1000);
        for (i, fd) in fds.into_iter().enumerate() {
            let mut f = std::fs::File::from(fd);
            f.rewind().unwrap();
            let mut s = String::new();
            f.read_to_string(&mut s).unwrap();
            assert_eq!(s, i.to_string());
        }
    }

    fn tempfile() -> std::fs::File {
        let dir = std::env::temp_dir();
        let path = dir.join(format!(
            "edgelink-handover-test-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f
    }

    #[test]
    fn a_peer_that_closes_or_lies_is_an_error() {
        let (mut a, mut b) = pair();
        a.send(&Message::Hello(Peer {
            protocol: PROTOCOL,
            version: "t".into(),
            instance: "i".into(),
        }))
        .unwrap();
        drop(a);
        assert!(matches!(b.expect("Hello").unwrap(), Message::Hello(_)));
        assert!(matches!(
            b.recv(),
            Err(Error::Closed("between two messages"))
        ));

        // An Fds frame that announces more than it carries.
        let (mut a, mut b) = pair();
        let f = tempfile();
        a.send_frame(&Message::Fds { count: 2 }.encode(), &[f.as_raw_fd()])
            .unwrap();
        let e = b.recv().unwrap_err().to_string();
        assert!(e.contains("announced 2 descriptors and carried 1"), "{e}");

        // Descriptors on a frame that is not Fds.
        let (mut a, mut b) = pair();
        a.send_frame(&Message::Confirm {}.encode(), &[f.as_raw_fd()])
            .unwrap();
        let e = b.recv().unwrap_err().to_string();
        assert!(e.contains("rode on a Confirm frame"), "{e}");

        // A length past the limit.
        let (a, mut b) = pair();
        (&a.sock).write_all(&u32::MAX.to_be_bytes()).unwrap();
        assert!(matches!(b.recv(), Err(Error::TooLarge(_))));

        // Half a frame, then gone.
        let (a, mut b) = pair();
        (&a.sock).write_all(&[0, 0, 0, 9, b'{']).unwrap();
        drop(a);
        assert!(matches!(b.recv(), Err(Error::Closed("inside a frame"))));

        // A refusal is an error that says why.
        let (mut a, mut b) = pair();
        a.send(&Message::Refused {
            reason: "protocol 2, this daemon speaks 1".into(),
            code: crate::RefusalCode::Protocol,
        })
        .unwrap();
        let e = b.expect("Welcome").unwrap_err().to_string();
        assert!(e.contains("protocol 2, this daemon speaks 1"), "{e}");
        let _ = Fd(0);
    }

    #[test]
    fn a_silent_peer_times_out() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut b = Channel::new(b, Duration::from_millis(100)).unwrap();
        let t = std::time::Instant::now();
        let e = b.recv().unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(2));
        assert!(
            matches!(e, Error::Io(ref io) if io.kind() == std::io::ErrorKind::TimedOut),
            "{e}"
        );
        drop(a);
    }
}
