use super::*;
use serde_json::{json, Value};

fn plan() -> Plan {
    Plan {
        table: "edgelink".into(),
        private_ifname: "net1".into(),
        cluster_ifname: None,
        forwards: vec![
            KernelForward {
                name: "api".into(),
                protocol: Protocol::Tcp,
                port: 8080,
                target: "172.31.50.10:80".parse().unwrap(),
            },
            KernelForward {
                name: "dns6".into(),
                protocol: Protocol::Udp,
                port: 5353,
                target: "[fd00:50::10]:53".parse().unwrap(),
            },
        ],
        allowed: vec![
            "172.31.50.0/24".parse().unwrap(),
            "fd00:50::/64".parse().unwrap(),
        ],
    }
}

fn commands(plan: &Plan) -> Vec<Value> {
    let doc = serde_json::to_value(render(plan).unwrap()).unwrap();
    doc["nftables"].as_array().unwrap().clone()
}

fn rules_of(cmds: &[Value], chain: &str) -> Vec<Value> {
    cmds.iter()
        .filter_map(|c| c["add"].get("rule"))
        .filter(|r| r["chain"] == chain)
        .map(|r| {
            assert_eq!(r["family"], "inet");
            assert_eq!(r["table"], "edgelink");
            r["expr"].clone()
        })
        .collect()
}

#[test]
fn one_transaction_replaces_the_whole_table() {
    let cmds = commands(&plan());
    let table = json!({"family": "inet", "name": "edgelink"});
    assert_eq!(cmds[0], json!({"add": {"table": table}}));
    assert_eq!(cmds[1], json!({"delete": {"table": table}}));
    assert_eq!(cmds[2], json!({"add": {"table": table}}));
    let counters: Vec<&Value> = cmds
        .iter()
        .filter_map(|c| c["add"].get("counter"))
        .map(|c| &c["name"])
        .collect();
    assert_eq!(
        counters,
        [
            "api-conn",
            "api-up",
            "api-down",
            "dns6-conn",
            "dns6-up",
            "dns6-down"
        ]
    );
    let chains: Vec<&Value> = cmds.iter().filter_map(|c| c["add"].get("chain")).collect();
    assert_eq!(
        chains,
        [
            &json!({"family": "inet", "table": "edgelink", "name": "prerouting",
                    "type": "nat", "hook": "prerouting", "prio": -100, "policy": "accept"}),
            &json!({"family": "inet", "table": "edgelink", "name": "postrouting",
                    "type": "nat", "hook": "postrouting", "prio": 100, "policy": "accept"}),
            &json!({"family": "inet", "table": "edgelink", "name": "forward",
                    "type": "filter", "hook": "forward", "prio": 0, "policy": "drop"}),
            // Regular chains, one per forward, before the rules that jump.
            &json!({"family": "inet", "table": "edgelink", "name": "fwd-api"}),
            &json!({"family": "inet", "table": "edgelink", "name": "fwd-dns6"}),
        ]
    );
    let first_forward_rule = cmds
        .iter()
        .position(|c| c["add"]["rule"]["chain"] == "forward")
        .unwrap();
    let last_chain = cmds
        .iter()
        .rposition(|c| c["add"].get("chain").is_some())
        .unwrap();
    assert!(last_chain < first_forward_rule);
    // Nothing but adds after the one delete.
    assert!(cmds[3..].iter().all(|c| c.get("add").is_some()));
}

