use super::*;
use crate::access::book::Book;
use crate::clients::NamespaceLabels;
use crate::crd::DeviceLeaseStatus;
use crate::fixtures::{device, phase, pod, proxy_pod};
use std::collections::HashSet;

fn namespaces() -> NamespaceLabels {
    NamespaceLabels::from([
        (
            "hil".into(),
            BTreeMap::from([("team".into(), "hil".into())]),
        ),
        ("ci".into(), BTreeMap::from([("team".into(), "ci".into())])),
        (
            "web".into(),
            BTreeMap::from([("team".into(), "web".into())]),
        ),
    ])
}

fn pods() -> Vec<Pod> {
    let mut host = pod("ci", "host", &[("app", "ci")], "192.168.1.10", "kedge2");
    host.spec.as_mut().unwrap().host_network = Some(true);
    let mut dual = pod("ci", "dual", &[("app", "ci")], "10.0.1.2", "kedge2");
    dual.status.as_mut().unwrap().pod_ips = Some(
        serde_json::from_value(serde_json::json!([{"ip": "10.0.1.2"}, {"ip": "fd00::2"}])).unwrap(),
    );
    let mut deleting = pod("ci", "deleting", &[("app", "ci")], "10.0.1.3", "kedge2");
    deleting.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()),
    );
    vec![
        proxy_pod(),
        pod("hil", "tester", &[("app", "ci")], "10.0.0.1", "kedge2"),
        pod("hil", "other", &[("app", "web")], "10.0.0.2", "kedge2"),
        pod("ci", "runner", &[("app", "ci")], "10.0.1.1", "kedge2"),
        pod("web", "front", &[("app", "ci")], "10.0.2.1", "kedge2"),
        phase(
            pod("ci", "done", &[("app", "ci")], "10.0.1.9", "kedge2"),
            "Succeeded",
        ),
        host,
        dual,
        deleting,
    ]
}

fn with_access(yaml: &str) -> Device {
    let mut d = device();
    d.spec.access = Some(serde_norway::from_str(yaml).unwrap());
    d
}

fn names(c: &[Client]) -> Vec<String> {
    c.iter()
        .map(|c| format!("{} {}", c.pod, c.address))
        .collect()
}

#[test]
fn allowed_clients_select_as_networkpolicy_peers_do() {
    let (pods, ns, lost) = (pods(), namespaces(), HashSet::new());
    let w = World::new(&pods, &ns, &lost);
    assert_eq!(allowed(&device(), &w), None, "no access: everyone");
    assert_eq!(
        allowed(&with_access("{allowedClients: []}"), &w),
        None,
        "empty: everyone"
    );
    // podSelector alone: the Device's namespace (hil) only.
    let d = with_access("{allowedClients: [{podSelector: {matchLabels: {app: ci}}}]}");
    assert_eq!(names(&allowed(&d, &w).unwrap()), ["hil/tester 10.0.0.1"]);
    // namespaceSelector alone: every live pod of ci, each address; not the
    // hostNetwork pod, the finished one, the one being deleted.
    let d = with_access("{allowedClients: [{namespaceSelector: {matchLabels: {team: ci}}}]}");
    assert_eq!(
        names(&allowed(&d, &w).unwrap()),
        ["ci/runner 10.0.1.1", "ci/dual 10.0.1.2", "ci/dual fd00::2"]
    );
    // (In the order of their addresses.) Both: matching pods in matching namespaces; two peers add up.
    let d = with_access(
        "{allowedClients: [{namespaceSelector: {matchExpressions: [{key: team, operator: In, values: [ci, web]}]}, podSelector: {matchLabels: {app: ci}}}, {podSelector: {matchLabels: {app: web}}}]}",
    );
    assert_eq!(
        names(&allowed(&d, &w).unwrap()),
        [
            "hil/other 10.0.0.2",
            "ci/runner 10.0.1.1",
            "ci/dual 10.0.1.2",
            "web/front 10.0.2.1",
            "ci/dual fd00::2"
        ]
    );
    // A peer that selects nobody: nobody (not everyone).
    let d = with_access("{allowedClients: [{podSelector: {matchLabels: {app: none}}}]}");
    assert_eq!(allowed(&d, &w), Some(vec![]));
    // A pod on a lost node is gone: of every namespace's pods, only
    // those of kedge1 are left.
    let lost = HashSet::from(["kedge2".to_string()]);
    let w = World::new(&pods, &ns, &lost);
    let d = with_access("{allowedClients: [{namespaceSelector: {}}]}");
    assert_eq!(
        names(&allowed(&d, &w).unwrap()),
        ["hil/device01-01-0 10.244.1.9"]
    );
}

