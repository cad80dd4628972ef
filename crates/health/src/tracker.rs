//! The rise/fall state machine of one device: pure, fed with outcomes
//! and the time they came.

use std::fmt;
use std::time::Duration;

/// What the probes say of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Not enough results yet.
    Unknown,
    Reachable,
    Unreachable,
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            State::Unknown => "unknown",
            State::Reachable => "reachable",
            State::Unreachable => "unreachable",
        })
    }
}

/// One device's state and what led to it. Times are Unix milliseconds.
#[derive(Debug, Clone)]
pub struct Tracker {
    pub state: State,
    /// The last transition (or the start).
    pub since_ms: u64,
    /// The last successful probe.
    pub last_seen_ms: Option<u64>,
    /// The last probe, whatever its outcome.
    pub checked_at_ms: Option<u64>,
    /// Of the last successful probe.
    pub latency: Option<Duration>,
    /// Of the last failed probe; cleared by a success.
    pub error: Option<String>,
    pub probes_total: u64,
    pub failures_total: u64,
    /// Probes not sent (the device had no free place).
    pub skipped_total: u64,
    rise: u32,
    fall: u32,
    successes: u32,
    failures: u32,
}

impl Tracker {
    /// `fall` consecutive failures make a device unreachable, `rise`
    /// consecutive successes reachable (both at least 1).
    pub fn new(fall: u32, rise: u32, now_ms: u64) -> Tracker {
        Tracker {
            state: State::Unknown,
            since_ms: now_ms,
            last_seen_ms: None,
            checked_at_ms: None,
            latency: None,
            error: None,
            probes_total: 0,
            failures_total: 0,
            skipped_total: 0,
            rise: rise.max(1),
            fall: fall.max(1),
            successes: 0,
            failures: 0,
        }
    }

    /// A probe that worked; true if the state changed.
    pub fn success(&mut self, latency: Duration, now_ms: u64) -> bool {
        self.probes_total += 1;
        self.checked_at_ms = Some(now_ms);
        self.last_seen_ms = Some(now_ms);
        self.latency = Some(latency);
        self.error = None;
        self.failures = 0;
        self.successes = self.successes.saturating_add(1);
        self.settle(self.successes >= self.rise, State::Reachable, now_ms)
    }

    /// A probe that failed with `error`; true if the state changed.
    pub fn failure(&mut self, error: String, now_ms: u64) -> bool {
        self.probes_total += 1;
        self.failures_total += 1;
        self.checked_at_ms = Some(now_ms);
        self.error = Some(error);
        self.successes = 0;
        self.failures = self.failures.saturating_add(1);
        self.settle(self.failures >= self.fall, State::Unreachable, now_ms)
    }

    /// A probe not sent: counted, nothing else changes (streaks included).
    pub fn skipped(&mut self) {
        self.skipped_total += 1;
    }

    fn settle(&mut self, enough: bool, to: State, now_ms: u64) -> bool {
        if !enough || self.state == to {
            return false;
        }
        self.state = to;
        self.since_ms = now_ms;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_state_moves_only_after_enough_consecutive_results() {
        let mut t = Tracker::new(2, 3, 1000);
        assert_eq!((t.state, t.since_ms), (State::Unknown, 1000));
        assert!(!t.success(MS, 1100));
        assert!(!t.success(MS, 1200));
        assert!(t.success(MS, 1300));
        assert_eq!((t.state, t.since_ms), (State::Reachable, 1300));
        // One failure between successes changes nothing, and resets the
        // streak of failures.
        assert!(!t.failure("x".into(), 1400));
        assert!(!t.success(MS, 1500));
        assert!(!t.failure("y".into(), 1600));
        assert_eq!(t.state, State::Reachable);
        assert!(t.failure("z".into(), 1700));
        assert_eq!((t.state, t.since_ms), (State::Unreachable, 1700));
        assert_eq!(t.error.as_deref(), Some("z"));
        assert!(!t.failure("z".into(), 1800));
        assert_eq!(t.since_ms, 1700);
        assert_eq!((t.probes_total, t.failures_total), (8, 4));
    }

    #[test]
    fn a_success_clears_the_error_and_keeps_the_latency() {
        let mut t = Tracker::new(1, 1, 0);
        assert!(t.failure("refused".into(), 10));
        assert_eq!(
            (t.state, t.last_seen_ms, t.latency),
            (State::Unreachable, None, None)
        );
        assert!(t.success(Duration::from_micros(420), 20));
        assert_eq!(t.error, None);
        assert_eq!(t.latency, Some(Duration::from_micros(420)));
        assert_eq!((t.last_seen_ms, t.checked_at_ms), (Some(20), Some(20)));
        assert!(t.failure("again".into(), 30), "a fall of 1");
        assert_eq!((t.last_seen_ms, t.checked_at_ms), (Some(20), Some(30)));
        assert_eq!(t.latency, Some(Duration::from_micros(420)));
    }

    #[test]
    fn skipped_probes_count_and_change_nothing() {
        let mut t = Tracker::new(2, 2, 0);
        t.failure("a".into(), 1);
        t.skipped();
        t.skipped();
        assert_eq!(t.state, State::Unknown);
        assert!(t.failure("b".into(), 2), "the streak survives a skip");
        assert_eq!((t.skipped_total, t.probes_total), (2, 2));
    }
}
