//! ADD: validate, make the interface, reserve addresses, configure the pod,
//! record the attachment; on any failure undo everything done so far.

use crate::addressing::{self, Assigned};
use crate::config::{Config, Ipam, Mode};
use crate::driver::{self, bridge, macvlan};
use crate::error::{NetlinkContext, PluginError};
use crate::node::NodePolicy;
use crate::{lock, names};
use edgelink_attachment::{nudge_daemon, Record, RecordInterface, RecordStore, RECORD_VERSION};
use edgelink_cni_spec::{CniResult, Env, Interface};
use edgelink_netlink::{Handle, Link, RouteSpec};
use edgelink_netns::Netns;
use ipnetwork::IpNetwork;
use serde_json::Value;
use std::net::IpAddr;

/// What has been done so far, for rollback.
#[derive(Default)]
struct Done {
    pod_link: bool,
    /// The macvlan, from the moment it exists (under its temporary name).
    macvlan: macvlan::Created,
    host_veth: Option<String>,
    bridge_undo: Option<bridge::Undo>,
    /// This ADD created the isGateway guard of its bridge.
    guard: bool,
    ipam: bool,
    record: bool,
}

/// Stall at a named point when EDGELINK_DEBUG_STALL names it: lets the
/// crash tests kill the plugin half-way through an ADD.
fn debug_stall(point: &str) {
    if std::env::var("EDGELINK_DEBUG_STALL").is_ok_and(|p| p == point) {
        eprintln!("edgelink: stalled at {point}");
        std::thread::sleep(std::time::Duration::from_secs(60));
    }
}

pub fn run(cfg: &Config, env: &Env) -> Result<Value, PluginError> {
    let netns_path = env.netns.as_ref().expect("Env checks CNI_NETNS for ADD");
    tracing::debug!("ADD start");
    // What this node lets a config name (uplinks, bridges), read before
    // anything is touched.
    let policy = NodePolicy::load(&cfg.state_dir)?;
    let pod_ns = Netns::open(netns_path)?;
    let mut node = Handle::new().ctx(|| "open netlink in the node namespace".into())?;
    let mut pod = pod_ns
        .run(Handle::new)?
        .ctx(|| format!("open netlink in {}", netns_path.display()))?;
    // A retry after an ADD that was killed half-way: its veth pair is ours
    // to remove. An ADD that completed wrote a record: then CNI_IFNAME is
    // a live attachment and must fail below without being touched.
    let completed = RecordStore::new(&cfg.state_dir)
        .read(&env.container_id, &env.ifname)
        .map(|r| r.is_some())
        .unwrap_or(true);
    if let (Mode::Bridge(_), false) = (&cfg.mode, completed) {
        bridge::remove_own_leftover(&mut node, &mut pod, env)?;
    }
    driver::ensure_ifname_free(&mut pod, &env.ifname, &netns_path.display().to_string())?;

    let mut done = Done::default();
    match add(cfg, env, &policy, &pod_ns, &mut node, &mut pod, &mut done) {
        Ok(v) => Ok(v),
        Err(e) => {
            tracing::warn!(error = %e, "ADD failed, rolling back");
            rollback(cfg, env, &mut node, &mut pod, done);
            Err(e)
        }
    }
}

