//! Reverse forwards to a DNS name: resolved with the pod's resolver, from
//! inside the pod, followed when the answer changes and looked up again
//! when its address stops answering.
//!
//! ```text
//!   device --segment-- pod net1 :1883        pod eth0 10.244.1.10
//!   cluster 10.244.1.20 (A), .21 (B), .22 (C) --routes-- resolver ns 10.244.2.53 (DNS)
//! ```
//!
//! The DNS server (edgelink-resolve's test server) runs in a namespace of
//! its own behind the cluster namespace, which routes for it.

use super::lab::*;
use super::reverse::*;
use edgelink_tests::dns::DnsServer;
use edgelink_tests::*;
use serde_json::{json, Value};
use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const NAME: &str = "mqtt.hil.svc.cluster.local";
const DNS_IP: &str = "10.244.2.53";

/// The resolver namespace, cabled to the cluster namespace, which
/// forwards between it and the pods; the pod routes to it over eth0.
struct Resolver {
    // Dropped first: the server's threads, then the namespace.
    server: DnsServer,
    _ns: Netns,
}

fn resolver_ns(l: &DLab) -> Resolver {
    let ns = Netns::new("res");
    l.client.ip(&[
        "link", "add", "resv", "type", "veth", "peer", "name", "eth0", "netns", &ns.name,
    ]);
    l.client
        .ip(&["addr", "add", "10.244.2.1/24", "dev", "resv"]);
    l.client.ip(&["link", "set", "resv", "up"]);
    ns.ip(&["addr", "add", &format!("{DNS_IP}/24"), "dev", "eth0"]);
    ns.ip(&["link", "set", "eth0", "up"]);
    ns.ip(&["route", "add", "default", "via", "10.244.2.1"]);
    let out = l.client.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    assert!(out.status.success(), "{out:?}");
    l.pod
        .ip(&["route", "add", "10.244.2.0/24", "via", CLIENT_IP]);
    let server = DnsServer::start_in(&ns.path(), format!("{DNS_IP}:53").parse().unwrap());
    Resolver { server, _ns: ns }
}

/// A process in the pod's netns with its own mount namespace, whose
/// /etc/resolv.conf is `text` (`ip netns exec` bind-mounts
/// /etc/netns/<name>/resolv.conf there): the pod's containers, as the
/// daemon finds them.
struct PodProcess {
    _child: ChildGuard,
    dir: std::path::PathBuf,
}

