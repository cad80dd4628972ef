//! Socket options that neither nix nor socket2 wraps.

use std::io;
use std::os::fd::AsRawFd;
use tokio::net::TcpStream;

/// SO_RCVLOWAT (neither nix nor socket2 has it).
pub(crate) fn set_rcvlowat(stream: &TcpStream, bytes: usize) -> io::Result<()> {
    let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: the descriptor is open for the borrow of `stream`; the option
    // value is a c_int that lives across the call, and its size is passed.
    let r = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
