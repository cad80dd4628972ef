//! The plan as nft's JSON: pure, checked before anything is run.
//!
//! ```text
//! table inet <table> {
//!   counter <fwd>-conn {}  counter <fwd>-up {}  counter <fwd>-down {}   (per forward)
//!   chain prerouting { type nat hook prerouting priority dstnat; policy accept;
//!     meta nfproto ipv4 iifname "eth0" tcp dport 8080 fib daddr type local
//!       (iifname != "net1" when the plan names no cluster interface)
//!       counter name "<fwd>-conn" dnat ip to 172.31.50.10:80 }
//!   chain postrouting { type nat hook postrouting priority srcnat; policy accept;
//!     oifname "net1" ct status dnat masquerade }   (the client's port kept where free)
//!   chain forward { type filter hook forward priority filter; policy drop;
//!     meta l4proto tcp ct status dnat ct original proto-dst vmap { 8080 : jump fwd-<fwd>, ... }
//!     meta l4proto udp ct status dnat ct original proto-dst vmap { ... } }
//!   chain fwd-<fwd> {                                                   (per forward)
//!     oifname "net1" ct direction original meta l4proto tcp
//!       ct reply ip saddr 172.31.50.10 ct reply proto-src 80 counter name "<fwd>-up" accept
//!     iifname "net1" ct direction reply  (same target)  counter name "<fwd>-down" accept }
//! }
//! ```
//!
//! A flow is told apart by its original destination port (before DNAT)
//! and its reply source (the target after DNAT), so each forward's
//! counters see its own flows only, and the forward chain accepts nothing
//! that this table's DNAT did not make. Every packet a pod routes passes
//! the forward hook: one lookup in a verdict map per protocol finds its
//! forward's chain, whatever the number of forwards, where a list of
//! rules made the last forward's packets try every other one first. A
//! packet conntrack does not know (`ct state invalid`, kubernetes#74839)
//! has no `ct status`, matches no rule and meets the policy: drop.

use crate::{Error, KernelForward, Plan, Protocol};
use nftables::expr::{
    CTDir, Expression, Fib, FibFlag, FibResult, Meta, MetaKey, NamedExpression, Payload,
    PayloadField, SetItem, Verdict, CT,
};
use nftables::schema::{Chain, Counter, NfCmd, NfListObject, NfObject, Nftables, Rule, Table};
use nftables::stmt::{JumpTarget, Match, NATFamily, Operator, Statement, VerdictMap, NAT};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};
use std::borrow::Cow;
use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};

const PREROUTING: &str = "prerouting";
const POSTROUTING: &str = "postrouting";
const FORWARD: &str = "forward";
/// The named priorities dstnat, srcnat and filter.
const PRIO_DSTNAT: i32 = -100;
const PRIO_SRCNAT: i32 = 100;
pub(crate) const PRIO_FILTER: i32 = 0;

/// Suffixes of a forward's three named counters.
pub(crate) const CONN: &str = "-conn";
pub(crate) const UP: &str = "-up";
pub(crate) const DOWN: &str = "-down";

