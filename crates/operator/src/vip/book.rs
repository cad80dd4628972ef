//! The grants of every Device's virtual address: who should hold it (the
//! controller's choice), what each proxy pod was granted and until when,
//! and the answer to each node's heartbeat. Pure (instants are passed in),
//! kept by the leader in memory.
//!
//! The rule that keeps the address on one pod: a pod is granted it only
//! when no other pod of the Device may hold it: none has an unexpired
//! grant of this leader's, and none said within a grant's length that it
//! holds one (a grant of the last leader's counts too), unless it said
//! since that it holds nothing (it was told to release). A leader that
//! just took over does not know what its predecessor granted: until every
//! other pod's node has been heard (each heartbeat says what its node
//! holds), or for `hold` at most, it grants only to a pod that says it
//! holds the address already (so a holder keeps it across a leader
//! change, and an address that lapsed in the change is granted again as
//! soon as the nodes are heard).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// One Device's address and its proxies.
#[derive(Debug, Clone, Default)]
struct Entry {
    /// (node, `namespace/pod`), in the Device's node order.
    pods: Vec<(String, String)>,
    chosen: Option<String>,
    /// Per pod: the end of its last grant.
    granted: HashMap<String, Instant>,
    /// Per pod: when its heartbeat last said it holds the address (it
    /// may, until a grant's length after that).
    claimed: HashMap<String, Instant>,
    /// The pod that was last granted the address, and since when it has
    /// held it (for the status).
    holder: Option<(String, Instant)>,
    /// When the controller last placed it: an entry not placed for
    /// [`FORGET_AFTER`] is of a Device that is gone.
    placed: Option<Instant>,
}

/// Every Device is placed at each resync (minutes): one not placed this
/// long was deleted.
pub const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// The answer to one heartbeat.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Answer {
    /// `namespace/pod`s of the node that hold their Device's address
    /// (again) for `hold_ms` from the heartbeat.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub holds: Vec<String>,
    /// `namespace/pod`s of the node that must drop it now.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub releases: Vec<String>,
    pub hold_ms: u64,
    /// `namespace/device`s whose address has a new holder with this
    /// answer (for the controller; not sent).
    #[serde(skip)]
    pub moved: Vec<String>,
}

/// Every Device's grants, keyed by `namespace/device`.
#[derive(Debug)]
pub struct Book {
    hold: Duration,
    leading_since: Option<Instant>,
    /// The nodes heard since this replica leads.
    heard: HashSet<String>,
    devices: HashMap<String, Entry>,
}

impl Book {
    pub fn new(hold: Duration) -> Book {
        Book {
            hold,
            leading_since: None,
            heard: HashSet::new(),
            devices: HashMap::new(),
        }
    }

    pub fn hold(&self) -> Duration {
        self.hold
    }

    /// This replica leads from `now`: what was granted before is unknown.
    pub fn leading(&mut self, now: Instant) {
        self.leading_since = Some(now);
        self.heard.clear();
        self.devices.clear();
    }

    /// The controller's view of `device`: its proxies and who should hold
    /// its address.
    pub fn place(&mut self, device: &str, pods: Vec<(String, String)>, chosen: Option<String>) {
        let e = self.devices.entry(device.to_string()).or_default();
        e.placed = Some(Instant::now());
        e.granted.retain(|p, _| pods.iter().any(|(_, q)| q == p));
        e.claimed.retain(|p, _| pods.iter().any(|(_, q)| q == p));
        e.pods = pods;
        e.chosen = chosen;
    }

    /// Who the controller chose last for `device`.
    pub fn chosen(&self, device: &str) -> Option<String> {
        self.devices.get(device)?.chosen.clone()
    }

    /// A Device without a virtual address (or gone): its grants run out.
    pub fn forget(&mut self, device: &str) {
        self.devices.remove(device);
    }

    /// The pod last granted `device`'s address, its node, and since when,
    /// while its grant runs.
    pub fn holder(&self, device: &str, now: Instant) -> Option<(String, String, Instant)> {
        let e = self.devices.get(device)?;
        let (pod, since) = e.holder.as_ref()?;
        if e.granted.get(pod).is_none_or(|until| *until <= now) {
            return None;
        }
        let node = e.pods.iter().find(|(_, p)| p == pod)?.0.clone();
        Some((pod.clone(), node, *since))
    }

