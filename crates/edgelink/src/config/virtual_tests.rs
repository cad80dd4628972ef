//! `virtualAddresses`: accepted when they fit the segment; every bad value
//! refused with code 7 naming the key, the value and what is wrong.

use super::*;
use crate::validate::{problems, Where};

const V6_SET: &str = "fd00:17:16::/64";

/// `with_reverse()` (the segment 172.17.16.0/24, range .200-.250, gateway
/// .1) with `virtualAddresses` set to `vips`.
fn with_vips(vips: Value) -> Value {
    let mut v = with_reverse();
    v["virtualAddresses"] = vips;
    v
}

/// As [`with_vips`], with an IPv6 range set beside the IPv4 one.
fn dual(vips: Value) -> Value {
    let mut v = with_vips(vips);
    v["ipam"]["ranges"] = json!([
        [{"subnet": "172.17.16.0/24", "rangeStart": "172.17.16.200",
          "rangeEnd": "172.17.16.250", "gateway": "172.17.16.1"}],
        [{"subnet": V6_SET, "rangeStart": "fd00:17:16::100",
          "rangeEnd": "fd00:17:16::1ff", "gateway": "fd00:17:16::1"}]
    ]);
    v
}

fn ips(list: &[&str]) -> Vec<IpAddr> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

/// The error of `v` is code 7, starts with `field: value` and says `why`.
fn refused(v: &Value, field: &str, value: &str, why: &str) {
    let e = err(v);
    assert_eq!(e.code, 7, "{field} {value}: {e}");
    assert!(
        e.msg.starts_with(&format!("{field}: {value} ")) && e.msg.contains(why),
        "{field} {value}: expected {why:?} in: {}",
        e.msg
    );
}

#[test]
fn one_ipv4_address_outside_the_range_is_kept() {
    let c = parse(&with_vips(json!(["172.17.16.60"])), "").unwrap();
    assert_eq!(c.virtual_addresses, ips(&["172.17.16.60"]));
    // Left out, null or empty: none.
    assert!(parse(&with_reverse(), "")
        .unwrap()
        .virtual_addresses
        .is_empty());
    assert!(parse(&with_vips(Value::Null), "")
        .unwrap()
        .virtual_addresses
        .is_empty());
    let mut v = base();
    v["virtualAddresses"] = json!([]);
    assert!(parse(&v, "").unwrap().virtual_addresses.is_empty());
    // Just outside the range, on both sides; the last host of the subnet.
    for ip in ["172.17.16.199", "172.17.16.251", "172.17.16.254"] {
        let c = parse(&with_vips(json!([ip])), "").unwrap();
        assert_eq!(c.virtual_addresses, ips(&[ip]));
    }
}

#[test]
fn one_ipv4_and_one_ipv6_address_are_kept_in_order() {
    let c = parse(&dual(json!(["172.17.16.60", "fd00:17:16::60"])), "").unwrap();
    assert_eq!(
        c.virtual_addresses,
        ips(&["172.17.16.60", "fd00:17:16::60"])
    );
    let c = parse(&dual(json!(["fd00:17:16::60", "172.17.16.60"])), "").unwrap();
    assert_eq!(
        c.virtual_addresses,
        ips(&["fd00:17:16::60", "172.17.16.60"])
    );
    let c = parse(&dual(json!(["fd00:17:16::60"])), "").unwrap();
    assert_eq!(c.virtual_addresses, ips(&["fd00:17:16::60"]));
}

#[test]
fn the_list_must_be_an_array_of_at_most_two_addresses() {
    refused(
        &with_vips(json!("172.17.16.60")),
        "virtualAddresses",
        "\"172.17.16.60\"",
        "is not an array of IP addresses",
    );
    refused(
        &with_vips(json!({"v4": "172.17.16.60"})),
        "virtualAddresses",
        "{\"v4\":\"172.17.16.60\"}",
        "is not an array",
    );
    refused(
        &dual(json!(["172.17.16.60", "fd00:17:16::60", "172.17.16.61"])),
        "virtualAddresses",
        "[\"172.17.16.60\",\"fd00:17:16::60\",\"172.17.16.61\"]",
        "has 3 entries: at most 2",
    );
}

