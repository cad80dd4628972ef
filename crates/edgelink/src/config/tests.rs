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
    Config::parse(net, &env(args)).map_err(|e| e.into_cni())
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
    assert!(err(&v).msg.contains("another forward"));
    let mut v = base();
    v["forwards"][1]["protocol"] = json!("tcp");
    v["forwards"][1]["port"] = json!(8080);
    assert!(err(&v).msg.contains("another tcp forward"));
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