/// The one transaction that makes the table hold exactly `plan`: add the
/// table (so the delete cannot fail), delete it with all it holds, add it
/// again with its counters, chains and rules.
pub fn render(plan: &Plan) -> Result<Nftables<'static>, Error> {
    check(plan)?;
    let table = plan.table.as_str();
    let ifname = plan.private_ifname.as_str();
    let mut cmds = vec![
        NfCmd::Add(NfListObject::Table(table_obj(table))),
        NfCmd::Delete(NfListObject::Table(table_obj(table))),
        NfCmd::Add(NfListObject::Table(table_obj(table))),
    ];
    for f in &plan.forwards {
        for suffix in [CONN, UP, DOWN] {
            cmds.push(NfCmd::Add(NfListObject::Counter(Counter {
                family: NfFamily::INet,
                table: owned(table),
                name: format!("{}{suffix}", f.name).into(),
                handle: None,
                packets: Some(0),
                bytes: Some(0),
            })));
        }
    }
    cmds.push(base_chain(
        table,
        PREROUTING,
        NfChainType::NAT,
        NfHook::Prerouting,
        PRIO_DSTNAT,
        NfChainPolicy::Accept,
    ));
    cmds.push(base_chain(
        table,
        POSTROUTING,
        NfChainType::NAT,
        NfHook::Postrouting,
        PRIO_SRCNAT,
        NfChainPolicy::Accept,
    ));
    cmds.push(base_chain(
        table,
        FORWARD,
        NfChainType::Filter,
        NfHook::Forward,
        PRIO_FILTER,
        NfChainPolicy::Drop,
    ));
    let ingress = match &plan.cluster_ifname {
        Some(cluster) => (cluster.as_str(), Operator::EQ),
        None => (ifname, Operator::NEQ),
    };
    for f in &plan.forwards {
        cmds.push(rule(table, PREROUTING, dnat_rule(f, ingress)));
    }
    cmds.push(rule(
        table,
        POSTROUTING,
        vec![
            eq(meta(MetaKey::Oifname), string(ifname)),
            dnat_status(),
            // No random flag: the masquerade keeps the client's source
            // port where it is free, so a client's connection meets the
            // device on the same port each time, with timestamps that only
            // go up, and the device takes its SYN into the TIME_WAIT the
            // last one left. A random port (kubernetes#78547) lands on
            // another client's TIME_WAIT with older timestamps: the device
            // drops the SYN (PAWS) and the client waits 1 s to send it
            // again. Sustained, that cut the connections/s by four.
            Statement::Masquerade(None),
        ],
    ));
    // The chains a verdict map jumps to are there before it.
    for f in &plan.forwards {
        cmds.push(NfCmd::Add(NfListObject::Chain(Chain {
            family: NfFamily::INet,
            table: owned(table),
            name: flow_chain(f).into(),
            newname: None,
            handle: None,
            _type: None,
            hook: None,
            prio: None,
            dev: None,
            policy: None,
        })));
        for dir in [CTDir::Original, CTDir::Reply] {
            cmds.push(rule(table, flow_chain(f), forward_rule(f, ifname, dir)));
        }
    }
    for protocol in [Protocol::Tcp, Protocol::Udp] {
        if let Some(r) = dispatch_rule(plan, protocol) {
            cmds.push(rule(table, FORWARD, r));
        }
    }
    Ok(Nftables {
        objects: cmds.into_iter().map(NfObject::CmdObject).collect(),
    })
}

/// Delete the table (which must exist: nft fails otherwise).
pub(crate) fn delete(table: &str) -> Nftables<'static> {
    Nftables {
        objects: vec![NfObject::CmdObject(NfCmd::Delete(NfListObject::Table(
            table_obj(table),
        )))]
        .into(),
    }
}

/// `[meta nfproto ipvX] iifname == <cluster> (or != <private>) <l4> dport
/// <port> fib daddr type local counter name <fwd>-conn dnat ipX to <target>`.
fn dnat_rule(f: &KernelForward, ingress: (&str, Operator)) -> Vec<Statement<'static>> {
    let (nfproto, family) = match f.target.ip() {
        IpAddr::V4(_) => ("ipv4", NATFamily::IP),
        IpAddr::V6(_) => ("ipv6", NATFamily::IP6),
    };
    vec![
        eq(meta(MetaKey::Nfproto), string(nfproto)),
        Statement::Match(Match {
            left: meta(MetaKey::Iifname),
            right: string(ingress.0),
            op: ingress.1,
        }),
        eq(
            Expression::Named(NamedExpression::Payload(Payload::PayloadField(
                PayloadField {
                    protocol: l4(f.protocol).into(),
                    field: "dport".into(),
                },
            ))),
            Expression::Number(f.port.into()),
        ),
        eq(
            Expression::Named(NamedExpression::Fib(Fib {
                result: FibResult::Type,
                flags: HashSet::from([FibFlag::Daddr]),
            })),
            string("local"),
        ),
        counter(f, CONN),
        Statement::DNAT(Some(NAT {
            addr: Some(string(&f.target.ip().to_string())),
            family: Some(family),
            port: Some(Expression::Number(f.target.port().into())),
            flags: None,
        })),
    ]
}

