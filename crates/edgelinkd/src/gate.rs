//! Whether the daemon serves, hands over, or stops: a hand-over and a
//! shutdown never run at once, and one hand-over at a time.

use std::sync::Mutex;

/// Whether the daemon serves, hands over, or stops: a hand-over and a
/// shutdown never run at once.
#[derive(Default)]
pub struct Gate {
    phase: Mutex<Phase>,
    changed: tokio::sync::Notify,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Phase {
    #[default]
    Serving,
    HandingOver,
    Stopping,
}

impl Gate {
    fn set(&self, from: Phase, to: Phase) -> bool {
        let mut p = self.phase.lock().unwrap_or_else(|e| e.into_inner());
        if *p != from {
            return false;
        }
        *p = to;
        drop(p);
        self.changed.notify_waiters();
        true
    }

    /// Start a hand-over; `false` if one runs or the daemon is stopping.
    pub fn begin(&self) -> bool {
        self.set(Phase::Serving, Phase::HandingOver)
    }

    /// The hand-over failed: this daemon serves on.
    pub fn served_on(&self) {
        self.set(Phase::HandingOver, Phase::Serving);
    }

    /// Stop (SIGTERM): no hand-over starts from now on, and one under way
    /// ends first: if it succeeds this process exits from it; if it fails,
    /// this returns `true` once its state was taken back (a pass serves it
    /// again, so that its connections drain rather than close).
    pub async fn stop(&self) -> bool {
        let mut waited = false;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.set(Phase::Serving, Phase::Stopping) {
                return waited;
            }
            if *self.phase.lock().unwrap_or_else(|e| e.into_inner()) == Phase::Stopping {
                return waited;
            }
            if !waited {
                tracing::info!("stopping: waiting for the hand-over under way to end");
            }
            waited = true;
            changed.await;
        }
    }
}
