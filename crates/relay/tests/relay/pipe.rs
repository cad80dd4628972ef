//! The pipe pool under the per-user pipe-pages limit.

use edgelink_relay::{PipePool, DEFAULT_PIPE_SIZE};

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_SYS_RESOURCE: u32 = 24;

/// Drop CAP_SYS_ADMIN and CAP_SYS_RESOURCE from the calling thread's
/// effective set (capabilities are per thread): its pipes then obey
/// fs.pipe-max-size and fs.pipe-user-pages-soft, as a non-root daemon's.
fn drop_pipe_privileges_of_this_thread() {
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget writes two CapData (version 3) for the calling thread
    // into `data`, which is that size.
    let r = unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut header as *mut CapHeader,
            data.as_mut_ptr(),
        )
    };
    assert_eq!(r, 0, "capget: {}", std::io::Error::last_os_error());
    for cap in [CAP_SYS_ADMIN, CAP_SYS_RESOURCE] {
        data[0].effective &= !(1u32 << cap);
    }
    // SAFETY: capset reads the header and two CapData; it changes only the
    // calling thread, which is a thread of this test alone.
    let r = unsafe {
        libc::syscall(
            libc::SYS_capset,
            &mut header as *mut CapHeader,
            data.as_ptr(),
        )
    };
    assert_eq!(r, 0, "capset: {}", std::io::Error::last_os_error());
}

#[test]
fn pipes_over_the_user_limit_are_undersized_not_refused() {
    // 2 MiB is above fs.pipe-max-size (1 MiB by default) and, 40 of them,
    // above fs.pipe-user-pages-soft (64 MiB by default): F_SETPIPE_SZ fails
    // with EPERM without CAP_SYS_RESOURCE.
    let limit = std::fs::read_to_string("/proc/sys/fs/pipe-max-size")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .unwrap_or(DEFAULT_PIPE_SIZE);
    let size = (limit * 2).max(2 * DEFAULT_PIPE_SIZE);
    let stats = std::thread::spawn(move || {
        drop_pipe_privileges_of_this_thread();
        let pool = PipePool::new(size, 8);
        let pipes: Vec<_> = (0..40)
            .map(|_| pool.acquire().expect("acquire never fails for the size"))
            .collect();
        assert!(pipes
            .iter()
            .all(|p| p.is_undersized() && p.capacity() < size));
        let stats = pool.stats();
        drop(pipes);
        // Undersized pipes are not kept: the pool gets full-sized ones once
        // the pressure is gone.
        assert_eq!(pool.stats().idle, 0);
        stats
    })
    .join()
    .unwrap();
    assert_eq!(stats.created, 40);
    assert_eq!(stats.undersized, 40);
    assert_eq!(stats.in_use, 40);
}
