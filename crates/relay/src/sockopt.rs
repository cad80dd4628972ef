//! Socket options that neither nix nor socket2 wraps.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

/// setsockopt(2) with an int value.
pub(crate) fn set_int(
    fd: impl AsFd,
    level: libc::c_int,
    option: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the descriptor is open for the borrow of `fd`; the option
    // value is a c_int that lives across the call, and its size is passed.
    let r = unsafe {
        libc::setsockopt(
            fd.as_fd().as_raw_fd(),
            level,
            option,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// TCP_INFO's byte counts of a connected socket: (bytes received, bytes
/// sent and acknowledged by the peer), FINs not counted.
pub(crate) fn tcp_bytes(fd: impl AsFd) -> io::Result<(u64, u64)> {
    // SAFETY: all-zero is a valid tcp_info (integers only).
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: the descriptor is open for the borrow of `fd`; `info` and
    // `len` live across the call, and `len` is `info`'s size; the kernel
    // writes at most that much and says how much in `len`.
    let r = unsafe {
        libc::getsockopt(
            fd.as_fd().as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // Both counts are sequence numbers, in which a FIN takes one: taken
    // off where the state says it is in (a reset socket, CLOSE, says
    // nothing: one more at most).
    const FIN_WAIT2: u8 = 5;
    const TIME_WAIT: u8 = 6;
    const CLOSE_WAIT: u8 = 8;
    const LAST_ACK: u8 = 9;
    const CLOSING: u8 = 11;
    let fin_in = matches!(info.tcpi_state, CLOSE_WAIT | LAST_ACK | CLOSING | TIME_WAIT);
    let fin_acked = matches!(info.tcpi_state, FIN_WAIT2 | TIME_WAIT);
    Ok((
        info.tcpi_bytes_received.saturating_sub(u64::from(fin_in)),
        info.tcpi_bytes_acked.saturating_sub(u64::from(fin_acked)),
    ))
}

/// SO_RCVLOWAT: the bytes a socket must hold before it reads as readable.
pub(crate) fn set_rcvlowat(stream: impl AsFd, bytes: usize) -> io::Result<()> {
    let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    set_int(stream, libc::SOL_SOCKET, libc::SO_RCVLOWAT, v)
}

/// SO_NO_CHECK: no UDP checksum; the kernel then refuses UDP_SEGMENT
/// (EINVAL), as a path without checksum offload does (EIO). For tests.
#[cfg(test)]
pub(crate) fn refuse_gso(socket: impl AsFd) {
    set_int(socket, libc::SOL_SOCKET, libc::SO_NO_CHECK, 1).expect("SO_NO_CHECK");
}

/// SIOCATMARK from asm-generic/sockios.h (the value of every architecture
/// this project builds for; libc does not export it for Linux).
const SIOCATMARK: libc::c_ulong = 0x8905;

/// Whether the next byte to read from a TCP socket is at the urgent mark
/// (the sender's MSG_OOB byte). splice(2) never reads across the mark:
/// only read(2) does, and with SO_OOBINLINE the urgent byte stays in line.
pub(crate) fn at_mark(fd: impl AsFd) -> io::Result<bool> {
    let mut at: libc::c_int = 0;
    // SAFETY: the descriptor is open for the borrow of `fd`; SIOCATMARK
    // writes one c_int through the pointer, which points at `at`, alive
    // across the call.
    let r = unsafe {
        libc::ioctl(
            fd.as_fd().as_raw_fd(),
            SIOCATMARK as _,
            &mut at as *mut libc::c_int,
        )
    };
    if r == 0 {
        Ok(at != 0)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// SIOCINQ (FIONREAD): the bytes a TCP socket has received and not yet
/// given to the reader.
pub(crate) fn unread(fd: impl AsFd) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: the descriptor is open for the borrow of `fd`; SIOCINQ
    // writes one c_int through the pointer, which points at `n`, alive
    // across the call.
    let r = unsafe {
        libc::ioctl(
            fd.as_fd().as_raw_fd(),
            libc::FIONREAD as _,
            &mut n as *mut libc::c_int,
        )
    };
    if r == 0 {
        Ok(usize::try_from(n).unwrap_or(0))
    } else {
        Err(io::Error::last_os_error())
    }
}