/// The chain of a forward's flows, which the forward hook jumps to.
fn flow_chain(f: &KernelForward) -> String {
    format!("fwd-{}", f.name)
}

/// `meta l4proto <p> ct status dnat ct original proto-dst vmap { <port> :
/// jump fwd-<name>, ... }` for the plan's forwards of `protocol`; None
/// when it has none.
fn dispatch_rule(plan: &Plan, protocol: Protocol) -> Option<Vec<Statement<'static>>> {
    let jumps: Vec<SetItem<'static>> = plan
        .forwards
        .iter()
        .filter(|f| f.protocol == protocol)
        .map(|f| {
            SetItem::Mapping(
                Expression::Number(f.port.into()),
                Expression::Verdict(Verdict::Jump(JumpTarget {
                    target: flow_chain(f).into(),
                })),
            )
        })
        .collect();
    if jumps.is_empty() {
        return None;
    }
    Some(vec![
        eq(meta(MetaKey::L4proto), string(l4(protocol))),
        dnat_status(),
        Statement::VerdictMap(VerdictMap {
            key: ct("proto-dst", Some(CTDir::Original)),
            data: Expression::Named(NamedExpression::Set(jumps)),
        }),
    ])
}

/// One direction of the forward's flows: out of the private interface
/// towards the target (original), or back in from it (reply). The
/// dispatch rule matched the protocol, the DNAT and the original port.
fn forward_rule(f: &KernelForward, ifname: &str, dir: CTDir) -> Vec<Statement<'static>> {
    let (iface, direction, suffix) = match dir {
        CTDir::Original => (MetaKey::Oifname, "original", UP),
        CTDir::Reply => (MetaKey::Iifname, "reply", DOWN),
    };
    let saddr = match f.target {
        SocketAddr::V4(_) => "ip saddr",
        SocketAddr::V6(_) => "ip6 saddr",
    };
    vec![
        eq(meta(iface), string(ifname)),
        eq(ct("direction", None), string(direction)),
        // The protocol again: nft needs it to read `ct reply proto-src`.
        eq(meta(MetaKey::L4proto), string(l4(f.protocol))),
        eq(
            ct(saddr, Some(CTDir::Reply)),
            string(&f.target.ip().to_string()),
        ),
        eq(
            ct("proto-src", Some(CTDir::Reply)),
            Expression::Number(f.target.port().into()),
        ),
        counter(f, suffix),
        Statement::Accept(None),
    ]
}

