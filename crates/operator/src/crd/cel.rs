//! The CEL rules (`x-kubernetes-validations`) of the CRDs: the controller's
//! checks (`crate::validate`, `crate::reverse::check_spec`) that need
//! nothing but the object itself, so that `kubectl apply` refuses what
//! the controller would otherwise only report in status, in the
//! controller's words. The controller keeps every check (older clusters,
//! and what a rule here leaves to it).
//!
//! They need Kubernetes 1.31 or later: the IP and CIDR functions came with
//! the CEL library of 1.30, which an apiserver offers to new rules one
//! release later. `edgelink-operator crds --without-cel`
//! (daemonset/operator/crds-1.20.yaml) is the same CRDs without them, for
//! 1.20 to 1.30.
//!
//! Every list or string a rule walks is bounded in the schema (maxItems,
//! maxLength), or the apiserver refuses the CRD for the rules' estimated
//! cost; for the same reason a message names no value that comes out of a
//! list's filter or `string(int)` (whose length the estimate cannot
//! bound): those messages are fixed text. `protocol` of a reverse entry
//! and `mode` have schema defaults, which the apiserver applies before it
//! runs the rules.

use kube::core::{Message, Reason, Rule};
use schemars::Schema;

/// The keys of a port that need the relay's own TCP connection.
const RELAY_KEYS: [&str; 4] = [
    "maxConnections",
    "queueTimeoutMs",
    "connectRetries",
    "proxyProtocol",
];

/// The keys of a reverse entry that are TCP only.
const REVERSE_TCP_KEYS: [&str; 5] = [
    "idleTimeoutMs",
    "maxConnections",
    "queueTimeoutMs",
    "connectRetries",
    "proxyProtocol",
];

/// The bridge-mode-only keys of an EdgeNetwork.
const BRIDGE_KEYS: [&str; 3] = ["bridge", "moveUplinkAddresses", "vlan"];

/// The addresses of a node's range that must lie in its subnet.
const RANGE_ADDRESSES: [&str; 3] = ["rangeStart", "rangeEnd", "gateway"];

/// A DNS-1035 label, as `validate::is_dns1035`.
const DNS1035: &str = "^[a-z]([-a-z0-9]*[a-z0-9])?$";

/// `rule` on `.field` of the object the schema describes, refused with
/// `reason` and `message`.
fn on(field: &str, rule: &str, reason: Reason, message: Message) -> Rule {
    Rule::new(rule)
        .field_path(format!(".{field}"))
        .reason(reason)
        .message(message)
}

/// A message that names the values: a CEL expression.
fn expr(e: impl Into<String>) -> Message {
    Message::Expression(e.into())
}

fn add(s: &mut Schema, rules: impl IntoIterator<Item = Rule>) {
    for r in rules {
        kube::core::validate(s, r).expect("a CEL rule serialises");
    }
}

/// Device: `metadata.name` names the Service and, as `<name>-0`, the
/// proxy pod, whose label value carries it: a DNS-1035 label of at most
/// 61 characters (`validate::device`).
pub(super) fn device_name() -> Rule {
    Rule::new(format!(
        "size(self.metadata.name) <= 61 && self.metadata.name.matches('{DNS1035}')"
    ))
    .message(
        "metadata.name: cannot name a Service and its proxy pod: it must be a DNS-1035 label \
         (a-z first, then a-z, 0-9 and -, not ending in -) of at most 61 characters",
    )
}

/// Device: a reverse entry naming the Device's own Service, without a
/// namespace (so the Device's), would loop through the proxy
/// (`reverse::check_spec`; one naming the Device's namespace outright is
/// left to the controller: a rule cannot read `metadata.namespace`).
pub(super) fn reverse_not_self() -> Rule {
    Rule::new(
        "!has(self.spec.reverse) || self.spec.reverse.all(r, !has(r.service) || \
         has(r.service.namespace) || r.service.name != self.metadata.name)",
    )
    .field_path(".spec.reverse")
    .message(
        "a service names the Device's own Service: the device would call itself through its proxy",
    )
}