fn add(
    cfg: &Config,
    env: &Env,
    policy: &NodePolicy,
    pod_ns: &Netns,
    node: &mut Handle,
    pod: &mut Handle,
    done: &mut Done,
) -> Result<Value, PluginError> {
    // 1. The interface.
    let (pod_link, host_side): (Link, Vec<Link>) = match &cfg.mode {
        Mode::Bridge(b) => {
            let _guard = lock::lock(&cfg.state_dir, &format!("bridge-{}", b.name))?;
            let mut undo = bridge::Undo::default();
            let prepared = bridge::prepare(node, b, cfg.mtu, &mut undo, policy);
            done.bridge_undo = Some(undo);
            let (br, mtu) = prepared?;
            done.host_veth = Some(names::host_veth(&env.container_id, &env.ifname));
            let (host, podl) = bridge::attach(node, pod, pod_ns, env, b, &br, mtu, cfg.mac)?;
            done.pod_link = true;
            (podl, vec![br, host])
        }
        Mode::Macvlan(m) => {
            let uplink = macvlan::prepare(node, m, cfg.mtu, policy)?;
            let l = macvlan::attach(
                node,
                pod,
                pod_ns,
                env,
                m,
                &uplink,
                cfg.mtu,
                cfg.mac,
                &mut done.macvlan,
            )?;
            (l, Vec::new())
        }
    };
    tracing::debug!("interface ready");
    debug_stall("link");

    // 2. Addresses.
    let probe_cfg = match &cfg.ipam {
        Ipam::Builtin(ic) if ic.probe.enabled => Some(ic.probe.timeout),
        _ => None,
    };
    let mut probe = |ip: IpAddr| -> bool {
        let (Some(timeout), IpAddr::V4(v4)) = (probe_cfg, ip) else {
            return false;
        };
        let answered = pod_ns
            .run(|| edgelink_ipam::arp::probe(&pod_link.name, v4, timeout))
            .ok()
            .and_then(|r| {
                r.map_err(|e| tracing::warn!(%ip, error = %e, "ARP probe failed"))
                    .ok()
            })
            .unwrap_or(false);
        if answered {
            tracing::warn!(%ip, "address answered an ARP probe: a device uses it, skipping");
        }
        answered
    };
    done.ipam = !matches!(cfg.ipam, Ipam::None);
    let assigned: Assigned = addressing::add(cfg, env, policy, &mut probe)?;
    tracing::debug!(addresses = %assigned.ips.iter().map(|i| i.address.to_string()).collect::<Vec<_>>().join(", "),
        "addresses reserved");
    debug_stall("ipam");
    let own: Vec<IpNetwork> = assigned.ips.iter().map(|i| i.address).collect();
    if !matches!(cfg.ipam, Ipam::Builtin(_)) {
        cfg.check_targets(&own)?;
        cfg.check_reverse(&own)?;
        let gateways: Vec<IpAddr> = assigned
            .ips
            .iter()
            .filter_map(|i| i.gateway)
            .chain(assigned.routes.iter().filter_map(|r| r.gw))
            .collect();
        cfg.check_virtual(&own, &gateways)?;
    }

    // 3. Configure the pod side.
    for ip in &assigned.ips {
        pod.ensure_addr(pod_link.index, &ip.address, true)
            .ctx(|| format!("add {} to {}", ip.address, env.ifname))?;
    }
    for r in &assigned.routes {
        let spec = RouteSpec::new(r.dst, r.gw, Some(pod_link.index));
        pod.ensure_route(&spec)
            .ctx(|| format!("add route {} via {:?} in the pod", r.dst, r.gw))?;
    }
    // The pod must not route for the segment, in either direction: a device
    // that takes net1's address as its gateway would reach the cluster, a
    // cluster sender that routes the segment to the pod would reach any
    // device (a new netns copies the node's IPv4 forwarding, often on).
    // Forwarding is turned off in the whole pod, whatever path the forwards
    // take: the kernel path turns it on only once its table, which drops
    // every flow it did not DNAT, is in (edgelinkd).
    pod_ns.run(|| crate::sysctl::ensure_no_forwarding(&env.ifname))??;
    if let Mode::Bridge(b) = &cfg.mode {
        if b.is_gateway {
            let gws: Vec<IpNetwork> = assigned
                .ips
                .iter()
                .filter_map(|i| {
                    i.gateway
                        .and_then(|g| IpNetwork::new(g, i.address.prefix()).ok())
                })
                .collect();
            let _lock = lock::lock(&cfg.state_dir, &format!("bridge-{}", b.name))?;
            done.guard = bridge::ensure_gateways(node, &host_side[0], &gws)?;
        }
        bridge::wait_forwarding(node, &host_side[1])?;
    }

    tracing::debug!("pod configured");

    // 4. The record for the node daemon.
    let mut stored = cfg.net.raw.clone();
    if let Some(o) = stored.as_object_mut() {
        o.remove("prevResult");
    }
    let record = Record {
        pid_namespace: edgelink_attachment::own_pid_namespace(),
        netns_id: env
            .netns
            .as_ref()
            .and_then(|p| edgelink_netns::Netns::open(p).ok()?.id().ok())
            .map(|(dev, ino)| edgelink_attachment::NetnsId { dev, ino }),
        boot_id: edgelink_attachment::boot_id(),
        version: RECORD_VERSION,
        container_id: env.container_id.clone(),
        ifname: env.ifname.clone(),
        netns: env
            .netns
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        network: cfg.net.name.clone(),
        mode: cfg.mode.name().to_string(),
        pod_namespace: env.args.pod_namespace().map(str::to_string),
        pod_name: env.args.pod_name().map(str::to_string),
        pod_uid: env.args.pod_uid().map(str::to_string),
        interface: RecordInterface {
            name: env.ifname.clone(),
            mac: pod_link.mac_string().unwrap_or_default(),
            ips: own.clone(),
        },
        forwards: cfg.forwards.clone(),
        allowed_targets: cfg.allowed(&own),
        reverse: cfg.reverse_for(&own),
        dns: cfg.dns.clone(),
        health: cfg.health.clone(),
        virtual_addresses: cfg.virtual_addresses.clone(),
        created_at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        cni_config: Some(stored),
    };
    done.record = true;
    RecordStore::new(&cfg.state_dir).write(&record)?;
    nudge_daemon(&cfg.state_dir, &env.container_id, &env.ifname);
    tracing::debug!("record written");

    // 5. The Result: prevResult, amended.
    let mut result = cfg.net.prev_result.clone().unwrap_or_default();
    let mut mine = CniResult::default();
    for l in &host_side {
        mine.interfaces.push(Interface {
            name: l.name.clone(),
            mac: l.mac_string(),
            mtu: Some(l.mtu),
            ..Default::default()
        });
    }
    let pod_index = mine.interfaces.len();
    mine.interfaces.push(Interface {
        name: env.ifname.clone(),
        mac: pod_link.mac_string(),
        mtu: Some(pod_link.mtu),
        sandbox: Some(netns_display(env)),
        ..Default::default()
    });
    mine.ips = assigned
        .ips
        .into_iter()
        .map(|mut i| {
            i.interface = Some(pod_index);
            i
        })
        .collect();
    mine.routes = assigned.routes;
    mine.dns = assigned.dns.or_else(|| cfg.net.dns.clone());
    result.append(mine);
    Ok(result.to_json(cfg.net.cni_version))
}

