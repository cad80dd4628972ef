//! Following a reverse forward's target name: look it up with the pod's
//! resolver from inside the pod's netns, again when its TTL runs out, and
//! at once after a connect to its address failed. The address in use is
//! [`ReverseSide`]'s; this task only keeps it fresh.
//!
//! The resolver configuration is the pod's own /etc/resolv.conf (found
//! through a process in the pod's netns, read from its mount namespace),
//! else the `dns` the runtime (or the network config) gave, else the
//! cluster's as a `ClusterFirst` pod of its namespace has it (from the
//! daemon's own kubelet-written /etc/resolv.conf: without `hostPID` the
//! pod's processes are out of sight, and Multus passes no `dns` to its
//! delegates). It is looked for again after every failed lookup: at ADD
//! only the sandbox runs, and the containers that carry resolv.conf come
//! later.

use crate::factory::Factory;
use crate::reverse::ReverseSide;
use edgelink_attachment::Target;
use edgelink_relay::SocketSource;
use edgelink_resolve::{cluster_first_for, pod_resolv_conf, DnsSockets, ResolvConf, Resolver};
use futures_util::future::BoxFuture;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// After a failure, the next lookup waits this long, doubling up to
/// [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// An answer is used at least this long (a TTL of 0 must not turn into a
/// query loop).
const MIN_WAIT: Duration = Duration::from_secs(1);

/// The queries' sockets: made by the attachment's factory, inside the
/// pod's netns, so they leave through the pod's own interfaces.
struct PodSockets(Arc<Factory>);

impl DnsSockets for PodSockets {
    fn udp(&self, server: SocketAddr) -> BoxFuture<'static, io::Result<std::net::UdpSocket>> {
        self.0.udp_socket(server)
    }

    fn tcp(&self, server: SocketAddr) -> BoxFuture<'static, io::Result<socket2::Socket>> {
        self.0.tcp_socket(server)
    }
}

/// The pod's resolver configuration and where it came from.
fn pod_conf(r: &ReverseSide) -> Result<(ResolvConf, String), String> {
    let mut why = Vec::new();
    match pod_resolv_conf(Path::new(&r.netns)) {
        Ok(Some((pid, conf))) => {
            return Ok((conf, format!("/etc/resolv.conf of pid {pid} in the pod")))
        }
        Ok(None) => why.push("no process in the pod's netns has an /etc/resolv.conf".to_string()),
        Err(e) => why.push(format!("the pod's resolv.conf: {e}")),
    }
    match &r.dns {
        Some(d) => {
            let mut search = d.search.clone();
            if search.is_empty() {
                search.extend(d.domain.clone());
            }
            match ResolvConf::from_parts(&d.nameservers, &search, &d.options) {
                Ok(conf) => return Ok((conf, "the runtime's dns".into())),
                Err(e) => why.push(format!("the runtime's dns: {e}")),
            }
        }
        None => why.push("the runtime gave no dns".into()),
    }
    match &r.cluster_resolv_conf {
        Some(own) => match cluster_conf(r.pod_namespace.as_deref(), own) {
            Ok(found) => return Ok(found),
            Err(e) => why.push(e),
        },
        None => why.push("no --cluster-resolv-conf".into()),
    }
    Err(format!("no resolver: {}", why.join("; ")))
}

/// The cluster's resolver for a `ClusterFirst` pod of `namespace`, from
/// the daemon's own file at `own`.
fn cluster_conf(namespace: Option<&str>, own: &Path) -> Result<(ResolvConf, String), String> {
    let ns = namespace.ok_or("the pod's namespace is unknown")?;
    let text = std::fs::read_to_string(own)
        .map_err(|e| format!("the daemon's own {}: {e}", own.display()))?;
    let conf =
        ResolvConf::parse(&text).map_err(|e| format!("the daemon's own {}: {e}", own.display()))?;
    let conf = cluster_first_for(&conf, ns).ok_or_else(|| {
        format!(
            "the daemon's own {} is not the cluster's (no <ns>.svc.<domain> search list)",
            own.display()
        )
    })?;
    Ok((
        conf,
        format!("the cluster DNS, as a ClusterFirst pod of namespace {ns} has it"),
    ))
}

