use super::*;
use edgelink_attachment::{ForwardPath, Protocol, ProxyProtocol};
use serde_json::json;
use std::collections::HashMap;

fn env(args: &str) -> Env {
    let m: HashMap<&str, String> = [
        ("CNI_COMMAND", "ADD".to_string()),
        ("CNI_CONTAINERID", "c1".into()),
        ("CNI_IFNAME", "net1".into()),
        ("CNI_NETNS", "/run/netns/x".into()),
        ("CNI_ARGS", args.into()),
    ]
    .into_iter()
    .collect();
    Env::from_lookup(|k| m.get(k).cloned()).unwrap()
}

fn base() -> Value {
    json!({
        "cniVersion": "1.0.0", "name": "plant-floor", "type": "edgelink",
        "mode": "bridge", "bridge": "edge0", "uplink": "eth1",
        "stateDir": "/tmp/elk-config-test",
        "ipam": {"ranges": [[{"subnet": "172.17.16.0/24", "rangeStart": "172.17.16.200",
                 "rangeEnd": "172.17.16.250", "gateway": "172.17.16.1"}]], "nodeName": "n1"},
        "forwards": [
            {"name": "api", "protocol": "tcp", "port": 8080, "target": "172.17.16.120:8080"},
            {"name": "telemetry", "protocol": "udp", "port": 5000, "target": "172.17.16.120:5000"}
        ]
    })
}

fn parse(v: &Value, args: &str) -> Result<Config, CniError> {
    let net = NetConf::parse(v.to_string().as_bytes())?;
    Config::parse_in(net, &env(args), "/tmp/elk-config-test".into()).map_err(|e| e.into_cni())
}

fn err(v: &Value) -> CniError {
    parse(v, "").unwrap_err()
}

#[test]
fn parses_the_design_example() {
    let c = parse(&base(), "").unwrap();
    assert!(
        matches!(&c.mode, Mode::Bridge(b) if b.name == "edge0" && b.uplink.as_deref() == Some("eth1"))
    );
    assert_eq!(c.forwards.len(), 2);
    assert_eq!(c.forwards[1].protocol, Protocol::Udp);
    assert_eq!(c.forwards[0].connect_timeout_ms, 5000);
    assert!(matches!(c.ipam, Ipam::Builtin(_)));
}

#[test]
fn unknown_mode_names_the_value() {
    let mut v = base();
    v["mode"] = json!("ipvlan");
    let e = err(&v);
    assert_eq!(e.code, 7);
    assert!(e.msg.contains("mode") && e.msg.contains("ipvlan"), "{e}");
}

#[test]
fn target_outside_subnets_is_refused_unless_allowed() {
    let mut v = base();
    v["forwards"][0]["target"] = json!("10.0.0.5:80");
    let e = err(&v);
    assert_eq!(e.code, 7);
    assert!(
        e.msg.contains("forwards[0].target") && e.msg.contains("10.0.0.5:80"),
        "{e}"
    );
    v["allowedTargets"] = json!(["10.0.0.0/8", "172.17.16.0/24"]);
    assert!(parse(&v, "").is_ok());
    v["allowedTargets"] = json!(["172.17.16.0/24"]);
    assert_eq!(err(&v).code, 7);
    v["allowedTargets"] = json!(["nope"]);
    assert!(err(&v).msg.contains("allowedTargets[0]"));
}

#[test]
fn forward_validation() {
    for (k, val, needle) in [
        ("name", json!("API"), "forwards[0].name"),
        ("protocol", json!("sctp"), "sctp"),
        ("port", json!(0), "forwards[0].port"),
        ("port", json!(70000), "forwards[0].port"),
        ("target", json!("172.17.16.120"), "forwards[0].target"),
        ("target", json!("172.17.16.120:0"), "forwards[0].target"),
    ] {
        let mut v = base();
        v["forwards"][0][k] = val;
        let e = err(&v);
        assert_eq!(e.code, 7, "{k}");
        assert!(e.msg.contains(needle), "{k}: {e}");
    }
    let mut v = base();
    v["forwards"][1]["name"] = json!("api");
    assert_eq!(
        err(&v).msg,
        "forwards[1].name: \"api\" is used by forwards[0] too"
    );
    let mut v = base();
    v["forwards"][1]["protocol"] = json!("tcp");
    v["forwards"][1]["port"] = json!(8080);
    // The message names the other forward (issue 21).
    assert_eq!(
        err(&v).msg,
        "forwards[1].port: 8080 (tcp) is used by forwards[0] (\"api\") too"
    );
    let mut v = base();
    v["forwards"][1].as_object_mut().unwrap().remove("port");
    assert_eq!(err(&v).msg, "forwards[1].port: is missing");
}

