//! Nothing from the private side is DNATed, and the pod routes nothing but
//! the forwards' own flows although forwarding is on.

use crate::lab::*;
use crate::{full_plan, TABLE};
use edgelink_kernel_path::{ensure, remove};

#[test]
fn the_private_side_cannot_use_the_path_nor_route_through_the_pod() {
    let Some(nft) = nft_or_skip("the_private_side_cannot_use_the_path") else {
        return;
    };
    let lab = Lab::new();
    let opts = options(nft);
    // Something on the cluster side for the device to aim at.
    let client_echo = Echo::start(&lab.client, &[CLIENT]);
    ensure(&lab.pod.netns, &full_plan(), &opts).unwrap();
    assert_eq!(lab.pod.read("/proc/sys/net/ipv4/ip_forward"), "1");

    // The forwards' ports seen from the device: not DNATed (the pod has no
    // listener there, so TCP is refused and UDP gets port-unreachable).
    for to in [addr(POD_NET1, 8080), addr(POD, 8080)] {
        let e = tcp_exchange(&lab.device, to, b"in?").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{to}: {e}");
    }
    assert!(tcp_exchange(&lab.device, addr(POD_NET1_6, 8086), b"in?").is_err());
    assert!(udp_exchange(&lab.device, addr(POD_NET1, 5353), b"in?", 2).is_err());
    assert!(lab.echo.peers().is_empty(), "{:?}", lab.echo.peers());

    // Routed through the pod from the device to the client, and from the
    // client straight to the device: dropped by the forward chain.
    assert!(tcp_exchange(&lab.device, addr(CLIENT, TCP_ECHO), b"route?").is_err());
    assert!(udp_exchange(&lab.device, addr(CLIENT, UDP_ECHO), b"route?", 2).is_err());
    assert!(tcp_exchange(&lab.client, addr(DEVICE, TCP_ECHO), b"route?").is_err());
    assert!(client_echo.peers().is_empty(), "{:?}", client_echo.peers());
    assert!(lab.echo.peers().is_empty(), "{:?}", lab.echo.peers());

    // Control: with the table gone and forwarding forced on, the same
    // routes work, so it was the table's chain that stopped them.
    assert!(remove(&lab.pod.netns, TABLE, &opts).unwrap());
    lab.pod.write("/proc/sys/net/ipv4/ip_forward", "1");
    assert_eq!(
        tcp_exchange(&lab.device, addr(CLIENT, TCP_ECHO), b"routed").unwrap(),
        b"routed"
    );
    assert_eq!(
        tcp_exchange(&lab.client, addr(DEVICE, TCP_ECHO), b"routed").unwrap(),
        b"routed"
    );
}