impl Drop for PodProcess {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn pod_process(pod: &Netns, text: &str) -> PodProcess {
    let dir = std::path::PathBuf::from("/etc/netns").join(&pod.name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("resolv.conf"), text).unwrap();
    let child = Command::new("ip")
        .args(["netns", "exec", &pod.name, "sleep", "300"])
        .stdin(Stdio::null())
        .spawn()
        .expect("ip netns exec sleep");
    let pid = child.id();
    let guard = ChildGuard::new(child);
    // Up once it has its own mount namespace (the bind mount is in it).
    let ok = wait_until(Duration::from_secs(5), || {
        std::fs::read_to_string(format!("/proc/{pid}/root/etc/resolv.conf"))
            .is_ok_and(|t| t == text)
    });
    assert!(ok, "the pod process did not get its resolv.conf");
    PodProcess { _child: guard, dir }
}

fn addr(ip: &str, port: u16) -> SocketAddr {
    format!("{ip}:{port}").parse().unwrap()
}

/// Connect from the device through net1:1883 until the banner is `want`
/// (bounded); returns the banners seen on the way.
fn until_banner(l: &DLab, want: &str, within: Duration) -> Vec<String> {
    let start = Instant::now();
    let mut seen = Vec::new();
    loop {
        let got = device_connect(l, DEVICE_V4, addr(&l.net1_ip(), MQTT))
            .and_then(|mut s| banner(&mut s))
            .unwrap_or_else(|e| format!("error: {e}"));
        if got == want {
            return seen;
        }
        seen.push(got);
        assert!(
            start.elapsed() < within,
            "no {want:?} within {within:?}; saw {seen:?}; status: {:#}",
            l.forward("mqtt")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// ADD, then service A at the client's address: the device reaches it
/// through the name (bounded); the cluster's record and the `resolved` of
/// the forward `mqtt` then.
fn add_and_reach_a(l: &mut DLab) -> (Arc<Cluster>, Value) {
    l.add();
    l.wait_serving();
    let cluster = Arc::new(Cluster::default());
    tcp_service(l, addr(CLIENT_IP, MQTT), "A", cluster.clone());
    until_banner(l, "A", Duration::from_secs(15));
    let r = l.forward("mqtt")["resolved"].clone();
    (cluster, r)
}

fn name_lab(target: &str, edit: impl FnOnce(&mut Value)) -> DLab {
    reverse_lab(
        json!([{"name": "mqtt", "protocol": "tcp", "port": MQTT, "target": target,
                "connectTimeoutMs": 1000, "connectRetries": 2}]),
        edit,
    )
}

#[test]
fn a_name_is_resolved_with_the_pods_resolv_conf_and_followed_when_it_changes() {
    let mut l = DLab::with(Opts {
        add: false,
        ..Default::default()
    });
    let res = resolver_ns(&l);
    res.server.set(NAME, &[CLIENT_IP.parse().unwrap()], 1);
    // The pod's own resolver: search list and ndots as Kubernetes writes
    // them; the target is the short name.
    let _proc = pod_process(
        &l.pod,
        &format!(
            "nameserver {DNS_IP}\nsearch hil.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n"
        ),
    );
    l.conf["reverse"] = json!([{"name": "mqtt", "protocol": "tcp", "port": MQTT, "target": format!("mqtt:{MQTT}"),
                "connectTimeoutMs": 1000, "connectRetries": 2}]);
    l.add();
    l.wait_serving();
    let cluster = Arc::new(Cluster::default());
    tcp_service(&l, addr(CLIENT_IP, MQTT), "A", cluster.clone());
    for ip in ["10.244.1.21", "10.244.1.22"] {
        l.client
            .ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
    }
    let b = tcp_service(&l, addr("10.244.1.21", MQTT), "B", cluster.clone());
    tcp_service(&l, addr("10.244.1.22", MQTT), "C", cluster.clone());

    // Resolved through the search list, from the pod's resolv.conf.
    until_banner(&l, "A", Duration::from_secs(15));
    let r = l.forward("mqtt")["resolved"].clone();
    assert_eq!(r["address"], format!("{CLIENT_IP}:{MQTT}"), "{r:#}");
    assert!(r["answeredAs"].as_str().unwrap().starts_with(NAME), "{r:#}");
    assert!(
        r["resolver"]
            .as_str()
            .unwrap()
            .contains("/etc/resolv.conf of pid"),
        "{r:#}"
    );
    assert_eq!(l.forward("mqtt")["target"], format!("mqtt:{MQTT}"));
    // The queries came from the pod, through its eth0 (the server only
    // ever saw them from there: it has no other route back).
    assert!(res.server.queries(NAME) >= 1);

    // The answer changes: once its TTL (1 s) is out, new connections go to
    // the new address.
    res.server.set(NAME, &["10.244.1.21".parse().unwrap()], 300);
    until_banner(&l, "B", Duration::from_secs(15));
    let queries = res.server.queries(NAME);

    // A long TTL, and the address stops answering: the connect fails, the
    // name is looked up again at once, and the retry reaches the new one.
    res.server.set(NAME, &["10.244.1.22".parse().unwrap()], 300);
    b.abort();
    let seen = until_banner(&l, "C", Duration::from_secs(15));
    assert!(seen.len() <= 3, "{seen:?}");
    assert!(res.server.queries(NAME) > queries);
    let s = l.forward("mqtt");
    assert_eq!(
        s["resolved"]["address"],
        format!("10.244.1.22:{MQTT}"),
        "{s:#}"
    );
}

/// The shipped DaemonSet has no hostPID (the pods' processes are out of
/// sight) and Multus passes no `dns` to its delegates: the daemon's own
/// resolv.conf, a kubelet's cluster file, is used with the search list of
/// the pod's namespace (hil, from K8S_POD_NAMESPACE), as a ClusterFirst pod
/// of that namespace has it. Found in the 1.36 kube lab (issue 23).
#[test]
fn without_the_pods_file_or_dns_the_daemons_cluster_resolver_serves_the_pods_namespace() {
    let own = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        own.path(),
        format!(
            "search edgelink-system.svc.cluster.local svc.cluster.local cluster.local\nnameserver {DNS_IP}\noptions ndots:5\n"
        ),
    )
    .unwrap();
    let flag = format!("--cluster-resolv-conf={}", own.path().display());
    let mut l = DLab::with(Opts {
        add: false,
        flags: &[&flag],
        ..Default::default()
    });
    let res = resolver_ns(&l);
    res.server.set(NAME, &[CLIENT_IP.parse().unwrap()], 1);
    // The short name: only the pod's namespace's search list finds it.
    l.conf["reverse"] = json!([{"name": "mqtt", "protocol": "tcp", "port": MQTT, "target": format!("mqtt:{MQTT}"),
                "connectTimeoutMs": 1000}]);
    let (_, r) = add_and_reach_a(&mut l);
    assert_eq!(
        r["resolver"], "the cluster DNS, as a ClusterFirst pod of namespace hil has it",
        "{r:#}"
    );
    assert!(r["answeredAs"].as_str().unwrap().starts_with(NAME), "{r:#}");
    // from the pod, through its eth0 (the server has no other way back)
    assert!(res.server.queries(NAME) >= 1);
}

#[test]
fn the_runtimes_dns_is_used_when_the_pod_has_no_resolv_conf_and_loops_are_refused() {
    let mut l = DLab::with(Opts {
        add: false,
        ..Default::default()
    });
    let res = resolver_ns(&l);
    res.server.set(NAME, &[CLIENT_IP.parse().unwrap()], 1);
    // No process in the pod: the `dns` the runtime passed
    // (runtimeConfig.dns, with the capability) is the resolver.
    l.conf["capabilities"] = json!({"dns": true});
    l.conf["runtimeConfig"] =
        json!({"dns": {"nameservers": [DNS_IP], "search": ["svc.cluster.local"]}});
    l.conf["reverse"] = json!([{"name": "mqtt", "protocol": "tcp", "port": MQTT, "target": format!("{NAME}:{MQTT}"),
                "connectTimeoutMs": 1000}]);
    let (cluster, r) = add_and_reach_a(&mut l);
    assert_eq!(r["resolver"], "the runtime's dns", "{r:#}");

    // The name now leads into the segment: a loop, never used. Devices are
    // reset, the status says why.
    let device: IpAddr = DEVICE_V4.parse().unwrap();
    res.server.set(NAME, &[device], 1);
    let s = l.wait_status(Duration::from_secs(15), "the loop refused", |s| {
        forward_of(s, "mqtt")["resolved"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("a loop"))
    });
    assert!(
        forward_of(&s, "mqtt")["resolved"].get("address").is_none(),
        "{s:#}"
    );
    let before = cluster.tcp_peers.lock().unwrap().len();
    let r =
        device_connect(&l, DEVICE_V4, addr(&l.net1_ip(), MQTT)).and_then(|mut s| banner(&mut s));
    assert!(
        r.as_ref().is_err() || r.as_ref().is_ok_and(|b| b.is_empty()),
        "{r:?}"
    );
    assert_eq!(cluster.tcp_peers.lock().unwrap().len(), before);
    let s = l.wait_status(Duration::from_secs(10), "the failed connect counted", |s| {
        forward_of(s, "mqtt")["connectErrors"].as_u64() >= Some(1)
    });
    assert!(
        forward_of(&s, "mqtt")["lastError"]
            .as_str()
            .is_some_and(|e| e.contains(NAME)),
        "{s:#}"
    );
}

#[test]
fn without_any_resolver_the_status_says_so_and_devices_are_reset() {
    let l = name_lab(&format!("{NAME}:{MQTT}"), |_| {});
    let s = l.wait_status(
        Duration::from_secs(15),
        "the missing resolver reported",
        |s| {
            forward_of(s, "mqtt")["resolved"]["error"]
                .as_str()
                .is_some_and(|e| e.contains("no resolver"))
        },
    );
    let e = forward_of(&s, "mqtt")["resolved"]["error"].clone();
    assert!(
        e.as_str().unwrap().contains("the runtime gave no dns"),
        "{e}"
    );
    let r =
        device_connect(&l, DEVICE_V4, addr(&l.net1_ip(), MQTT)).and_then(|mut s| banner(&mut s));
    assert!(
        r.as_ref().is_err() || r.as_ref().is_ok_and(|b| b.is_empty()),
        "{r:?}"
    );
}
