use super::*;
use serde_json::json;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn net(s: &str) -> IpNetwork {
    s.parse().unwrap()
}

fn err(v: Value) -> ConfigError {
    match IpamConfig::from_json(&v, "kedge1") {
        Ok(cfg) => panic!("expected an error for {v}, got {cfg:?}"),
        Err(e) => e,
    }
}

/// Asserts the error names `field` and that its message contains each of `parts`.
fn assert_err(v: Value, field: &str, parts: &[&str]) {
    let e = err(v);
    let msg = e.to_string();
    assert_eq!(e.field, field, "message: {msg}");
    assert!(msg.starts_with(&format!("{field}: ")), "message: {msg}");
    for p in parts {
        assert!(msg.contains(p), "{msg:?} lacks {p:?}");
    }
}

#[test]
fn full_example_from_the_docs() {
    let v = json!({
        "type": "edgelink",
        "ranges": [[{"subnet": "172.17.16.0/24",
                     "rangeStart": "172.17.16.200", "rangeEnd": "172.17.16.250",
                     "gateway": "172.17.16.1"}]],
        "exclude": ["172.17.16.210/32", "172.17.16.220"],
        "routes": [{"dst": "172.17.0.0/16"}, {"dst": "10.9.0.0/16", "gw": "172.17.16.1"}],
        "dns": {"nameservers": ["172.17.16.53"], "domain": "plant", "search": ["plant"], "options": ["ndots:2"]},
        "probe": {"enabled": true, "timeoutMs": 50},
        "someFutureKey": {"anything": 1}
    });
    let cfg = IpamConfig::from_json(&v, "kedge1").unwrap();
    assert_eq!(cfg.range_sets.len(), 1);
    let r = &cfg.range_sets[0].ranges[0];
    assert_eq!(r.subnet, net("172.17.16.0/24"));
    assert_eq!(r.start, ip("172.17.16.200"));
    assert_eq!(r.end, ip("172.17.16.250"));
    assert_eq!(r.gateway, Some(ip("172.17.16.1")));
    assert_eq!(r.node, None);
    assert_eq!(
        cfg.exclude,
        vec![net("172.17.16.210/32"), net("172.17.16.220/32")]
    );
    assert_eq!(
        cfg.routes,
        vec![
            RouteConfig {
                dst: net("172.17.0.0/16"),
                gw: None
            },
            RouteConfig {
                dst: net("10.9.0.0/16"),
                gw: Some(ip("172.17.16.1"))
            },
        ]
    );
    assert_eq!(cfg.dns.as_ref().unwrap()["domain"], "plant");
    assert_eq!(
        cfg.probe,
        ProbeConfig {
            enabled: true,
            timeout: Duration::from_millis(50)
        }
    );
    assert_eq!(cfg.subnets(), vec![net("172.17.16.0/24")]);
    assert!(cfg.is_excluded(ip("172.17.16.210")));
    assert!(!cfg.is_excluded(ip("172.17.16.211")));
}

#[test]
fn defaults_ipv4_ipv6_and_small_subnets() {
    let v = json!({"ranges": [
        [{"subnet": "10.1.0.0/24"}, {"subnet": "10.2.0.0/31"}, {"subnet": "10.3.0.7/32"}],
        [{"subnet": "2001:db8::/64"}]
    ]});
    let cfg = IpamConfig::from_json(&v, "n").unwrap();
    let r = |i: usize, j: usize| &cfg.range_sets[i].ranges[j];
    assert_eq!(
        (r(0, 0).start, r(0, 0).end),
        (ip("10.1.0.1"), ip("10.1.0.254"))
    );
    assert_eq!(
        (r(1, 0).start, r(1, 0).end),
        (ip("2001:db8::1"), ip("2001:db8::ffff:ffff:ffff:ffff"))
    );
    assert_eq!(
        (r(0, 1).start, r(0, 1).end),
        (ip("10.2.0.0"), ip("10.2.0.1"))
    );
    assert_eq!(
        (r(0, 2).start, r(0, 2).end),
        (ip("10.3.0.7"), ip("10.3.0.7"))
    );
    assert_eq!(
        cfg.probe,
        ProbeConfig {
            enabled: false,
            timeout: Duration::from_millis(200)
        }
    );
    assert!(cfg.exclude.is_empty() && cfg.routes.is_empty() && cfg.dns.is_none());
}

