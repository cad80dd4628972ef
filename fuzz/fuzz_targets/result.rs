//! Result decoding: `CniResult::from_json`, and `prevResult` as the plugin
//! decodes it inside its stdin config (`NetConf::parse`).
//!
//! Checks: prevResult in a config decodes exactly as the Result alone; a
//! decoded Result encoded as 1.1.0 decodes back equal (nothing lost or
//! changed); encoded as every older version it decodes back with the same
//! IPs (and `ips[].version` matching each address), the same interface
//! names, MACs and sandboxes, the same route destinations and gateways;
//! ADD's amendment (`append`) keeps prevResult's entries first and points
//! the appended IPs at the appended interfaces.
#![no_main]

use edgelink_cni_spec::{CniResult, CniVersion, IpConfig, NetConf};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

fuzz_target!(|data: &[u8]| {
    let Ok(v) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    if v.is_null() {
        // `"prevResult": null` is no prevResult at all.
        return;
    }
    let direct = CniResult::from_json(&v);
    let conf = json!({"cniVersion": "1.1.0", "name": "n", "type": "edgelink", "prevResult": v});
    let via_conf = NetConf::parse(conf.to_string().as_bytes());
    let r = match (direct, via_conf) {
        (Ok(r), Ok(c)) => {
            assert_eq!(c.prev_result.as_ref(), Some(&r));
            r
        }
        (Err(_), Err(_)) => return,
        (Ok(r), Err(e)) => panic!("decodes alone ({r:?}) but not as prevResult: {e}"),
        (Err(e), Ok(c)) => panic!(
            "decodes as prevResult ({:?}) but not alone: {e}",
            c.prev_result
        ),
    };

    for version in CniVersion::ALL {
        let j = r.to_json(version);
        assert_eq!(j["cniVersion"], version.as_str());
        let back = CniResult::from_json(&j)
            .unwrap_or_else(|e| panic!("{version}: our own encoding does not decode: {e}\n{j}"));
        if version == CniVersion::LATEST {
            assert_eq!(back, r, "1.1.0 round trip\n{j}");
            continue;
        }
        assert_eq!(back.ips, r.ips, "{version}");
        if version.result_has_ip_version() && !r.ips.is_empty() {
            for (ip, out) in r.ips.iter().zip(j["ips"].as_array().unwrap()) {
                let want = if ip.address.is_ipv4() { "4" } else { "6" };
                assert_eq!(out["version"], want);
            }
        }
        let names = |x: &CniResult| -> Vec<_> {
            x.interfaces
                .iter()
                .map(|i| (i.name.clone(), i.mac.clone(), i.sandbox.clone()))
                .collect()
        };
        assert_eq!(names(&back), names(&r), "{version}");
        let routes = |x: &CniResult| -> Vec<_> { x.routes.iter().map(|t| (t.dst, t.gw)).collect() };
        assert_eq!(routes(&back), routes(&r), "{version}");
        assert_eq!(back.dns, r.dns, "{version}");
    }

    // ADD: prevResult, amended with the plugin's own interface and IP.
    let mut amended = r.clone();
    let mine = CniResult {
        interfaces: vec![edgelink_cni_spec::Interface {
            name: "net1".into(),
            sandbox: Some("/run/netns/pod".into()),
            ..Default::default()
        }],
        ips: vec![IpConfig {
            address: "172.17.16.200/24".parse().unwrap(),
            gateway: None,
            interface: Some(0),
        }],
        ..Default::default()
    };
    amended.append(mine);
    assert_eq!(amended.interfaces[..r.interfaces.len()], r.interfaces[..]);
    assert_eq!(amended.ips[..r.ips.len()], r.ips[..]);
    let last = amended.ips.last().unwrap();
    assert_eq!(
        amended.interfaces[last.interface.unwrap()].name,
        "net1",
        "the appended IP points at the appended interface"
    );
    let back = CniResult::from_json(&amended.to_json(CniVersion::LATEST)).unwrap();
    assert_eq!(back, amended);
});
