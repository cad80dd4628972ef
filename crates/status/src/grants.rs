//! What edgelink-operator granted this node in the answers to its
//! heartbeats: which attachments (`namespace/pod`) may hold their
//! Device's virtual address, and until when. The heartbeat task writes it
//! ([`crate::heartbeat`]) and tells the operator what is held; the
//! attachments' virtual-address tasks (edgelink-node) read it.
//!
//! A grant runs from when its heartbeat was *sent* (so it ends here no
//! later than the operator thinks it does). Until the first answer nothing
//! is held: a daemon that just started must not take an address another
//! node holds. Without an operator (no webhook URL, or one that answers
//! heartbeats without grants) the node holds every address of its
//! attachments: one node, nothing to share.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Whose grants count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No answer yet: nothing is held.
    Unknown,
    /// No operator grants addresses: every attachment holds its own.
    Unmanaged,
    /// The operator's grants.
    Managed,
}

/// The operator's answer to a heartbeat (`run::server` there).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Answer {
    #[serde(default)]
    pub holds: Vec<String>,
    #[serde(default)]
    pub releases: Vec<String>,
    /// Absent: an operator without virtual addresses.
    #[serde(default)]
    pub hold_ms: Option<u64>,
}

#[derive(Debug)]
struct Inner {
    mode: Mode,
    until: HashMap<String, Instant>,
}

/// The grants, shared by the heartbeat and the attachments.
#[derive(Debug)]
pub struct Grants {
    inner: Mutex<Inner>,
    /// Bumped on every change of mode or grants.
    changed: watch::Sender<u64>,
}

impl Default for Grants {
    fn default() -> Self {
        Grants::new(Mode::Unknown)
    }
}

impl Grants {
    pub fn new(mode: Mode) -> Grants {
        Grants {
            inner: Mutex::new(Inner {
                mode,
                until: HashMap::new(),
            }),
            changed: watch::channel(0).0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    pub fn mode(&self) -> Mode {
        self.lock().mode
    }

    /// No operator grants addresses (or one again does).
    pub fn set_mode(&self, mode: Mode) {
        let moved = {
            let mut i = self.lock();
            let moved = i.mode != mode;
            i.mode = mode;
            if moved && mode != Mode::Managed {
                i.until.clear();
            }
            moved
        };
        if moved {
            self.bump();
        }
    }

    /// Until when `pod` may hold its address: `None` not now. Unmanaged:
    /// a while from `now` (renewed as long as the daemon runs).
    pub fn until(&self, pod: &str, now: Instant) -> Option<Instant> {
        let i = self.lock();
        match i.mode {
            Mode::Unknown => None,
            Mode::Unmanaged => Some(now + UNMANAGED_HOLD),
            Mode::Managed => i.until.get(pod).copied().filter(|u| *u > now),
        }
    }

    /// The pods with a running grant (what the next heartbeat says).
    pub fn holding(&self, now: Instant) -> Vec<String> {
        let i = self.lock();
        if i.mode != Mode::Managed {
            return Vec::new();
        }
        let mut v: Vec<String> = i
            .until
            .iter()
            .filter(|(_, u)| **u > now)
            .map(|(p, _)| p.clone())
            .collect();
        v.sort();
        v
    }

    /// The answer to a heartbeat sent at `sent`.
    pub fn answered(&self, a: &Answer, sent: Instant) {
        let Some(ms) = a.hold_ms else {
            self.set_mode(Mode::Unmanaged);
            return;
        };
        // An answer is not trusted with the clock: a grant of more than
        // MAX_HOLD is taken as MAX_HOLD (and `Instant + u64::MAX ms`
        // would panic the heartbeat task).
        let until = sent + Duration::from_millis(ms).min(MAX_HOLD);
        {
            let mut i = self.lock();
            i.mode = Mode::Managed;
            for p in &a.releases {
                i.until.remove(p);
            }
            for p in &a.holds {
                i.until.insert(p.clone(), until);
            }
            i.until.retain(|_, u| *u > sent);
        }
        // A renewal too: the holders extend their kernel lifetimes.
        self.bump();
    }

    /// Changes (and renewals) of the grants.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

/// The longest grant taken from an answer (the operator gives the
/// node-lost bound, 1.5 s by default).
pub const MAX_HOLD: Duration = Duration::from_secs(60);

/// An unmanaged address's lifetime in the kernel: renewed while the
/// daemon runs, gone this long after it stops for good.
pub const UNMANAGED_HOLD: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(holds: &[&str], releases: &[&str], ms: Option<u64>) -> Answer {
        Answer {
            holds: holds.iter().map(|s| s.to_string()).collect(),
            releases: releases.iter().map(|s| s.to_string()).collect(),
            hold_ms: ms,
        }
    }

    #[test]
    fn nothing_is_held_before_the_first_answer_and_a_grant_runs_from_the_heartbeat() {
        let g = Grants::default();
        let t0 = Instant::now();
        assert_eq!(g.until("hil/p-0", t0), None);
        let a: Answer = serde_json::from_str(r#"{"holds":["hil/p-0"],"holdMs":1500}"#).unwrap();
        g.answered(&a, t0);
        assert_eq!(g.mode(), Mode::Managed);
        assert_eq!(
            g.until("hil/p-0", t0 + Duration::from_millis(10)),
            Some(t0 + Duration::from_millis(1500))
        );
        assert_eq!(g.holding(t0), vec!["hil/p-0"]);
        assert_eq!(
            g.until("hil/p-0", t0 + Duration::from_millis(1500)),
            None,
            "ran out"
        );
        assert!(g.holding(t0 + Duration::from_secs(2)).is_empty());
        assert_eq!(g.until("hil/other-0", t0), None);
    }

    #[test]
    fn a_grant_longer_than_max_hold_is_cut_to_it() {
        let g = Grants::default();
        let t0 = Instant::now();
        g.answered(&answer(&["hil/p-0"], &[], Some(u64::MAX)), t0);
        assert_eq!(g.until("hil/p-0", t0), Some(t0 + MAX_HOLD));
    }

    #[test]
    fn a_release_ends_a_grant_at_once_and_an_operator_without_grants_leaves_it_unmanaged() {
        let g = Grants::default();
        let t0 = Instant::now();
        g.answered(&answer(&["hil/p-0"], &[], Some(1500)), t0);
        let mut rx = g.subscribe();
        rx.mark_unchanged();
        g.answered(
            &answer(&[], &["hil/p-0"], Some(1500)),
            t0 + Duration::from_millis(500),
        );
        assert!(rx.has_changed().unwrap());
        assert_eq!(g.until("hil/p-0", t0 + Duration::from_millis(600)), None);
        g.answered(&answer(&[], &[], None), t0);
        assert_eq!(g.mode(), Mode::Unmanaged);
        assert!(
            g.until("hil/any-0", t0).is_some(),
            "unmanaged: every attachment holds its own"
        );
        assert!(g.holding(t0).is_empty(), "and tells no operator");
    }
}