#[test]
fn subnet_host_bits_are_cleared() {
    let cfg =
        IpamConfig::from_json(&json!({"ranges": [[{"subnet": "10.1.0.9/24"}]]}), "n").unwrap();
    assert_eq!(cfg.range_sets[0].ranges[0].subnet, net("10.1.0.0/24"));
    assert_eq!(cfg.range_sets[0].ranges[0].start, ip("10.1.0.1"));
}

#[test]
fn range_for_and_subnets() {
    let v = json!({"ranges": [
        [{"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.10", "rangeEnd": "10.1.0.20"},
         {"subnet": "10.1.1.0/24"}],
        [{"subnet": "fd00::/120"}]
    ]});
    let cfg = IpamConfig::from_json(&v, "n").unwrap();
    assert_eq!(
        cfg.range_for(ip("10.1.0.15")).map(|(s, r)| (s, r.subnet)),
        Some((0, net("10.1.0.0/24")))
    );
    assert_eq!(
        cfg.range_for(ip("10.1.1.7")).map(|(s, r)| (s, r.subnet)),
        Some((0, net("10.1.1.0/24")))
    );
    assert_eq!(cfg.range_for(ip("fd00::9")).map(|(s, _)| s), Some(1));
    assert!(
        cfg.range_for(ip("10.1.0.9")).is_none(),
        "outside rangeStart..rangeEnd"
    );
    assert!(cfg.range_for(ip("10.9.0.1")).is_none());
    assert_eq!(
        cfg.subnets(),
        vec![net("10.1.0.0/24"), net("10.1.1.0/24"), net("fd00::/120")]
    );
}

#[test]
fn node_filtering_keeps_own_and_unlabelled_ranges() {
    let v = json!({"nodeName": "kedge1", "ranges": [
        [{"subnet": "172.17.16.0/24", "rangeStart": "172.17.16.100", "rangeEnd": "172.17.16.149", "node": "kedge1"},
         {"subnet": "172.17.16.0/24", "rangeStart": "172.17.16.150", "rangeEnd": "172.17.16.199", "node": "kedge2"},
         {"subnet": "10.7.0.0/24"}],
        [{"subnet": "fd00:1::/64", "node": "kedge2"}]
    ]});
    assert_eq!(node_name_override(&v), Some("kedge1".to_string()));
    let cfg = IpamConfig::from_json(&v, "kedge1").unwrap();
    assert_eq!(
        cfg.range_sets.len(),
        1,
        "the IPv6 set only has kedge2's range"
    );
    assert_eq!(cfg.range_sets[0].ranges.len(), 2);
    assert_eq!(cfg.range_sets[0].ranges[0].start, ip("172.17.16.100"));
    assert_eq!(cfg.range_sets[0].ranges[1].subnet, net("10.7.0.0/24"));

    let cfg2 = IpamConfig::from_json(&v, "kedge2").unwrap();
    assert_eq!(cfg2.range_sets.len(), 2);
    assert_eq!(cfg2.range_sets[0].ranges[0].start, ip("172.17.16.150"));
}

#[test]
fn no_range_for_this_node() {
    let v = json!({"ranges": [[{"subnet": "172.17.16.0/25", "node": "kedge1"}]]});
    let e = IpamConfig::from_json(&v, "kedge2").unwrap_err();
    assert_eq!(
        e.to_string(),
        "ipam.ranges: no range applies to node \"kedge2\""
    );
}

#[test]
fn node_name_override_variants() {
    assert_eq!(node_name_override(&json!({})), None);
    assert_eq!(node_name_override(&json!({"nodeName": ""})), None);
    assert_eq!(node_name_override(&json!({"nodeName": 3})), None);
    assert_eq!(
        node_name_override(&json!({"nodeName": "a"})),
        Some("a".into())
    );
}

