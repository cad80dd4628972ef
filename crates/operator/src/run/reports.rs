//! The latest report of each node's edgelinkd (`--status-webhook`), when
//! each node was last heard (reports and heartbeats), and the reconciles
//! they ask for: a Device whose proxy pod's listeners, reachability or
//! health changed is reconciled at once, and so is every Device with a
//! proxy on a node that goes silent (lost) or is heard again; counters
//! alone wait for the next resync.

use edgelink_operator::crd::Device;
use edgelink_operator::nodes::Heard;
use edgelink_operator::report::{NodeReport, Received};
use kube::runtime::reflector::ObjectRef;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::mpsc;

/// When a node was last heard, and the heartbeat interval it announced.
#[derive(Debug, Clone, Copy)]
struct LastHeard {
    at: Instant,
    every: Option<Duration>,
    lost: bool,
}

/// Per (namespace, pod): what of its attachment matters for status.
type ProxyStates = HashMap<(String, String), String>;

pub struct Reports {
    latest: Mutex<HashMap<String, Received>>,
    /// Per node: per (namespace, pod) the states that matter for status.
    states: Mutex<HashMap<String, ProxyStates>>,
    heard: Mutex<HashMap<String, LastHeard>>,
    /// Per (namespace, proxy pod): its Device, as the controller made it.
    proxies: Mutex<HashMap<(String, String), String>>,
    trigger: mpsc::UnboundedSender<ObjectRef<Device>>,
    /// A node that sends heartbeats is lost after this long without one.
    pub lost_after: Duration,
    /// A node that does not (an older edgelinkd) after this long.
    pub stale_after: Duration,
    /// When the leader's first seconds end (a node not heard by then is
    /// taken as lost): the watchdog reconciles every Device once then.
    fresh_until: Mutex<Option<Instant>>,
}

/// The proxy pod of Device `d` is `d-0`: the Device a pod's attachment may
/// belong to (a pod of anything else gives a reference that matches no
/// Device, which the controller drops).
fn device_of(pod: &str) -> Option<&str> {
    pod.strip_suffix("-0").filter(|d| !d.is_empty())
}

impl Reports {
    pub fn new(
        lost_after: Duration,
        stale_after: Duration,
    ) -> (Reports, mpsc::UnboundedReceiver<ObjectRef<Device>>) {
        let (trigger, rx) = mpsc::unbounded_channel();
        (
            Reports {
                latest: Mutex::new(HashMap::new()),
                states: Mutex::new(HashMap::new()),
                heard: Mutex::new(HashMap::new()),
                proxies: Mutex::new(HashMap::new()),
                trigger,
                lost_after,
                stale_after,
                fresh_until: Mutex::new(None),
            },
            rx,
        )
    }

