use super::*;
use crate::wire::LeaseAccess;

fn client(a: &str, pod: &str) -> Client {
    Client {
        address: a.parse().unwrap(),
        pod: pod.into(),
    }
}

fn ip(a: &str) -> IpAddr {
    a.parse().unwrap()
}

fn rules(generation: &str, key: &str, a: AttachmentAccess) -> AccessRules {
    AccessRules {
        generation: generation.into(),
        attachments: [(key.to_string(), a)].into(),
    }
}

#[test]
fn the_allowed_list_comes_first_then_the_lease() {
    let r = Rule::from_wire(&AttachmentAccess {
        device: "lab/d".into(),
        allowed: Some(vec![
            client("10.0.0.1", "ci/a"),
            client("10.0.0.2", "ci/b"),
            client("10.0.0.3", "ci/c"),
        ]),
        lease: Some(LeaseAccess {
            name: "ci/l".into(),
            holders: vec![client("10.0.0.1", "ci/a"), client("10.0.0.9", "other/x")],
            waiting: vec![client("10.0.0.2", "ci/b")],
        }),
    });
    assert_eq!(r.verdict(ip("10.0.0.1")), Verdict::Allowed);
    assert_eq!(
        r.verdict(ip("::ffff:10.0.0.1")),
        Verdict::Allowed,
        "IPv4-mapped"
    );
    assert_eq!(r.verdict(ip("10.0.0.2")), Verdict::Wait);
    assert_eq!(r.verdict(ip("10.0.0.3")), Verdict::Refused(Refusal::Lease));
    // A holder the policy does not allow is refused by the policy.
    assert_eq!(r.verdict(ip("10.0.0.9")), Verdict::Refused(Refusal::Policy));
    assert_eq!(r.verdict(ip("10.0.0.4")), Verdict::Refused(Refusal::Policy));
    assert_eq!(r.pod_of(ip("10.0.0.2")), Some("ci/b"));
    assert_eq!(r.pod_of(ip("10.0.0.4")), None);
    assert_eq!(r.lease(), Some("ci/l"));
}

#[test]
fn no_rule_is_open_and_an_empty_list_is_nobody() {
    let open = Rule::from_wire(&AttachmentAccess::default());
    assert_eq!(open.verdict(ip("192.0.2.1")), Verdict::Allowed);
    let nobody = Rule::from_wire(&AttachmentAccess {
        allowed: Some(Vec::new()),
        ..Default::default()
    });
    assert_eq!(
        nobody.verdict(ip("192.0.2.1")),
        Verdict::Refused(Refusal::Policy)
    );
    let access = Access::default();
    assert_eq!(
        access.slot("lab/d-0").verdict(ip("192.0.2.1")),
        Verdict::Allowed
    );
}

#[test]
fn a_replace_bumps_only_the_slots_whose_rule_changed() {
    let access = Access::default();
    let a = access.slot("lab/a-0");
    let b = access.slot("lab/b-0");
    let (mut wa, wb) = (a.subscribe(), b.subscribe());
    let only_a = AttachmentAccess {
        device: "lab/a".into(),
        allowed: Some(vec![client("10.0.0.1", "ci/a")]),
        lease: None,
    };
    let changed = access.replace(rules("g1", "lab/a-0", only_a.clone()));
    assert_eq!(changed, vec!["lab/a-0".to_string()]);
    assert!(wa.has_changed().unwrap() && !wb.has_changed().unwrap());
    wa.mark_unchanged();
    assert_eq!(a.verdict(ip("10.0.0.2")), Verdict::Refused(Refusal::Policy));
    assert_eq!(access.generation(), "g1");
    // The same content again: nothing changes.
    assert!(access.replace(rules("g2", "lab/a-0", only_a)).is_empty());
    assert!(!wa.has_changed().unwrap());
    // A slot made after the rules came gets its rule at once.
    let later = Access::default();
    later.replace(rules(
        "g1",
        "lab/c-0",
        AttachmentAccess {
            allowed: Some(vec![]),
            ..Default::default()
        },
    ));
    assert_eq!(
        later.slot("lab/c-0").verdict(ip("10.0.0.1")),
        Verdict::Refused(Refusal::Policy)
    );
    // Rules without the attachment: open again.
    access.replace(AccessRules {
        generation: "g3".into(),
        ..Default::default()
    });
    assert!(wa.has_changed().unwrap());
    assert_eq!(a.verdict(ip("10.0.0.2")), Verdict::Allowed);
}

