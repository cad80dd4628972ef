//! Every problem of one configuration. ADD stops at the first; here, after
//! each problem the key or the `forwards`/`reverse` entry it names is left
//! out and the rest is checked again, until nothing more is wrong (or what
//! is wrong cannot be left out: `name`, `type`, a required key).

use crate::config::{keys, Config, Mode};
use crate::driver::{check_mtu, require_uplink};
use crate::error::PluginError;
use crate::node::NodePolicy;
use edgelink_cni_spec::{Env, NetConf};
use edgelink_netlink::Handle;
use serde_json::Value;
use std::collections::BTreeSet;

/// Where the configuration is meant to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Where {
    /// This machine is the node: check against its policy and interfaces.
    ThisNode,
    /// Anywhere: no node checks; per-node ranges checked for each node.
    Offline,
}

/// At most this many rounds (one problem each) for one configuration.
const MAX_ROUNDS: usize = 256;

/// The problems of `conf`, unknown keys first, each a line a user reads.
pub fn problems(conf: &Value, place: Where) -> Vec<String> {
    let mut out: Vec<String> = keys::unknown_keys(conf)
        .iter()
        .map(ToString::to_string)
        .collect();
    let nodes = match place {
        Where::ThisNode => vec![None],
        Where::Offline => range_nodes(conf),
    };
    let per_node: Vec<(Option<String>, Vec<String>)> = nodes
        .into_iter()
        .map(|n| {
            let mut c = conf.clone();
            if let (Some(n), Some(Value::Object(io))) = (&n, c.get_mut("ipam")) {
                io.insert("nodeName".into(), Value::String(n.clone()));
            }
            let found = config_problems(c, place);
            (n, found)
        })
        .collect();
    // What every node has is said once; the rest names its node.
    let everywhere: BTreeSet<&String> = per_node
        .first()
        .map(|(_, f)| {
            f.iter()
                .filter(|p| per_node.iter().all(|(_, g)| g.contains(p)))
                .collect()
        })
        .unwrap_or_default();
    let mut said = BTreeSet::new();
    for (node, found) in &per_node {
        for p in found {
            let line = match node {
                Some(n) if !everywhere.contains(p) => format!("{p} (on node {n:?})"),
                _ => p.clone(),
            };
            if said.insert(line.clone()) {
                out.push(line);
            }
        }
    }
    out
}

/// The nodes `ipam.ranges[][].node` names, unless `ipam.nodeName` says
/// which node it is; `[None]` when ranges apply to every node.
fn range_nodes(conf: &Value) -> Vec<Option<String>> {
    if conf.pointer("/ipam/nodeName").is_some() {
        return vec![None];
    }
    let nodes: BTreeSet<String> = conf
        .pointer("/ipam/ranges")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_array)
        .flatten()
        .filter_map(|r| r.get("node").and_then(Value::as_str))
        .map(str::to_string)
        .collect();
    if nodes.is_empty() {
        vec![None]
    } else {
        nodes.into_iter().map(Some).collect()
    }
}

fn validation_env() -> Env {
    Env::from_lookup(|k| {
        match k {
            "CNI_COMMAND" => Some("ADD"),
            "CNI_CONTAINERID" => Some("edgelink-validate"),
            "CNI_IFNAME" => Some("net1"),
            "CNI_NETNS" => Some("/proc/self/ns/net"),
            _ => None,
        }
        .map(str::to_string)
    })
    .expect("a fixed, valid environment")
}

fn message(e: PluginError) -> String {
    e.into_cni().msg
}

/// The entries of `forwards` and `reverse` still in the configuration, by
/// their index in the user's file.
struct Kept {
    forwards: Vec<usize>,
    reverse: Vec<usize>,
}

impl Kept {
    fn of(conf: &Value) -> Kept {
        let n = |k: &str| conf.get(k).and_then(Value::as_array).map_or(0, Vec::len);
        Kept {
            forwards: (0..n("forwards")).collect(),
            reverse: (0..n("reverse")).collect(),
        }
    }

