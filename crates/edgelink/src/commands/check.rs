//! CHECK: the attachment is still what ADD made (interface, MAC, addresses,
//! routes, bridge port, reservation, record).

use super::require_version;
use crate::addressing;
use crate::config::{Config, Ipam, Mode};
use crate::error::{NetlinkContext, PluginError};
use crate::names;
use edgelink_attachment::RecordStore;
use edgelink_cni_spec::{codes, CniError, CniVersion, Env};
use edgelink_netlink::{Handle, LinkKind};
use edgelink_netns::Netns;
use std::net::IpAddr;

fn failed(msg: String) -> PluginError {
    PluginError::Cni(CniError::new(codes::CHECK_FAILED, msg))
}

pub fn run(cfg: &Config, env: &Env) -> Result<(), PluginError> {
    require_version(cfg.net.cni_version, CniVersion::V0_4_0, "CHECK")?;
    if cfg.net.disable_check {
        return Ok(());
    }
    let prev = cfg.net.prev_result.as_ref().ok_or_else(|| {
        PluginError::Cni(CniError::new(
            codes::INVALID_CONFIG,
            "prevResult: CHECK needs the Result of ADD",
        ))
    })?;
    let path = env.netns.as_ref().expect("Env checks CNI_NETNS for CHECK");
    let ns = Netns::open(path)?;
    let mut pod = ns
        .run(Handle::new)?
        .ctx(|| format!("open netlink in {}", path.display()))?;
    let link = pod
        .link_by_name(&env.ifname)
        .ctx(|| format!("look up {}", env.ifname))?
        .ok_or_else(|| {
            failed(format!(
                "interface {} is missing from {}",
                env.ifname,
                path.display()
            ))
        })?;

    let idx = prev
        .interfaces
        .iter()
        .position(|i| i.name == env.ifname && i.sandbox.as_deref().is_some_and(|s| !s.is_empty()))
        .ok_or_else(|| {
            failed(format!(
                "prevResult has no sandbox interface named {}",
                env.ifname
            ))
        })?;
    let iface = &prev.interfaces[idx];
    if let (Some(want), Some(have)) = (&iface.mac, link.mac_string()) {
        if !want.eq_ignore_ascii_case(&have) {
            return Err(failed(format!(
                "{} has MAC {have}, ADD gave it {want}",
                env.ifname
            )));
        }
    }
    if let Some(want) = iface.mtu {
        if want != link.mtu {
            return Err(failed(format!(
                "{} has MTU {}, ADD gave it {want}",
                env.ifname, link.mtu
            )));
        }
    }
    match &cfg.mode {
        Mode::Macvlan(_) if link.kind != LinkKind::Macvlan => {
            return Err(failed(format!(
                "{} is a {:?}, not a macvlan",
                env.ifname, link.kind
            )))
        }
        Mode::Bridge(_) if link.kind != LinkKind::Veth => {
            return Err(failed(format!(
                "{} is a {:?}, not a veth",
                env.ifname, link.kind
            )))
        }
        _ => {}
    }

    let have = pod
        .addrs(Some(link.index))
        .ctx(|| format!("list addresses of {}", env.ifname))?;
    let mine: Vec<_> = prev
        .ips
        .iter()
        .filter(|i| i.interface == Some(idx))
        .collect();
    for ip in &mine {
        if !have.iter().any(|a| a.network == ip.address) {
            return Err(failed(format!(
                "address {} is missing from {}",
                ip.address, env.ifname
            )));
        }
    }
    let routes = pod.routes().ctx(|| "list routes in the pod".into())?;
    for r in &prev.routes {
        let ours = match r.gw {
            Some(gw) => mine.iter().any(|i| i.address.contains(gw)),
            None => false,
        };
        if ours && !routes.iter().any(|x| x.dst == r.dst && x.gw == r.gw) {
            return Err(failed(format!(
                "route {} via {:?} is missing in the pod",
                r.dst, r.gw
            )));
        }
    }

    if let Mode::Bridge(b) = &cfg.mode {
        let mut node = Handle::new().ctx(|| "open netlink in the node namespace".into())?;
        let host = names::host_veth(&env.container_id, &env.ifname);
        let br = node
            .link_by_name(&b.name)
            .ctx(|| format!("look up {}", b.name))?
            .ok_or_else(|| failed(format!("bridge {} is missing", b.name)))?;
        let h = node
            .link_by_name(&host)
            .ctx(|| format!("look up {host}"))?
            .ok_or_else(|| failed(format!("node-side veth {host} is missing")))?;
        if h.master != Some(br.index) {
            return Err(failed(format!(
                "node-side veth {host} is not a port of bridge {}",
                b.name
            )));
        }
        if let Some(u) = &b.uplink {
            let ul = node.link_by_name(u).ctx(|| format!("look up {u}"))?;
            if ul.as_ref().and_then(|l| l.master) != Some(br.index) {
                return Err(failed(format!(
                    "uplink {u} is not a port of bridge {}",
                    b.name
                )));
            }
        }
    }

    let ips: Vec<IpAddr> = mine.iter().map(|i| i.address.ip()).collect();
    if !matches!(cfg.ipam, Ipam::None) {
        addressing::check(cfg, env, &ips)?;
    }
    let Some(record) = RecordStore::new(&cfg.state_dir).read(&env.container_id, &env.ifname)?
    else {
        return Err(failed(format!(
            "the attachment record of container {} ifname {} is missing from {}",
            env.container_id,
            env.ifname,
            RecordStore::new(&cfg.state_dir).dir().display()
        )));
    };
    if !record.forwards.is_empty() || !record.reverse.is_empty() {
        check_daemon(cfg, env)?;
    }
    Ok(())
}

/// Forwards need the node daemon: it must be running and serve them all.
fn check_daemon(cfg: &Config, env: &Env) -> Result<(), PluginError> {
    let sock = cfg.state_dir.join(edgelink_attachment::DAEMON_SOCKET);
    match edgelink_attachment::query_daemon(
        &cfg.state_dir,
        &env.container_id,
        &env.ifname,
        std::time::Duration::from_secs(3),
    ) {
        Ok(None) => Err(failed(format!(
            "the node daemon edgelinkd is not running (nothing listens on {}): the forwards are not served",
            sock.display()
        ))),
        Ok(Some(r)) if !r.found => Err(failed(format!(
            "edgelinkd does not serve container {} ifname {}",
            env.container_id, env.ifname
        ))),
        Ok(Some(r)) if !r.live() => {
            let down: Vec<String> = r
                .forwards
                .iter()
                .filter(|f| !f.listening)
                .map(|f| format!("{} ({})", f.name, f.error.as_deref().unwrap_or("not listening")))
                .collect();
            Err(failed(format!("forwards not served by edgelinkd: {}", down.join(", "))))
        }
        Ok(Some(_)) => Ok(()),
        Err(e) => Err(failed(format!("cannot ask edgelinkd on {}: {e}", sock.display()))),
    }
}