/// Keep `r`'s address fresh until `stop`.
pub async fn run(r: Arc<ReverseSide>, factory: Arc<Factory>, mut stop: watch::Receiver<bool>) {
    let Target::Name { host, port } = r.spec.target.clone() else {
        return;
    };
    let sockets: Arc<dyn DnsSockets> = Arc::new(PodSockets(factory));
    let mut resolver: Option<Resolver> = None;
    let mut backoff = FIRST_BACKOFF;
    loop {
        let mut failed = |why: String, lost: bool| {
            tracing::warn!(forward = %r.spec.name, %host, error = %why, "reverse target lookup failed");
            if lost {
                r.lost(why);
            } else {
                r.failed(why);
            }
            let wait = backoff;
            backoff = (backoff * 2).min(MAX_BACKOFF);
            wait
        };
        let wait = match resolver.as_ref() {
            None => match pod_conf(&r) {
                Ok((conf, from)) => {
                    tracing::info!(forward = %r.spec.name, %host, resolver = %from,
                        nameservers = %conf.nameservers.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "), "resolving the reverse target");
                    r.lock().resolver = Some(from);
                    resolver = Some(Resolver::new(conf, sockets.clone()));
                    continue;
                }
                Err(why) => failed(why, false),
            },
            Some(res) => {
                r.counted_lookup();
                match res.lookup(&host).await {
                    Ok(answer) => match take_answer(&r, &host, port, &answer) {
                        Ok(wait) => {
                            backoff = FIRST_BACKOFF;
                            wait
                        }
                        Err(why) => failed(why, true),
                    },
                    Err(e) => {
                        // The configuration may have changed (or appeared):
                        // read it again before the next lookup.
                        resolver = None;
                        failed(format!("lookup {host}: {e}"), false)
                    }
                }
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = r.again.notified() => {
                tracing::debug!(forward = %r.spec.name, %host, "connect failed: looking the target up again");
                if let Some(res) = &resolver {
                    res.forget(&host);
                }
            }
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Take a lookup's answer: its first address outside the segment becomes
/// the target until the answer's TTL runs out (the wait returned). A name
/// that leads back into the segment is a loop: those addresses are never
/// used, and the error says so.
fn take_answer(
    r: &ReverseSide,
    host: &str,
    port: u16,
    answer: &edgelink_resolve::Resolved,
) -> Result<Duration, String> {
    let Some(ip) = answer.addrs.iter().find(|ip| r.in_segment(**ip).is_none()) else {
        return Err(format!(
            "{host} resolves to {:?}, inside the interface's subnet: a loop, refused",
            answer.addrs
        ));
    };
    let addr = SocketAddr::new(*ip, port);
    let before = r.lock().addr;
    if before != Some(addr) {
        tracing::info!(forward = %r.spec.name, %host, %addr,
            previous = %before.map_or("none".to_string(), |a| a.to_string()), "reverse target resolved");
    }
    r.resolved(addr, answer.name.clone());
    Ok(answer
        .valid_until
        .saturating_duration_since(Instant::now())
        .max(MIN_WAIT))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    #[test]
    fn the_cluster_resolver_comes_from_the_daemons_own_file() {
        let f = own("search edgelink-system.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.0.0.10\noptions ndots:5\n");
        let (conf, from) = cluster_conf(Some("hil"), f.path()).expect("the cluster's");
        assert_eq!(conf.search[0], "hil.svc.cluster.local");
        assert_eq!(conf.nameservers, ["10.0.0.10:53".parse().unwrap()]);
        assert!(from.contains("namespace hil"), "{from}");
    }

    #[test]
    fn no_cluster_resolver_says_why() {
        let node = own("search plant.example\nnameserver 192.0.2.53\n");
        let e = cluster_conf(Some("hil"), node.path()).unwrap_err();
        assert!(e.contains("is not the cluster's"), "{e}");
        let e = cluster_conf(None, node.path()).unwrap_err();
        assert_eq!(e, "the pod's namespace is unknown");
        let e = cluster_conf(Some("hil"), Path::new("/nonexistent/resolv.conf")).unwrap_err();
        assert!(
            e.starts_with("the daemon's own /nonexistent/resolv.conf: "),
            "{e}"
        );
    }
}
