//! An attachment's virtual addresses (`virtualAddresses`): held on its
//! interface while the operator grants them (or, without an operator,
//! always), with a kernel lifetime that ends with the grant, and
//! announced on taking them. One task per attachment that has them.
//!
//! What a move does to live reverse connections: the old holder deletes
//! the address; its sockets stay (they are bound to it) but no segment
//! reaches them any more, and the device's next segment reaches the new
//! holder, which has no such connection and resets it: the device sees a
//! reset and connects again, to the new holder. A hold that lapses and
//! returns to the same pod (an operator restart quicker than a grant)
//! loses nothing: its connections carry on. The listeners on the address
//! are bound from the start (IP_FREEBIND), so taking it needs none.

use edgelink_forward::factory::Factory;
use edgelink_status::grants::{Grants, Mode};
use edgelink_status::VirtualStatus;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// How often the task looks even when nothing changed (a grant running
/// out is its own wake-up; this bounds everything else).
const TICK: Duration = Duration::from_millis(250);

#[derive(Debug, Default)]
struct State {
    held: bool,
    since: Option<u64>,
    error: Option<String>,
    taken: u64,
    released: u64,
    announcements: u64,
}

/// One attachment's virtual addresses and what was done with them.
#[derive(Debug)]
pub struct VipRuntime {
    pub addresses: Vec<IpAddr>,
    /// `namespace/pod`: the name grants use.
    pub pod: String,
    state: Mutex<State>,
}