    /// This replica leads from now on; its first `fresh_for` end then.
    pub fn leading(&self, fresh_for: Duration) {
        *self.fresh_until.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Instant::now() + fresh_for);
    }

    /// Once, when the leader's first seconds end: every Device the
    /// controller made proxies for, so that nodes not heard by then are
    /// judged at once, not at the next resync.
    fn check_fresh_end(&self) {
        let ended = {
            let mut f = self.fresh_until.lock().unwrap_or_else(|e| e.into_inner());
            match *f {
                Some(t) if Instant::now() >= t => {
                    *f = None;
                    true
                }
                _ => false,
            }
        };
        if ended {
            let pods: Vec<(String, String)> = self
                .proxies
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .keys()
                .cloned()
                .collect();
            self.trigger_pods(&pods);
        }
    }

    /// The controller made `pod` (in `ns`) the proxy of Device `device`.
    pub fn register(&self, ns: &str, pod: &str, device: &str) {
        self.proxies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((ns.to_string(), pod.to_string()), device.to_string());
    }

    /// The Device `pod` is a proxy of: as registered, else `<device>-0`.
    fn device_of(&self, ns: &str, pod: &str) -> Option<String> {
        let known = self
            .proxies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(ns.to_string(), pod.to_string()))
            .cloned();
        known.or_else(|| device_of(pod).map(str::to_string))
    }

    /// Ask for the reconcile of the Devices of `pods`; how many.
    fn trigger_pods<'a>(&self, pods: impl IntoIterator<Item = &'a (String, String)>) -> usize {
        let mut sent = HashSet::new();
        for (ns, pod) in pods {
            if let Some(d) = self.device_of(ns, pod) {
                if sent.insert((ns.clone(), d.clone())) {
                    let _ = self.trigger.send(ObjectRef::new(&d).within(ns));
                }
            }
        }
        sent.len()
    }

    /// Node `node` was heard: a report (`every` None) or a heartbeat that
    /// announces its interval. A node heard again after it was lost asks
    /// for its Devices' reconciles.
    /// Reconcile Device `ns/name` now.
    pub fn reconcile(&self, ns: &str, name: &str) {
        let _ = self.trigger.send(ObjectRef::new(name).within(ns));
    }

    pub fn heard(&self, node: &str, every: Option<Duration>) {
        let was_lost = {
            let mut h = self.heard.lock().unwrap_or_else(|e| e.into_inner());
            let e = h.entry(node.to_string()).or_insert(LastHeard {
                at: Instant::now(),
                every: None,
                lost: false,
            });
            e.at = Instant::now();
            e.every = every.or(e.every);
            std::mem::replace(&mut e.lost, false)
        };
        if was_lost {
            tracing::info!(%node, "edgelinkd heard again");
            self.trigger_node(node);
        }
    }

    fn trigger_node(&self, node: &str) {
        let pods: Vec<(String, String)> = self
            .states
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(node)
            .map(|s| s.keys().cloned().collect())
            .unwrap_or_default();
        self.trigger_pods(&pods);
    }

    /// Whether `node` is heard: lost past `lost_after` when it sends
    /// heartbeats, past `stale_after` when it only reports.
    pub fn heard_state(&self, node: &str) -> Heard {
        let h = self.heard.lock().unwrap_or_else(|e| e.into_inner());
        let Some(e) = h.get(node) else {
            return Heard::Never;
        };
        let silent = e.at.elapsed();
        let bound = match e.every {
            Some(_) => self.lost_after,
            None => self.stale_after,
        };
        if silent > bound {
            Heard::Lost(silent)
        } else {
            Heard::Alive
        }
    }

    /// Mark the nodes that went silent lost and ask for their Devices'
    /// reconciles (the watchdog calls it a few times a second).
    pub fn check_lost(&self) {
        self.check_fresh_end();
        let newly: Vec<String> = {
            let mut h = self.heard.lock().unwrap_or_else(|e| e.into_inner());
            let (lost_after, stale_after) = (self.lost_after, self.stale_after);
            h.iter_mut()
                .filter(|(_, e)| {
                    let bound = if e.every.is_some() {
                        lost_after
                    } else {
                        stale_after
                    };
                    !e.lost && e.at.elapsed() > bound
                })
                .map(|(n, e)| {
                    e.lost = true;
                    n.clone()
                })
                .collect()
        };
        for node in newly {
            tracing::warn!(%node, "edgelinkd not heard: its proxies leave their Services");
            self.trigger_node(&node);
        }
    }

    pub fn get(&self, node: &str) -> Option<Received> {
        self.latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(node)
            .cloned()
    }

    /// Take a node's report; ask for the reconcile of each Device whose
    /// proxy's state changed (or appeared, or went); how many were asked.
    pub fn put(&self, report: NodeReport) -> usize {
        let mut now_states = HashMap::new();
        for a in &report.attachments {
            let (Some(ns), Some(pod)) = (&a.pod_namespace, &a.pod_name) else {
                continue;
            };
            let mut sig = format!("{}|{}|", a.state, a.interface.ips.join(","));
            if let Some(h) = &a.health {
                sig.push_str(&format!("health:{};", h.state));
            }
            for f in &a.forwards {
                sig.push_str(&format!(
                    "{}:{}:{};",
                    f.name, f.listener, f.reachability.state
                ));
            }
            now_states.insert((ns.clone(), pod.clone()), sig);
        }
        let node = report.node.clone();
        self.heard(&node, None);
        let before = self
            .states
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(node.clone(), now_states.clone())
            .unwrap_or_default();
        let mut changed: Vec<&(String, String)> = now_states
            .iter()
            .filter(|(k, v)| before.get(*k) != Some(*v))
            .map(|(k, _)| k)
            .collect();
        changed.extend(before.keys().filter(|k| !now_states.contains_key(*k)));
        self.latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                node,
                Received {
                    report,
                    at: SystemTime::now(),
                },
            );
        self.trigger_pods(changed)
    }
}

/// How often the watchdog looks for nodes gone silent.
pub const WATCHDOG_EVERY: Duration = Duration::from_millis(250);

