//! The netlink calls against a real kernel, in namespaces this test creates.

use edgelink_netlink::{BridgePortState, Handle, LinkKind, MacvlanMode, NewLink, RouteSpec};
use edgelink_netns::Netns;
use std::os::fd::AsFd;
use std::process::Command;

struct TempNs(String);
impl TempNs {
    fn new(tag: &str) -> TempNs {
        let name = format!("elk-nl-{}-{tag}", std::process::id());
        assert!(Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap()
            .success());
        TempNs(name)
    }
    fn open(&self) -> Netns {
        Netns::open(format!("/var/run/netns/{}", self.0)).unwrap()
    }
}
impl Drop for TempNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

#[test]
fn bridge_veth_macvlan_addresses_and_routes() {
    let node_ns = TempNs::new("node");
    let pod_ns = TempNs::new("pod");
    let node = node_ns.open();
    let pod = pod_ns.open();
    let mut h = node.run(Handle::new).unwrap().unwrap();
    let mut p = pod.run(Handle::new).unwrap().unwrap();

    h.create_link(&NewLink::Bridge {
        name: "br-t",
        mtu: Some(1400),
        vlan_filtering: false,
    })
    .unwrap();
    let err = h
        .create_link(&NewLink::Bridge {
            name: "br-t",
            mtu: None,
            vlan_filtering: false,
        })
        .unwrap_err();
    assert!(err.is_exists(), "{err}");
    let br = h.require_link("br-t").unwrap();
    assert_eq!(br.kind, LinkKind::Bridge);
    assert_eq!(br.mtu, 1400);

    let mac = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];
    h.create_link(&NewLink::Veth {
        name: "vh-t",
        mtu: Some(1400),
        master: None,
        up: false,
        peer_name: "net1",
        peer_mac: Some(mac),
        peer_netns: Some(pod.as_fd()),
    })
    .unwrap();
    let vh = h.require_link("vh-t").unwrap();
    assert!(h.link_by_name("net1").unwrap().is_none());
    let net1 = p.require_link("net1").unwrap();
    assert_eq!(net1.mac, Some(mac));
    assert_eq!(net1.mtu, 1400);

    h.set_master(vh.index, br.index).unwrap();
    h.set_up(br.index).unwrap();
    p.set_up(net1.index).unwrap();
    h.set_up(vh.index).unwrap();
    h.set_hairpin(vh.index, true).unwrap();
    let vh = h.require_link("vh-t").unwrap();
    assert_eq!(vh.master, Some(br.index));
    assert_eq!(vh.hairpin, Some(true));
    assert!(vh.port_state.is_some(), "{vh:?}");
    let mut forwarding = false;
    for _ in 0..100 {
        if h.require_link("vh-t").unwrap().port_state == Some(BridgePortState::Forwarding) {
            forwarding = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(forwarding);

    let a4 = "10.99.0.5/24".parse().unwrap();
    let a6 = "fd99::5/64".parse().unwrap();
    p.ensure_addr(net1.index, &a4, true).unwrap();
    p.ensure_addr(net1.index, &a4, true).unwrap();
    p.ensure_addr(net1.index, &a6, true).unwrap();
    let addrs = p.addrs(Some(net1.index)).unwrap();
    assert!(addrs.iter().any(|a| a.network == a4));
    assert!(addrs.iter().any(|a| a.network == a6 && !a.tentative));
    let r = RouteSpec::new(
        "10.98.0.0/16".parse().unwrap(),
        Some("10.99.0.1".parse().unwrap()),
        Some(net1.index),
    );
    p.ensure_route(&r).unwrap();
    p.ensure_route(&r).unwrap();
    assert!(p
        .routes()
        .unwrap()
        .iter()
        .any(|x| x.dst == r.dst && x.gw == r.gw));
    p.del_route(&r).unwrap();
    p.del_route(&r).unwrap();
    assert!(!p.routes().unwrap().iter().any(|x| x.dst == r.dst));
    p.del_addr(net1.index, &a4).unwrap();
    p.del_addr(net1.index, &a4).unwrap();

    // macvlan: master is a veth end in the node netns, child created in the pod.
    h.create_link(&NewLink::Veth {
        name: "up-t",
        mtu: None,
        master: Some(br.index),
        up: true,
        peer_name: "up-peer",
        peer_mac: None,
        peer_netns: None,
    })
    .unwrap();
    let up = h.require_link("up-t").unwrap();
    assert_eq!(up.master, Some(br.index));
    assert!(up.up);
    assert!(!h.require_link("up-peer").unwrap().up);
    // A bridge port cannot be a macvlan master: release it first.
    h.set_master(up.index, 0).unwrap();
    h.create_link(&NewLink::Macvlan {
        name: "tmp-mv",
        parent: up.index,
        mode: MacvlanMode::Bridge,
        mtu: None,
        mac: None,
        netns: Some(pod.as_fd()),
    })
    .unwrap();
    let mv = p.require_link("tmp-mv").unwrap();
    assert_eq!(mv.kind, LinkKind::Macvlan);
    p.set_name(mv.index, "net2").unwrap();
    assert!(p.link_by_name("net2").unwrap().is_some());
    assert_eq!(p.require_link("net2").unwrap().alias, None);
    p.set_alias(mv.index, "edgelink: retired by DEL").unwrap();
    assert_eq!(
        p.link_by_index(mv.index).unwrap().unwrap().alias.as_deref(),
        Some("edgelink: retired by DEL")
    );

    assert!(p.del_link_by_name("net1").unwrap());
    assert!(!p.del_link_by_name("net1").unwrap());
    assert!(
        h.link_by_name("vh-t").unwrap().is_none(),
        "deleting one veth end removes both"
    );
    assert!(p.links().unwrap().iter().any(|l| l.name == "lo"));
}