impl VipRuntime {
    pub fn new(addresses: Vec<IpAddr>, pod: String) -> VipRuntime {
        VipRuntime {
            addresses,
            pod,
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn report(&self, mode: Mode) -> VirtualStatus {
        let s = self.lock();
        VirtualStatus {
            addresses: self.addresses.iter().map(|a| a.to_string()).collect(),
            held: s.held,
            since: s.since,
            granted_by: match mode {
                Mode::Managed => "operator",
                Mode::Unmanaged => "unmanaged",
                Mode::Unknown => "unknown",
            }
            .into(),
            error: s.error.clone(),
            taken_total: s.taken,
            released_total: s.released,
            announcements_total: s.announcements,
        }
    }
}

/// What the task is given.
pub struct Holder {
    pub vip: Arc<VipRuntime>,
    pub factory: Arc<Factory>,
    pub ifname: String,
    pub grants: Arc<Grants>,
    pub stop: watch::Receiver<bool>,
    /// Called when it takes or releases the addresses (the webhook posts).
    pub changed: Arc<dyn Fn() + Send + Sync>,
}

/// Add (or renew) every address for `valid`, in the pod's netns; the
/// interface's index.
fn hold(ifname: &str, addrs: &[IpAddr], valid: Duration) -> Result<u32, String> {
    let mut h = edgelink_netlink::Handle::new().map_err(|e| e.to_string())?;
    let index = h.require_link(ifname).map_err(|e| e.to_string())?.index;
    for a in addrs {
        h.hold_addr(index, &edgelink_vip::host_net(*a), valid)
            .map_err(|e| e.to_string())?;
    }
    Ok(index)
}

fn release(ifname: &str, addrs: &[IpAddr]) -> Result<(), String> {
    let mut h = edgelink_netlink::Handle::new().map_err(|e| e.to_string())?;
    let index = h.require_link(ifname).map_err(|e| e.to_string())?.index;
    for a in addrs {
        h.del_addr(index, &edgelink_vip::host_net(*a))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn announce(index: u32, addrs: &[IpAddr]) -> Result<u64, String> {
    let mut sent = 0;
    for a in addrs {
        edgelink_vip::announce(index, *a).map_err(|e| format!("announcing {a}: {e}"))?;
        sent += 1;
    }
    Ok(sent)
}

/// The whole seconds the kernel keeps an address given `valid`.
fn kernel_lifetime(valid: Duration) -> Duration {
    Duration::from_secs(valid.as_secs_f64().ceil().max(1.0) as u64)
}

impl Holder {
    async fn in_netns<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T, String> + Send + 'static,
    ) -> Result<T, String> {
        self.factory
            .run(work)
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r)
    }

    fn failed(&self, what: &str, e: String) {
        tracing::warn!(pod = %self.vip.pod, error = %e, "virtual address: {what} failed");
        self.vip.lock().error = Some(format!("{what}: {e}"));
    }

    /// Take or renew the addresses until `until`; `Some(index)` when they
    /// were just taken.
    async fn take(&self, until: Instant, kernel_until: &mut Option<Instant>) -> Option<u32> {
        let now = Instant::now();
        let held = self.vip.lock().held;
        // Renewed once the kernel keeps it for less than half of what is
        // left of the grant (and a margin): about every second with the
        // operator's grants, every 15 s unmanaged.
        let kept = kernel_until.map_or(Duration::ZERO, |k| k.saturating_duration_since(now));
        if held && kept >= until.saturating_duration_since(now) / 2 + 2 * TICK {
            return None;
        }
        let valid = until.saturating_duration_since(now);
        let (ifname, addrs) = (self.ifname.clone(), self.vip.addresses.clone());
        match self.in_netns(move || hold(&ifname, &addrs, valid)).await {
            Ok(index) => {
                *kernel_until = Some(now + kernel_lifetime(valid));
                if held {
                    return None;
                }
                {
                    let mut s = self.vip.lock();
                    s.held = true;
                    s.since = Some(edgelink_status::now());
                    s.taken += 1;
                    s.error = None;
                }
                tracing::info!(pod = %self.vip.pod, addresses = ?self.vip.addresses, "took the virtual address");
                (self.changed)();
                Some(index)
            }
            Err(e) => {
                self.failed("adding the address", e);
                None
            }
        }
    }

    async fn give_up(&self, kernel_until: &mut Option<Instant>) {
        let (ifname, addrs) = (self.ifname.clone(), self.vip.addresses.clone());
        match self.in_netns(move || release(&ifname, &addrs)).await {
            Ok(()) => {
                *kernel_until = None;
                {
                    let mut s = self.vip.lock();
                    s.held = false;
                    s.since = Some(edgelink_status::now());
                    s.released += 1;
                }
                tracing::info!(pod = %self.vip.pod, addresses = ?self.vip.addresses, "released the virtual address");
                (self.changed)();
            }
            Err(e) => self.failed("removing the address", e),
        }
    }

    async fn announce_now(&self, index: u32) {
        let addrs = self.vip.addresses.clone();
        match self.in_netns(move || announce(index, &addrs)).await {
            Ok(n) => self.vip.lock().announcements += n,
            Err(e) => self.failed("announcing", e),
        }
    }
}

/// Hold the addresses while granted, until `stop`. Stopping leaves them
/// as they are: a daemon taking over (or the attachment's replacement)
/// goes on from there, and the kernel lifetime ends them otherwise.
pub async fn run(mut h: Holder) {
    let mut changes = h.grants.subscribe();
    let mut kernel_until: Option<Instant> = None;
    // Announcements still due, and the interface's index for them.
    let mut due: Vec<Instant> = Vec::new();
    let mut index = 0;
    loop {
        let now = Instant::now();
        let until = h.grants.until(&h.vip.pod, now);
        match until {
            Some(u) => {
                if let Some(i) = h.take(u, &mut kernel_until).await {
                    index = i;
                    due = edgelink_vip::ANNOUNCE_AFTER
                        .iter()
                        .map(|d| now + *d)
                        .collect();
                }
            }
            None if h.vip.lock().held => {
                h.give_up(&mut kernel_until).await;
                due.clear();
            }
            None => {}
        }
        let now = Instant::now();
        if due.first().is_some_and(|t| *t <= now) {
            due.remove(0);
            h.announce_now(index).await;
        }
        let mut wake = now + TICK;
        if let Some(t) = due.first() {
            wake = wake.min(*t);
        }
        if let Some(u) = until {
            wake = wake.min(u.max(now));
        }
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            r = changes.changed() => if r.is_err() { return },
            _ = h.stop.wait_for(|s| *s) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_keeps_an_address_whole_seconds_at_least_one() {
        assert_eq!(
            kernel_lifetime(Duration::from_millis(1500)),
            Duration::from_secs(2)
        );
        assert_eq!(
            kernel_lifetime(Duration::from_millis(10)),
            Duration::from_secs(1)
        );
        assert_eq!(
            kernel_lifetime(Duration::from_secs(30)),
            Duration::from_secs(30)
        );
    }

    #[test]
    fn the_report_says_who_grants() {
        let v = VipRuntime::new(vec!["172.17.16.250".parse().unwrap()], "hil/p-0".into());
        let r = v.report(Mode::Unknown);
        assert_eq!((r.held, r.granted_by.as_str()), (false, "unknown"));
        assert_eq!(r.addresses, vec!["172.17.16.250"]);
        assert_eq!(v.report(Mode::Managed).granted_by, "operator");
    }
}
