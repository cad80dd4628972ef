//! recvmmsg(2) and sendmmsg(2) over buffers that are reused from call to
//! call: no allocation per datagram or per batch.
//!
//! The message headers point into the buffers, so they are built on the
//! stack for the length of one call and never kept: the reusable state
//! ([`RecvBatch`]) holds no pointer and can live in a task across awaits.
//! (nix's `MultiHeaders` keeps pointers, so it could not.)

use socket2::SockAddr;
use std::io::{self, IoSlice};
use std::mem;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr;

/// Largest datagram relayed; longer ones are truncated by the kernel, and
/// then dropped and counted.
pub(crate) const DATAGRAM_SIZE: usize = 2048;
/// Most datagrams moved by one call.
pub(crate) const MAX_BATCH: usize = 64;
/// Room for an IP_PKTINFO or IPV6_PKTINFO control message (32 or 40 bytes)
/// and a UDP_SEGMENT one (24 bytes).
const CMSG_SIZE: usize = 64;

/// One datagram's control-message buffer, aligned for `cmsghdr`.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct CmsgBuf([u8; CMSG_SIZE]);

/// The local address a datagram was sent to, to send replies from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Local {
    /// `ipi_spec_dst` of IP_PKTINFO: the address to answer from.
    V4(Ipv4Addr),
    /// `ipi6_addr` of IPV6_PKTINFO (possibly IPv4-mapped).
    V6(Ipv6Addr),
}

/// What is known of one received datagram.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Meta {
    /// Bytes in the buffer (at most [`DATAGRAM_SIZE`]).
    pub len: usize,
    pub peer: Option<SocketAddr>,
    /// The interface it came in through (IP_PKTINFO / IPV6_PKTINFO).
    pub ifindex: Option<u32>,
    pub local: Option<Local>,
    /// The datagram was longer than the buffer.
    pub truncated: bool,
}

/// Buffers for one batch of received datagrams.
pub(crate) struct RecvBatch {
    data: Box<[u8]>,
    names: Box<[libc::sockaddr_storage]>,
    cmsgs: Box<[CmsgBuf]>,
    meta: Box<[Meta]>,
}

