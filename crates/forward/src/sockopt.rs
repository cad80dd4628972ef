//! The two socket options the standard crates do not wrap: asking a TCP
//! listener to record each connection's ingress interface, and reading it
//! back from an accepted connection (Linux `IP_PKTOPTIONS` /
//! `IPV6_2292PKTOPTIONS`: the kernel keeps the interface a connection's SYN
//! came in on). Also SO_LINGER 0 on a socket known only by its descriptor
//! (a relay that owns it is being dropped).

use std::io;
use std::os::fd::{AsRawFd, RawFd};

const IP_PKTINFO: libc::c_int = 8;
const IP_PKTOPTIONS: libc::c_int = 9;
const IPV6_2292PKTOPTIONS: libc::c_int = 6;
const IPV6_RECVPKTINFO: libc::c_int = 49;
const IPV6_PKTINFO: libc::c_int = 50;

fn set_int(fd: RawFd, level: libc::c_int, opt: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: fd is an open socket owned by the caller; the option value is
    // a c_int that lives for the duration of the call.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            &v as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Give a UDP socket a receive buffer of `bytes`: SO_RCVBUFFORCE (the
/// daemon has CAP_NET_ADMIN) past `net.core.rmem_max`, else as much as
/// SO_RCVBUF allows. A relay under a burst drops at the socket whose buffer
/// fills first; the kernel's default (~212 KB, ~90 datagrams of 1400 bytes)
/// is too small for a burst of replies.
pub fn grow_rcvbuf(s: &socket2::Socket, bytes: usize) {
    const SO_RCVBUFFORCE: libc::c_int = 33;
    let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    if set_int(s.as_raw_fd(), libc::SOL_SOCKET, SO_RCVBUFFORCE, v).is_err() {
        let _ = s.set_recv_buffer_size(bytes);
    }
}

/// Cap a TCP socket's send and receive buffers at `bytes` (the kernel
/// doubles the value for its bookkeeping and stops autotuning them); 0
/// leaves them to the kernel. On a listener, before connections arrive:
/// accepted sockets inherit both (and the window scale follows). What a
/// client that never reads can make the daemon hold is bounded by it
/// (docs/configuration.md, "Memory").
pub fn cap_buffers(s: &impl AsRawFd, bytes: usize) {
    if bytes == 0 {
        return;
    }
    let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
        if let Err(e) = set_int(s.as_raw_fd(), libc::SOL_SOCKET, opt, v) {
            tracing::debug!(error = %e, "cannot cap a socket buffer");
        }
    }
}

/// Make accepted connections remember their ingress interface.
pub fn enable_pktinfo(s: &impl AsRawFd, v6: bool) -> io::Result<()> {
    if v6 {
        set_int(s.as_raw_fd(), libc::IPPROTO_IPV6, IPV6_RECVPKTINFO, 1)
    } else {
        set_int(s.as_raw_fd(), libc::IPPROTO_IP, IP_PKTINFO, 1)
    }
}

/// The interface index an accepted TCP connection arrived on, if the
/// kernel says.
pub fn ingress_ifindex(s: &impl AsRawFd, v6: bool) -> Option<u32> {
    let mut buf = [0u8; 256];
    let mut len = buf.len() as libc::socklen_t;
    let (level, opt) = if v6 {
        (libc::IPPROTO_IPV6, IPV6_2292PKTOPTIONS)
    } else {
        (libc::IPPROTO_IP, IP_PKTOPTIONS)
    };
    // SAFETY: buf is a writable buffer of `len` bytes that outlives the call;
    // the kernel writes at most `len` bytes and updates `len`.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            level,
            opt,
            buf.as_mut_ptr() as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 {
        return None;
    }
    parse_pktinfo(&buf[..len as usize], v6)
}

/// Walk the control messages for IP_PKTINFO / IPV6_PKTINFO.
fn parse_pktinfo(mut b: &[u8], v6: bool) -> Option<u32> {
    let hdr = std::mem::size_of::<libc::cmsghdr>();
    let align = std::mem::size_of::<usize>();
    while b.len() >= hdr {
        let clen = usize::from_ne_bytes(b[..align].try_into().ok()?);
        let level = i32::from_ne_bytes(b[align..align + 4].try_into().ok()?);
        let kind = i32::from_ne_bytes(b[align + 4..align + 8].try_into().ok()?);
        if clen < hdr || clen > b.len() {
            return None;
        }
        let data = &b[hdr..clen];
        if !v6 && level == libc::IPPROTO_IP && kind == IP_PKTINFO && data.len() >= 4 {
            return Some(i32::from_ne_bytes(data[..4].try_into().ok()?) as u32);
        }
        if v6 && level == libc::IPPROTO_IPV6 && kind == IPV6_PKTINFO && data.len() >= 20 {
            return Some(u32::from_ne_bytes(data[16..20].try_into().ok()?));
        }
        let next = (clen + align - 1) & !(align - 1);
        if next >= b.len() {
            break;
        }
        b = &b[next..];
    }
    None
}

/// SO_LINGER {on, 0} on `fd`: its close(2) then sends a reset and drops
/// what is still queued, so the peer cannot take a cut stream for a whole
/// one. The caller must know `fd` is open and still the socket it means.
pub fn linger_zero(fd: RawFd) -> io::Result<()> {
    let v = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: the caller guarantees fd is an open socket; the option value
    // is a `linger` that lives for the duration of the call.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &v as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn loopback_connections_report_lo() {
        let l = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        enable_pktinfo(&l, false).unwrap();
        l.bind(
            &"127.0.0.1:0"
                .parse::<std::net::SocketAddr>()
                .unwrap()
                .into(),
        )
        .unwrap();
        l.listen(8).unwrap();
        let l: TcpListener = l.into();
        let _c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (a, _) = l.accept().unwrap();
        let lo = nix::net::if_::if_nametoindex("lo").unwrap();
        assert_eq!(ingress_ifindex(&a, false), Some(lo));
    }
}
