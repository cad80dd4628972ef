use super::*;
use crate::fixtures;

fn nodes() -> Vec<String> {
    vec!["kedge1".into(), "kedge2".into()]
}

fn with_vips(vips: &[&str]) -> Device {
    let mut d = fixtures::device_with_reverse();
    d.spec.virtual_addresses = vips.iter().map(|s| s.to_string()).collect();
    d
}

#[test]
fn an_address_in_both_nodes_subnet_outside_their_ranges_passes_and_is_rendered() {
    let d = with_vips(&["172.17.16.250"]);
    assert_eq!(
        check(&d, &fixtures::network(), &nodes()),
        Vec::<String>::new()
    );
    assert_eq!(
        addresses(&d),
        vec!["172.17.16.250".parse::<IpAddr>().unwrap()]
    );
    let resolved = crate::reverse::resolve(&d, &fixtures::services(), "cluster.local");
    let c = crate::render::cni_config(&d, &fixtures::network(), &nodes(), &resolved);
    assert_eq!(c["virtualAddresses"], serde_json::json!(["172.17.16.250"]));
    let none = crate::render::cni_config(&fixtures::device(), &fixtures::network(), &nodes(), &[]);
    assert!(none.get("virtualAddresses").is_none(), "{none}");
}

#[test]
fn addresses_a_proxy_could_get_or_could_not_hold_are_refused_naming_why() {
    for (vips, want) in [
        (&["172.17.16.210"][..], "inside the range 172.17.16.200-172.17.16.224 that proxy pods on node kedge1"),
        (&["172.17.16.230"][..], "inside the range 172.17.16.225-172.17.16.249 that proxy pods on node kedge2"),
        (&["172.17.17.5"][..], "spec.virtualAddresses[0]: 172.17.17.5 is in no subnet EdgeNetwork plant-floor gives proxies on node kedge1"),
        (&["172.17.16.120"][..], "172.17.16.120 is the device's own address"),
        (&["172.17.16.255"][..], "the network or broadcast address of 172.17.16.0/24"),
        (&["172.17.16.250", "172.17.16.251"][..], "at most one IPv4 and one IPv6 address"),
        (&["fd00::1"][..], "fd00::1 is in no subnet"),
        (&["nonsense"][..], "\"nonsense\" is not an IP address"),
    ] {
        let p = check(&with_vips(vips), &fixtures::network(), &nodes());
        assert!(p.iter().any(|m| m.contains(want)), "{vips:?}: {p:?}");
    }
    let mut gw = fixtures::network();
    gw.spec.ipam.ranges[1].gateway = Some("172.17.16.254".into());
    let p = check(&with_vips(&["172.17.16.254"]), &gw, &nodes());
    assert!(
        p.iter()
            .any(|m| m.contains("is the gateway of node kedge2's range")),
        "{p:?}"
    );
    let mut bare = fixtures::device();
    bare.spec.virtual_addresses = vec!["172.17.16.250".into()];
    let p = check(&bare, &fixtures::network(), &nodes());
    assert!(p[0].contains("has no reverse entries"), "{p:?}");
}

fn cand(node: &str, alive: bool, serving: bool) -> Candidate {
    Candidate {
        node: node.into(),
        pod: format!("hil/d-{node}-0"),
        alive,
        serving,
    }
}

#[test]
fn the_holder_stays_while_it_serves_and_moves_to_the_first_that_does() {
    let both = [cand("kedge1", true, true), cand("kedge2", true, true)];
    assert_eq!(choose(None, &both).as_deref(), Some("hil/d-kedge1-0"));
    assert_eq!(
        choose(Some("hil/d-kedge2-0"), &both).as_deref(),
        Some("hil/d-kedge2-0"),
        "sticky"
    );
    let cut = [cand("kedge1", true, false), cand("kedge2", true, true)];
    assert_eq!(
        choose(Some("hil/d-kedge1-0"), &cut).as_deref(),
        Some("hil/d-kedge2-0")
    );
    let lost = [cand("kedge1", false, false), cand("kedge2", true, true)];
    assert_eq!(
        choose(Some("hil/d-kedge1-0"), &lost).as_deref(),
        Some("hil/d-kedge2-0")
    );
}

#[test]
fn with_no_node_serving_the_address_stays_where_it_is_alive_and_else_nowhere() {
    let dark = [cand("kedge1", true, false), cand("kedge2", true, false)];
    assert_eq!(
        choose(Some("hil/d-kedge2-0"), &dark).as_deref(),
        Some("hil/d-kedge2-0")
    );
    assert_eq!(choose(None, &dark).as_deref(), Some("hil/d-kedge1-0"));
    let gone = [cand("kedge1", false, false), cand("kedge2", false, false)];
    assert_eq!(choose(Some("hil/d-kedge1-0"), &gone), None);
    assert_eq!(choose(Some("hil/other-0"), &[]), None);
}

#[test]
fn a_node_whose_probe_starts_over_serves_while_its_proxy_is_ready() {
    let st = |reachable: &str, ready: bool| crate::crd::NodeStatus {
        node: "kedge1".into(),
        reachable: reachable.into(),
        ready,
        ..Default::default()
    };
    assert!(serves(&st("True", false)));
    assert!(serves(&st("Unknown", true)), "a take-over keeps it");
    assert!(!serves(&st("Unknown", false)), "a new proxy not probed yet");
    assert!(
        !serves(&st("False", true)),
        "unreachable, even if still Ready"
    );
}

#[test]
fn an_address_another_device_has_or_another_devices_virtual_address_is_refused() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let at = |secs: i64| {
        Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(secs).unwrap(),
        ))
    };
    let mut first = with_vips(&["172.17.16.250"]);
    first.metadata.creation_timestamp = at(1000);
    let mut second = with_vips(&["172.17.16.250"]);
    second.metadata.name = Some("device01-02".into());
    second.metadata.creation_timestamp = at(2000);
    let all = [first.clone(), second.clone()];
    assert_eq!(
        clashes(&first, &all),
        Vec::<String>::new(),
        "the older keeps it"
    );
    let p = clashes(&second, &all);
    assert_eq!(
        p,
        ["spec.virtualAddresses[0]: 172.17.16.250 is already Device hil/device01-01's virtual address on EdgeNetwork plant-floor"]
    );
    // A device's own address is never a virtual address, whoever came first.
    let mut device = fixtures::device();
    device.metadata.name = Some("device01-03".into());
    device.spec.address = "172.17.16.250".into();
    device.metadata.creation_timestamp = at(5000);
    let p = clashes(&first, [&device]);
    assert_eq!(p, ["spec.virtualAddresses[0]: 172.17.16.250 is the address of Device hil/device01-03's device"]);
    // Another EdgeNetwork's Devices are another segment.
    device.spec.network = "other".into();
    assert!(clashes(&first, [&device]).is_empty());
}