#[test]
fn each_entry_must_be_a_bare_ip_address() {
    refused(
        &with_vips(json!([60])),
        "virtualAddresses[0]",
        "60",
        "is not a string",
    );
    refused(
        &with_vips(json!(["172.17.16.60", null])),
        "virtualAddresses[1]",
        "null",
        "is not a string",
    );
    refused(
        &with_vips(json!(["172.17.16.60/24"])),
        "virtualAddresses[0]",
        "\"172.17.16.60/24\"",
        "has a prefix length",
    );
    refused(
        &with_vips(json!(["fd00:17:16::60/64"])),
        "virtualAddresses[0]",
        "\"fd00:17:16::60/64\"",
        "has a prefix length",
    );
    for s in ["plc.local", "172.17.16.300", "", " 172.17.16.60"] {
        refused(
            &with_vips(json!([s])),
            "virtualAddresses[0]",
            &Value::from(s).to_string(),
            "is not an IP address",
        );
    }
}

#[test]
fn each_entry_must_be_unicast() {
    for (ip, what) in [
        ("0.0.0.0", "the unspecified address"),
        ("::", "the unspecified address"),
        ("127.0.0.1", "a loopback address"),
        ("::1", "the loopback address"),
        ("224.0.0.18", "a multicast address"),
        ("ff02::12", "a multicast address"),
        ("169.254.10.60", "a link-local address (169.254.0.0/16)"),
        ("fe80::60", "a link-local address (fe80::/10)"),
        ("255.255.255.255", "the broadcast address"),
    ] {
        refused(
            &dual(json!([ip])),
            "virtualAddresses[0]",
            &format!("\"{ip}\""),
            &format!("is {what}, not a unicast address"),
        );
    }
}

#[test]
fn duplicates_and_two_of_a_family_are_refused() {
    refused(
        &with_vips(json!(["172.17.16.60", "172.17.16.60"])),
        "virtualAddresses[1]",
        "\"172.17.16.60\"",
        "is listed twice (virtualAddresses[0]",
    );
    // The same address written two ways is still one address.
    refused(
        &dual(json!(["fd00:17:16::60", "fd00:17:16:0::0060"])),
        "virtualAddresses[1]",
        "\"fd00:17:16:0::0060\"",
        "is listed twice",
    );
    refused(
        &with_vips(json!(["172.17.16.60", "172.17.16.61"])),
        "virtualAddresses[1]",
        "\"172.17.16.61\"",
        "is a second IPv4 address (virtualAddresses[0] is one): at most one IPv4 and one IPv6",
    );
    refused(
        &dual(json!(["fd00:17:16::60", "fd00:17:16::61"])),
        "virtualAddresses[1]",
        "\"fd00:17:16::61\"",
        "is a second IPv6 address",
    );
}

#[test]
fn virtual_addresses_without_a_reverse_forward_are_refused() {
    let mut v = base();
    v["virtualAddresses"] = json!(["172.17.16.60"]);
    refused(
        &v,
        "virtualAddresses",
        "[\"172.17.16.60\"]",
        "there is no reverse entry: nothing would listen on them",
    );
    v["reverse"] = json!([]);
    refused(
        &v,
        "virtualAddresses",
        "[\"172.17.16.60\"]",
        "no reverse entry",
    );
}

#[test]
fn an_address_needs_a_subnet_of_its_family_and_must_lie_in_one() {
    refused(
        &with_vips(json!(["fd00:17:16::60"])),
        "virtualAddresses[0]",
        "\"fd00:17:16::60\"",
        "is an IPv6 address and the interface has no IPv6 subnet (it has only 172.17.16.0/24)",
    );
    let mut v = dual(json!(["fd00:17:16::60"]));
    v["ipam"]["ranges"] = json!([[{"subnet": V6_SET}]]);
    v["virtualAddresses"] = json!(["172.17.16.60"]);
    v["reverse"][1]["allowedSources"] = json!(["fd00:17:16::/80"]);
    v["forwards"] = json!([]);
    refused(
        &v,
        "virtualAddresses[0]",
        "\"172.17.16.60\"",
        "is an IPv4 address and the interface has no IPv4 subnet",
    );
    refused(
        &with_vips(json!(["172.17.17.60"])),
        "virtualAddresses[0]",
        "\"172.17.17.60\"",
        "is outside the interface's subnets [172.17.16.0/24]",
    );
    refused(
        &dual(json!(["172.17.16.60", "fd00:17:17::60"])),
        "virtualAddresses[1]",
        "\"fd00:17:17::60\"",
        "is outside the interface's subnets [172.17.16.0/24, fd00:17:16::/64]",
    );
}