#[test]
fn macvlan_needs_uplink_and_valid_mode() {
    let mut v = base();
    v["mode"] = json!("macvlan");
    v.as_object_mut().unwrap().remove("uplink");
    assert!(err(&v).msg.contains("uplink"));
    v["uplink"] = json!("eth1");
    v["macvlanMode"] = json!("bogus");
    assert!(err(&v).msg.contains("bogus"));
    v["macvlanMode"] = json!("passthru");
    assert!(
        matches!(parse(&v, "").unwrap().mode, Mode::Macvlan(m) if m.mode == MacvlanMode::Passthru)
    );
    v["isGateway"] = json!(true);
    assert!(err(&v).msg.contains("isGateway"));
}

#[test]
fn mac_and_ips_from_every_source() {
    let mut v = base();
    v["mac"] = json!("02:00:00:00:00:01");
    let c = parse(
        &v,
        "IgnoreUnknown=1;MAC=02:00:00:00:00:02;IP=172.17.16.210/24",
    )
    .unwrap();
    assert_eq!(c.mac, Some([2, 0, 0, 0, 0, 2]));
    assert_eq!(
        c.requested_ips,
        vec!["172.17.16.210".parse::<IpAddr>().unwrap()]
    );
    v["capabilities"] = json!({"mac": true, "ips": true});
    v["runtimeConfig"] = json!({"mac": "02:00:00:00:00:03", "ips": ["172.17.16.211/24"]});
    let c = parse(&v, "MAC=02:00:00:00:00:02;IP=172.17.16.210").unwrap();
    assert_eq!(c.mac, Some([2, 0, 0, 0, 0, 3]));
    assert_eq!(
        c.requested_ips,
        vec!["172.17.16.211".parse::<IpAddr>().unwrap()]
    );
    v["runtimeConfig"]["mac"] = json!("01:00:00:00:00:00");
    assert!(err(&v).msg.contains("multicast"));
    v["runtimeConfig"]["mac"] = json!("zz");
    assert!(err(&v).msg.contains("runtimeConfig.mac"));
}

#[test]
fn delegated_ipam_and_scalar_checks() {
    let mut v = base();
    v["ipam"] = json!({"type": "host-local", "ranges": [[{"subnet": "172.17.16.0/24"}]]});
    assert!(
        matches!(parse(&v, "").unwrap().ipam, Ipam::Delegated { plugin } if plugin == "host-local")
    );
    v["ipam"]["type"] = json!("../../bin/sh");
    assert!(err(&v).msg.contains("ipam.type"));
    let mut v = base();
    v["mtu"] = json!(10);
    assert!(err(&v).msg.contains("mtu"));
    let mut v = base();
    v["vlan"] = json!(5000);
    assert!(err(&v).msg.contains("vlan"));
    let mut v = base();
    v["bridge"] = json!("this-name-is-too-long");
    assert!(err(&v).msg.contains("bridge"));
    let mut v = base();
    v["stateDir"] = json!("relative/dir");
    assert!(err(&v).msg.contains("stateDir"));
    // Any directory but the node's (issue 20, item 1): code 7 naming both.
    let mut v = base();
    v["stateDir"] = json!("/tmp/elk-other");
    let e = err(&v);
    assert_eq!(e.code, 7);
    assert!(
        e.msg.contains("/tmp/elk-other") && e.msg.contains("/tmp/elk-config-test"),
        "{e}"
    );
    let mut v = base();
    v["type"] = json!("bridge");
    assert!(err(&v).msg.contains("type"));
}