    fn list(&mut self, name: &str) -> Option<&mut Vec<usize>> {
        match name {
            "forwards" => Some(&mut self.forwards),
            "reverse" => Some(&mut self.reverse),
            _ => None,
        }
    }

    /// `msg` with each `forwards[i]` and `reverse[i]` numbered as in the
    /// user's file.
    fn renumber(&mut self, msg: &str) -> String {
        let mut out = String::with_capacity(msg.len());
        let mut rest = msg;
        while let Some((at, list)) = ["forwards[", "reverse["]
            .iter()
            .filter_map(|l| rest.find(l).map(|at| (at, *l)))
            .min()
        {
            let after = at + list.len();
            out.push_str(&rest[..after]);
            rest = &rest[after..];
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            let kept = self.list(&list[..list.len() - 1]).map(|k| k.as_slice());
            match (rest[..digits].parse::<usize>().ok(), kept) {
                (Some(i), Some(k)) if i < k.len() => out.push_str(&k[i].to_string()),
                _ => out.push_str(&rest[..digits]),
            }
            rest = &rest[digits..];
        }
        out.push_str(rest);
        out
    }
}

/// The key path a problem starts with (`forwards[1].port`), if it does.
fn field(msg: &str) -> Option<&str> {
    let f = msg.split(": ").next()?;
    (!f.is_empty() && !f.contains(' ')).then_some(f)
}

