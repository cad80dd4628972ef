//! The latest report of each node's edgelinkd (`--status-webhook`), and the
//! reconciles a report asks for: a Device whose proxy pod's listeners or
//! reachability changed is reconciled at once; counters alone wait for the
//! next resync.

use edgelink_operator::crd::Device;
use edgelink_operator::report::{NodeReport, Received};
use kube::runtime::reflector::ObjectRef;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::SystemTime;
use tokio::sync::mpsc;

/// Per (namespace, pod): what of its attachment matters for status.
type ProxyStates = HashMap<(String, String), String>;

pub struct Reports {
    latest: Mutex<HashMap<String, Received>>,
    /// Per node: per (namespace, pod) the states that matter for status.
    states: Mutex<HashMap<String, ProxyStates>>,
    trigger: mpsc::UnboundedSender<ObjectRef<Device>>,
}

/// The proxy pod of Device `d` is `d-0`: the Device a pod's attachment may
/// belong to (a pod of anything else gives a reference that matches no
/// Device, which the controller drops).
fn device_of(pod: &str) -> Option<&str> {
    pod.strip_suffix("-0").filter(|d| !d.is_empty())
}

impl Reports {
    pub fn new() -> (Reports, mpsc::UnboundedReceiver<ObjectRef<Device>>) {
        let (trigger, rx) = mpsc::unbounded_channel();
        (
            Reports {
                latest: Mutex::new(HashMap::new()),
                states: Mutex::new(HashMap::new()),
                trigger,
            },
            rx,
        )
    }

    pub fn get(&self, node: &str) -> Option<Received> {
        self.latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(node)
            .cloned()
    }

    /// Take a node's report; ask for the reconcile of each Device whose
    /// proxy's state changed (or appeared, or went).
    pub fn put(&self, report: NodeReport) {
        let mut now_states = HashMap::new();
        for a in &report.attachments {
            let (Some(ns), Some(pod)) = (&a.pod_namespace, &a.pod_name) else {
                continue;
            };
            let mut sig = format!("{}|{}|", a.state, a.interface.ips.join(","));
            for f in &a.forwards {
                sig.push_str(&format!(
                    "{}:{}:{};",
                    f.name, f.listener, f.reachability.state
                ));
            }
            now_states.insert((ns.clone(), pod.clone()), sig);
        }
        let node = report.node.clone();
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
        for (ns, pod) in changed {
            if let Some(d) = device_of(pod) {
                let _ = self.trigger.send(ObjectRef::new(d).within(ns));
            }
        }
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
    fn a_changed_state_triggers_its_device_and_counters_alone_do_not() {
        let (r, mut rx) = Reports::new();
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
