use super::*;
use crate::clients::NamespaceLabels;
use crate::fixtures::{device, lease, phase, pod};
use std::collections::HashSet;

const T0: i64 = 1_767_225_600;

fn at(s: i64) -> Timestamp {
    Timestamp::from_second(T0 + s).unwrap()
}

/// A cluster: Devices, pods, namespaces' labels, lost nodes.
struct Cluster {
    devices: Vec<Device>,
    pods: Vec<Pod>,
    namespaces: NamespaceLabels,
    lost: HashSet<String>,
}

impl Cluster {
    fn new(pods: Vec<Pod>) -> Cluster {
        Cluster {
            devices: vec![device()],
            pods,
            namespaces: NamespaceLabels::from([
                (
                    "hil".into(),
                    BTreeMap::from([("team".into(), "hil".into())]),
                ),
                ("ci".into(), BTreeMap::from([("team".into(), "ci".into())])),
            ]),
            lost: HashSet::new(),
        }
    }

    /// One pass at second `s`, its statuses written back into `leases`.
    fn step(&self, leases: &mut [DeviceLease], s: i64) -> Vec<Decided> {
        let devices: Devices = self
            .devices
            .iter()
            .map(|d| ((d.namespace().unwrap(), d.name_any()), d))
            .collect();
        let w = World::new(&self.pods, &self.namespaces, &self.lost);
        let refs: Vec<&DeviceLease> = leases.iter().collect();
        let out = decide(&refs, &devices, &w, at(s));
        for d in &out {
            let l = leases
                .iter_mut()
                .find(|l| format!("{}/{}", l.namespace().unwrap(), l.name_any()) == d.name)
                .unwrap();
            l.status = Some(d.status.clone());
        }
        out
    }
}

fn states(out: &[Decided]) -> Vec<(String, &'static str, Option<u32>)> {
    out.iter()
        .map(|d| {
            (
                d.name.clone(),
                d.state().map_or("-", LeaseState::as_str),
                d.status.position,
            )
        })
        .collect()
}

fn runner(name: &str, ip: &str) -> Pod {
    pod("hil", name, &[("app", "runner")], ip, "kedge2")
}

#[test]
fn leases_queue_first_come_first_served_and_the_held_one_keeps_it() {
    let c = Cluster::new(vec![
        runner("r1", "10.0.0.1"),
        runner("r2", "10.0.0.2"),
        runner("r3", "10.0.0.3"),
    ]);
    let mut leases = vec![
        lease("hil", "c", 3, "{device: device01-01, holder: {pod: r3}}"),
        lease(
            "hil",
            "b",
            2,
            "{device: device01-01, holder: {pod: r2}, wait: true}",
        ),
        // Same second as b: the name decides.
        lease("hil", "a", 2, "{device: device01-01, holder: {pod: r1}}"),
    ];
    let out = c.step(&mut leases, 10);
    assert_eq!(
        states(&out),
        [
            ("hil/a".to_string(), "Held", None),
            ("hil/b".into(), "Waiting", Some(1)),
            ("hil/c".into(), "Waiting", Some(2)),
        ]
    );
    assert_eq!(out[0].holders[0].pod, "hil/r1");
    assert_eq!(
        out[0].status.since.as_deref(),
        Some(at(10).to_string().as_str())
    );
    assert_eq!(out[0].status.expires, None, "no durationSeconds");
    assert_eq!(out[0].status.holder.as_deref(), Some("pod/r1"));
    // A lease created earlier than the holder later on does not take it.
    leases.push(lease(
        "hil",
        "early",
        0,
        "{device: device01-01, holder: {pod: r3}}",
    ));
    let out = c.step(&mut leases, 20);
    assert_eq!(
        states(&out),
        [
            ("hil/early".to_string(), "Waiting", Some(1)),
            ("hil/a".into(), "Held", None),
            ("hil/b".into(), "Waiting", Some(2)),
            ("hil/c".into(), "Waiting", Some(3)),
        ]
    );
    assert_eq!(
        out[1].status.since.as_deref(),
        Some(at(10).to_string().as_str()),
        "since stays"
    );
}

