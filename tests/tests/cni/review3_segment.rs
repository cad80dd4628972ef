//! Third review (issue 20), items 2, 3, 4, 9: the segment never becomes a route (forwarding in the pod and on the node, the bridge's IPv6 link-local address).
//!
//! Each test sends real datagrams between namespaces it builds (a device
//! on the segment, a "cluster" routed through the pod or the node) with
//! every route a sender would need, asserts that nothing arrives, and then
//! shows that the same datagram does arrive once the guard under test is
//! taken away: the topology routes, and the guard is what stops it.

use edgelink_tests::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const POD_ETH0: &str = "10.244.1.10";
const CLUSTER_IP: &str = "10.244.1.20";

/// A veth from `a`'s `a_if` (`a_cidr`) to `b`'s `b_if` (`b_cidr`), both up.
fn cable(a: &Netns, a_if: &str, a_cidr: &str, b: &Netns, b_if: &str, b_cidr: &str) {
    a.ip(&[
        "link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", &b.name,
    ]);
    a.ip(&["addr", "add", a_cidr, "dev", a_if]);
    b.ip(&["addr", "add", b_cidr, "dev", b_if]);
    a.ip(&["link", "set", a_if, "up"]);
    b.ip(&["link", "set", b_if, "up"]);
}

/// Whether a UDP datagram sent from `from` to `dst` (`[addr]:port` or
/// `addr:port`; an IPv6 address may carry `%scope`) reaches a receiver
/// bound to the wildcard address of that port in `to`. Five datagrams,
/// and the receiver gives up 3 s after the first was sent.
fn arrives(from: &Netns, to: &Netns, host: &str, port: u16) -> bool {
    let v6 = host.contains(':');
    let family = if v6 { "AF_INET6" } else { "AF_INET" };
    let any = if v6 { "::" } else { "0.0.0.0" };
    // The receiver waits for the sender's datagrams or for the word
    // `stop`, sent on its own loopback once the sender is done (not for a
    // time: on a loaded machine a sender can take seconds to start). The
    // sender sends for 2 s: datagrams that wait for a neighbour's address
    // are delivered after an ARP retransmission (1 s), not lost.
    let recv = format!(
        "import socket\ns=socket.socket(socket.{family},socket.SOCK_DGRAM)\n\
         s.bind(('{any}',{port}))\ns.settimeout(60)\nprint('ready',flush=True)\n\
         try:\n d,a=s.recvfrom(100)\n print('none' if d==b'stop' else 'got',a,flush=True)\n\
         except socket.timeout:\n print('none',flush=True)\n"
    );
    let mut child = ChildGuard::new(
        Command::new("ip")
            .args(["netns", "exec", &to.name, "python3", "-c", &recv])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the receiver"),
    );
    let mut out = BufReader::new(child.child().stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("read the receiver");
    assert_eq!(
        line.trim(),
        "ready",
        "the receiver in {} did not start",
        to.name
    );
    let send = format!(
        "import socket,time\nfor i in range(20):\n s=socket.socket(socket.{family},socket.SOCK_DGRAM)\n \
         try:\n  s.sendto(b'x',('{host}',{port}))\n except OSError:\n  pass\n s.close()\n time.sleep(0.1)\n"
    );
    let sent = from.exec(&["python3", "-c", &send]);
    assert!(sent.status.success(), "{sent:?}");
    let lo = if v6 { "::1" } else { "127.0.0.1" };
    let stop = format!(
        "import socket,time\ntime.sleep(0.3)\ns=socket.socket(socket.{family},socket.SOCK_DGRAM)\ns.sendto(b'stop',('{lo}',{port}))\n"
    );
    let stopped = to.exec(&["python3", "-c", &stop]);
    assert!(stopped.status.success(), "{stopped:?}");
    line.clear();
    out.read_line(&mut line).expect("read the receiver");
    drop(child.wait_output(Duration::from_secs(5)));
    line.starts_with("got")
}

/// An ICMP echo from inside `ns` to the IPv4 `host` (a raw socket) is
/// answered within 2 s.
pub fn icmp_reachable(ns: &Netns, host: &str) -> bool {
    let script = format!(
        "import socket,struct,sys,time\n\
         def cs(b):\n t=sum(struct.unpack('!%dH'%(len(b)//2),b))\n t=(t>>16)+(t&0xffff)\n t+=t>>16\n return (~t)&0xffff\n\
         s=socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_ICMP)\ns.settimeout(2)\n\
         p=struct.pack('!BBHHH',8,0,0,0x4242,1)+b'edgelink'\n\
         p=struct.pack('!BBHHH',8,0,cs(p),0x4242,1)+b'edgelink'\n\
         s.sendto(p,('{host}',0))\nend=time.time()+2\n\
         while time.time()<end:\n try:\n  d,a=s.recvfrom(200)\n except socket.timeout:\n  break\n \
         if a[0]=='{host}' and d[20]==0:\n  sys.exit(0)\nsys.exit(1)\n"
    );
    ns.exec(&["python3", "-c", &script]).status.success()
}

/// A pod with a cluster side: its eth0 (10.244.1.10) cabled to a "cluster"
/// namespace (10.244.1.20) that routes the segment through the pod. The
/// pod forwards before ADD, as a new netns on a Kubernetes node does.
fn pod_with_cluster(lab: &Lab) -> (Netns, Netns) {
    let pod = lab.pod();
    let cluster = Netns::new("clu");
    cable(
        &pod,
        "eth0",
        &format!("{POD_ETH0}/24"),
        &cluster,
        "eth0",
        &format!("{CLUSTER_IP}/24"),
    );
    cluster.ip(&["route", "add", "172.31.250.0/24", "via", POD_ETH0]);
    pod.set_sysctl("net.ipv4.ip_forward", "1");
    pod.set_sysctl("net.ipv6.conf.all.forwarding", "1");
    (pod, cluster)
}

fn net1_ip(r: &Value) -> String {
    let a = r["ips"][0]["address"].as_str().expect("an address");
    a.split('/').next().unwrap().to_string()
}

/// ADD, then the device routes the cluster through the pod's net1.
fn add_routed(lab: &Lab, pod: &Netns, conf: &Value, cid: &str) -> Value {
    let r = Call::new("ADD", cid, Some(&pod.path()), "net1")
        .run(&lab.node, conf)
        .ok();
    lab.device
        .ip(&["route", "add", "10.244.1.0/24", "via", &net1_ip(&r)]);
    r
}

fn assert_pod_routes_nothing(lab: &Lab, pod: &Netns, cluster: &Netns) {
    assert!(
        !arrives(cluster, &lab.device, DEVICE_V4, 7001),
        "a cluster sender reached the device through the pod"
    );
    assert!(
        !arrives(&lab.device, cluster, CLUSTER_IP, 7002),
        "the device reached the cluster through the pod"
    );
    assert_eq!(pod.sysctl("net.ipv4.ip_forward"), "0");
    assert_eq!(pod.sysctl("net.ipv4.conf.eth0.forwarding"), "0");
    assert_eq!(pod.sysctl("net.ipv4.conf.net1.forwarding"), "0");
    assert_eq!(pod.sysctl("net.ipv6.conf.all.forwarding"), "0");
}

#[test]
fn on_the_relay_path_the_pod_forwards_nothing_either_way() {
    let lab = Lab::new();
    let (pod, cluster) = pod_with_cluster(&lab);
    add_routed(&lab, &pod, &lab.bridge_conf("1.0.0"), "fw-relay");
    assert_pod_routes_nothing(&lab, &pod, &cluster);
    // The topology routes: with forwarding on again, both get through.
    pod.set_sysctl("net.ipv4.ip_forward", "1");
    assert!(arrives(&cluster, &lab.device, DEVICE_V4, 7003));
    assert!(arrives(&lab.device, &cluster, CLUSTER_IP, 7004));
}

#[test]
fn on_the_relay_path_the_pod_forwards_no_ipv6_onto_the_segment() {
    let lab = Lab::new();
    let (pod, cluster) = pod_with_cluster(&lab);
    pod.ip(&["addr", "add", "fd00:244::10/64", "dev", "eth0", "nodad"]);
    cluster.ip(&["addr", "add", "fd00:244::20/64", "dev", "eth0", "nodad"]);
    cluster.ip(&["-6", "route", "add", "fd00:e1::/64", "via", "fd00:244::10"]);
    let mut conf = lab.bridge_conf("1.0.0");
    conf["ipam"]["ranges"] = json!([
        [{"subnet": "172.31.250.0/24", "rangeStart": "172.31.250.100",
          "rangeEnd": "172.31.250.150"}],
        [{"subnet": "fd00:e1::/64", "rangeStart": "fd00:e1::100",
          "rangeEnd": "fd00:e1::1ff"}]
    ]);
    Call::new("ADD", "fw-relay6", Some(&pod.path()), "net1")
        .run(&lab.node, &conf)
        .ok();
    assert!(
        !arrives(&cluster, &lab.device, DEVICE_V6, 7031),
        "a cluster sender reached the device through the pod over IPv6"
    );
    assert_eq!(pod.sysctl("net.ipv6.conf.all.forwarding"), "0");
    // The topology routes once IPv6 forwarding is on again (the pod's
    // addresses may still be tentative for a moment: bounded retries).
    pod.set_sysctl("net.ipv6.conf.all.forwarding", "1");
    let mut port = 7032;
    assert!(wait_until(Duration::from_secs(20), || {
        port += 1;
        arrives(&cluster, &lab.device, DEVICE_V6, port)
    }));
}

#[test]
fn with_a_kernel_forward_the_pod_routes_nothing_until_its_table_is_in() {
    // No edgelinkd here: the table never comes, the pod must not route.
    let lab = Lab::new();
    let (pod, cluster) = pod_with_cluster(&lab);
    let mut conf = lab.bridge_conf("1.0.0");
    conf["forwards"] = json!([
        {"name": "api", "protocol": "tcp", "port": 8080,
         "target": format!("{DEVICE_V4}:8080"), "path": "kernel"}
    ]);
    add_routed(&lab, &pod, &conf, "fw-kernel");
    assert_pod_routes_nothing(&lab, &pod, &cluster);
    pod.set_sysctl("net.ipv4.ip_forward", "1");
    assert!(arrives(&lab.device, &cluster, CLUSTER_IP, 7005));
}

/// The node's cluster side: `clu0` (10.244.9.1) cabled to a "cluster"
/// namespace (10.244.9.2) that routes the segment through the node.
fn node_with_cluster(lab: &Lab) -> Netns {
    let cluster = Netns::new("clu");
    cable(
        &lab.node,
        "clu0",
        "10.244.9.1/24",
        &cluster,
        "eth0",
        "10.244.9.2/24",
    );
    cluster.ip(&["route", "add", "172.31.250.0/24", "via", "10.244.9.1"]);
    lab.device
        .ip(&["route", "add", "10.244.9.0/24", "via", "172.31.250.1"]);
    cluster
}

fn guard_listing(lab: &Lab) -> Option<String> {
    let out = lab
        .node
        .exec(&["nft", "list", "table", "inet", "edgelink-gw-edge0"]);
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn is_gateway_routes_nothing_between_the_segment_and_the_cluster() {
    let lab = Lab::new();
    lab.node.set_sysctl("net.ipv4.ip_forward", "0");
    let cluster = node_with_cluster(&lab);
    let mut conf = lab.bridge_conf("1.0.0");
    conf["isGateway"] = json!(true);
    let pod = lab.pod();
    Call::new("ADD", "gw-guard", Some(&pod.path()), "net1")
        .run(&lab.node, &conf)
        .ok();

    // Neither way through the node, and nothing new answered by the node
    // itself: not on the gateway address, not on its cluster address.
    assert!(
        !arrives(&lab.device, &cluster, "10.244.9.2", 7011),
        "the device reached the cluster through the node"
    );
    assert!(
        !arrives(&cluster, &lab.device, DEVICE_V4, 7012),
        "the cluster reached the device through the node"
    );
    assert!(!arrives(&lab.device, &lab.node, "172.31.250.1", 7013));
    assert!(!arrives(&lab.device, &lab.node, "10.244.9.1", 7014));
    assert_eq!(lab.node.sysctl("net.ipv4.ip_forward"), "1");
    let listing = guard_listing(&lab).expect("the bridge's guard table");
    assert!(
        listing.contains("iifname \"edge0\" oifname != \"edge0\" drop"),
        "{listing}"
    );
    // The gateway answers ICMP (the pod's next hop on the segment).
    assert!(icmp_reachable(&pod, "172.31.250.1"));
    // The segment itself works: the pod reaches the device.
    assert!(tcp_reachable(&pod, DEVICE_V4, 9));
    // A second ADD finds the guard in place and leaves one table.
    let pod2 = lab.pod();
    Call::new("ADD", "gw-guard-2", Some(&pod2.path()), "net1")
        .run(&lab.node, &conf)
        .ok();
    assert_eq!(guard_listing(&lab).as_deref(), Some(listing.as_str()));

    // Without the guard the node routes the segment into the cluster.
    let out = lab
        .node
        .exec(&["nft", "delete", "table", "inet", "edgelink-gw-edge0"]);
    assert!(out.status.success(), "{out:?}");
    // (This failed about one run in eight while the bridge's MAC followed
    // its lowest port: the device's ARP cache kept the old one.)
    assert!(arrives(&lab.device, &cluster, "10.244.9.2", 7015));
    assert!(arrives(&lab.device, &lab.node, "10.244.9.1", 7016));
}

#[test]
fn is_gateway_without_nft_fails_and_leaves_nothing_behind() {
    let lab = Lab::new();
    let mut conf = lab.bridge_conf("1.0.0");
    conf["isGateway"] = json!(true);
    let pod = lab.pod();
    let path = pod.path();
    let mut call = Call::new("ADD", "gw-nonft", Some(&path), "net1");
    // `ip` (which runs the plugin in the node netns) is there, nft is not.
    call.extra_env.push(("PATH", "/usr/bin"));
    let (code, msg) = call.run(&lab.node, &conf).err();
    assert_eq!(code, 100, "{msg}");
    assert!(msg.contains("isGateway") && msg.contains("nft"), "{msg}");
    assert!(
        lab.node_extra_links(&[]).is_empty(),
        "{:?}",
        lab.node_extra_links(&[])
    );
    assert!(lab.records().is_empty());
    assert!(lab.reserved("plant-floor").is_empty());
    assert!(!pod.has_link("net1"));
    assert_eq!(guard_listing(&lab), None);
}

#[test]
fn a_bridge_the_plugin_creates_has_no_ipv6_address_for_devices_to_reach_the_node() {
    let lab = Lab::new();
    let mut conf = lab.bridge_conf("1.0.0");
    conf["ipam"]["ranges"] = json!([
        [{"subnet": "172.31.250.0/24", "rangeStart": "172.31.250.100",
          "rangeEnd": "172.31.250.150"}],
        [{"subnet": "fd00:e1::/64", "rangeStart": "fd00:e1::100",
          "rangeEnd": "fd00:e1::1ff"}]
    ]);
    let pod = lab.pod();
    Call::new("ADD", "ll", Some(&pod.path()), "net1")
        .run(&lab.node, &conf)
        .ok();
    let v6 = lab.node.ip(&["-6", "-o", "addr", "show", "dev", "edge0"]);
    assert!(v6.trim().is_empty(), "edge0 has IPv6 addresses: {v6}");
    assert_eq!(lab.node.sysctl("net.ipv6.conf.edge0.disable_ipv6"), "1");
    // A device's datagram to every IPv6 node on the link (ff02::1) finds
    // no node service bound to [::].
    assert!(
        !arrives(&lab.device, &lab.node, "ff02::1%dev0", 7021),
        "a node service on [::] answered the segment"
    );
    // Switching IPv6 on the bridge goes on: the pod reaches the device.
    assert!(tcp_reachable(&pod, DEVICE_V6, 9));
    // The topology carries it when the bridge has IPv6.
    lab.node.set_sysctl("net.ipv6.conf.edge0.disable_ipv6", "0");
    assert!(wait_until(Duration::from_secs(5), || {
        !lab.node
            .ip(&["-6", "-o", "addr", "show", "dev", "edge0", "scope", "link"])
            .trim()
            .is_empty()
    }));
    assert!(arrives(&lab.device, &lab.node, "ff02::1%dev0", 7022));
}

#[test]
fn a_bridge_the_plugin_creates_keeps_the_uplinks_mac_whatever_port_joins() {
    let lab = Lab::new();
    let conf = lab.bridge_conf("1.0.0");
    let mac = |name: &str| {
        let out = lab
            .node
            .exec(&["cat", &format!("/sys/class/net/{name}/address")])
            .stdout;
        String::from_utf8_lossy(&out).trim().to_string()
    };
    let uplink = mac("uplink0");
    let pod = lab.pod();
    Call::new("ADD", "mac-1", Some(&pod.path()), "net1")
        .run(&lab.node, &conf)
        .ok();
    assert_eq!(mac("edge0"), uplink, "the bridge took another MAC");
    // A port with a lower MAC than every other (a pod's veth may have
    // one) changed an unpinned bridge's MAC under the devices' ARP caches:
    // the flaky is_gateway check of CI, 2026-11-26.
    lab.node.ip(&[
        "link",
        "add",
        "low0",
        "address",
        "02:00:00:00:00:01",
        "type",
        "veth",
        "peer",
        "low1",
    ]);
    lab.node
        .ip(&["link", "set", "low0", "master", "edge0", "up"]);
    assert_eq!(
        mac("edge0"),
        uplink,
        "a joining port moved the bridge's MAC"
    );
    let pod2 = lab.pod();
    Call::new("ADD", "mac-2", Some(&pod2.path()), "net1")
        .run(&lab.node, &conf)
        .ok();
    assert_eq!(mac("edge0"), uplink);
}