#[test]
fn the_rules_survive_a_restart_in_the_state_directory() {
    let dir = tempfile::tempdir().unwrap();
    let access = Access::default();
    access.load(dir.path()).unwrap();
    assert_eq!(access.generation(), "", "nothing saved: no rules");
    let a = AttachmentAccess {
        device: "lab/a".into(),
        allowed: Some(vec![client("fd00::1", "ci/a")]),
        lease: None,
    };
    access.replace(rules("g7", "lab/a-0", a));
    access.save(dir.path()).unwrap();
    let next = Access::default();
    next.load(dir.path()).unwrap();
    assert_eq!(next.generation(), "g7");
    assert_eq!(
        next.slot("lab/a-0").verdict(ip("fd00::2")),
        Verdict::Refused(Refusal::Policy)
    );
    std::fs::write(dir.path().join(FILE), b"{not json").unwrap();
    let e = Access::default().load(dir.path()).unwrap_err().to_string();
    assert!(
        e.contains("access.json") && e.contains("not access rules"),
        "{e}"
    );
}

#[test]
fn only_a_rule_that_may_refuse_a_client_let_through_before_narrows() {
    let rule = |allowed: Option<Vec<Client>>, lease: Option<(&str, Vec<Client>)>| {
        Rule::from_wire(&AttachmentAccess {
            device: "lab/d".into(),
            allowed,
            lease: lease.map(|(name, holders)| LeaseAccess {
                name: name.into(),
                holders,
                waiting: vec![],
            }),
        })
    };
    let (a, b) = (client("10.0.0.1", "ci/a"), client("10.0.0.2", "ci/b"));
    let open = rule(None, None);
    let only_a = rule(Some(vec![a.clone()]), None);
    let a_and_b = rule(Some(vec![a.clone(), b.clone()]), None);
    let leased = rule(
        Some(vec![a.clone(), b.clone()]),
        Some(("ci/l", vec![a.clone()])),
    );
    let leased_more = rule(
        Some(vec![a.clone(), b.clone()]),
        Some(("ci/l", vec![a.clone(), b.clone()])),
    );
    let other_lease = rule(
        Some(vec![a.clone(), b.clone()]),
        Some(("ci/m", vec![a.clone(), b])),
    );
    // A new client pod, a lease that ends, more holders: nobody refused.
    assert!(!Rule::narrows(Some(&only_a), Some(&a_and_b)));
    assert!(!Rule::narrows(Some(&leased), Some(&a_and_b)));
    assert!(!Rule::narrows(Some(&leased), Some(&leased_more)));
    assert!(!Rule::narrows(Some(&only_a), None), "no rule: open");
    assert!(!Rule::narrows(None, None));
    // A client dropped, a rule where there was none, a lease taken or
    // passed to another: check again.
    assert!(Rule::narrows(Some(&a_and_b), Some(&only_a)));
    assert!(Rule::narrows(None, Some(&open)));
    assert!(Rule::narrows(Some(&open), Some(&only_a)));
    assert!(Rule::narrows(Some(&a_and_b), Some(&leased)));
    assert!(Rule::narrows(Some(&leased_more), Some(&other_lease)));
    assert!(Rule::narrows(Some(&leased_more), Some(&leased)));
    // A slot says so apart from any change.
    let access = Access::default();
    let slot = access.slot("lab/d-0");
    let (changed, narrowed) = (slot.subscribe(), slot.subscribe_narrowed());
    let wire = |allowed: Vec<Client>| {
        rules(
            "g",
            "lab/d-0",
            AttachmentAccess {
                device: "lab/d".into(),
                allowed: Some(allowed),
                lease: None,
            },
        )
    };
    access.replace(wire(vec![client("10.0.0.1", "ci/a")]));
    assert!(changed.has_changed().unwrap() && narrowed.has_changed().unwrap());
    let (changed, narrowed) = (slot.subscribe(), slot.subscribe_narrowed());
    access.replace(wire(vec![
        client("10.0.0.1", "ci/a"),
        client("10.0.0.2", "ci/b"),
    ]));
    assert!(changed.has_changed().unwrap(), "waiting clients look again");
    assert!(
        !narrowed.has_changed().unwrap(),
        "live connections are left alone"
    );
}