    /// A heartbeat of `node`, whose edgelinkd says it holds the addresses
    /// of `holding` (`namespace/pod`s): the grants and releases for its pods.
    pub fn beat(&mut self, node: &str, holding: &[String], now: Instant) -> Answer {
        let hold = self.hold;
        let settled = self.leading_since.is_some_and(|t| now >= t + hold);
        self.heard.insert(node.to_string());
        let mut a = Answer {
            hold_ms: u64::try_from(hold.as_millis()).unwrap_or(u64::MAX),
            ..Answer::default()
        };
        self.devices.retain(|_, e| {
            e.placed
                .is_none_or(|t| now.saturating_duration_since(t) < FORGET_AFTER)
        });
        for (device, e) in self.devices.iter_mut() {
            let mine: Vec<String> = e
                .pods
                .iter()
                .filter(|(n, _)| n == node)
                .map(|(_, p)| p.clone())
                .collect();
            for p in mine {
                let says = holding.contains(&p);
                if says {
                    e.claimed.insert(p.clone(), now);
                } else {
                    // Whatever it was granted, it holds nothing now.
                    e.granted.remove(&p);
                    e.claimed.remove(&p);
                }
                if e.chosen.as_deref() != Some(p.as_str()) {
                    if says {
                        a.releases.push(p);
                    }
                    continue;
                }
                let others_hold = e.granted.iter().any(|(q, until)| *q != p && *until > now)
                    || e.claimed.iter().any(|(q, at)| *q != p && *at + hold > now);
                let others_known = e
                    .pods
                    .iter()
                    .all(|(n, q)| *q == p || self.heard.contains(n));
                if others_hold || !(settled || says || others_known) {
                    continue;
                }
                e.granted.insert(p.clone(), now + hold);
                if e.holder.as_ref().is_none_or(|(h, _)| *h != p) {
                    e.holder = Some((p.clone(), now));
                    a.moved.push(device.clone());
                }
                a.holds.push(p);
            }
        }
        a.holds.sort();
        a.releases.sort();
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOLD: Duration = Duration::from_millis(1500);

    fn two() -> Vec<(String, String)> {
        vec![
            ("kedge1".into(), "hil/d-kedge1-0".into()),
            ("kedge2".into(), "hil/d-kedge2-0".into()),
        ]
    }

    fn settled() -> (Book, Instant) {
        let mut b = Book::new(HOLD);
        let t0 = Instant::now();
        b.leading(t0);
        (b, t0 + HOLD)
    }

    #[test]
    fn the_chosen_pod_is_granted_and_renewed_with_each_heartbeat() {
        let (mut b, t) = settled();
        b.place("hil/d", two(), Some("hil/d-kedge1-0".into()));
        let a = b.beat("kedge1", &[], t);
        assert_eq!(a.holds, vec!["hil/d-kedge1-0"]);
        assert_eq!(a.hold_ms, 1500);
        assert_eq!(a.moved, vec!["hil/d"], "a first holder is a move");
        let text = serde_json::to_string(&a).unwrap();
        assert_eq!(text, r#"{"holds":["hil/d-kedge1-0"],"holdMs":1500}"#);
        assert_eq!(b.beat("kedge2", &[], t).holds, Vec::<String>::new());
        let later = t + Duration::from_millis(500);
        let a = b.beat("kedge1", &["hil/d-kedge1-0".into()], later);
        assert_eq!(a.holds, vec!["hil/d-kedge1-0"]);
        assert!(a.moved.is_empty(), "a renewal is not a move");
        let (pod, node, since) = b.holder("hil/d", later).unwrap();
        assert_eq!(
            (pod.as_str(), node.as_str(), since),
            ("hil/d-kedge1-0", "kedge1", t)
        );
    }

    #[test]
    fn a_lost_holders_address_moves_only_when_its_grant_has_run_out() {
        let (mut b, t) = settled();
        b.place("hil/d", two(), Some("hil/d-kedge1-0".into()));
        b.beat("kedge1", &[], t);
        // kedge1 goes silent; the controller chooses kedge2.
        b.place("hil/d", two(), Some("hil/d-kedge2-0".into()));
        let early = t + Duration::from_millis(1000);
        assert!(
            b.beat("kedge2", &[], early).holds.is_empty(),
            "kedge1's grant still runs"
        );
        let after = t + HOLD + Duration::from_millis(1);
        assert_eq!(b.beat("kedge2", &[], after).holds, vec!["hil/d-kedge2-0"]);
        assert_eq!(b.holder("hil/d", after).unwrap().1, "kedge2");
    }

    #[test]
    fn a_live_holder_is_told_to_release_and_the_next_pod_gets_it_once_it_has() {
        let (mut b, t) = settled();
        b.place("hil/d", two(), Some("hil/d-kedge1-0".into()));
        b.beat("kedge1", &[], t);
        b.place("hil/d", two(), Some("hil/d-kedge2-0".into()));
        let t1 = t + Duration::from_millis(100);
        let a = b.beat("kedge1", &["hil/d-kedge1-0".into()], t1);
        assert_eq!(a.releases, vec!["hil/d-kedge1-0"]);
        assert!(a.holds.is_empty());
        assert!(
            b.beat("kedge2", &[], t1).holds.is_empty(),
            "not before kedge1 says it let go"
        );
        // kedge1's next heartbeat (sent at once on the release) holds nothing.
        b.beat("kedge1", &[], t1 + Duration::from_millis(20));
        let a = b.beat("kedge2", &[], t1 + Duration::from_millis(30));
        assert_eq!(a.holds, vec!["hil/d-kedge2-0"]);
    }

    #[test]
    fn a_new_leader_grants_at_first_only_to_a_pod_that_holds_or_once_every_node_is_heard() {
        let mut b = Book::new(HOLD);
        let t0 = Instant::now();
        b.leading(t0);
        b.place("hil/d", two(), Some("hil/d-kedge1-0".into()));
        assert!(
            b.beat("kedge1", &[], t0).holds.is_empty(),
            "kedge2 not heard: it may hold a grant of the last leader's"
        );
        let a = b.beat("kedge1", &["hil/d-kedge1-0".into()], t0);
        assert_eq!(
            a.holds,
            vec!["hil/d-kedge1-0"],
            "the holder keeps it across the change"
        );
        b.place("hil/d", two(), Some("hil/d-kedge2-0".into()));
        // A pod that says it holds but is not the choice is told to let go.
        let a = b.beat("kedge1", &["hil/d-kedge1-0".into()], t0 + HOLD);
        assert_eq!(a.releases, vec!["hil/d-kedge1-0"]);

        // Another leader: kedge2 says it holds (the last leader's grant),
        // kedge1 is chosen: not before kedge2 let go.
        b.leading(t0);
        b.place("hil/d", two(), Some("hil/d-kedge1-0".into()));
        let a = b.beat("kedge2", &["hil/d-kedge2-0".into()], t0);
        assert_eq!(a.releases, vec!["hil/d-kedge2-0"]);
        assert!(
            b.beat("kedge1", &[], t0).holds.is_empty(),
            "kedge2 still holds"
        );
        b.beat("kedge2", &[], t0 + Duration::from_millis(10));
        let a = b.beat("kedge1", &[], t0 + Duration::from_millis(20));
        assert_eq!(
            a.holds,
            vec!["hil/d-kedge1-0"],
            "every node heard, nobody holds: at once"
        );
    }

    #[test]
    fn a_claim_of_a_silent_node_counts_for_a_grants_length_only() {
        let (mut b, t) = settled();
        b.place("hil/d", two(), Some("hil/d-kedge2-0".into()));
        // kedge1 says it holds (told to let go), then falls silent.
        b.beat("kedge1", &["hil/d-kedge1-0".into()], t);
        assert!(b
            .beat("kedge2", &[], t + Duration::from_millis(500))
            .holds
            .is_empty());
        let a = b.beat("kedge2", &[], t + HOLD + Duration::from_millis(1));
        assert_eq!(a.holds, vec!["hil/d-kedge2-0"]);
    }

    #[test]
    fn nobody_chosen_nobody_granted_and_a_forgotten_device_answers_nothing() {
        let (mut b, t) = settled();
        b.place("hil/d", two(), None);
        assert_eq!(
            b.beat("kedge1", &[], t),
            Answer {
                hold_ms: 1500,
                ..Answer::default()
            }
        );
        b.place("hil/d", two(), Some("hil/d-kedge1-0".into()));
        b.beat("kedge1", &[], t);
        b.forget("hil/d");
        let a = b.beat("kedge1", &["hil/d-kedge1-0".into()], t);
        assert!(a.holds.is_empty() && a.releases.is_empty(), "{a:?}");
        assert!(b.holder("hil/d", t).is_none());
    }
}