fn decided(name: &str, state: LeaseState, wait: bool, holders: Vec<Client>) -> Decided {
    Decided {
        name: name.into(),
        device: ("hil".into(), "device01-01".into()),
        status: DeviceLeaseStatus {
            state: Some(state),
            ..Default::default()
        },
        holders,
        wait,
        duration: None,
    }
}

fn client(pod: &str, ip: &str) -> Client {
    Client {
        address: ip.parse().unwrap(),
        pod: pod.into(),
    }
}

#[test]
fn a_nodes_rules_name_its_restricted_proxy_pods_only() {
    let (pods, ns, lost) = (pods(), namespaces(), HashSet::new());
    let w = World::new(&pods, &ns, &lost);
    let open = device();
    let devices: Devices = [(("hil".to_string(), "device01-01".to_string()), &open)].into();
    assert!(rules(&pods, &devices, &w, &[]).is_empty(), "an open Device");
    let d = with_access("{allowedClients: [{podSelector: {matchLabels: {app: ci}}}]}");
    let devices: Devices = [(("hil".to_string(), "device01-01".to_string()), &d)].into();
    let r = rules(&pods, &devices, &w, &[]);
    let a = &r["kedge1"]["hil/device01-01-0"];
    assert_eq!(a.device, "hil/device01-01");
    assert_eq!(names(a.allowed.as_ref().unwrap()), ["hil/tester 10.0.0.1"]);
    assert_eq!(a.lease, None);
    assert_eq!(r.len(), 1, "no other node");
    // An open Device under a lease: its holders, and the waiters that wait.
    let leases = [
        decided(
            "hil/a",
            LeaseState::Held,
            false,
            vec![client("hil/tester", "10.0.0.1")],
        ),
        decided(
            "hil/b",
            LeaseState::Waiting,
            true,
            vec![client("ci/runner", "10.0.1.1")],
        ),
        decided(
            "hil/c",
            LeaseState::Waiting,
            false,
            vec![client("hil/other", "10.0.0.2")],
        ),
        decided("hil/d", LeaseState::Released, true, vec![]),
    ];
    let devices: Devices = [(("hil".to_string(), "device01-01".to_string()), &open)].into();
    let r = rules(&pods, &devices, &w, &leases);
    let a = &r["kedge1"]["hil/device01-01-0"];
    assert_eq!(a.allowed, None);
    let l = a.lease.as_ref().unwrap();
    assert_eq!(l.name, "hil/a");
    assert_eq!(names(&l.holders), ["hil/tester 10.0.0.1"]);
    assert_eq!(names(&l.waiting), ["ci/runner 10.0.1.1"]);
}

#[test]
fn the_generation_changes_with_the_content_only() {
    let one = |clients: Vec<Client>| -> Attachments {
        BTreeMap::from([(
            "hil/device01-01-0".to_string(),
            AttachmentAccess {
                device: "hil/device01-01".into(),
                allowed: Some(clients),
                lease: None,
            },
        )])
    };
    let a = generation(&one(vec![client("ci/a", "10.0.0.1")]));
    assert_eq!(a.len(), 16);
    assert_eq!(a, generation(&one(vec![client("ci/a", "10.0.0.1")])));
    assert_ne!(a, generation(&one(vec![client("ci/a", "10.0.0.2")])));
    assert_ne!(a, generation(&one(vec![])));
    assert!(!generation(&Attachments::new()).is_empty());
}