fn check(plan: &Plan) -> Result<(), Error> {
    check_table_name(&plan.table)?;
    let invalid = |reason: String| Error::InvalidPlan {
        table: plan.table.clone(),
        reason,
    };
    let names = std::iter::once(("private", &plan.private_ifname))
        .chain(plan.cluster_ifname.iter().map(|c| ("cluster", c)));
    for (side, ifname) in names {
        if ifname.is_empty()
            || ifname.len() > 15
            || ifname == "."
            || ifname == ".."
            || !ifname
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'/' && b != b':')
        {
            return Err(invalid(format!(
                "{side} interface {ifname:?} is not an interface name"
            )));
        }
    }
    if plan.cluster_ifname.as_ref() == Some(&plan.private_ifname) {
        return Err(invalid(format!(
            "the cluster interface is the private one ({:?})",
            plan.private_ifname
        )));
    }
    let mut names = HashSet::new();
    let mut ports = HashSet::new();
    for f in &plan.forwards {
        let valid_name = !f.name.is_empty()
            && f.name.len() <= 64
            && f.name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !valid_name {
            return Err(invalid(format!(
                "forward name {:?} is not [A-Za-z0-9_-]{{1,64}}",
                f.name
            )));
        }
        if !names.insert(f.name.as_str()) {
            return Err(invalid(format!("forward {} is declared twice", f.name)));
        }
        if !ports.insert((l4(f.protocol), f.port)) {
            return Err(invalid(format!(
                "forward {}: {}/{} is taken by another forward",
                f.name, f.protocol, f.port
            )));
        }
        if f.port == 0 || f.target.port() == 0 {
            return Err(invalid(format!("forward {}: port 0", f.name)));
        }
        let ip = f.target.ip();
        let mapped = matches!(ip, IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some());
        if ip.is_unspecified() || ip.is_multicast() || mapped {
            return Err(invalid(format!(
                "forward {}: {ip} cannot be a DNAT target",
                f.name
            )));
        }
        if !plan.allowed.iter().any(|n| n.contains(ip)) {
            return Err(Error::TargetNotAllowed {
                table: plan.table.clone(),
                forward: f.name.clone(),
                target: f.target,
                allowed: plan
                    .allowed
                    .iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    }
    Ok(())
}

pub(crate) fn check_table_name(table: &str) -> Result<(), Error> {
    let valid = table.len() <= 64
        && table
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic())
        && table
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if valid {
        Ok(())
    } else {
        Err(Error::InvalidPlan {
            table: table.to_string(),
            reason: "the table name is not [A-Za-z][A-Za-z0-9_-]{0,63}".into(),
        })
    }
}

fn l4(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
    }
}

pub(crate) fn owned(s: &str) -> Cow<'static, str> {
    Cow::Owned(s.to_string())
}

pub(crate) fn string(s: &str) -> Expression<'static> {
    Expression::String(owned(s))
}

pub(crate) fn meta(key: MetaKey) -> Expression<'static> {
    Expression::Named(NamedExpression::Meta(Meta { key }))
}

pub(crate) fn ct(key: &'static str, dir: Option<CTDir>) -> Expression<'static> {
    Expression::Named(NamedExpression::CT(CT {
        key: key.into(),
        family: None,
        dir,
    }))
}

pub(crate) fn eq(left: Expression<'static>, right: Expression<'static>) -> Statement<'static> {
    Statement::Match(Match {
        left,
        right,
        op: Operator::EQ,
    })
}

/// A bit test, as nft writes `ct status dnat`.
pub(crate) fn flag(left: Expression<'static>, bit: &'static str) -> Statement<'static> {
    Statement::Match(Match {
        left,
        right: Expression::String(bit.into()),
        op: Operator::IN,
    })
}

fn dnat_status() -> Statement<'static> {
    flag(ct("status", None), "dnat")
}

fn counter(f: &KernelForward, suffix: &str) -> Statement<'static> {
    Statement::Counter(nftables::stmt::Counter::Named(
        format!("{}{suffix}", f.name).into(),
    ))
}

pub(crate) fn table_obj(table: &str) -> Table<'static> {
    Table {
        family: NfFamily::INet,
        name: owned(table),
        handle: None,
    }
}

pub(crate) fn base_chain(
    table: &str,
    name: &'static str,
    kind: NfChainType,
    hook: NfHook,
    prio: i32,
    policy: NfChainPolicy,
) -> NfCmd<'static> {
    NfCmd::Add(NfListObject::Chain(Chain {
        family: NfFamily::INet,
        table: owned(table),
        name: name.into(),
        newname: None,
        handle: None,
        _type: Some(kind),
        hook: Some(hook),
        prio: Some(prio),
        dev: None,
        policy: Some(policy),
    }))
}

pub(crate) fn rule(
    table: &str,
    chain: impl Into<Cow<'static, str>>,
    expr: Vec<Statement<'static>>,
) -> NfCmd<'static> {
    NfCmd::Add(NfListObject::Rule(Rule {
        family: NfFamily::INet,
        table: owned(table),
        chain: chain.into(),
        expr: expr.into(),
        handle: None,
        index: None,
        comment: None,
    }))
}

#[cfg(test)]
mod tests;
