//! An attachment's device health probe, run from inside the pod's netns
//! (its sockets come from the attachment's [`Factory`], as the forwards'
//! do): one task per attachment, one probe in flight at most, the first
//! at a random phase within the interval. A TCP-based probe to the target
//! of a forward with `maxConnections` takes one of that forward's places,
//! without queueing: with none free it is skipped (counted), never put
//! ahead of a client. Each transition is logged and told at once
//! (`changed`: the status webhook posts).

use crate::factory::Factory;
use crate::protect::NoPlace;
use crate::runtime::ForwardRuntime;
use edgelink_attachment::{Health, Protocol};
use edgelink_health::{probe, State, Tracker};
use edgelink_status::HealthStatus;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;
use tokio::time::Instant;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// A random number (std's per-process random hash keys: no dependency).
fn random() -> u64 {
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

/// One attachment's health: its spec and what the probes said.
#[derive(Debug)]
pub struct HealthRuntime {
    pub spec: Health,
    tracker: Mutex<Tracker>,
}

impl HealthRuntime {
    pub fn new(spec: Health) -> HealthRuntime {
        let tracker = Tracker::new(spec.failure_threshold, spec.success_threshold, now_ms());
        HealthRuntime {
            spec,
            tracker: Mutex::new(tracker),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Tracker> {
        self.tracker.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Not probed at all (the record's target is outside allowedTargets,
    /// the netns could not be entered): stays unknown, with why.
    pub fn not_probed(&self, why: String) {
        self.lock().error = Some(why);
    }

    pub fn state(&self) -> State {
        self.lock().state
    }

    pub fn report(&self) -> HealthStatus {
        let t = self.lock();
        HealthStatus {
            kind: self.spec.kind.to_string(),
            target: self.spec.target.to_string(),
            state: t.state.to_string(),
            since: t.since_ms / 1000,
            since_ms: t.since_ms,
            last_seen: t.last_seen_ms.map(|ms| ms / 1000),
            checked_at: t.checked_at_ms.map(|ms| ms / 1000),
            latency_ms: t.latency.map(|d| d.as_secs_f64() * 1000.0),
            error: t.error.clone(),
            probes_total: t.probes_total,
            failures_total: t.failures_total,
            skipped_total: t.skipped_total,
        }
    }
}

/// The forward whose places a probe of `spec` takes: a relayed TCP
/// forward to the same target, with a `maxConnections` bound.
pub fn limiter_for(spec: &Health, forwards: &[Arc<ForwardRuntime>]) -> Option<Arc<ForwardRuntime>> {
    let target = spec.target.addr().filter(|_| spec.kind.is_tcp())?;
    forwards
        .iter()
        .find(|f| {
            f.reverse.is_none()
                && f.spec.protocol == Protocol::Tcp
                && f.spec.path.is_relay()
                && f.spec.target == target
                && f.protection.limits.max_connections.is_some()
        })
        .cloned()
}

/// What the probe task is given.
pub struct Prober {
    pub health: Arc<HealthRuntime>,
    pub sockets: Arc<Factory>,
    /// See [`limiter_for`].
    pub limiter: Option<Arc<ForwardRuntime>>,
    pub stop: watch::Receiver<bool>,
    /// Called on each transition.
    pub changed: Arc<dyn Fn() + Send + Sync>,
    /// The attachment, for the log: `container/ifname`.
    pub name: String,
}

/// Probe every interval until `stop`; the first at a random phase.
pub async fn run(mut p: Prober) {
    let every = Duration::from_millis(p.health.spec.interval_ms.max(1));
    let phase = Duration::from_millis(random() % p.health.spec.interval_ms.max(1));
    let mut next = Instant::now() + phase;
    let mut seq = random() as u16;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = p.stop.wait_for(|s| *s) => return,
        }
        seq = seq.wrapping_add(1);
        p.once(seq).await;
        // The next one an interval after this one was due; after a stall,
        // an interval from now (no burst to catch up).
        next = (next + every).max(Instant::now());
    }
}

impl Prober {
    async fn once(&self, seq: u16) {
        let h = &self.health;
        let place = match self.limiter.as_ref().map(|f| f.protection.try_place()) {
            Some(Err(NoPlace)) => {
                h.lock().skipped();
                tracing::debug!(attachment = %self.name, target = %h.spec.target, "health probe skipped: no free place under maxConnections");
                return;
            }
            Some(Ok(place)) => place,
            None => None,
        };
        let outcome = probe(&h.spec, &*self.sockets, seq).await;
        drop(place);
        let now = now_ms();
        let (moved, state) = {
            let mut t = h.lock();
            let moved = match &outcome {
                Ok(took) => t.success(*took, now),
                Err(e) => t.failure(e.to_string(), now),
            };
            (moved, t.state)
        };
        if let Err(e) = &outcome {
            tracing::debug!(attachment = %self.name, error = %e, "health probe failed");
        }
        if moved {
            let error = outcome.err().map(|e| e.to_string());
            tracing::info!(attachment = %self.name, kind = %h.spec.kind, target = %h.spec.target,
                %state, error = error.as_deref().unwrap_or(""), "device health changed");
            (self.changed)();
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::protect::{Admission, Limits, NoPlace, Protection, Turn};
    use std::time::{Duration, Instant};

    fn bound(max: Option<u32>) -> Protection {
        Protection::new(Limits {
            max_connections: max,
            queue_timeout: Duration::from_secs(5),
            max_queue: 8,
            connect_retries: 0,
            retry_backoff: Duration::from_millis(100),
        })
    }

    #[test]
    fn a_probe_takes_a_free_place_and_never_waits_or_passes_a_client() {
        let p = bound(Some(1));
        let probe = p.try_place().expect("a free place").expect("a bound");
        assert_eq!(p.in_use(), Some(1), "the probe is one of the connections");
        assert_eq!(p.try_place().unwrap_err(), NoPlace);
        drop(probe);
        let Turn::Decided(Admission::Go(Some(client))) = p.enqueue(Instant::now()) else {
            panic!("the client gets the free place")
        };
        assert_eq!(p.try_place().unwrap_err(), NoPlace, "the client's place");
        let waiting = p.enqueue(Instant::now());
        assert!(matches!(waiting, Turn::Waiting { .. }), "{waiting:?}");
        drop(client);
        assert_eq!(
            p.try_place().unwrap_err(),
            NoPlace,
            "the freed place is the waiting client's"
        );
        drop(waiting);
        assert!(p.try_place().is_ok_and(|pl| pl.is_some()));
        assert!(bound(None).try_place().is_ok_and(|pl| pl.is_none()));
    }
}
