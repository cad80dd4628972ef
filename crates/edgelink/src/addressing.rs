//! IP address management for one attachment: the built-in store
//! (`edgelink-ipam`) or a delegated IPAM plugin, behind one interface.

use crate::config::{Config, Ipam};
use crate::delegate;
use crate::error::{Errors, PluginError};
use crate::node::NodePolicy;
use edgelink_cni_spec::{codes, CniError, CniResult, Command, Dns, Env, IpConfig, Route};
use edgelink_ipam::{Owner, Ownership, Store};
use serde_json::Value;
use std::collections::HashSet;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

/// How long to wait for the store's lock before answering "try again later".
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(20);

/// What IPAM gave the attachment.
#[derive(Debug, Default)]
pub struct Assigned {
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Option<Dns>,
}

pub fn owner(env: &Env) -> Owner {
    Owner {
        container_id: env.container_id.clone(),
        ifname: env.ifname.clone(),
        pod_namespace: env.args.pod_namespace().map(str::to_string),
        pod_name: env.args.pod_name().map(str::to_string),
        pod_uid: env.args.pod_uid().map(str::to_string),
    }
}

/// Reserve addresses. `probe(ip)` returns true when a device answers for ip.
/// With the built-in IPAM, a pod's namespace (CNI_ARGS K8S_POD_NAMESPACE)
/// must own the network's store, unless the node policy shares the network
/// (`edgelink_ipam::store` module `owner`); the first namespace to take an
/// address from a store owns it. Callers without a namespace (a runtime
/// outside Kubernetes, root's) are not asked.
pub fn add(
    cfg: &Config,
    env: &Env,
    policy: &NodePolicy,
    probe: &mut dyn FnMut(IpAddr) -> bool,
) -> Result<Assigned, PluginError> {
    match &cfg.ipam {
        Ipam::None => Ok(Assigned::default()),
        Ipam::Builtin(ic) => {
            let store = Store::open(&cfg.state_dir, &cfg.net.name)?;
            let mut lock = store.lock(LOCK_TIMEOUT)?;
            let namespace = env
                .args
                .pod_namespace()
                .filter(|ns| !ns.is_empty() && !policy.shares(&cfg.net.name));
            let claim = match namespace {
                Some(ns) => lock.check_owner(ns)? == Ownership::Claimable,
                None => false,
            };
            let allocs = lock.allocate(ic, &owner(env), &cfg.requested_ips, probe)?;
            if let (true, Some(ns)) = (claim, namespace) {
                if let Err(e) = lock.record_owner(ns) {
                    tracing::warn!(error = %e, "could not record the store's namespace");
                }
            }
            drop(lock);
            let ips: Vec<IpConfig> = allocs
                .iter()
                .map(|a| IpConfig {
                    address: a.address,
                    gateway: a.gateway,
                    interface: None,
                })
                .collect();
            let routes = ic
                .routes
                .iter()
                .map(|r| Route {
                    dst: r.dst,
                    gw: r.gw.or_else(|| {
                        ips.iter()
                            .find(|i| i.address.is_ipv4() == r.dst.is_ipv4())
                            .and_then(|i| i.gateway)
                    }),
                    mtu: None,
                    advmss: None,
                    priority: None,
                    table: None,
                    scope: None,
                })
                .collect();
            let dns = match &ic.dns {
                Some(v) => Some(serde_json::from_value::<Dns>(v.clone()).map_err(|e| {
                    PluginError::Cni(CniError::new(
                        codes::INVALID_CONFIG,
                        format!("ipam.dns: {v} is not a DNS object: {e}"),
                    ))
                })?),
                None => None,
            };
            Ok(Assigned {
                ips,
                routes,
                dns: dns.filter(|d| !d.is_empty()),
            })
        }
        Ipam::Delegated { plugin } => {
            let out =
                delegate::exec(plugin, env, Command::Add, &cfg.net.raw)?.ok_or_else(|| {
                    PluginError::Cni(CniError::new(
                        codes::DELEGATE_FAILED,
                        format!("ipam plugin {plugin} returned no result on ADD"),
                    ))
                })?;
            let r = CniResult::from_json(&out).map_err(|e| {
                PluginError::Cni(CniError::new(
                    codes::DELEGATE_FAILED,
                    format!("ipam plugin {plugin}: {e}"),
                ))
            })?;
            let ips: Vec<IpConfig> = r
                .ips
                .into_iter()
                .map(|mut i| {
                    i.interface = None;
                    i
                })
                .collect();
            // A route without gw goes via the gateway of the address of its
            // family, as with the built-in IPAM and the reference plugins.
            let routes = r
                .routes
                .into_iter()
                .map(|mut rt| {
                    if rt.gw.is_none() {
                        rt.gw = ips
                            .iter()
                            .find(|i| i.address.is_ipv4() == rt.dst.is_ipv4())
                            .and_then(|i| i.gateway);
                    }
                    rt
                })
                .collect();
            Ok(Assigned {
                ips,
                routes,
                dns: r.dns,
            })
        }
    }
}

