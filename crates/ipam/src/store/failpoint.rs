//! Crash simulation for tests: a named point in the write path can be armed
//! (per thread) so that the operation stops right there, as if the process
//! had been killed, leaving the disk exactly as it is (no rollback); or so
//! that it fails there with an I/O error (the caller then cleans up as for a
//! real error). In non-test builds every check is a no-op.

use std::path::Path;

use super::IpamError;

#[cfg(test)]
thread_local! {
    /// (point name, hits to let pass, crash (true) or fail (false))
    static POINT: std::cell::Cell<Option<(&'static str, usize, bool)>> = const { std::cell::Cell::new(None) };
    static CRASHED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Arm `point`: the check after `skip` passing hits crashes.
#[cfg(test)]
pub(crate) fn arm(point: &'static str, skip: usize) {
    POINT.with(|p| p.set(Some((point, skip, true))));
    CRASHED.with(|c| c.set(false));
}

/// Arm `point` to fail with an I/O error (no crash) after `skip` passing hits.
#[cfg(test)]
pub(crate) fn arm_error(point: &'static str, skip: usize) {
    POINT.with(|p| p.set(Some((point, skip, false))));
    CRASHED.with(|c| c.set(false));
}

/// Disarm and forget a simulated crash ("the process restarted").
#[cfg(test)]
pub(crate) fn reset() {
    POINT.with(|p| p.set(None));
    CRASHED.with(|c| c.set(false));
}

/// Whether a simulated crash happened on this thread (then nothing may be
/// cleaned up: a killed process does not roll back).
#[cfg(test)]
pub(crate) fn crashed() -> bool {
    CRASHED.with(|c| c.get())
}

#[cfg(not(test))]
#[inline(always)]
pub(crate) fn crashed() -> bool {
    false
}

/// A crash point.
#[cfg(test)]
pub(crate) fn check(point: &'static str, path: &Path) -> Result<(), IpamError> {
    if crashed() {
        return Err(simulated(point, path));
    }
    let fire = POINT.with(|p| match p.get() {
        Some((name, 0, crash)) if name == point => {
            p.set(None);
            Some(crash)
        }
        Some((name, n, crash)) if name == point => {
            p.set(Some((name, n - 1, crash)));
            None
        }
        _ => None,
    });
    match fire {
        Some(true) => {
            CRASHED.with(|c| c.set(true));
            Err(simulated(point, path))
        }
        Some(false) => Err(IpamError::io(
            path,
            std::io::Error::other(format!("injected error at {point}")),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
fn simulated(point: &str, path: &Path) -> IpamError {
    IpamError::io(
        path,
        std::io::Error::other(format!("simulated crash at {point}")),
    )
}

#[cfg(not(test))]
#[inline(always)]
pub(crate) fn check(_point: &'static str, _path: &Path) -> Result<(), IpamError> {
    Ok(())
}