#[test]
fn overlap_is_checked_across_nodes_and_sets() {
    // The docs' example message.
    let e =
        err(json!({"ranges": [[{"subnet": "172.17.16.0/24"}], [{"subnet": "172.17.16.0/25"}]]}));
    assert_eq!(
        e.to_string(),
        "ipam.ranges[1][0]: 172.17.16.0/25 overlaps ipam.ranges[0][0] (172.17.16.0/24)"
    );
    // Ranges of other nodes count too.
    assert_err(
        json!({"ranges": [[
            {"subnet": "172.17.16.0/24", "rangeStart": "172.17.16.100", "rangeEnd": "172.17.16.150", "node": "kedge1"},
            {"subnet": "172.17.16.0/24", "rangeStart": "172.17.16.150", "rangeEnd": "172.17.16.199", "node": "kedge2"}]]}),
        "ipam.ranges[0][1]",
        &[
            "172.17.16.150-172.17.16.199 (172.17.16.0/24)",
            "overlaps ipam.ranges[0][0]",
            "172.17.16.100-172.17.16.150",
        ],
    );
    assert_err(
        json!({"ranges": [[{"subnet": "fd00::/64"}], [{"subnet": "fd00::/48"}]]}),
        "ipam.ranges[1][0]",
        &["fd00::/48", "overlaps ipam.ranges[0][0] (fd00::/64)"],
    );
    // Adjacent spans of one subnet are fine, families never overlap.
    IpamConfig::from_json(
        &json!({"ranges": [[
            {"subnet": "172.17.16.0/24", "rangeStart": "172.17.16.100", "rangeEnd": "172.17.16.149"},
            {"subnet": "172.17.16.0/24", "rangeStart": "172.17.16.150", "rangeEnd": "172.17.16.199"}],
            [{"subnet": "::/0"}]]}),
        "n",
    )
    .unwrap();
}

#[test]
fn bad_top_level() {
    assert_err(json!("x"), "ipam", &["\"x\"", "is not an object"]);
    assert_err(json!({}), "ipam.ranges", &["is missing"]);
    assert_err(json!({"ranges": []}), "ipam.ranges", &["[]", "is empty"]);
    assert_err(
        json!({"ranges": {"subnet": "10.0.0.0/24"}}),
        "ipam.ranges",
        &["{\"subnet\":\"10.0.0.0/24\"}", "is not an array"],
    );
    assert_err(
        json!({"ranges": [{"subnet": "10.0.0.0/24"}]}),
        "ipam.ranges[0]",
        &["is not an array of ranges"],
    );
    assert_err(
        json!({"ranges": [[]]}),
        "ipam.ranges[0]",
        &["[]", "empty range set"],
    );
    assert_err(
        json!({"ranges": [["10.0.0.0/24"]]}),
        "ipam.ranges[0][0]",
        &["\"10.0.0.0/24\"", "is not a range object"],
    );
}

#[test]
fn bad_subnets() {
    let e = err(json!({"ranges": [[{"subnet": "10.1.0.0/24"}, {"subnet": "10.0.0.0/33"}]]}));
    assert_eq!(
        e.to_string(),
        "ipam.ranges[0][1].subnet: \"10.0.0.0/33\" is not a CIDR"
    );
    assert_eq!(e.value, "\"10.0.0.0/33\"");
    assert_err(
        json!({"ranges": [[{"subnet": "10.0.0.0"}]]}),
        "ipam.ranges[0][0].subnet",
        &["\"10.0.0.0\"", "prefix length"],
    );
    assert_err(
        json!({"ranges": [[{"subnet": "banana/8"}]]}),
        "ipam.ranges[0][0].subnet",
        &["\"banana/8\"", "is not a CIDR"],
    );
    assert_err(
        json!({"ranges": [[{"subnet": 10}]]}),
        "ipam.ranges[0][0].subnet",
        &["10 is not a string"],
    );
    assert_err(
        json!({"ranges": [[{"rangeStart": "10.0.0.1"}]]}),
        "ipam.ranges[0][0].subnet",
        &["is missing"],
    );
}