#[test]
fn requested_ips_take_an_address_with_or_without_its_prefix() {
    assert_eq!(
        parse_requested_ip("ips", "172.17.16.5").unwrap(),
        "172.17.16.5".parse::<IpAddr>().unwrap()
    );
    assert_eq!(
        parse_requested_ip("ips", "172.17.16.5/24").unwrap(),
        "172.17.16.5".parse::<IpAddr>().unwrap()
    );
    assert_eq!(
        parse_requested_ip("ips", "fd00::5/64").unwrap(),
        "fd00::5".parse::<IpAddr>().unwrap()
    );
    for bad in ["172.17.16.5/garbage", "172.17.16.5/33", "nope", ""] {
        assert!(parse_requested_ip("ips", bad).is_err(), "{bad}");
    }
}

#[test]
fn device_protection_proxy_protocol_and_path_parse() {
    let mut v = base();
    v["forwards"][0]["maxConnections"] = json!(16);
    v["forwards"][0]["queueTimeoutMs"] = json!(2000);
    v["forwards"][0]["connectRetries"] = json!(0);
    v["forwards"][0]["proxyProtocol"] = json!("v2");
    v["forwards"][1]["path"] = json!("kernel");
    let c = parse(&v, "").unwrap();
    let f = &c.forwards[0];
    assert_eq!(f.queue_timeout_ms, Some(2000));
    assert_eq!(f.connect_retries, Some(0));
    assert_eq!(f.proxy_protocol, Some(ProxyProtocol::V2));
    assert_eq!(f.path, ForwardPath::Relay);
    assert_eq!(c.forwards[1].path, ForwardPath::Kernel);
    // Absent: the daemon's defaults.
    let c = parse(&base(), "").unwrap();
    assert_eq!(c.forwards[0].queue_timeout_ms, None);
    assert_eq!(c.forwards[0].connect_retries, None);
    assert_eq!(c.forwards[0].proxy_protocol, None);
    // The kernel path has no connection to bound, queue, retry or prefix.
    for (key, value) in [
        ("idleTimeoutMs", json!(5000)),
        ("maxConnections", json!(4)),
        ("queueTimeoutMs", json!(5000)),
        ("connectRetries", json!(2)),
        ("proxyProtocol", json!("v1")),
    ] {
        let mut v = base();
        v["forwards"][0]["path"] = json!("kernel");
        v["forwards"][0][key] = value;
        let e = err(&v);
        assert_eq!(e.code, 7);
        assert!(
            e.msg.contains(&format!("forwards[0].{key}")) && e.msg.contains("kernel"),
            "{e}"
        );
    }
}

#[test]
fn forward_bounds_are_validated_and_name_the_forward() {
    let mut v = base();
    v["forwards"][0]["idleTimeoutMs"] = json!(0);
    v["forwards"][0]["maxConnections"] = json!(3);
    let c = parse(&v, "").unwrap();
    assert_eq!(c.forwards[0].idle_timeout_ms, Some(0));
    assert_eq!(c.forwards[0].max_connections, Some(3));
    // Absent: the daemon's defaults.
    assert_eq!(c.forwards[1].idle_timeout_ms, None);
    assert_eq!(c.forwards[1].max_connections, None);
    let mut v = base();
    v["forwards"][0]["idleTimeoutMs"] = json!(MAX_IDLE_TIMEOUT_MS);
    v["forwards"][0]["maxConnections"] = json!(MAX_CONNECTIONS);
    assert!(parse(&v, "").is_ok());

    for (key, value) in [
        ("idleTimeoutMs", json!(999)),
        ("idleTimeoutMs", json!(-1)),
        ("idleTimeoutMs", json!(MAX_IDLE_TIMEOUT_MS + 1)),
        ("idleTimeoutMs", json!("60000")),
        ("idleTimeoutMs", json!(1.5)),
        ("maxConnections", json!(0)),
        ("maxConnections", json!(MAX_CONNECTIONS + 1)),
        ("maxConnections", json!(true)),
        ("queueTimeoutMs", json!(0)),
        ("queueTimeoutMs", json!(MAX_QUEUE_TIMEOUT_MS + 1)),
        ("connectRetries", json!(-1)),
        ("connectRetries", json!(MAX_CONNECT_RETRIES + 1)),
        ("proxyProtocol", json!("v3")),
        ("proxyProtocol", json!(2)),
        ("path", json!("fast")),
        ("path", json!(true)),
    ] {
        let mut v = base();
        v["forwards"][0][key] = value.clone();
        let e = err(&v);
        assert_eq!(e.code, 7, "{key}={value}: {e}");
        assert!(
            e.msg.contains(&format!("forwards[0].{key}")) && e.msg.contains("\"api\""),
            "{key}={value}: {e}"
        );
    }
    // UDP has sessions, not connections: the keys are refused there.
    for (key, value) in [
        ("idleTimeoutMs", json!(5000)),
        ("maxConnections", json!(5000)),
        ("queueTimeoutMs", json!(5000)),
        ("connectRetries", json!(2)),
        ("proxyProtocol", json!("v1")),
    ] {
        let mut v = base();
        v["forwards"][1][key] = value;
        let e = err(&v);
        assert_eq!(e.code, 7);
        assert!(
            e.msg.contains(&format!("forwards[1].{key}")) && e.msg.contains("telemetry"),
            "{e}"
        );
    }
}