/// Release what (container ID, ifname) holds in the built-in store of
/// `network`, or of every network when the config did not say (stripped
/// config). Absent is success.
pub fn release_builtin(
    state_dir: &Path,
    network: Option<&str>,
    env: &Env,
) -> Result<(), PluginError> {
    let root = state_dir.join("ipam");
    let networks: Vec<String> = match network {
        Some(n) => vec![n.to_string()],
        None => match std::fs::read_dir(&root) {
            Ok(rd) => rd
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => return Err(PluginError::Io { path: root, source }),
        },
    };
    let mut errs = Errors::default();
    for n in networks {
        if !root.join(&n).is_dir() {
            continue;
        }
        // Not a store the plugin made (Store::open refuses the name): with a
        // stripped config, one such directory must not fail every DEL.
        if network.is_none() && !edgelink_ipam::valid_network_name(&n) {
            tracing::warn!(dir = %root.join(&n).display(), "not a network's IPAM store (invalid network name): skipped");
            continue;
        }
        if let Some(store) = errs.note(Store::open(state_dir, &n)) {
            if let Some(mut lock) = errs.note(store.lock(LOCK_TIMEOUT)) {
                if let Some(released) = errs.note(lock.release(&env.container_id, &env.ifname)) {
                    if !released.is_empty() {
                        tracing::info!(network = %n, addresses = %edgelink_ipam::show_ips(&released), "released addresses");
                    }
                }
            }
        }
    }
    errs.into_result()
}

/// Release through the delegated plugin (ADD rollback and DEL).
pub fn release_delegated(plugin: &str, env: &Env, config: &Value) -> Result<(), PluginError> {
    delegate::exec(plugin, env, Command::Del, config).map(|_| ())
}

/// CHECK: the reservation still exists and matches the addresses.
pub fn check(cfg: &Config, env: &Env, ips: &[IpAddr]) -> Result<(), PluginError> {
    match &cfg.ipam {
        Ipam::None => Ok(()),
        Ipam::Builtin(_) => {
            let store = Store::open(&cfg.state_dir, &cfg.net.name)?;
            let held: HashSet<IpAddr> = store
                .reserved_by(&env.container_id, &env.ifname)?
                .into_iter()
                .collect();
            for ip in ips {
                if !held.contains(ip) {
                    return Err(PluginError::Cni(CniError::new(
                        codes::CHECK_FAILED,
                        format!(
                            "address {ip} is not reserved for container {} ifname {} in the IPAM store of network {}",
                            env.container_id, env.ifname, cfg.net.name
                        ),
                    )));
                }
            }
            if held.is_empty() {
                return Err(PluginError::Cni(CniError::new(
                    codes::CHECK_FAILED,
                    format!(
                        "no address is reserved for container {} ifname {}",
                        env.container_id, env.ifname
                    ),
                )));
            }
            Ok(())
        }
        Ipam::Delegated { plugin } => {
            delegate::exec(plugin, env, Command::Check, &cfg.net.raw).map(|_| ())
        }
    }
}
