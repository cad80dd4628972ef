//! `appProtocol`/`multiplex`: a Modbus/TCP forward's multiplexing, its
//! defaults, and every combination it cannot have refused with code 7
//! naming the key and the forward.

use super::*;
use edgelink_attachment::ModbusMux;

#[test]
fn a_multiplexed_modbus_forward_parses_with_its_defaults_and_bounds() {
    let mut v = base();
    v["forwards"][0]["appProtocol"] = json!("modbus-tcp");
    v["forwards"][0]["multiplex"] = json!(true);
    let c = parse(&v, "").unwrap();
    assert_eq!(
        c.forwards[0].modbus,
        Some(ModbusMux {
            max_in_flight: 1,
            response_timeout_ms: 1000
        })
    );
    assert_eq!(c.forwards[1].modbus, None);
    v["forwards"][0]["maxInFlight"] = json!(16);
    v["forwards"][0]["responseTimeoutMs"] = json!(250);
    let m = parse(&v, "").unwrap().forwards[0].modbus.unwrap();
    assert_eq!((m.max_in_flight, m.response_timeout_ms), (16, 250));
    // appProtocol alone: a plain relay (the multiplexing is asked for).
    let mut plain = base();
    plain["forwards"][0]["appProtocol"] = json!("modbus-tcp");
    assert_eq!(parse(&plain, "").unwrap().forwards[0].modbus, None);
}

#[test]
fn what_a_multiplexed_forward_cannot_have_is_refused_naming_it() {
    let modbus = |f: &mut Value| {
        f["appProtocol"] = json!("modbus-tcp");
        f["multiplex"] = json!(true);
    };
    let cases: Vec<(usize, &str, Value, bool, &str)> = vec![
        (0, "appProtocol", json!("opc-ua"), false, "modbus-tcp"),
        (0, "multiplex", json!("yes"), true, "true or false"),
        (0, "maxInFlight", json!(0), true, "1..=16"),
        (0, "maxInFlight", json!(17), true, "1..=16"),
        (0, "responseTimeoutMs", json!(0), true, "1..=600000"),
        (
            0,
            "maxInFlight",
            json!(2),
            false,
            "needs \"multiplex\": true",
        ),
        (
            0,
            "responseTimeoutMs",
            json!(100),
            false,
            "needs \"multiplex\": true",
        ),
        (0, "proxyProtocol", json!("v2"), true, "proxyProtocol"),
        (0, "path", json!("kernel"), true, "not \"path\": \"kernel\""),
    ];
    for (i, key, value, with_mux, says) in cases {
        let mut v = base();
        if with_mux {
            modbus(&mut v["forwards"][i]);
        }
        v["forwards"][i][key] = value.clone();
        let e = err(&v);
        assert_eq!(e.code, 7, "{key}={value}: {e}");
        assert!(
            e.msg.contains("\"api\"") && e.msg.contains(says),
            "{key}={value}: {e}"
        );
    }
    // multiplex without appProtocol, and on UDP.
    let mut v = base();
    v["forwards"][0]["multiplex"] = json!(true);
    let e = err(&v);
    assert!(
        e.msg.contains("forwards[0].multiplex") && e.msg.contains("modbus-tcp"),
        "{e}"
    );
    let mut v = base();
    modbus(&mut v["forwards"][1]);
    let e = err(&v);
    assert!(
        e.msg.contains("forwards[1].multiplex") && e.msg.contains("protocol tcp"),
        "{e}"
    );
}