fn netns_display(env: &Env) -> String {
    env.netns
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

fn rollback(cfg: &Config, env: &Env, node: &mut Handle, pod: &mut Handle, done: Done) {
    if done.record {
        let _ = RecordStore::new(&cfg.state_dir).remove(&env.container_id, &env.ifname);
    }
    if done.ipam {
        let r = match &cfg.ipam {
            Ipam::Builtin(_) => {
                addressing::release_builtin(&cfg.state_dir, Some(&cfg.net.name), env)
            }
            Ipam::Delegated { plugin } => addressing::release_delegated(plugin, env, &cfg.net.raw),
            Ipam::None => Ok(()),
        };
        if let Err(e) = r {
            tracing::error!(error = %e, "rollback: cannot release addresses");
        }
    }
    if done.pod_link {
        if let Err(e) = pod.del_link_by_name(&env.ifname) {
            tracing::error!(error = %e, "rollback: cannot delete {}", env.ifname);
        }
    }
    if let Err(e) = macvlan::undo(pod, &done.macvlan) {
        tracing::error!(error = %e, "rollback: cannot delete the macvlan");
    }
    if let Some(host) = &done.host_veth {
        let _ = node.del_link_by_name(host);
    }
    if let (Some(undo), Mode::Bridge(b)) = (done.bridge_undo, &cfg.mode) {
        let _guard = lock::lock(&cfg.state_dir, &format!("bridge-{}", b.name));
        for e in bridge::undo(node, b, undo) {
            tracing::error!(error = %e, "rollback: bridge");
        }
        if done.guard {
            bridge::remove_guard(node, &b.name);
        }
    }
}
