//! Third review (issue 20), items 2 and 5: the pod routes only while the
//! table is in, and only what arrives on the cluster interface is DNATed
//! (not what comes from a second segment the pod is attached to).

use crate::full_plan;
use crate::lab::*;
use edgelink_kernel_path::{ensure, Options};

/// A fake nft that fails every call.
fn failing_nft() -> (std::path::PathBuf, Options) {
    let dir = std::env::temp_dir().join(format!("elkk-review3-nft-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("nft");
    std::fs::write(&script, "#!/bin/sh\necho 'Error: no' >&2\nexit 1\n").unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&script)
        .status()
        .unwrap();
    let opts = Options {
        nft: script,
        ..Options::default()
    };
    (dir, opts)
}

#[test]
fn a_failed_install_leaves_the_pod_routing_nothing() {
    let Some(_) = nft_or_skip("a_failed_install_leaves_the_pod_routing_nothing") else {
        return;
    };
    let lab = Lab::new();
    let client_echo = Echo::start(&lab.client, &[CLIENT]);
    // As a pod on a node that forwards, which no ADD turned off.
    lab.pod.write("/proc/sys/net/ipv4/ip_forward", "1");
    let (dir, fake) = failing_nft();
    let e = ensure(&lab.pod.netns, &full_plan(), &fake).unwrap_err();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(e.to_string().contains("Error: no"), "{e}");
    assert!(
        tcp_exchange(&lab.device, addr(CLIENT, TCP_ECHO), b"route?").is_err(),
        "the device reached the client through the pod"
    );
    assert!(client_echo.peers().is_empty(), "{:?}", client_echo.peers());
    assert_eq!(lab.pod.read("/proc/sys/net/ipv4/ip_forward"), "0");
    assert_eq!(lab.pod.read("/proc/sys/net/ipv6/conf/all/forwarding"), "0");
}

#[test]
fn an_install_turns_on_the_private_interfaces_forwarding_that_add_turned_off() {
    let Some(nft) = nft_or_skip("an_install_turns_on_the_private_interfaces_forwarding") else {
        return;
    };
    let lab = Lab::new();
    // ip_forward already on (another attachment's table, or the node's),
    // net1's own off as ADD leaves it: writing ip_forward=1 again does not
    // change net1's.
    lab.pod.write("/proc/sys/net/ipv4/ip_forward", "1");
    lab.pod
        .write("/proc/sys/net/ipv4/conf/net1/forwarding", "0");
    ensure(&lab.pod.netns, &full_plan(), &options(nft)).unwrap();
    assert_eq!(lab.pod.read("/proc/sys/net/ipv4/conf/net1/forwarding"), "1");
    assert_eq!(
        tcp_exchange(&lab.client, addr(POD, 8080), b"through").unwrap(),
        b"through"
    );
}

#[test]
fn a_device_on_a_second_segment_is_not_dnated() {
    let Some(nft) = nft_or_skip("a_device_on_a_second_segment_is_not_dnated") else {
        return;
    };
    let lab = Lab::new();
    // Segment B: the pod's net2 (172.31.60.1) and a device on it.
    let other = Ns::new("devb");
    lab.pod.ip(&[
        "link",
        "add",
        "net2",
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        &other.name,
    ]);
    lab.pod
        .ip(&["addr", "add", "172.31.60.1/24", "dev", "net2"]);
    other.ip(&["addr", "add", "172.31.60.10/24", "dev", "eth0"]);
    lab.pod.ip(&["link", "set", "net2", "up"]);
    other.ip(&["link", "set", "eth0", "up"]);
    other.ip(&["route", "add", "default", "via", "172.31.60.1"]);
    let opts = options(nft);
    ensure(&lab.pod.netns, &full_plan(), &opts).unwrap();
    // The forward's port, from segment B, at net2's and eth0's addresses:
    // not DNATed to segment A's device (nothing listens in the pod).
    for to in [addr("172.31.60.1", 8080), addr(POD, 8080)] {
        let e = tcp_exchange(&other, to, b"across?").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{to}: {e}");
    }
    assert!(udp_exchange(&other, addr("172.31.60.1", 5353), b"across?", 2).is_err());
    assert!(lab.echo.peers().is_empty(), "{:?}", lab.echo.peers());
    // The cluster side is served.
    assert_eq!(
        tcp_exchange(&lab.client, addr(POD, 8080), b"cluster").unwrap(),
        b"cluster"
    );
    // Control: a plan that names no cluster interface DNATs all but net1,
    // segment B's device included.
    let mut old = full_plan();
    old.cluster_ifname = None;
    ensure(&lab.pod.netns, &old, &opts).unwrap();
    assert_eq!(
        tcp_exchange(&other, addr("172.31.60.1", 8080), b"across").unwrap(),
        b"across"
    );
}