fn with_reverse() -> Value {
    let mut v = base();
    v["reverse"] = json!([
        {"name": "mqtt", "protocol": "tcp", "port": 1883,
         "target": "mqtt.hil.svc.cluster.local:1883"},
        {"name": "collector", "protocol": "udp", "port": 8125,
         "target": "10.96.0.20:8125", "allowedSources": ["172.17.16.128/25"]}
    ]);
    v
}

#[test]
fn reverse_forwards_parse_and_default_their_sources_to_the_subnet() {
    let c = parse(&with_reverse(), "").unwrap();
    assert_eq!(c.reverse.len(), 2);
    assert_eq!(
        c.reverse[0].target.to_string(),
        "mqtt.hil.svc.cluster.local:1883"
    );
    assert_eq!(c.reverse[1].protocol, Protocol::Udp);
    let own: Vec<ipnetwork::IpNetwork> = vec!["172.17.16.201/24".parse().unwrap()];
    let rec = c.reverse_for(&own);
    assert_eq!(
        rec[0].allowed_sources,
        vec!["172.17.16.0/24".parse().unwrap()]
    );
    assert_eq!(
        rec[1].allowed_sources,
        vec!["172.17.16.128/25".parse().unwrap()]
    );
    assert!(!c.allow_foreign_sources);
    assert_eq!(c.dns, None);
}

#[test]
fn reverse_collisions_are_refused_naming_both() {
    // With a forward of the same protocol and port.
    let mut v = with_reverse();
    v["reverse"][0]["port"] = json!(8080);
    let e = err(&v);
    assert_eq!(e.code, 7);
    assert!(
        e.msg.contains("reverse[0].port")
            && e.msg.contains("forwards[0]")
            && e.msg.contains("\"api\""),
        "{e}"
    );
    // The same port with the other protocol is another socket: fine.
    v["reverse"][0]["protocol"] = json!("udp");
    v["reverse"][0]["port"] = json!(8080);
    v["reverse"][1]["port"] = json!(8126);
    assert!(parse(&v, "").is_ok());
    // With another reverse forward.
    let mut v = with_reverse();
    v["reverse"][1]["protocol"] = json!("tcp");
    v["reverse"][1]["port"] = json!(1883);
    let e = err(&v);
    assert!(
        e.msg.contains("reverse[1].port")
            && e.msg.contains("reverse[0]")
            && e.msg.contains("\"mqtt\""),
        "{e}"
    );
    // Names are shared with the forwards (status and metrics key on them).
    let mut v = with_reverse();
    v["reverse"][0]["name"] = json!("api");
    let e = err(&v);
    assert!(
        e.msg.contains("reverse[0].name") && e.msg.contains("forwards[0]"),
        "{e}"
    );
    let mut v = with_reverse();
    v["reverse"][1]["name"] = json!("mqtt");
    assert!(err(&v).msg.contains("is used by reverse[0]"));
}

