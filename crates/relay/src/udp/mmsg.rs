//! recvmmsg(2) and sendmmsg(2) over buffers that are reused from call to
//! call: no allocation per datagram or per batch.
//!
//! The message headers point into the buffers, so they are built on the
//! stack for the length of one call and never kept: the reusable state
//! ([`RecvBatch`]) holds no pointer and can live in a task across awaits.
//! (nix's `MultiHeaders` keeps pointers, so it could not.)
//!
//! Each datagram of a batch is received into a [`SLOT_SIZE`] slot on the
//! heap, and what goes beyond it into that datagram's slot of a [`Spill`]
//! mapping (two iovecs per message), up to [`DATAGRAM_MAX`] in all: the
//! kernel never truncates a UDP datagram, and a short one touches no spill
//! page. A long one is made whole in its spill slot (its first
//! [`SLOT_SIZE`] bytes copied in front) and the pages are given back by
//! [`RecvBatch::release`] once the batch was passed on.

mod spill;

use socket2::SockAddr;
use std::io::{self, IoSlice};
use std::mem;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr;

use spill::Spill;

/// The heap slot of each datagram of a batch: enough for the common ones
/// (up to an Ethernet MTU), the rest spills (see the module's
/// documentation).
pub(crate) const SLOT_SIZE: usize = 2048;
/// Largest datagram received whole: more than UDP can carry.
pub(crate) const DATAGRAM_MAX: usize = spill::STRIDE;
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
    /// Bytes of the datagram (at most [`DATAGRAM_MAX`]).
    pub len: usize,
    pub peer: Option<SocketAddr>,
    /// The interface it came in through (IP_PKTINFO / IPV6_PKTINFO).
    pub ifindex: Option<u32>,
    pub local: Option<Local>,
    /// The datagram was longer than the buffer (only without a spill
    /// mapping: then the buffer is [`SLOT_SIZE`]).
    pub truncated: bool,
}

/// Buffers for one batch of received datagrams.
pub(crate) struct RecvBatch {
    data: Box<[u8]>,
    /// None if it could not be mapped: datagrams over [`SLOT_SIZE`] are
    /// then truncated (and dropped by the relay).
    spill: Option<Spill>,
    /// First and last slot that spilled since the last release.
    spilled: Option<(usize, usize)>,
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
        let spill = Spill::new(capacity)
            .inspect_err(|e| {
                tracing::warn!(error = %e, "no mapping for UDP datagrams over {SLOT_SIZE} bytes: they will be dropped");
            })
            .ok();
        RecvBatch {
            data: vec![0u8; capacity * SLOT_SIZE].into_boxed_slice(),
            spill,
            spilled: None,
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
        let len = self.meta[i].len;
        match &self.spill {
            Some(spill) if len > SLOT_SIZE => &spill.slot(i)[..len],
            _ => {
                let start = i * SLOT_SIZE;
                &self.data[start..start + len.min(SLOT_SIZE)]
            }
        }
    }