impl RecvBatch {
    /// Buffers for `capacity` datagrams (at most [`MAX_BATCH`]).
    pub(crate) fn new(capacity: usize) -> RecvBatch {
        let capacity = capacity.clamp(1, MAX_BATCH);
        // SAFETY: sockaddr_storage is a plain C struct of integers, for
        // which all-zero bytes are a valid value.
        let zero: libc::sockaddr_storage = unsafe { mem::zeroed() };
        RecvBatch {
            data: vec![0u8; capacity * DATAGRAM_SIZE].into_boxed_slice(),
            names: vec![zero; capacity].into_boxed_slice(),
            cmsgs: vec![CmsgBuf([0; CMSG_SIZE]); capacity].into_boxed_slice(),
            meta: vec![Meta::default(); capacity].into_boxed_slice(),
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.meta.len()
    }

    /// Datagram `i` of the last [`recv_batch`].
    pub(crate) fn datagram(&self, i: usize) -> &[u8] {
        let start = i * DATAGRAM_SIZE;
        &self.data[start..start + self.meta[i].len]
    }

    pub(crate) fn meta(&self, i: usize) -> &Meta {
        &self.meta[i]
    }
}

/// Receive up to `max` datagrams (at most the batch's capacity) without
/// blocking. Fails with `WouldBlock` when there is none.
pub(crate) fn recv_batch(
    fd: BorrowedFd<'_>,
    batch: &mut RecvBatch,
    max: usize,
) -> io::Result<usize> {
    let n = max.clamp(1, batch.capacity());
    let mut iovs = [libc::iovec {
        iov_base: ptr::null_mut(),
        iov_len: 0,
    }; MAX_BATCH];
    // SAFETY: mmsghdr is a plain C struct for which all-zero bytes (null
    // pointers, zero lengths and flags) are a valid value.
    let mut hdrs: [libc::mmsghdr; MAX_BATCH] = unsafe { mem::zeroed() };
    let iov_base = iovs.as_mut_ptr();
    let names = batch.names.as_mut_ptr();
    let cmsgs = batch.cmsgs.as_mut_ptr();
    for (i, (iov, chunk)) in iovs
        .iter_mut()
        .zip(batch.data.chunks_exact_mut(DATAGRAM_SIZE))
        .take(n)
        .enumerate()
    {
        iov.iov_base = chunk.as_mut_ptr().cast();
        iov.iov_len = chunk.len();
        let h = &mut hdrs[i].msg_hdr;
        h.msg_name = names.wrapping_add(i).cast();
        h.msg_namelen = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        h.msg_iov = iov_base.wrapping_add(i);
        h.msg_iovlen = 1;
        h.msg_control = cmsgs.wrapping_add(i).cast();
        h.msg_controllen = CMSG_SIZE as _;
    }
    // SAFETY: the first `n` headers point to live buffers of the lengths
    // they give (one iovec into `data`, one `sockaddr_storage`, one
    // control buffer each), which nothing else touches until the call
    // returns; `n` is at most the number of headers.
    let got = unsafe {
        libc::recvmmsg(
            fd.as_raw_fd(),
            hdrs.as_mut_ptr(),
            n as _,
            libc::MSG_DONTWAIT as _,
            ptr::null_mut(),
        )
    };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    let got = got as usize;
    for (i, h) in hdrs.iter().take(got).enumerate() {
        let len = h.msg_len as usize;
        let (ifindex, local) = pktinfo(&h.msg_hdr);
        batch.meta[i] = Meta {
            len: len.min(DATAGRAM_SIZE),
            peer: socket_addr(&batch.names[i], h.msg_hdr.msg_namelen),
            ifindex,
            local,
            truncated: h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 || len > DATAGRAM_SIZE,
        };
    }
    Ok(got)
}

/// Most datagrams in one UDP_SEGMENT send (the kernel's UDP_MAX_SEGMENTS).
const GSO_MAX_SEGMENTS: usize = 64;
/// Most payload bytes in one UDP_SEGMENT send (below the 64 KiB an IP
/// packet can carry, with room for the headers).
const GSO_MAX_BYTES: usize = 65000;

/// Send `msgs` (at most [`MAX_BATCH`]) without blocking, each to `to` (or
/// on a connected socket when `None`), from `from` when given. Returns how
/// many were sent; fails with `WouldBlock` when none could be.
///
/// With `gso`, runs of datagrams of one size (and a shorter last one) go
/// out as one message with UDP_SEGMENT: the kernel passes each run through
/// the stack once and cuts it into the same datagrams at the end (in
/// software if the device cannot). A kernel or path that refuses it fails
/// the call with EINVAL or EIO before anything of that message was sent;
/// see [`gso_refused`].
pub(crate) fn send_batch(
    fd: BorrowedFd<'_>,
    msgs: &[IoSlice<'_>],
    to: Option<&SockAddr>,
    from: Option<Local>,
    gso: bool,
) -> io::Result<usize> {
    let n = msgs.len().min(MAX_BATCH);
    if n == 0 {
        return Ok(0);
    }
    let mut cmsgs = [CmsgBuf([0; CMSG_SIZE]); MAX_BATCH];
    let mut counts = [0usize; MAX_BATCH];
    // SAFETY: as in `recv_batch`, all-zero is a valid mmsghdr.
    let mut hdrs: [libc::mmsghdr; MAX_BATCH] = unsafe { mem::zeroed() };
    // IoSlice is guaranteed to be ABI compatible with iovec.
    let iovs = msgs.as_ptr().cast::<libc::iovec>().cast_mut();
    let mut groups = 0;
    let mut i = 0;
    while i < n {
        let len = msgs[i].len();
        let mut j = i + 1;
        if gso && len > 0 {
            let limit = (GSO_MAX_BYTES / len).min(GSO_MAX_SEGMENTS);
            while j < n && j - i < limit && msgs[j].len() == len {
                j += 1;
            }
            // Only the last segment may be shorter.
            if j < n && j - i < limit && (1..len).contains(&msgs[j].len()) {
                j += 1;
            }
        }
        let count = j - i;
        let buf = &mut cmsgs[groups];
        let mut controllen = 0;
        if let Some(local) = from {
            controllen += encode_pktinfo(buf, controllen, local);
        }
        if count > 1 {
            // `len` is at most GSO_MAX_BYTES / 2 here.
            controllen += encode_cmsg(
                buf,
                controllen,
                libc::SOL_UDP,
                libc::UDP_SEGMENT,
                len as u16,
            );
        }
        let h = &mut hdrs[groups].msg_hdr;
        if let Some(to) = to {
            h.msg_name = to.as_ptr().cast_mut().cast();
            h.msg_namelen = to.len();
        }
        h.msg_iov = iovs.wrapping_add(i);
        h.msg_iovlen = count as _;
        if controllen > 0 {
            h.msg_control = ptr::addr_of_mut!(*buf).cast::<libc::c_void>();
            h.msg_controllen = controllen as _;
        }
        counts[groups] = count;
        groups += 1;
        i = j;
    }
    // SAFETY: the first `groups` headers point to runs of live IoSlices
    // within `msgs` (read only by sendmmsg, whatever the pointer's
    // mutability), to `to` and to their own control buffer with its encoded
    // length; all outlive the call.
    let sent = unsafe {
        libc::sendmmsg(
            fd.as_raw_fd(),
            hdrs.as_mut_ptr(),
            groups as _,
            libc::MSG_DONTWAIT as _,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(counts[..sent as usize].iter().sum())
}

/// Whether a failed [`send_batch`] with `gso` may have failed for the
/// UDP_SEGMENT itself (no checksum offload on the path: EIO; a segment
/// size above the path's MTU or an old kernel: EINVAL, ENOPROTOOPT): send
/// without it from then on.
pub(crate) fn gso_refused(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::EIO | libc::ENOPROTOOPT | libc::EMSGSIZE)
    )
}

/// Write an IP_PKTINFO / IPV6_PKTINFO control message at `offset` that
/// makes the kernel send from `local`; returns the space it took.
fn encode_pktinfo(buf: &mut CmsgBuf, offset: usize, local: Local) -> usize {
    match local {
        Local::V4(addr) => encode_cmsg(
            buf,
            offset,
            libc::IPPROTO_IP,
            libc::IP_PKTINFO,
            libc::in_pktinfo {
                ipi_ifindex: 0,
                ipi_spec_dst: libc::in_addr {
                    s_addr: u32::from(addr).to_be(),
                },
                ipi_addr: libc::in_addr { s_addr: 0 },
            },
        ),
        Local::V6(addr) => encode_cmsg(
            buf,
            offset,
            libc::IPPROTO_IPV6,
            libc::IPV6_PKTINFO,
            libc::in6_pktinfo {
                ipi6_addr: libc::in6_addr {
                    s6_addr: addr.octets(),
                },
                ipi6_ifindex: 0,
            },
        ),
    }
}

/// Write one control message carrying `data` at `offset` (a multiple of
/// CMSG_SPACE, so aligned for `cmsghdr`); returns the space it took.
fn encode_cmsg<T: Copy>(
    buf: &mut CmsgBuf,
    offset: usize,
    level: libc::c_int,
    kind: libc::c_int,
    data: T,
) -> usize {
    let len = mem::size_of::<T>();
    // SAFETY: CMSG_SPACE and CMSG_LEN only compute sizes.
    let (space, cmsg_len) = unsafe {
        (
            libc::CMSG_SPACE(len as u32) as usize,
            libc::CMSG_LEN(len as u32) as usize,
        )
    };
    assert!(offset + space <= CMSG_SIZE, "control buffer too small");
    let header = libc::cmsghdr {
        cmsg_len: cmsg_len as _,
        cmsg_level: level,
        cmsg_type: kind,
    };
    // SAFETY: the buffer is CMSG_SIZE bytes and aligned for cmsghdr;
    // `offset` is 0 or the CMSG_SPACE of earlier messages, so aligned too,
    // and the header plus its data take `space` bytes, within the buffer
    // (asserted above). The data starts CMSG_LEN(0) bytes into the message,
    // as CMSG_DATA would say, and is written unaligned.
    unsafe {
        let base = buf.0.as_mut_ptr().add(offset);
        ptr::write(base.cast::<libc::cmsghdr>(), header);
        ptr::write_unaligned(base.add(libc::CMSG_LEN(0) as usize).cast::<T>(), data);
    }
    space
}

/// The ingress interface and local address from a received header's
/// IP_PKTINFO or IPV6_PKTINFO, if any.
fn pktinfo(hdr: &libc::msghdr) -> (Option<u32>, Option<Local>) {
    let mut found = (None, None);
    if hdr.msg_controllen == 0 || hdr.msg_control.is_null() {
        return found;
    }
    // SAFETY: `hdr` was filled by recvmmsg: msg_control and msg_controllen
    // describe our aligned control buffer holding that many bytes of
    // well-formed control messages, which CMSG_FIRSTHDR/CMSG_NXTHDR walk
    // within bounds; each payload is read only when cmsg_len says it is
    // complete, and unaligned reads are used for it.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(hdr);
        while !cmsg.is_null() {
            let c = &*cmsg;
            let data = libc::CMSG_DATA(cmsg);
            let have = (c.cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
            match (c.cmsg_level, c.cmsg_type) {
                (libc::IPPROTO_IP, libc::IP_PKTINFO)
                    if have >= mem::size_of::<libc::in_pktinfo>() =>
                {
                    let info = ptr::read_unaligned(data.cast::<libc::in_pktinfo>());
                    // Index 0: queued before IP_PKTINFO was on; says nothing.
                    if info.ipi_ifindex == 0 {
                        cmsg = libc::CMSG_NXTHDR(hdr, cmsg);
                        continue;
                    }
                    found = (
                        Some(info.ipi_ifindex as u32),
                        Some(Local::V4(Ipv4Addr::from(u32::from_be(
                            info.ipi_spec_dst.s_addr,
                        )))),
                    );
                }
                (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO)
                    if have >= mem::size_of::<libc::in6_pktinfo>() =>
                {
                    let info = ptr::read_unaligned(data.cast::<libc::in6_pktinfo>());
                    if info.ipi6_ifindex == 0 {
                        cmsg = libc::CMSG_NXTHDR(hdr, cmsg);
                        continue;
                    }
                    found = (
                        Some(info.ipi6_ifindex),
                        Some(Local::V6(Ipv6Addr::from(info.ipi6_addr.s6_addr))),
                    );
                }
                _ => {}
            }
            cmsg = libc::CMSG_NXTHDR(hdr, cmsg);
        }
    }
    found
}

/// A `sockaddr_storage` filled by the kernel, as a `SocketAddr`.
fn socket_addr(ss: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    match libc::c_int::from(ss.ss_family) {
        libc::AF_INET if len >= mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family is AF_INET and the kernel wrote a whole
            // sockaddr_in; sockaddr_storage is aligned for every sockaddr.
            let sin = unsafe { &*ptr::from_ref(ss).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 if len >= mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for AF_INET6 and sockaddr_in6.
            let sin6 = unsafe { &*ptr::from_ref(ss).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsFd;

    /// `recv_from` on a socket with SO_RCVTIMEO, again after an EINTR (a
    /// stop and continue of the test process makes one, signal(7)).
    pub(crate) fn recv_from(rx: &UdpSocket, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        loop {
            match rx.recv_from(buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => return r,
            }
        }
    }

    #[test]
    fn batches_round_trip_with_pktinfo() {
        let rx = UdpSocket::bind("0.0.0.0:0").unwrap();
        nix::sys::socket::setsockopt(&rx, nix::sys::socket::sockopt::Ipv4PacketInfo, &true)
            .unwrap();
        let port = rx.local_addr().unwrap().port();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to: SockAddr = SocketAddr::from(([127, 0, 0, 3], port)).into();
        let payloads: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 100 + i as usize]).collect();
        let slices: Vec<IoSlice<'_>> = payloads.iter().map(|p| IoSlice::new(p)).collect();
        assert_eq!(
            send_batch(tx.as_fd(), &slices, Some(&to), None, false).unwrap(),
            5
        );

        let mut batch = RecvBatch::new(8);
        let mut got = 0;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while got < 5 && std::time::Instant::now() < deadline {
            match recv_batch(rx.as_fd(), &mut batch, 8) {
                Ok(n) => {
                    for i in 0..n {
                        assert_eq!(batch.datagram(i), &payloads[got][..]);
                        let m = batch.meta(i);
                        assert_eq!(m.peer, Some(tx.local_addr().unwrap()));
                        assert_eq!(m.local, Some(Local::V4(Ipv4Addr::new(127, 0, 0, 3))));
                        assert!(m.ifindex.is_some_and(|i| i > 0));
                        assert!(!m.truncated);
                        got += 1;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(std::time::Duration::from_millis(1))
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(got, 5);

        // Answer from the address it was sent to.
        let answer = [IoSlice::new(b"pong")];
        let back: SockAddr = tx.local_addr().unwrap().into();
        let from = batch.meta(0).local;
        assert_eq!(
            send_batch(rx.as_fd(), &answer, Some(&back), from, false).unwrap(),
            1
        );
        tx.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 16];
        let (n, src) = recv_from(&tx, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"pong");
        assert_eq!(src, SocketAddr::from(([127, 0, 0, 3], port)));
    }

    #[test]
    fn flags_truncated_datagrams() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.send_to(&[1u8; DATAGRAM_SIZE + 1], rx.local_addr().unwrap())
            .unwrap();
        rx.set_nonblocking(true).unwrap();
        let mut batch = RecvBatch::new(2);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            match recv_batch(rx.as_fd(), &mut batch, 2) {
                Ok(n) => {
                    assert_eq!(n, 1);
                    assert!(batch.meta(0).truncated);
                    break;
                }
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(1))
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// Receive `n` datagrams from `rx` (blocking socket with a timeout).
    fn receive(rx: &UdpSocket, n: usize) -> Vec<(Vec<u8>, SocketAddr)> {
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let mut buf = vec![0u8; 65536];
        (0..n)
            .map(|i| {
                let (len, from) =
                    recv_from(rx, &mut buf).unwrap_or_else(|e| panic!("datagram {i} of {n}: {e}"));
                (buf[..len].to_vec(), from)
            })
            .collect()
    }

    /// Sizes that exercise the grouping: runs of one size, a shorter last
    /// one, a longer one right after, empty datagrams, a run longer than
    /// fits one 64 KiB message.
    fn mixed_payloads() -> Vec<Vec<u8>> {
        let mut sizes = vec![1000; 5];
        sizes.extend([300, 1000, 1000, 1400, 0, 0, 7]);
        sizes.extend(vec![1400; 50]);
        sizes.push(10);
        (0..sizes.len())
            .map(|i| (0..sizes[i]).map(|j| (i * 7 + j) as u8).collect())
            .collect()
    }

    #[test]
    fn gso_keeps_every_datagram_and_its_boundaries() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.connect(rx.local_addr().unwrap()).unwrap();
        let payloads = mixed_payloads();
        let slices: Vec<IoSlice<'_>> = payloads.iter().map(|p| IoSlice::new(p)).collect();
        let mut sent = 0;
        while sent < slices.len() {
            sent += send_batch(tx.as_fd(), &slices[sent..], None, None, true).unwrap();
        }
        assert_eq!(sent, payloads.len());
        let got = receive(&rx, payloads.len());
        for (i, ((data, from), want)) in got.iter().zip(&payloads).enumerate() {
            assert_eq!(data, want, "datagram {i}");
            assert_eq!(*from, tx.local_addr().unwrap());
        }
    }

    #[test]
    fn gso_with_pktinfo_answers_from_the_given_address() {
        let rx = UdpSocket::bind("0.0.0.0:0").unwrap();
        let port = rx.local_addr().unwrap().port();
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to: SockAddr = client.local_addr().unwrap().into();
        let payloads: Vec<Vec<u8>> = (0..20u8).map(|i| vec![i; 1200]).collect();
        let slices: Vec<IoSlice<'_>> = payloads.iter().map(|p| IoSlice::new(p)).collect();
        let from = Some(Local::V4(Ipv4Addr::new(127, 0, 0, 5)));
        assert_eq!(
            send_batch(rx.as_fd(), &slices, Some(&to), from, true).unwrap(),
            20
        );
        for (i, (data, src)) in receive(&client, 20).into_iter().enumerate() {
            assert_eq!(data, payloads[i]);
            assert_eq!(src, SocketAddr::from(([127, 0, 0, 5], port)));
        }
    }

    #[test]
    fn a_refused_gso_send_is_recognised() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.connect(rx.local_addr().unwrap()).unwrap();
        crate::sockopt::refuse_gso(&tx);
        let payloads: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i; 500]).collect();
        let slices: Vec<IoSlice<'_>> = payloads.iter().map(|p| IoSlice::new(p)).collect();
        let e = send_batch(tx.as_fd(), &slices, None, None, true).unwrap_err();
        assert!(gso_refused(&e), "{e}");
        // Without GSO the same datagrams go.
        assert_eq!(
            send_batch(tx.as_fd(), &slices, None, None, false).unwrap(),
            4
        );
        assert_eq!(receive(&rx, 4).len(), 4);
    }

    #[test]
    fn a_datagram_queued_before_pktinfo_was_on_has_no_interface() {
        // The kernel then reports ifindex 0 and address 0.0.0.0: unknown,
        // not an interface.
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.send_to(b"early", rx.local_addr().unwrap()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        nix::sys::socket::setsockopt(&rx, nix::sys::socket::sockopt::Ipv4PacketInfo, &true)
            .unwrap();
        tx.send_to(b"late", rx.local_addr().unwrap()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut batch = RecvBatch::new(4);
        assert_eq!(recv_batch(rx.as_fd(), &mut batch, 4).unwrap(), 2);
        assert_eq!(batch.datagram(0), b"early");
        assert_eq!((batch.meta(0).ifindex, batch.meta(0).local), (None, None));
        assert_eq!(batch.datagram(1), b"late");
        assert!(batch.meta(1).ifindex.is_some_and(|i| i > 0));
    }
}