#[test]
fn rules_too_large_are_cut_to_fit_and_say_which_devices() {
    let many: Vec<Client> = (0..5000u32)
        .map(|i| {
            client(
                &format!("ci/p{i}"),
                &std::net::Ipv4Addr::from(0x0a00_0000 + i).to_string(),
            )
        })
        .collect();
    let big = BTreeMap::from([(
        "hil/device01-01-0".to_string(),
        AttachmentAccess {
            device: "hil/device01-01".into(),
            allowed: Some(many.clone()),
            lease: None,
        },
    )]);
    let (r, cut) = fit(big.clone(), 1 << 20);
    assert!(cut.is_empty());
    assert_eq!(r.attachments, big);
    let (r, cut) = fit(big, 64 << 10);
    assert_eq!(cut, ["hil/device01-01"]);
    let kept = r.attachments["hil/device01-01-0"].allowed.as_ref().unwrap();
    assert!(!kept.is_empty() && kept.len() < 5000 && kept[..] == many[..kept.len()]);
    assert!(serde_json::to_vec(&r.attachments).unwrap().len() <= 64 << 10);
    assert_eq!(r.generation, generation(&r.attachments));
}

#[test]
fn a_heartbeat_is_answered_rules_only_when_its_generation_differs() {
    let mut book = Book::new();
    assert_eq!(
        book.answer("kedge1", None),
        None,
        "not made yet: nothing, not 'open'"
    );
    let attachments = BTreeMap::from([(
        "hil/device01-01-0".to_string(),
        AttachmentAccess {
            device: "hil/device01-01".into(),
            allowed: Some(vec![]),
            lease: None,
        },
    )]);
    let (rules, _) = fit(attachments, MAX_RULES_BYTES);
    let g = rules.generation.clone();
    book.set(BTreeMap::from([("kedge1".to_string(), rules.clone())]));
    assert_eq!(book.answer("kedge1", Some("")).as_deref(), Some(&rules));
    assert_eq!(book.answer("kedge1", None).as_deref(), Some(&rules));
    assert_eq!(book.answer("kedge1", Some("0123")).as_deref(), Some(&rules));
    assert_eq!(book.answer("kedge1", Some(&g)), None);
    // A node without restricted pods gets the empty rules once.
    let empty = book.answer("kedge2", Some("")).unwrap();
    assert!(empty.attachments.is_empty() && !empty.generation.is_empty());
    assert_eq!(book.answer("kedge2", Some(&empty.generation)), None);
    // kedge1's rules went: it is told so.
    book.set(BTreeMap::new());
    assert_eq!(book.answer("kedge1", Some(&g)).as_deref(), Some(&*empty));
}

#[test]
fn kernel_path_ports_are_reported_on_a_restricted_or_leased_device() {
    assert_eq!(verdict(&device(), false, false), None, "open");
    let mut d = device();
    assert_eq!(verdict(&d, true, false).unwrap().reason, "Enforced");
    d.spec.ports[1].path = Some(ForwardPath::Kernel);
    let v = verdict(&d, true, false).unwrap();
    assert_eq!((v.status, v.reason), ("False", "KernelPath"));
    assert!(
        v.message.contains("telemetry") && v.message.contains("nothing limits"),
        "{}",
        v.message
    );
    d.spec.access = Some(serde_norway::from_str("{allowedClients: [{podSelector: {}}]}").unwrap());
    let v = verdict(&d, false, false).unwrap();
    assert!(
        v.message.contains("NetworkPolicy device01-01"),
        "{}",
        v.message
    );
    d.spec.ports[1].path = None;
    assert_eq!(verdict(&d, false, true).unwrap().reason, "TooManyClients");
}