/// Device.spec: a nodeSelector that selects something; reverse entries
/// whose name and port/protocol no port has (`validate::device`,
/// `reverse::check_spec`).
pub(super) fn device_spec(s: &mut Schema) {
    let name = "self.ports.exists(p, p.name == r.name)";
    let port = "self.ports.exists(p, p.port == r.port && p.protocol == r.protocol)";
    add(
        s,
        [
            on(
                "nodeSelector",
                "!has(self.nodeSelector) || size(self.nodeSelector) > 0",
                Reason::FieldValueInvalid,
                "is empty: it would select every node".into(),
            ),
            on(
                "reverse",
                &format!("!has(self.reverse) || self.reverse.all(r, !{name})"),
                Reason::FieldValueInvalid,
                "an entry has the name of a port: a name is unique across ports and reverse".into(),
            ),
            on(
                "reverse",
                &format!("!has(self.reverse) || self.reverse.all(r, !{port})"),
                Reason::FieldValueInvalid,
                "an entry has the port and protocol of a port: devices could not reach the port"
                    .into(),
            ),
            on(
                "virtualAddresses",
                "!has(self.virtualAddresses) || size(self.virtualAddresses) == 0 || (has(self.reverse) && size(self.reverse) > 0)",
                Reason::FieldValueInvalid,
                "needs reverse entries: nothing else listens on a virtual address".into(),
            ),
            on(
                "virtualAddresses",
                "!has(self.virtualAddresses) || !(self.address in self.virtualAddresses)",
                Reason::FieldValueInvalid,
                "names the device's own address".into(),
            ),
        ],
    );
}

/// Device.spec.address: a unicast address, as the controller wants
/// (`validate::device`; link-local is one).
pub(super) fn unicast(s: &mut Schema) {
    add(
        s,
        [Rule::new(
            "!isIP(self) || ip(self).isGlobalUnicast() || ip(self).isLinkLocalUnicast()",
        )
        .message(expr(
            "self + ' is not a unicast address (unspecified, loopback, multicast or broadcast)'",
        ))],
    );
}

/// `spec.virtualAddresses`: unicast, at most one per family (the
/// subnets and ranges are `vip::check`'s).
pub(super) fn virtual_addresses(s: &mut Schema) {
    add(
        s,
        [
            Rule::new("self.all(a, !isIP(a) || ip(a).isGlobalUnicast())")
                .message("a virtual address must be a global unicast address"),
            Rule::new("self.filter(a, isIP(a) && ip(a).family() == 4).size() <= 1 && self.filter(a, isIP(a) && ip(a).family() == 6).size() <= 1")
                .message("at most one IPv4 and one IPv6 virtual address"),
        ],
    );
}

/// A list of ports or reverse entries: no port/protocol twice
/// (`validate::device`, `reverse::check_spec`; names are the list's map
/// key, which the apiserver keeps unique).
pub(super) fn unique_ports(s: &mut Schema) {
    let once = "self.exists_one(q, q.port == p.port && q.protocol == p.protocol)";
    add(
        s,
        [Rule::new(format!("self.all(p, {once})"))
            .message("two entries have the same port and protocol")],
    );
}

/// `key` is only valid with protocol tcp.
fn tcp_only(key: &str) -> Rule {
    on(
        key,
        &format!("!has(self.{key}) || self.protocol == 'tcp'"),
        Reason::FieldValueForbidden,
        expr("'is only valid with protocol tcp (' + self.name + ' is ' + self.protocol + ')'"),
    )
}

/// Device.spec.ports[]: the relay's keys on a TCP port, and not on the
/// kernel path (`validate::relay_keys`, as the plugin refuses them).
pub(super) fn port(s: &mut Schema) {
    for key in RELAY_KEYS {
        add(
            s,
            [
                tcp_only(key),
                on(
                    key,
                    &format!("!has(self.{key}) || !has(self.path) || self.path != 'kernel'"),
                    Reason::FieldValueForbidden,
                    expr(
                        "'needs the relay: it cannot be set with path kernel (' + self.name + ')'",
                    ),
                ),
            ],
        );
    }
}

/// Device.spec.reverse[]: the TCP-only keys on TCP entries, idleTimeoutMs
/// 0 or at least a second, a target's port in 1..65535 (the schema's
/// pattern allows five digits) (`reverse::check_spec`).
pub(super) fn reverse(s: &mut Schema) {
    add(s, REVERSE_TCP_KEYS.map(tcp_only));
    let port = "int(self.target.substring(self.target.lastIndexOf(':') + 1))";
    add(
        s,
        [
            on(
                "idleTimeoutMs",
                "!has(self.idleTimeoutMs) || self.idleTimeoutMs == 0 || self.idleTimeoutMs >= 1000",
                Reason::FieldValueInvalid,
                format!(
                    "is not 0 (never) or in 1000..{}",
                    super::MAX_IDLE_TIMEOUT_MS
                )
                .as_str()
                .into(),
            ),
            on(
                "target",
                &format!(
                    "!has(self.target) || !self.target.matches('^.+:[0-9]{{1,5}}$') || \
                     ({port} >= 1 && {port} <= 65535)"
                ),
                Reason::FieldValueInvalid,
                expr("self.target + ': the port is not in 1..65535'"),
            ),
        ],
    );
}