#[test]
fn bad_range_bounds_and_gateway() {
    let base = |extra: Value| {
        let mut r = json!({"subnet": "10.0.0.0/24"});
        for (k, v) in extra.as_object().unwrap() {
            r[k] = v.clone();
        }
        json!({"ranges": [[r]]})
    };
    assert_err(
        base(json!({"rangeStart": "10.0.1.1"})),
        "ipam.ranges[0][0].rangeStart",
        &["\"10.0.1.1\"", "outside the subnet 10.0.0.0/24"],
    );
    assert_err(
        base(json!({"rangeEnd": "10.0.1.1"})),
        "ipam.ranges[0][0].rangeEnd",
        &["\"10.0.1.1\"", "outside the subnet"],
    );
    assert_err(
        base(json!({"rangeStart": "fd00::1"})),
        "ipam.ranges[0][0].rangeStart",
        &["\"fd00::1\"", "outside the subnet"],
    );
    assert_err(
        base(json!({"rangeStart": "10.0.0.x"})),
        "ipam.ranges[0][0].rangeStart",
        &["\"10.0.0.x\"", "is not an IP address"],
    );
    assert_err(
        base(json!({"gateway": "10.0.9.1"})),
        "ipam.ranges[0][0].gateway",
        &["\"10.0.9.1\"", "outside the subnet"],
    );
    assert_err(
        base(json!({"gateway": true})),
        "ipam.ranges[0][0].gateway",
        &["true is not a string"],
    );
    assert_err(
        base(json!({"rangeStart": "10.0.0.50", "rangeEnd": "10.0.0.40"})),
        "ipam.ranges[0][0].rangeEnd",
        &["\"10.0.0.40\"", "before rangeStart \"10.0.0.50\""],
    );
    assert_err(
        base(json!({"node": ""})),
        "ipam.ranges[0][0].node",
        &["\"\"", "is empty"],
    );
    assert_err(
        base(json!({"node": 7})),
        "ipam.ranges[0][0].node",
        &["7 is not a string"],
    );
    // start == end is a valid single-address range.
    IpamConfig::from_json(
        &base(json!({"rangeStart": "10.0.0.5", "rangeEnd": "10.0.0.5"})),
        "n",
    )
    .unwrap();
}