#[test]
fn dnat_only_what_does_not_come_from_the_private_side() {
    let rules = rules_of(&commands(&plan()), "prerouting");
    assert_eq!(
        rules,
        [
            json!([
                {"match": {"op": "==", "left": {"meta": {"key": "nfproto"}}, "right": "ipv4"}},
                {"match": {"op": "!=", "left": {"meta": {"key": "iifname"}}, "right": "net1"}},
                {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 8080}},
                {"match": {"op": "==", "left": {"fib": {"result": "type", "flags": ["daddr"]}}, "right": "local"}},
                {"counter": "api-conn"},
                {"dnat": {"addr": "172.31.50.10", "family": "ip", "port": 80}},
            ]),
            json!([
                {"match": {"op": "==", "left": {"meta": {"key": "nfproto"}}, "right": "ipv6"}},
                {"match": {"op": "!=", "left": {"meta": {"key": "iifname"}}, "right": "net1"}},
                {"match": {"op": "==", "left": {"payload": {"protocol": "udp", "field": "dport"}}, "right": 5353}},
                {"match": {"op": "==", "left": {"fib": {"result": "type", "flags": ["daddr"]}}, "right": "local"}},
                {"counter": "dns6-conn"},
                {"dnat": {"addr": "fd00:50::10", "family": "ip6", "port": 53}},
            ]),
        ]
    );
}

#[test]
fn masquerade_keeping_the_clients_port_out_of_the_private_interface() {
    let rules = rules_of(&commands(&plan()), "postrouting");
    assert_eq!(
        rules,
        [json!([
            {"match": {"op": "==", "left": {"meta": {"key": "oifname"}}, "right": "net1"}},
            {"match": {"op": "in", "left": {"ct": {"key": "status"}}, "right": "dnat"}},
            {"masquerade": null},
        ])]
    );
}