/// Look for silent nodes until the process ends.
pub async fn watchdog(reports: std::sync::Arc<Reports>) {
    let mut tick = tokio::time::interval(WATCHDOG_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        reports.check_lost();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(listener: &str) -> NodeReport {
        serde_json::from_value(serde_json::json!({
            "node": "kedge1",
            "attachments": [{
                "containerId": "c1", "ifname": "net1", "podNamespace": "hil", "podName": "device01-01-0",
                "state": "serving", "interface": {"name": "net1", "mac": "x", "ips": ["172.17.16.200/24"]},
                "forwards": [{"name": "api", "protocol": "tcp", "port": 8080, "listener": listener,
                              "reachability": {"state": "unknown", "checkedAt": 0}}]
            }]
        }))
        .unwrap()
    }

    #[test]
    fn a_node_that_sends_heartbeats_is_lost_after_their_bound_and_its_devices_reconciled() {
        let (r, mut rx) = Reports::new(Duration::from_millis(200), Duration::from_secs(35));
        r.put(report("listening"));
        let _ = rx.try_recv();
        // The multi-node name: registered by the controller.
        r.register("hil", "device01-01-0", "device01-01");
        assert_eq!(r.heard_state("kedge1"), Heard::Alive);
        assert_eq!(r.heard_state("kedge9"), Heard::Never);
        // Reports alone: lost only after the stale bound (35 s).
        std::thread::sleep(Duration::from_millis(300));
        r.check_lost();
        assert_eq!(r.heard_state("kedge1"), Heard::Alive);
        assert!(rx.try_recv().is_err());
        // With heartbeats: lost after 200 ms of silence, once.
        r.heard("kedge1", Some(Duration::from_millis(100)));
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            matches!(r.heard_state("kedge1"), Heard::Lost(d) if d >= Duration::from_millis(300))
        );
        r.check_lost();
        assert_eq!(
            rx.try_recv().unwrap(),
            ObjectRef::new("device01-01").within("hil")
        );
        r.check_lost();
        assert!(rx.try_recv().is_err(), "a lost node triggers once");
        // Heard again: its Devices again.
        r.heard("kedge1", None);
        assert_eq!(r.heard_state("kedge1"), Heard::Alive);
        assert_eq!(
            rx.try_recv().unwrap(),
            ObjectRef::new("device01-01").within("hil")
        );
    }

    #[test]
    fn when_the_leaders_first_seconds_end_every_device_is_reconciled_once() {
        let (r, mut rx) = Reports::new(Duration::from_secs(3), Duration::from_secs(35));
        r.register("hil", "device01-05-kedge1-0", "device01-05");
        r.register("hil", "device01-05-kedge2-0", "device01-05");
        r.register("lab", "plc-0", "plc");
        r.leading(Duration::from_millis(100));
        r.check_lost();
        assert!(rx.try_recv().is_err(), "not yet");
        std::thread::sleep(Duration::from_millis(150));
        r.check_lost();
        let mut got = vec![rx.try_recv().unwrap(), rx.try_recv().unwrap()];
        got.sort_by_key(|o| o.name.clone());
        assert_eq!(
            got,
            [
                ObjectRef::new("device01-05").within("hil"),
                ObjectRef::new("plc").within("lab")
            ]
        );
        assert!(rx.try_recv().is_err(), "each Device once");
        r.check_lost();
        assert!(rx.try_recv().is_err(), "and only once");
    }

    #[test]
    fn a_proxy_the_controller_registered_maps_to_its_device() {
        let (r, mut rx) = Reports::new(Duration::from_secs(3), Duration::from_secs(35));
        let mut rep = report("listening");
        rep.attachments[0].pod_name = Some("device01-01-kedge1-0".into());
        r.register("hil", "device01-01-kedge1-0", "device01-01");
        r.put(rep);
        assert_eq!(
            rx.try_recv().unwrap(),
            ObjectRef::new("device01-01").within("hil")
        );
    }

    #[test]
    fn a_changed_state_triggers_its_device_and_counters_alone_do_not() {
        let (r, mut rx) = Reports::new(Duration::from_secs(3), Duration::from_secs(35));
        r.put(report("starting"));
        assert_eq!(
            rx.try_recv().unwrap(),
            ObjectRef::new("device01-01").within("hil")
        );
        r.put(report("starting"));
        assert!(
            rx.try_recv().is_err(),
            "the same states must not trigger a reconcile"
        );
        r.put(report("listening"));
        assert_eq!(
            rx.try_recv().unwrap(),
            ObjectRef::new("device01-01").within("hil")
        );
        r.put(NodeReport {
            node: "kedge1".into(),
            ..Default::default()
        });
        assert_eq!(
            rx.try_recv().unwrap(),
            ObjectRef::new("device01-01").within("hil"),
            "a proxy gone triggers too"
        );
        assert!(r.get("kedge1").is_some() && r.get("kedge2").is_none());
    }
}