#[test]
fn the_network_and_broadcast_addresses_are_refused() {
    refused(
        &with_vips(json!(["172.17.16.0"])),
        "virtualAddresses[0]",
        "\"172.17.16.0\"",
        "is the network address of the subnet 172.17.16.0/24",
    );
    refused(
        &with_vips(json!(["172.17.16.255"])),
        "virtualAddresses[0]",
        "\"172.17.16.255\"",
        "is the broadcast address of the subnet 172.17.16.0/24",
    );
    refused(
        &dual(json!(["fd00:17:16::"])),
        "virtualAddresses[0]",
        "\"fd00:17:16::\"",
        "is the network (subnet-router anycast) address of the subnet fd00:17:16::/64",
    );
}

#[test]
fn a_gateway_of_the_ipam_config_is_refused() {
    let gw = "is a gateway of the IPAM configuration";
    refused(
        &with_vips(json!(["172.17.16.1"])),
        "virtualAddresses[0]",
        "\"172.17.16.1\"",
        gw,
    );
    refused(
        &dual(json!(["172.17.16.60", "fd00:17:16::1"])),
        "virtualAddresses[1]",
        "\"fd00:17:16::1\"",
        gw,
    );
    let mut v = with_vips(json!(["172.17.16.2"]));
    v["ipam"]["routes"] = json!([{"dst": "10.0.0.0/8", "gw": "172.17.16.2"}]);
    refused(&v, "virtualAddresses[0]", "\"172.17.16.2\"", gw);
}

#[test]
fn an_address_the_builtin_ipam_could_hand_out_is_refused() {
    let why = "is inside the built-in IPAM's range 172.17.16.200-172.17.16.250 (172.17.16.0/24): a pod could be given it";
    for ip in ["172.17.16.200", "172.17.16.220", "172.17.16.250"] {
        refused(
            &with_vips(json!([ip])),
            "virtualAddresses[0]",
            &format!("\"{ip}\""),
            why,
        );
    }
    refused(
        &dual(json!(["172.17.16.60", "fd00:17:16::1ff"])),
        "virtualAddresses[1]",
        "\"fd00:17:16::1ff\"",
        "is inside the built-in IPAM's range fd00:17:16::100-fd00:17:16::1ff",
    );
    // The default range is the whole subnet: only an exclusion frees one.
    let mut v = with_vips(json!(["172.17.16.60"]));
    v["ipam"]["ranges"] = json!([[{"subnet": "172.17.16.0/24"}]]);
    refused(
        &v,
        "virtualAddresses[0]",
        "\"172.17.16.60\"",
        "is inside the built-in IPAM's range 172.17.16.0/24",
    );
    v["ipam"]["exclude"] = json!(["172.17.16.56/29"]);
    assert_eq!(
        parse(&v, "").unwrap().virtual_addresses,
        ips(&["172.17.16.60"])
    );
}

#[test]
fn another_nodes_range_counts_too() {
    // The address moves between the nodes' proxy pods: a pod of either
    // node must never be given it.
    let mut v = with_vips(json!(["172.17.16.230"]));
    v["ipam"]["ranges"] = json!([[
        {"subnet": "172.17.16.0/24", "rangeStart": "172.17.16.200",
         "rangeEnd": "172.17.16.220", "node": "n1"},
        {"subnet": "172.17.16.0/24", "rangeStart": "172.17.16.221",
         "rangeEnd": "172.17.16.250", "node": "n2", "gateway": "172.17.16.2"}
    ]]);
    refused(
        &v,
        "virtualAddresses[0]",
        "\"172.17.16.230\"",
        "is inside the built-in IPAM's range 172.17.16.221-172.17.16.250 (172.17.16.0/24) of node \"n2\"",
    );
    v["virtualAddresses"] = json!(["172.17.16.2"]);
    refused(
        &v,
        "virtualAddresses[0]",
        "\"172.17.16.2\"",
        "is a gateway of the IPAM configuration",
    );
    v["virtualAddresses"] = json!(["172.17.16.60"]);
    assert!(parse(&v, "").is_ok());
}

/// A config with a delegated IPAM: its subnets are known after its ADD.
fn delegated(vips: Value) -> Config {
    let mut v = with_vips(vips);
    v["ipam"] = json!({"type": "host-local", "subnet": "172.17.16.0/24"});
    parse(&v, "").unwrap()
}