#[test]
fn reverse_sources_outside_the_segment_need_allow_foreign_sources() {
    let mut v = with_reverse();
    v["reverse"][1]["allowedSources"] = json!(["172.17.16.0/24", "192.168.9.0/24"]);
    let e = err(&v);
    assert_eq!(e.code, 7);
    assert!(
        e.msg.contains("reverse[1].allowedSources[1]")
            && e.msg.contains("192.168.9.0/24")
            && e.msg.contains("allowForeignSources"),
        "{e}"
    );
    // Wider than the segment is outside it too.
    v["reverse"][1]["allowedSources"] = json!(["172.17.0.0/16"]);
    assert!(err(&v).msg.contains("allowedSources[0]"));
    v["allowForeignSources"] = json!(true);
    assert!(parse(&v, "").is_ok());
    v["allowForeignSources"] = json!("yes");
    assert!(err(&v).msg.contains("allowForeignSources"));
    let mut v = with_reverse();
    v["reverse"][0]["allowedSources"] = json!([]);
    assert!(err(&v).msg.contains("is empty"));
}

#[test]
fn a_reverse_target_in_the_segment_is_a_loop() {
    let mut v = with_reverse();
    v["reverse"][1]["target"] = json!("172.17.16.120:8125");
    let e = err(&v);
    assert_eq!(e.code, 7);
    assert!(
        e.msg.contains("reverse[1].target")
            && e.msg.contains("loop")
            && e.msg.contains("172.17.16.0/24"),
        "{e}"
    );
}

#[test]
fn reverse_entries_are_validated_like_forwards() {
    for (k, val, needle) in [
        ("name", json!("MQTT"), "reverse[0].name"),
        ("protocol", json!("sctp"), "sctp"),
        ("port", json!(0), "reverse[0].port"),
        ("target", json!("mqtt"), "has no port"),
        ("target", json!("mqtt:0"), "not one in 1..=65535"),
        (
            "target",
            json!("bad name:1883"),
            "neither an IP address nor a DNS name",
        ),
        ("target", json!(1883), "is not a string"),
        ("path", json!("kernel"), "reverse forwards are relayed"),
        ("connectTimeoutMs", json!(0), "reverse[0].connectTimeoutMs"),
        ("idleTimeoutMs", json!(5), "reverse[0].idleTimeoutMs"),
        ("proxyProtocol", json!("v3"), "reverse[0].proxyProtocol"),
        (
            "allowedSources",
            json!(["nope"]),
            "reverse[0].allowedSources[0]",
        ),
    ] {
        let mut v = with_reverse();
        v["reverse"][0][k] = val;
        let e = err(&v);
        assert_eq!(e.code, 7, "{k}");
        assert!(e.msg.contains(needle), "{k}: {e}");
    }
    let mut v = with_reverse();
    v["reverse"][1]["maxConnections"] = json!(3);
    assert!(err(&v).msg.contains("only valid with protocol tcp"));
    let mut v = with_reverse();
    v["reverse"] = json!({"name": "x"});
    assert!(err(&v).msg.contains("reverse"));
}

#[test]
fn dns_comes_from_the_runtime_before_the_config() {
    let mut v = with_reverse();
    v["dns"] = json!({"nameservers": ["10.96.0.10"], "search": ["hil.svc.cluster.local"]});
    let c = parse(&v, "").unwrap();
    assert_eq!(c.dns.as_ref().unwrap().nameservers, vec!["10.96.0.10"]);
    v["capabilities"] = json!({"dns": true});
    v["runtimeConfig"] = json!({"dns": {"nameservers": ["10.96.0.53"], "options": ["ndots:5"]}});
    let c = parse(&v, "").unwrap();
    let d = c.dns.unwrap();
    assert_eq!(d.nameservers, vec!["10.96.0.53"]);
    assert_eq!(d.options, vec!["ndots:5"]);
    v["runtimeConfig"] = json!({"dns": {"nameservers": ["not-an-ip"]}});
    let e = err(&v);
    assert!(e.msg.contains("runtimeConfig.dns.nameservers[0]"), "{e}");
    v["runtimeConfig"] = json!({"dns": {"nameservers": "10.0.0.1"}});
    assert!(err(&v).msg.contains("runtimeConfig.dns"));
}

#[path = "health_tests.rs"]
mod health_tests;

#[path = "virtual_tests.rs"]
mod virtual_tests;

#[path = "modbus_tests.rs"]
mod modbus_tests;