/// Leave out what `field` names: an entry of `forwards`/`reverse`, else
/// its top-level key. False if there was nothing to leave out.
fn leave_out(conf: &mut Value, kept: &mut Kept, field: &str) -> bool {
    let top_end = field.find(['.', '[']).unwrap_or(field.len());
    let top = &field[..top_end];
    if matches!(top, "cniVersion" | "name" | "type") {
        return false;
    }
    if field[top_end..].starts_with('[') {
        let digits: String = field[top_end + 1..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        if let (Ok(i), Some(list)) = (digits.parse::<usize>(), kept.list(top)) {
            if let Some(Value::Array(a)) = conf.get_mut(top) {
                if i < a.len() && i < list.len() {
                    a.remove(i);
                    list.remove(i);
                    return true;
                }
            }
        }
    }
    conf.as_object_mut().and_then(|o| o.remove(top)).is_some()
}

fn config_problems(mut conf: Value, place: Where) -> Vec<String> {
    let env = validation_env();
    let mut kept = Kept::of(&conf);
    let mut out = Vec::new();
    for _ in 0..MAX_ROUNDS {
        let bytes = serde_json::to_vec(&conf).expect("a Value serializes");
        let parsed = NetConf::parse(&bytes)
            .map_err(PluginError::from)
            .and_then(|net| Config::parse(net, &env));
        match parsed {
            Ok(cfg) => {
                if place == Where::ThisNode {
                    out.extend(node_problems(&cfg));
                }
                return out;
            }
            Err(e) => {
                let msg = message(e);
                out.push(kept.renumber(&msg));
                let Some(f) = field(&msg) else { return out };
                if !leave_out(&mut conf, &mut kept, f) {
                    return out;
                }
            }
        }
    }
    out.push(format!("more than {MAX_ROUNDS} problems: stopped"));
    out
}

/// What ADD would find wrong on this node before touching it.
fn node_problems(cfg: &Config) -> Vec<String> {
    let here = |e: PluginError| format!("on this node: {}", message(e));
    let policy = match NodePolicy::load(&cfg.state_dir) {
        Ok(p) => p,
        Err(e) => return vec![here(e)],
    };
    let mut node = match Handle::new() {
        Ok(h) => h,
        Err(e) => return vec![format!("on this node: cannot open netlink: {e}")],
    };
    let mut out = Vec::new();
    let uplink = match &cfg.mode {
        Mode::Bridge(b) => b.uplink.as_deref(),
        Mode::Macvlan(m) => Some(m.uplink.as_str()),
    };
    if let Some(name) = uplink {
        match require_uplink(&mut node, name, &policy) {
            Ok(link) => {
                if let Err(e) = check_mtu(cfg.mtu, Some(&link)) {
                    out.push(here(e));
                }
            }
            Err(e) => out.push(here(e)),
        }
    }
    if let Mode::Bridge(b) = &cfg.mode {
        match node.link_by_name(&b.name) {
            Ok(Some(link)) => {
                if let Err(e) = policy.check_bridge(&link.name, link.alias.as_deref()) {
                    out.push(here(e));
                }
            }
            Ok(None) => {}
            Err(e) => out.push(format!(
                "on this node: cannot look up bridge {}: {e}",
                b.name
            )),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({
            "cniVersion": "1.0.0", "name": "plant", "type": "edgelink",
            "ipam": {"ranges": [[{"subnet": "172.17.16.0/24",
                                  "rangeStart": "172.17.16.200", "rangeEnd": "172.17.16.250"}]]},
            "forwards": [
                {"name": "api", "port": 8080, "target": "172.17.16.10:80"},
                {"name": "opc", "port": 4840, "target": "172.17.16.11:4840"}
            ]
        })
    }

    #[test]
    fn a_good_config_has_no_problem() {
        assert_eq!(problems(&base(), Where::Offline), Vec::<String>::new());
    }

    #[test]
    fn every_problem_is_listed_with_the_users_numbering() {
        let mut c = base();
        c["uplnk"] = json!("eth1");
        c["mtu"] = json!(10);
        c["forwards"] = json!([
            {"name": "api", "port": 8080, "target": "172.17.16.10:80"},
            {"name": "Bad_Name", "port": 1, "target": "172.17.16.10:1"},
            {"name": "opc", "port": 0, "target": "172.17.16.11:4840"},
            {"name": "far", "port": 9, "target": "10.9.9.9:9"},
            {"name": "dup", "port": 8080, "target": "172.17.16.10:81"}
        ]);
        let got = problems(&c, Where::Offline);
        assert_eq!(got.len(), 6, "{got:#?}");
        assert!(got[0].starts_with("uplnk: is not a key edgelink knows (did you mean \"uplink\"?)"));
        assert!(
            got[1].starts_with("mtu: 10 is not an integer in 68..=65535"),
            "{got:#?}"
        );
        assert!(
            got[2].starts_with("forwards[1].name: \"Bad_Name\" is not a valid port name"),
            "{got:#?}"
        );
        assert!(
            got[3].starts_with("forwards[2].port: 0 is not a port"),
            "{got:#?}"
        );
        assert!(
            got[4].starts_with("forwards[4].port: 8080 (tcp) is used by forwards[0] (\"api\") too"),
            "{got:#?}"
        );
        assert!(
            got[5].starts_with("forwards[3].target: \"10.9.9.9:9\""),
            "{got:#?}"
        );
    }

    #[test]
    fn what_cannot_be_left_out_ends_the_list() {
        let mut c = base();
        c["type"] = json!("bridge");
        assert_eq!(
            problems(&c, Where::Offline),
            ["type: \"bridge\" is not \"edgelink\""]
        );
    }

    #[test]
    fn offline_checks_each_node_the_ranges_name() {
        let mut c = base();
        c["ipam"] = json!({"ranges": [
            [{"subnet": "172.17.16.0/24", "rangeStart": "172.17.16.200", "rangeEnd": "172.17.16.220", "node": "edge-a"},
             {"subnet": "172.17.16.0/24", "rangeStart": "172.17.16.221", "rangeEnd": "172.17.16.250", "node": "edge-b"}]
        ]});
        c["forwards"] = json!([{"name": "api", "port": 8080, "target": "172.17.16.10:80"}]);
        assert_eq!(problems(&c, Where::Offline), Vec::<String>::new());
    }
}
