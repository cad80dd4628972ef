//! The node-side guard of a bridge that carries gateway addresses (the
//! plugin's `isGateway`): with an address on the segment and IP forwarding
//! on, the node would route from the segment into the cluster and answer
//! devices on every service it binds to a wildcard address. One table per
//! bridge, in the namespace it is handed (the node's):
//!
//! ```text
//! table inet edgelink-gw-<bridge> {
//!   chain forward { type filter hook forward priority filter; policy accept;
//!     iifname "edge0" oifname != "edge0" drop      (segment -> elsewhere)
//!     oifname "edge0" iifname != "edge0" drop }    (elsewhere -> segment)
//!   chain input { type filter hook input priority filter; policy accept;
//!     iifname "edge0" ct state established accept  (the node's own flows)
//!     iifname "edge0" ct state related accept
//!     iifname "edge0" meta l4proto icmp accept     (ping, errors)
//!     iifname "edge0" meta l4proto ipv6-icmp accept  (neighbour discovery)
//!     iifname "edge0" drop }
//! }
//! ```
//!
//! Routing between the subnets of the segment (in and out of the bridge)
//! stays, and so does switching between the bridge's ports (which, with
//! br_netfilter, the forward hook sees as in and out of the bridge).

use crate::render::{base_chain, eq, flag, meta, rule, string, table_obj, PRIO_FILTER};
use crate::{nft, Error, Options};
use edgelink_netns::Netns;
use nftables::expr::MetaKey;
use nftables::schema::{NfCmd, NfListObject, NfObject, Nftables};
use nftables::stmt::{Match, Operator, Statement};
use nftables::types::{NfChainPolicy, NfChainType, NfHook};

const FORWARD: &str = "forward";
const INPUT: &str = "input";

/// The guard's table for `bridge`: `edgelink-gw-` and the name, each byte
/// outside `[A-Za-z0-9_]` written as `-` and two hex digits (so two bridge
/// names never share a table).
pub fn gateway_table(bridge: &str) -> String {
    let mut t = String::from("edgelink-gw-");
    for b in bridge.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' {
            t.push(b as char);
        } else {
            t.push_str(&format!("-{b:02x}"));
        }
    }
    t
}

/// The one transaction that makes the guard of `bridge` hold exactly the
/// rules above (add, delete, add: never doubled).
pub fn render_gateway(bridge: &str) -> Result<Nftables<'static>, Error> {
    let table = gateway_table(bridge);
    crate::render::check_table_name(&table)?;
    if bridge.is_empty() || bridge.len() > 15 || bridge.contains(['/', ':']) {
        return Err(Error::InvalidPlan {
            table,
            reason: format!("bridge {bridge:?} is not an interface name"),
        });
    }
    let t = table.as_str();
    let iif = || eq(meta(MetaKey::Iifname), string(bridge));
    let not = |key: MetaKey| {
        Statement::Match(Match {
            left: meta(key),
            right: string(bridge),
            op: Operator::NEQ,
        })
    };
    let mut cmds = vec![
        NfCmd::Add(NfListObject::Table(table_obj(t))),
        NfCmd::Delete(NfListObject::Table(table_obj(t))),
        NfCmd::Add(NfListObject::Table(table_obj(t))),
    ];
    for name in [FORWARD, INPUT] {
        let hook = if name == FORWARD {
            NfHook::Forward
        } else {
            NfHook::Input
        };
        cmds.push(base_chain(
            t,
            name,
            NfChainType::Filter,
            hook,
            PRIO_FILTER,
            NfChainPolicy::Accept,
        ));
    }
    cmds.push(rule(
        t,
        FORWARD,
        vec![iif(), not(MetaKey::Oifname), Statement::Drop(None)],
    ));
    cmds.push(rule(
        t,
        FORWARD,
        vec![
            eq(meta(MetaKey::Oifname), string(bridge)),
            not(MetaKey::Iifname),
            Statement::Drop(None),
        ],
    ));
    for state in ["established", "related"] {
        cmds.push(rule(
            t,
            INPUT,
            vec![
                iif(),
                flag(crate::render::ct("state", None), state),
                Statement::Accept(None),
            ],
        ));
    }
    for proto in ["icmp", "ipv6-icmp"] {
        cmds.push(rule(
            t,
            INPUT,
            vec![
                iif(),
                eq(meta(MetaKey::L4proto), string(proto)),
                Statement::Accept(None),
            ],
        ));
    }
    cmds.push(rule(t, INPUT, vec![iif(), Statement::Drop(None)]));
    Ok(Nftables {
        objects: cmds.into_iter().map(NfObject::CmdObject).collect(),
    })
}

/// Install (or install again) the guard of `bridge` in `netns`. Returns
/// whether its table is new (a failed ADD removes only what it made).
pub fn ensure_gateway_guard(netns: &Netns, bridge: &str, opts: &Options) -> Result<bool, Error> {
    let doc = render_gateway(bridge)?;
    let table = gateway_table(bridge);
    let nft = nft::Nft::new(opts, netns, &table);
    netns.run_on_thread(|| {
        let existed = nft.list_table()?.is_some();
        nft.apply(&doc, "replace")?;
        Ok(!existed)
    })?
}

/// Remove the guard of `bridge`; Ok(false) when there was none.
pub fn remove_gateway_guard(netns: &Netns, bridge: &str, opts: &Options) -> Result<bool, Error> {
    let table = gateway_table(bridge);
    crate::render::check_table_name(&table)?;
    let nft = nft::Nft::new(opts, netns, &table);
    netns.run_on_thread(|| {
        if nft.list_table()?.is_none() {
            return Ok(false);
        }
        nft.apply(&crate::render::delete(&table), "delete")?;
        Ok(true)
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_distinct_per_bridge_and_valid() {
        assert_eq!(gateway_table("edge0"), "edgelink-gw-edge0");
        assert_eq!(gateway_table("br.10"), "edgelink-gw-br-2e10");
        assert_ne!(gateway_table("a.b"), gateway_table("a_b"));
        assert_ne!(gateway_table("a-b"), gateway_table("a_b"));
        for b in ["edge0", "br.10", "a-b", "x@y%z.abcdefghi"] {
            crate::render::check_table_name(&gateway_table(b)).unwrap();
            render_gateway(b).unwrap();
        }
        assert!(render_gateway("").is_err());
        assert!(render_gateway("a/b").is_err());
    }

    #[test]
    fn the_guard_drops_forwarding_off_the_bridge_and_new_input() {
        let json = serde_json::to_string(&render_gateway("edge0").unwrap()).unwrap();
        assert!(json.contains("\"policy\":\"accept\""), "{json}");
        assert_eq!(json.matches("\"drop\"").count(), 3, "{json}");
        assert!(json.contains("\"op\":\"!=\""), "{json}");
        assert!(json.contains("ipv6-icmp"), "{json}");
    }
}
