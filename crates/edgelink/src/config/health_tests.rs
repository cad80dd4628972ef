//! `health`: defaults, each type's keys, and every bad value refused with
//! code 7 naming the key.

use super::*;
use edgelink_attachment::{HealthKind, HealthTarget};

fn with_health(h: Value) -> Value {
    let mut v = base();
    v["health"] = h;
    v
}

#[test]
fn health_defaults_to_a_tcp_probe_of_the_first_tcp_forward() {
    let c = parse(&with_health(json!({})), "").unwrap();
    let h = c.health.unwrap();
    assert_eq!(h.kind, HealthKind::Tcp);
    assert_eq!(h.target.to_string(), "172.17.16.120:8080");
    assert_eq!(
        (
            h.interval_ms,
            h.timeout_ms,
            h.failure_threshold,
            h.success_threshold
        ),
        (2000, 1000, 2, 2)
    );
    assert_eq!((h.path, h.unit_id, h.payload), (None, None, None));
    assert!(parse(&base(), "").unwrap().health.is_none());
}

#[test]
fn each_type_takes_its_own_keys_and_defaults() {
    let c = parse(&with_health(json!({"type": "icmp"})), "").unwrap();
    assert_eq!(
        c.health.unwrap().target,
        HealthTarget::Host("172.17.16.120".parse().unwrap())
    );
    let c = parse(
        &with_health(json!({"type": "udp", "payload": "ping\n"})),
        "",
    )
    .unwrap();
    let h = c.health.unwrap();
    assert_eq!(h.target.to_string(), "172.17.16.120:5000");
    assert_eq!(h.payload.as_deref(), Some("ping\n"));
    let c = parse(
        &with_health(json!({"type": "http", "target": "172.17.16.121:80",
        "expectStatus": 204, "intervalMs": 200, "timeoutMs": 50})),
        "",
    )
    .unwrap();
    let h = c.health.unwrap();
    assert_eq!((h.path.as_deref(), h.expect_status), (Some("/"), Some(204)));
    assert_eq!((h.interval_ms, h.timeout_ms), (200, 50));
    // A timeout as long as the interval (the operator's 1 s and 1 s).
    let c = parse(
        &with_health(json!({"intervalMs": 1000, "timeoutMs": 1000})),
        "",
    )
    .unwrap();
    assert_eq!(
        c.health.map(|h| (h.interval_ms, h.timeout_ms)),
        Some((1000, 1000))
    );
    let c = parse(
        &with_health(json!({"type": "modbus", "target": "172.17.16.120:502",
        "register": 7})),
        "",
    )
    .unwrap();
    let h = c.health.unwrap();
    assert_eq!((h.unit_id, h.register), (Some(1), Some(7)));
    // A short interval gets a timeout below it.
    let c = parse(&with_health(json!({"intervalMs": 300})), "").unwrap();
    assert_eq!(c.health.unwrap().timeout_ms, 150);
}

#[test]
fn bad_health_values_are_refused_naming_the_key() {
    let cases = [
        (json!("tcp"), "health: \"tcp\" is not an object"),
        (
            json!({"type": "ssh"}),
            "health.type: \"ssh\" is not one of tcp, icmp, http, udp, modbus",
        ),
        (
            json!({"path": "/x"}),
            "health.path: \"/x\" is only valid with type http (this probe is tcp)",
        ),
        (
            json!({"type": "udp", "payload": "x", "unitId": 1}),
            "health.unitId: 1 is only valid with type modbus",
        ),
        (
            json!({"type": "http", "payload": "x"}),
            "health.payload: \"x\" is only valid with type udp",
        ),
        (
            json!({"type": "icmp", "target": "172.17.16.120:80"}),
            "has a port: type icmp takes an address alone",
        ),
        (
            json!({"target": "172.17.16.120"}),
            "has no port: type tcp takes IP:port",
        ),
        (
            json!({"target": "device01:80"}),
            "health.target: \"device01:80\" is not IP:port",
        ),
        (json!({"target": "172.17.16.120:0"}), "has port 0"),
        (
            json!({"target": "172.17.17.5:80"}),
            "health.target: \"172.17.17.5:80\" is outside the allowed targets [172.17.16.0/24]",
        ),
        (json!({"type": "udp"}), "health.payload: is missing"),
        (
            json!({"type": "udp", "payload": ""}),
            "health.payload: \"\" is not 1 to 1400 bytes",
        ),
        (
            json!({"type": "http", "path": "healthz"}),
            "health.path: \"healthz\" is not a request path",
        ),
        (
            json!({"type": "http", "path": "/a b"}),
            "is not a request path",
        ),
        (
            json!({"type": "http", "expectStatus": 700}),
            "health.expectStatus: 700 is not an integer in 100..=599",
        ),
        (
            json!({"type": "modbus", "unitId": 256}),
            "health.unitId: 256 is not an integer in 0..=255",
        ),
        (
            json!({"type": "modbus", "register": 65536}),
            "health.register: 65536 is not an integer in 0..=65535",
        ),
        (
            json!({"intervalMs": 199}),
            "health.intervalMs: 199 is not an integer in 200..=3600000",
        ),
        (
            json!({"intervalMs": 3600001}),
            "health.intervalMs: 3600001 is not an integer in 200..=3600000",
        ),
        (
            json!({"timeoutMs": 49}),
            "health.timeoutMs: 49 is not an integer in 50..=60000",
        ),
        (
            json!({"intervalMs": 1000, "timeoutMs": 1001}),
            "health.timeoutMs: 1001 is longer than intervalMs (1000)",
        ),
        (
            json!({"failureThreshold": 0}),
            "health.failureThreshold: 0 is not an integer in 1..=100",
        ),
        (
            json!({"successThreshold": 101}),
            "health.successThreshold: 101 is not an integer in 1..=100",
        ),
        (
            json!({"successThreshold": "2"}),
            "health.successThreshold: \"2\" is not an integer in 1..=100",
        ),
    ];
    for (h, want) in cases {
        let e = err(&with_health(h.clone()));
        assert_eq!(e.code, 7, "{h}: {e}");
        assert!(
            e.msg.contains(want),
            "{h}: {:?} does not contain {want:?}",
            e.msg
        );
    }
}

#[test]
fn a_type_whose_default_target_is_missing_names_what_to_add() {
    let mut v = with_health(json!({"type": "udp", "payload": "x"}));
    v["forwards"] = json!([{"name": "api", "port": 8080, "target": "172.17.16.120:8080"}]);
    let e = err(&v);
    assert!(
        e.msg.contains("health.target: is missing") && e.msg.contains("a UDP forward"),
        "{e}"
    );
    v["health"] = json!({});
    v["forwards"] = json!([]);
    let e = err(&v);
    assert!(e.msg.contains("add health.target or a TCP forward"), "{e}");
    v["health"] = json!({"target": "172.17.16.9:22"});
    assert!(parse(&v, "").is_ok());
}