#[test]
fn forward_hook_finds_each_forwards_chain_in_one_verdict_map_per_protocol() {
    let cmds = commands(&plan());
    let jump = |port: u16, chain: &str| json!({"key": port, "chain": chain});
    let dispatch = |l4: &str, jumps: Vec<Value>| {
        let set: Vec<Value> = jumps
            .iter()
            .map(|j| json!([j["key"], {"jump": {"target": j["chain"]}}]))
            .collect();
        json!([
            {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": l4}},
            {"match": {"op": "in", "left": {"ct": {"key": "status"}}, "right": "dnat"}},
            {"vmap": {"key": {"ct": {"key": "proto-dst", "dir": "original"}}, "data": {"set": set}}},
        ])
    };
    // No rule for invalid packets: they have no `ct status` and meet the
    // policy (drop).
    assert_eq!(
        rules_of(&cmds, "forward"),
        [
            dispatch("tcp", vec![jump(8080, "fwd-api")]),
            dispatch("udp", vec![jump(5353, "fwd-dns6")]),
        ]
    );
    let flow = |ifname_key: &str,
                dir: &str,
                l4: &str,
                saddr: &str,
                ip: &str,
                tport: u16,
                counter: &str| {
        json!([
            {"match": {"op": "==", "left": {"meta": {"key": ifname_key}}, "right": "net1"}},
            {"match": {"op": "==", "left": {"ct": {"key": "direction"}}, "right": dir}},
            {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": l4}},
            {"match": {"op": "==", "left": {"ct": {"key": saddr, "dir": "reply"}}, "right": ip}},
            {"match": {"op": "==", "left": {"ct": {"key": "proto-src", "dir": "reply"}}, "right": tport}},
            {"counter": counter},
            {"accept": null},
        ])
    };
    assert_eq!(
        rules_of(&cmds, "fwd-api"),
        [
            flow(
                "oifname",
                "original",
                "tcp",
                "ip saddr",
                "172.31.50.10",
                80,
                "api-up"
            ),
            flow(
                "iifname",
                "reply",
                "tcp",
                "ip saddr",
                "172.31.50.10",
                80,
                "api-down"
            ),
        ]
    );
    assert_eq!(
        rules_of(&cmds, "fwd-dns6"),
        [
            flow(
                "oifname",
                "original",
                "udp",
                "ip6 saddr",
                "fd00:50::10",
                53,
                "dns6-up"
            ),
            flow(
                "iifname",
                "reply",
                "udp",
                "ip6 saddr",
                "fd00:50::10",
                53,
                "dns6-down"
            ),
        ]
    );

    // One rule per protocol, whatever the number of forwards.
    let mut many = plan();
    many.forwards = (0..50)
        .map(|i| KernelForward {
            name: format!("f{i}"),
            protocol: Protocol::Tcp,
            port: 9000 + i,
            target: "172.31.50.10:80".parse().unwrap(),
        })
        .collect();
    let forward = rules_of(&commands(&many), "forward");
    assert_eq!(forward.len(), 1);
    assert_eq!(
        forward[0][2]["vmap"]["data"]["set"]
            .as_array()
            .unwrap()
            .len(),
        50
    );
}

#[test]
fn a_plan_without_forwards_still_drops_what_it_would_route() {
    let mut p = plan();
    p.forwards.clear();
    let cmds = commands(&p);
    assert!(rules_of(&cmds, "prerouting").is_empty());
    // The forward hook's policy drops everything.
    assert!(rules_of(&cmds, "forward").is_empty());
    assert!(cmds
        .iter()
        .any(|c| c["add"]["chain"]["name"] == "forward" && c["add"]["chain"]["policy"] == "drop"));
}

#[test]
fn a_target_outside_the_allowed_networks_is_refused_by_name() {
    let mut p = plan();
    p.forwards[0].target = "10.0.0.5:80".parse().unwrap();
    let e = render(&p).unwrap_err();
    assert!(matches!(e, Error::TargetNotAllowed { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("10.0.0.5:80") && text.contains("api"),
        "{text}"
    );
    assert!(text.contains("172.31.50.0/24"), "{text}");

    // Families do not mix: an IPv4 target is not inside an IPv6 network.
    let mut p = plan();
    p.allowed = vec!["::/0".parse().unwrap()];
    assert!(matches!(render(&p), Err(Error::TargetNotAllowed { forward, .. }) if forward == "api"));

    let mut p = plan();
    p.allowed.clear();
    assert!(render(&p).is_err());
}

#[test]
fn malformed_plans_are_refused_before_anything_runs() {
    let refused = |edit: &dyn Fn(&mut Plan), needle: &str| {
        let mut p = plan();
        edit(&mut p);
        match render(&p) {
            Err(e @ Error::InvalidPlan { .. }) => {
                assert!(e.to_string().contains(needle), "{e} lacks {needle}")
            }
            other => panic!("expected InvalidPlan with {needle}, got {other:?}"),
        }
    };
    refused(&|p| p.table = "".into(), "table name");
    refused(&|p| p.table = "a b".into(), "table name");
    refused(&|p| p.table = "9lives".into(), "table name");
    refused(&|p| p.private_ifname = "".into(), "interface");
    refused(
        &|p| p.private_ifname = "a-very-long-ifname".into(),
        "interface",
    );
    refused(&|p| p.private_ifname = "net 1".into(), "interface");
    refused(&|p| p.forwards[1].name = "api".into(), "declared twice");
    refused(&|p| p.forwards[0].name = "a\"b".into(), "forward name");
    refused(&|p| p.forwards[0].name = "".into(), "forward name");
    refused(
        &|p| {
            p.forwards[1].protocol = Protocol::Tcp;
            p.forwards[1].port = 8080;
        },
        "taken by another forward",
    );
    refused(&|p| p.forwards[0].port = 0, "port 0");
    refused(
        &|p| p.forwards[0].target = "172.31.50.10:0".parse().unwrap(),
        "port 0",
    );
    refused(
        &|p| {
            p.allowed.push("::/0".parse().unwrap());
            p.forwards[1].target = "[::ffff:172.31.50.10]:53".parse().unwrap();
        },
        "cannot be a DNAT target",
    );

    // The same port over TCP and UDP is two forwards, not a clash.
    let mut p = plan();
    p.forwards[1].port = 8080;
    render(&p).unwrap();
}