/// EdgeNetwork.spec: macvlan needs its master (uplink), the bridge keys
/// only with mode bridge, macvlanMode only with mode macvlan
/// (`validate::network`).
pub(super) fn network_spec(s: &mut Schema) {
    add(
        s,
        [on(
            "uplink",
            "self.mode != 'macvlan' || has(self.uplink)",
            Reason::FieldValueRequired,
            "is required with mode macvlan (the macvlan master)".into(),
        )],
    );
    for key in BRIDGE_KEYS {
        add(
            s,
            [on(
                key,
                &format!("!has(self.{key}) || self.mode == 'bridge'"),
                Reason::FieldValueForbidden,
                "is only valid with mode bridge".into(),
            )],
        );
    }
    add(
        s,
        [on(
            "macvlanMode",
            "!has(self.macvlanMode) || self.mode == 'macvlan'",
            Reason::FieldValueForbidden,
            "is only valid with mode macvlan".into(),
        )],
    );
}

/// An IPv4 address's value as an int, for ordering (CEL's IP type has none).
fn ipv4_value(field: &str) -> String {
    let octet = |i: u32| format!("int(self.{field}.split('.')[{i}])");
    format!(
        "{} * 16777216 + {} * 65536 + {} * 256 + {}",
        octet(0),
        octet(1),
        octet(2),
        octet(3)
    )
}

/// EdgeNetwork.spec.ipam.ranges[]: rangeStart, rangeEnd and gateway in the
/// subnet; rangeEnd not before rangeStart when both are IPv4 and given
/// (`validate::network`; the defaults, IPv6 and the overlaps between
/// ranges are left to the controller).
pub(super) fn node_range(s: &mut Schema) {
    for key in RANGE_ADDRESSES {
        add(
            s,
            [on(
                key,
                &format!(
                    "!has(self.{key}) || !isCIDR(self.subnet) || !isIP(self.{key}) || \
                     cidr(self.subnet).containsIP(self.{key})"
                ),
                Reason::FieldValueInvalid,
                expr(format!(
                    "self.{key} + ' is outside the subnet ' + self.subnet"
                )),
            )],
        );
    }
    let v4 = |f: &str| format!("isIP(self.{f}) && ip(self.{f}).family() == 4");
    add(
        s,
        [Rule::new(format!(
            "!has(self.rangeStart) || !has(self.rangeEnd) || !({}) || !({}) || {} <= {}",
            v4("rangeStart"),
            v4("rangeEnd"),
            ipv4_value("rangeStart"),
            ipv4_value("rangeEnd")
        ))
        .message(expr(
            "'rangeEnd ' + self.rangeEnd + ' is before rangeStart ' + self.rangeStart",
        ))],
    );
}

/// `v` (a CRD as JSON) without its CEL rules: what Kubernetes before 1.31
/// takes (crds-1.20.yaml).
pub(super) fn strip(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            m.remove("x-kubernetes-validations");
            m.values_mut().for_each(strip);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
        _ => {}
    }
}

#[cfg(test)]
mod tests;

/// Device.spec.health: each key with the probe types that take it,
/// udp's payload, a timeout within the interval (`validate::health`).
pub(super) fn health(s: &mut Schema) {
    let ty = "(has(self.type) ? self.type : 'tcp')";
    let keys: [(&str, &str); 6] = [
        ("port", "tcp, http, udp or modbus"),
        ("path", "http"),
        ("expectStatus", "http"),
        ("payload", "udp"),
        ("unitId", "modbus"),
        ("register", "modbus"),
    ];
    let takes = |key: &str| match key {
        "port" => format!("{ty} != 'icmp'"),
        "path" | "expectStatus" => format!("{ty} == 'http'"),
        "payload" => format!("{ty} == 'udp'"),
        _ => format!("{ty} == 'modbus'"),
    };
    add(
        s,
        keys.map(|(key, types)| {
            on(
                key,
                &format!("!has(self.{key}) || {}", takes(key)),
                Reason::FieldValueForbidden,
                format!("is for probe type {types} only").as_str().into(),
            )
        }),
    );
    add(
        s,
        [
            on(
                "payload",
                &format!("{ty} != 'udp' || has(self.payload)"),
                Reason::FieldValueRequired,
                "is required with probe type udp (the datagram sent)".into(),
            ),
            on(
                "timeoutSeconds",
                "!has(self.timeoutSeconds) || self.timeoutSeconds <= (has(self.intervalSeconds) ? self.intervalSeconds : 2)",
                Reason::FieldValueInvalid,
                "is longer than intervalSeconds (default 2)".into(),
            ),
        ],
    );
}
