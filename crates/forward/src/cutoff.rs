//! What ends an attachment's relayed connections from outside: a
//! hand-over (they park), the attachment going (they are reset), or its
//! access rules changing (they stop, and go on if their client is still
//! let through: `clients.rs`). Each
//! connection waits on one token for both, not on a token and a watch:
//! the second wait was ~200 bytes of every idle connection's task.

use edgelink_handover::lot::Lot;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use tokio_util::sync::CancellationToken;

/// Why a connection's token was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// The attachment is gone: reset.
    Closed,
    /// A hand-over: parked into the lot.
    HandOver,
    /// The access rules changed: checked again.
    Revoked,
}

/// One per attachment, shared by the contexts of its forwards.
#[derive(Debug, Default)]
pub struct Cutoff {
    /// Set by [`Cutoff::close`]: a connection whose token was cancelled
    /// is reset, not parked.
    closed: AtomicBool,
    /// The parent of the connections' tokens: a child of the lot's token
    /// of the time. A hand-over cancels it; a hand-over that failed leaves
    /// the lot a fresh token, and the next connection a fresh parent.
    parent: Mutex<Option<CancellationToken>>,
}

impl Cutoff {
    /// A connection's token: cancelled when a hand-over starts or when
    /// the attachment closes; already cancelled if either happened.
    pub fn token(&self, lot: &Lot) -> CancellationToken {
        let mut parent = self.lock();
        if self.closed.load(Ordering::Acquire) {
            let t = CancellationToken::new();
            t.cancel();
            return t;
        }
        match parent.as_ref().filter(|p| !p.is_cancelled()) {
            Some(p) => p.child_token(),
            None => {
                let p = lot.token().child_token();
                let t = p.child_token();
                *parent = Some(p);
                t
            }
        }
    }

    /// The attachment is gone: every connection's token is cancelled,
    /// and a cancelled one means a reset ([`Cutoff::is_closed`]).
    pub fn close(&self) {
        let mut parent = self.lock();
        self.closed.store(true, Ordering::Release);
        if let Some(p) = parent.take() {
            p.cancel();
        }
    }

    /// The access rules changed: every connection's token is cancelled, so
    /// that each checks its client again; tokens taken from now on are
    /// fresh.
    pub fn revoke(&self) {
        if let Some(p) = self.lock().take() {
            p.cancel();
        }
    }

    /// Why a connection's token was cancelled.
    pub fn why(&self, lot: &Lot) -> Cut {
        if self.is_closed() {
            Cut::Closed
        } else if lot.token().is_cancelled() {
            Cut::HandOver
        } else {
            Cut::Revoked
        }
    }

    /// Whether the attachment is gone (a cancelled token is a reset then,
    /// not a park).
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn lock(&self) -> MutexGuard<'_, Option<CancellationToken>> {
        self.parent.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_cancelled_by_a_hand_over_or_the_close_and_fresh_after_a_reopen() {
        let lot = Lot::default();
        let cut = Cutoff::default();
        let a = cut.token(&lot);
        let b = cut.token(&lot);
        assert!(!a.is_cancelled() && !b.is_cancelled());
        // A hand-over: every token so far, and one taken meanwhile.
        lot.start_parking();
        assert!(a.is_cancelled() && b.is_cancelled());
        assert!(cut.token(&lot).is_cancelled());
        assert!(!cut.is_closed(), "a hand-over is a park, not a close");
        // It failed: the lot reopens, and new connections run again.
        lot.reopen();
        let c = cut.token(&lot);
        assert!(!c.is_cancelled());
        // The attachment goes: its connections are cut, and any new one.
        cut.close();
        assert!(cut.is_closed() && c.is_cancelled());
        assert!(cut.token(&lot).is_cancelled());
        // Another attachment's are not.
        let other = Cutoff::default();
        assert!(!other.token(&lot).is_cancelled());
    }

    #[test]
    fn a_revoke_cancels_the_tokens_so_far_and_says_so() {
        let lot = Lot::default();
        let cut = Cutoff::default();
        let a = cut.token(&lot);
        cut.revoke();
        assert!(a.is_cancelled());
        assert_eq!(cut.why(&lot), Cut::Revoked);
        let b = cut.token(&lot);
        assert!(!b.is_cancelled(), "a token after the revoke is fresh");
        lot.start_parking();
        assert!(b.is_cancelled());
        assert_eq!(cut.why(&lot), Cut::HandOver);
        cut.close();
        assert_eq!(cut.why(&lot), Cut::Closed);
    }
}