fn nets(list: &[&str]) -> Vec<IpNetwork> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

/// The error of checking `c` against a delegated IPAM's result.
fn after_ipam(c: &Config, own: &[&str], gateways: &[&str]) -> CniError {
    c.check_virtual(&nets(own), &ips(gateways))
        .unwrap_err()
        .into_cni()
}

fn says(e: &CniError, field: &str, value: &str, why: &str) {
    assert_eq!(e.code, 7, "{e}");
    assert!(
        e.msg.starts_with(&format!("{field}: {value} ")) && e.msg.contains(why),
        "expected {field} {value} {why:?} in: {}",
        e.msg
    );
}

#[test]
fn with_a_delegated_ipam_the_result_is_checked() {
    // Nothing is known at parse time: the address is kept unchecked.
    let c = delegated(json!(["172.17.16.201"]));
    assert_eq!(c.virtual_addresses, ips(&["172.17.16.201"]));
    let own = ["172.17.16.201/24"];
    let e = after_ipam(&c, &own, &["172.17.16.1"]);
    says(
        &e,
        "virtualAddresses[0]",
        "\"172.17.16.201\"",
        "is the interface's own address (172.17.16.201/24)",
    );
    let c = delegated(json!(["172.17.16.1"]));
    let e = after_ipam(&c, &own, &["172.17.16.1"]);
    says(
        &e,
        "virtualAddresses[0]",
        "\"172.17.16.1\"",
        "is a gateway of the IPAM result",
    );
    let c = delegated(json!(["172.17.16.255"]));
    says(
        &after_ipam(&c, &own, &[]),
        "virtualAddresses[0]",
        "\"172.17.16.255\"",
        "is the broadcast address of the subnet 172.17.16.0/24",
    );
    let c = delegated(json!(["172.17.16.0"]));
    says(
        &after_ipam(&c, &own, &[]),
        "virtualAddresses[0]",
        "\"172.17.16.0\"",
        "is the network address",
    );
    let c = delegated(json!(["172.17.99.60"]));
    says(
        &after_ipam(&c, &own, &[]),
        "virtualAddresses[0]",
        "\"172.17.99.60\"",
        "is outside the interface's subnets [172.17.16.0/24]",
    );
    let c = delegated(json!(["fd00:17:16::60"]));
    says(
        &after_ipam(&c, &own, &[]),
        "virtualAddresses[0]",
        "\"fd00:17:16::60\"",
        "has no IPv6 subnet (it has only 172.17.16.0/24)",
    );
    // No address at all (no ipam): nothing to hold it on.
    says(
        &after_ipam(&c, &[], &[]),
        "virtualAddresses[0]",
        "\"fd00:17:16::60\"",
        "it has no address at all (ipam)",
    );
    // Anywhere else in the subnet: fine, the delegate's ranges are its own.
    let c = delegated(json!(["172.17.16.60"]));
    assert!(c.check_virtual(&nets(&own), &ips(&["172.17.16.1"])).is_ok());
}

#[test]
fn validate_reports_the_same_problems_and_knows_the_key() {
    // `edgelink validate` checks against the node's own state directory.
    let on_any_node = |mut v: Value| {
        v.as_object_mut().unwrap().remove("stateDir");
        v
    };
    for vips in [
        json!(["172.17.16.220"]),
        json!(["172.17.16.60", "172.17.16.60"]),
        json!(["172.17.16.0"]),
        json!(["fd00:17:16::60"]),
    ] {
        let v = with_vips(vips);
        let msg = err(&v).msg;
        assert!(msg.starts_with("virtualAddresses"), "{msg}");
        assert_eq!(problems(&on_any_node(v), Where::Offline), [msg]);
    }
    let mut v = base();
    v["virtualAddresses"] = json!(["172.17.16.60"]);
    let msg = err(&v).msg;
    assert_eq!(problems(&on_any_node(v), Where::Offline), [msg]);
    let v = on_any_node(with_vips(json!(["172.17.16.60"])));
    assert_eq!(problems(&v, Where::Offline), Vec::<String>::new());
    assert!(keys::unknown_keys(&v).is_empty());
    let mut v = with_reverse();
    v["virtualAddress"] = json!(["172.17.16.60"]);
    assert_eq!(keys::unknown_keys(&v)[0].closest, Some("virtualAddresses"));
}
