//! Room for what a datagram carries beyond its slot of a batch: one
//! anonymous mapping per batch, [`STRIDE`] bytes per datagram, of which
//! only the pages a long datagram writes become resident, and only until
//! [`Spill::release`] gives them back.
//!
//! A batch of 64 slots of 64 KiB on the heap would be 4 MiB that calloc
//! may touch whole (glibc serves it from its arenas once its mmap threshold
//! has grown) and that stays resident; the common datagram (a few hundred
//! bytes to 1.5 KiB) never reaches this mapping at all.

use std::io;
use std::ptr::{self, NonNull};

/// Bytes of the mapping per datagram: the largest datagram received.
pub(crate) const STRIDE: usize = 64 * 1024;

pub(crate) struct Spill {
    base: NonNull<u8>,
    slots: usize,
}

// SAFETY: the mapping belongs to this value alone, like a Box's memory;
// it is only reached through `&self` and `&mut self`.
unsafe impl Send for Spill {}

impl Spill {
    /// A mapping for `slots` datagrams; nothing of it is resident yet.
    pub(crate) fn new(slots: usize) -> io::Result<Spill> {
        let len = slots.max(1) * STRIDE;
        // SAFETY: an anonymous private mapping at an address the kernel
        // chooses: it overlaps nothing of ours.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave 0"))?;
        Ok(Spill {
            base,
            slots: slots.max(1),
        })
    }

    pub(crate) fn slots(&self) -> usize {
        self.slots
    }

    /// Start of slot `i` (`i < slots`), for the kernel to write into.
    pub(crate) fn slot_ptr(&mut self, i: usize) -> *mut u8 {
        assert!(i < self.slots);
        // SAFETY: `i * STRIDE` is within the mapping.
        unsafe { self.base.as_ptr().add(i * STRIDE) }
    }

    /// Slot `i`, whole.
    pub(crate) fn slot(&self, i: usize) -> &[u8] {
        assert!(i < self.slots);
        // SAFETY: the slot lies within the mapping, which is readable and
        // lives as long as `self`; anonymous pages read as zeros until
        // written, so every byte is initialised.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(i * STRIDE), STRIDE) }
    }

    pub(crate) fn slot_mut(&mut self, i: usize) -> &mut [u8] {
        assert!(i < self.slots);
        // SAFETY: as in `slot`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().add(i * STRIDE), STRIDE) }
    }

    /// Give the pages of slots `first..=last` back to the kernel: they read
    /// as zeros again and are no longer resident.
    pub(crate) fn release(&mut self, first: usize, last: usize) {
        let last = last.min(self.slots - 1);
        if first > last {
            return;
        }
        // SAFETY: the range is whole slots of the mapping (page-aligned,
        // since STRIDE is a multiple of the page size), and no reference
        // into it outlives this `&mut self`.
        let r = unsafe {
            libc::madvise(
                self.base.as_ptr().add(first * STRIDE).cast(),
                (last + 1 - first) * STRIDE,
                libc::MADV_DONTNEED,
            )
        };
        if r != 0 {
            tracing::debug!(error = %io::Error::last_os_error(), "madvise(MADV_DONTNEED) of UDP spill pages");
        }
    }

    /// Pages of the mapping resident now (mincore(2)), for tests.
    #[cfg(test)]
    pub(crate) fn resident_pages(&self) -> usize {
        // SAFETY: sysconf only reads a value.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let len = self.slots * STRIDE;
        let mut vec = vec![0u8; len.div_ceil(page)];
        // SAFETY: the range is the mapping; `vec` has one byte per page.
        let r = unsafe { libc::mincore(self.base.as_ptr().cast(), len, vec.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore: {}", io::Error::last_os_error());
        vec.iter().filter(|&&b| b & 1 != 0).count()
    }
}

impl Drop for Spill {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, of that length, unmapped once;
        // no reference into it outlives `self`.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.slots * STRIDE);
        }
    }
}