    /// Give back the pages that long datagrams of the last batches took
    /// (nothing to do, and no syscall, if there was none). Call it once the
    /// batch was passed on.
    pub(crate) fn release(&mut self) {
        if let (Some(spill), Some((first, last))) = (self.spill.as_mut(), self.spilled.take()) {
            spill.release(first, last);
        }
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
    // Two per message: its slot, then its spill slot (past the bytes the
    // slot's copy will take when the datagram is made whole).
    let mut iovs = [libc::iovec {
        iov_base: ptr::null_mut(),
        iov_len: 0,
    }; 2 * MAX_BATCH];
    // SAFETY: mmsghdr is a plain C struct for which all-zero bytes (null
    // pointers, zero lengths and flags) are a valid value.
    let mut hdrs: [libc::mmsghdr; MAX_BATCH] = unsafe { mem::zeroed() };
    let iov_base = iovs.as_mut_ptr();
    let names = batch.names.as_mut_ptr();
    let cmsgs = batch.cmsgs.as_mut_ptr();
    let mut spill = batch.spill.as_mut();
    for (i, chunk) in batch.data.chunks_exact_mut(SLOT_SIZE).take(n).enumerate() {
        iovs[2 * i] = libc::iovec {
            iov_base: chunk.as_mut_ptr().cast(),
            iov_len: chunk.len(),
        };
        let mut count = 1;
        if let Some(spill) = spill.as_mut().filter(|s| i < s.slots()) {
            iovs[2 * i + 1] = libc::iovec {
                iov_base: spill.slot_ptr(i).wrapping_add(SLOT_SIZE).cast(),
                iov_len: spill::STRIDE - SLOT_SIZE,
            };
            count = 2;
        }
        let h = &mut hdrs[i].msg_hdr;
        h.msg_name = names.wrapping_add(i).cast();
        h.msg_namelen = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        h.msg_iov = iov_base.wrapping_add(2 * i);
        h.msg_iovlen = count as _;
        h.msg_control = cmsgs.wrapping_add(i).cast();
        h.msg_controllen = CMSG_SIZE as _;
    }
    // SAFETY: the first `n` headers point to live buffers of the lengths
    // they give (one or two iovecs: into `data` and into the spill
    // mapping, one `sockaddr_storage`, one control buffer each), which
    // nothing else touches until the call returns; `n` is at most the
    // number of headers.
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
    let room = if batch.spill.is_some() {
        DATAGRAM_MAX
    } else {
        SLOT_SIZE
    };
    for (i, h) in hdrs.iter().take(got).enumerate() {
        let len = h.msg_len as usize;
        let (ifindex, local) = pktinfo(&h.msg_hdr);
        batch.meta[i] = Meta {
            len: len.min(room),
            peer: socket_addr(&batch.names[i], h.msg_hdr.msg_namelen),
            ifindex,
            local,
            truncated: h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 || len > room,
        };
        if let Some(spill) = batch.spill.as_mut().filter(|_| len > SLOT_SIZE) {
            // Whole in its spill slot: the head in front of the tail.
            let head = &batch.data[i * SLOT_SIZE..(i + 1) * SLOT_SIZE];
            spill.slot_mut(i)[..SLOT_SIZE].copy_from_slice(head);
            batch.spilled = Some(match batch.spilled {
                Some((first, last)) => (first.min(i), last.max(i)),
                None => (i, i),
            });
        }
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
        let count = first_run(&msgs[i..n], gso);
        let j = i + count;
        let buf = &mut cmsgs[groups];
        let mut controllen = 0;
        if let Some(local) = from {
            controllen += encode_pktinfo(buf, controllen, local);
        }
        if count > 1 {
            // `len` is at most SLOT_SIZE here.
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

/// How many datagrams at the start of `msgs` [`send_batch`] sends as one
/// message: with `gso`, a run of one size (and a shorter last one) of at
/// most [`SLOT_SIZE`] bytes each; else 1. A longer datagram goes alone:
/// beyond any common MTU, a UDP_SEGMENT of it would only be refused, and
/// turn GSO off for the datagrams it suits.
pub(crate) fn first_run(msgs: &[IoSlice<'_>], gso: bool) -> usize {
    let n = msgs.len().min(MAX_BATCH);
    let Some(len) = msgs.first().map(|m| m.len()) else {
        return 0;
    };
    if !gso || len == 0 || len > SLOT_SIZE {
        return 1;
    }
    let limit = (GSO_MAX_BYTES / len).min(GSO_MAX_SEGMENTS);
    let mut j = 1;
    while j < n && j < limit && msgs[j].len() == len {
        j += 1;
    }
    // Only the last segment may be shorter.
    if j < n && j < limit && (1..len).contains(&msgs[j].len()) {
        j += 1;
    }
    j
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
pub(crate) mod tests;