#[test]
fn mixed_families_in_one_set() {
    assert_err(
        json!({"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "fd00::/64"}]]}),
        "ipam.ranges[0][1].subnet",
        &[
            "\"fd00::/64\"",
            "is IPv6 but ipam.ranges[0][0] is IPv4",
            "may not mix",
        ],
    );
}

#[test]
fn bad_exclude_routes_dns_probe_node_name() {
    let ok = json!([[{"subnet": "10.0.0.0/24"}]]);
    assert_err(
        json!({"ranges": ok, "exclude": "10.0.0.5/32"}),
        "ipam.exclude",
        &["\"10.0.0.5/32\"", "is not an array"],
    );
    assert_err(
        json!({"ranges": ok, "exclude": ["10.0.0.5/32", "10.0.0.300/32"]}),
        "ipam.exclude[1]",
        &["\"10.0.0.300/32\"", "is not a CIDR"],
    );
    assert_err(
        json!({"ranges": ok, "routes": {"dst": "0.0.0.0/0"}}),
        "ipam.routes",
        &["is not an array"],
    );
    assert_err(
        json!({"ranges": ok, "routes": ["0.0.0.0/0"]}),
        "ipam.routes[0]",
        &["\"0.0.0.0/0\"", "is not an object"],
    );
    assert_err(
        json!({"ranges": ok, "routes": [{"gw": "10.0.0.1"}]}),
        "ipam.routes[0].dst",
        &["is missing"],
    );
    assert_err(
        json!({"ranges": ok, "routes": [{"dst": "10.0.0.0/40"}]}),
        "ipam.routes[0].dst",
        &["\"10.0.0.0/40\"", "is not a CIDR"],
    );
    assert_err(
        json!({"ranges": ok, "routes": [{"dst": "0.0.0.0/0", "gw": "x"}]}),
        "ipam.routes[0].gw",
        &["\"x\"", "is not an IP address"],
    );
    assert_err(
        json!({"ranges": ok, "routes": [{"dst": "0.0.0.0/0", "gw": "fd00::1"}]}),
        "ipam.routes[0].gw",
        &["\"fd00::1\"", "family of dst 0.0.0.0/0"],
    );
    assert_err(
        json!({"ranges": ok, "dns": ["8.8.8.8"]}),
        "ipam.dns",
        &["is not an object"],
    );
    assert_err(
        json!({"ranges": ok, "dns": {"nameservers": ["8.8.8.8", "dns.local"]}}),
        "ipam.dns.nameservers[1]",
        &["\"dns.local\"", "is not an IP address"],
    );
    assert_err(
        json!({"ranges": ok, "dns": {"domain": 5}}),
        "ipam.dns.domain",
        &["5 is not a string"],
    );
    assert_err(
        json!({"ranges": ok, "dns": {"search": "a"}}),
        "ipam.dns.search",
        &["\"a\"", "is not an array"],
    );
    assert_err(
        json!({"ranges": ok, "dns": {"options": [1]}}),
        "ipam.dns.options[0]",
        &["1 is not a string"],
    );
    assert_err(
        json!({"ranges": ok, "probe": true}),
        "ipam.probe",
        &["true is not an object"],
    );
    assert_err(
        json!({"ranges": ok, "probe": {"enabled": "yes"}}),
        "ipam.probe.enabled",
        &["\"yes\" is not a bool"],
    );
    assert_err(
        json!({"ranges": ok, "probe": {"timeoutMs": 0}}),
        "ipam.probe.timeoutMs",
        &["0 is not an integer in 1..5000"],
    );
    assert_err(
        json!({"ranges": ok, "probe": {"timeoutMs": 5001}}),
        "ipam.probe.timeoutMs",
        &["5001"],
    );
    assert_err(
        json!({"ranges": ok, "probe": {"timeoutMs": 2.5}}),
        "ipam.probe.timeoutMs",
        &["2.5"],
    );
    assert_err(
        json!({"ranges": ok, "nodeName": 12}),
        "ipam.nodeName",
        &["12", "not a non-empty string"],
    );
    assert_err(
        json!({"ranges": ok, "nodeName": ""}),
        "ipam.nodeName",
        &["\"\""],
    );
}

#[test]
fn route_and_exclude_host_bits_are_cleared() {
    let cfg = IpamConfig::from_json(
        &json!({"ranges": [[{"subnet": "10.0.0.0/24"}]], "routes": [{"dst": "10.9.9.9/16"}], "exclude": ["10.0.0.77/30"]}),
        "n",
    )
    .unwrap();
    assert_eq!(cfg.routes[0].dst, net("10.9.0.0/16"));
    assert_eq!(cfg.exclude[0], net("10.0.0.76/30"));
}

#[test]
fn long_values_are_truncated_in_messages() {
    let long = "x".repeat(1000);
    let e = err(json!({"ranges": [[{"subnet": long}]]}));
    assert!(e.value.len() < 200, "{}", e.value);
    assert!(e.value.ends_with("..."));
}

#[test]
fn describe_shows_span_only_when_not_default() {
    let cfg = IpamConfig::from_json(
        &json!({"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "10.0.1.0/24", "rangeStart": "10.0.1.5"}]]}),
        "n",
    )
    .unwrap();
    assert_eq!(cfg.range_sets[0].ranges[0].describe(), "10.0.0.0/24");
    assert_eq!(
        cfg.range_sets[0].ranges[1].describe(),
        "10.0.1.5-10.0.1.254 (10.0.1.0/24)"
    );
}

#[test]
fn one_range_set_per_family() {
    // Issue 20, item 11: 20 one-address sets took 20 addresses for one pod.
    let sets: Vec<_> = (1..=20)
        .map(|i| json!([{"subnet": format!("10.0.0.{i}/32")}]))
        .collect();
    assert_err(
        json!({ "ranges": sets }),
        "ipam.ranges[1]",
        &[
            "second IPv4 range set",
            "ipam.ranges[0]",
            "one range set per address family",
        ],
    );
    assert_err(
        json!({"ranges": [[{"subnet": "fd00::/64"}], [{"subnet": "10.0.0.0/24"}], [{"subnet": "fd01::/64"}]]}),
        "ipam.ranges[2]",
        &["second IPv6 range set", "ipam.ranges[0]"],
    );
    // One of each family is fine (dual stack).
    IpamConfig::from_json(
        &json!({"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/64"}]]}),
        "n",
    )
    .unwrap();
}