#[test]
fn a_lease_expires_its_duration_after_it_was_held_and_the_next_is_held() {
    let c = Cluster::new(vec![runner("r1", "10.0.0.1"), runner("r2", "10.0.0.2")]);
    let mut leases = vec![
        lease(
            "hil",
            "a",
            1,
            "{device: device01-01, holder: {pod: r1}, durationSeconds: 60}",
        ),
        lease(
            "hil",
            "b",
            2,
            "{device: device01-01, holder: {pod: r2}, durationSeconds: 60}",
        ),
    ];
    c.step(&mut leases, 100);
    let out = c.step(&mut leases, 159);
    assert_eq!(states(&out)[0].1, "Held");
    assert_eq!(
        out[0].status.expires.as_deref(),
        Some(at(160).to_string().as_str())
    );
    let out = c.step(&mut leases, 160);
    assert_eq!(states(&out)[0].1, "Expired");
    assert_eq!(states(&out)[1].1, "Held");
    assert_eq!(
        out[1].status.expires.as_deref(),
        Some(at(220).to_string().as_str()),
        "its own duration from now"
    );
    // Ended stays ended, whatever its holder does.
    let out = c.step(&mut leases, 500);
    assert_eq!(
        states(&out).iter().map(|s| s.1).collect::<Vec<_>>(),
        ["Expired", "Expired"]
    );
    assert_eq!(
        out[0].status.since.as_deref(),
        Some(at(160).to_string().as_str())
    );
}

#[test]
fn a_lease_is_released_when_its_holders_pods_are_gone_not_before_they_came() {
    let job =
        |name: &str, ip: &str, label: &str| pod("hil", name, &[(label, "hil-42")], ip, "kedge2");
    let mut c = Cluster::new(vec![]);
    let mut leases = vec![
        lease("hil", "a", 1, "{device: device01-01, holder: {job: hil-42}}"),
        lease("hil", "b", 2, "{device: device01-01, holder: {podSelector: {matchLabels: {app: runner}}}, wait: true}"),
    ];
    // The Job has no pods yet: Held, waiting for them.
    let out = c.step(&mut leases, 1);
    assert_eq!(states(&out)[0].1, "Held");
    assert!(out[0].holders.is_empty());
    c.pods = vec![
        job("j-1", "10.0.0.1", JOB_LABEL),
        job("j-2", "10.0.0.2", OLD_JOB_LABEL),
    ];
    let out = c.step(&mut leases, 2);
    assert_eq!(
        out[0]
            .holders
            .iter()
            .map(|h| h.pod.as_str())
            .collect::<Vec<_>>(),
        ["hil/j-1", "hil/j-2"]
    );
    assert_eq!(out[0].status.holder_seen, Some(true));
    // One pod done: still Held, by the other only.
    c.pods[0] = phase(c.pods[0].clone(), "Succeeded");
    let out = c.step(&mut leases, 3);
    assert_eq!(states(&out)[0].1, "Held");
    assert_eq!(out[0].holders.len(), 1);
    // Its node is lost: the last pod counts as gone.
    c.lost.insert("kedge2".into());
    let out = c.step(&mut leases, 4);
    assert_eq!(states(&out)[0].1, "Released");
    assert_eq!(states(&out)[1].1, "Held", "the next one");
    c.lost.clear();
    let out = c.step(&mut leases, 5);
    assert_eq!(states(&out)[0].1, "Released", "for good");
}

#[test]
fn a_lease_from_another_namespace_is_refused_unless_allowed_clients_selects_it() {
    let ci = pod("ci", "runner", &[("app", "ci")], "10.0.1.1", "kedge2");
    let mut c = Cluster::new(vec![ci]);
    let mut leases = vec![lease(
        "ci",
        "mine",
        1,
        "{device: device01-01, deviceNamespace: hil, holder: {pod: runner}}",
    )];
    let out = c.step(&mut leases, 1);
    assert_eq!(states(&out)[0].1, "Refused");
    assert!(
        out[0]
            .status
            .message
            .as_deref()
            .unwrap()
            .contains("namespace ci"),
        "{:?}",
        out[0].status.message
    );
    // A podSelector alone selects the Device's namespace only.
    c.devices[0].spec.access = Some(
        serde_norway::from_str("{allowedClients: [{podSelector: {matchLabels: {app: ci}}}]}")
            .unwrap(),
    );
    assert_eq!(states(&c.step(&mut leases, 2))[0].1, "Refused");
    c.devices[0].spec.access = Some(
        serde_norway::from_str(
            "{allowedClients: [{namespaceSelector: {matchLabels: {team: ci}}}]}",
        )
        .unwrap(),
    );
    let out = c.step(&mut leases, 3);
    assert_eq!(states(&out)[0].1, "Held");
    assert_eq!(out[0].holders[0].pod, "ci/runner");
    // A Device that does not exist: Waiting, said so.
    let mut other = vec![lease("hil", "x", 1, "{device: nope, holder: {pod: r}}")];
    let out = c.step(&mut other, 1);
    assert_eq!(states(&out)[0], ("hil/x".to_string(), "Waiting", None));
    assert_eq!(
        out[0].status.message.as_deref(),
        Some("Device hil/nope does not exist")
    );
}
