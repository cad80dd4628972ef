//! Traffic through the DNAT: it reaches the device, comes back, and is
//! counted.

use crate::lab::*;
use crate::{full_plan, TABLE};
use edgelink_kernel_path::{counters, ensure, Error};
use std::net::IpAddr;

#[test]
fn tcp_and_udp_reach_the_device_from_the_pods_net1_address() {
    let Some(nft) = nft_or_skip("tcp_and_udp_reach_the_device") else {
        return;
    };
    let lab = Lab::new();
    let opts = options(nft);
    ensure(&lab.pod.netns, &full_plan(), &opts).unwrap();

    for (to, what) in [(addr(POD, 8080), "tcp4"), (addr(POD6, 8086), "tcp6")] {
        let payload = format!("hello over {what}").into_bytes();
        let back = tcp_exchange(&lab.client, to, &payload)
            .unwrap_or_else(|e| panic!("{what} to {to}: {e}"));
        assert_eq!(back, payload, "{what}");
    }
    for (to, what) in [(addr(POD, 5353), "udp4"), (addr(POD6, 5356), "udp6")] {
        let payload = format!("hello over {what}").into_bytes();
        let back = udp_exchange(&lab.client, to, &payload, 3)
            .unwrap_or_else(|e| panic!("{what} to {to}: {e}"));
        assert_eq!(back, payload, "{what}");
    }

    // Masquerade: the device saw the pod's net1 addresses, never the client.
    let seen: Vec<IpAddr> = lab.echo.peers().iter().map(|p| p.ip()).collect();
    assert_eq!(seen.len(), 4, "{seen:?}");
    let net1: [IpAddr; 2] = [POD_NET1.parse().unwrap(), POD_NET1_6.parse().unwrap()];
    assert!(seen.iter().all(|ip| net1.contains(ip)), "{seen:?}");
    assert!(
        seen.contains(&net1[0]) && seen.contains(&net1[1]),
        "{seen:?}"
    );
}

#[test]
fn counters_count_flows_and_both_directions() {
    let Some(nft) = nft_or_skip("counters_count_flows_and_both_directions") else {
        return;
    };
    let lab = Lab::new();
    let opts = options(nft);
    ensure(&lab.pod.netns, &full_plan(), &opts).unwrap();

    let before = counters(&lab.pod.netns, TABLE, &opts).unwrap();
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        ["api", "api6", "dns", "dns6"]
    );
    assert!(
        before.values().all(|c| *c == Default::default()),
        "{before:?}"
    );

    const N: u64 = 5;
    let payload = vec![b'x'; 1000];
    for i in 0..N {
        let back = tcp_exchange(&lab.client, addr(POD, 8080), &payload)
            .unwrap_or_else(|e| panic!("connection {i}: {e}"));
        assert_eq!(back.len(), payload.len());
    }
    for i in 0..3 {
        // A new socket each time: three flows.
        udp_exchange(&lab.client, addr(POD, 5353), b"ping", 3)
            .unwrap_or_else(|e| panic!("datagram {i}: {e}"));
    }

    let c = counters(&lab.pod.netns, TABLE, &opts).unwrap();
    let api = c["api"];
    assert!(api.connections >= N, "{api:?}");
    // IP bytes: the payload plus headers, handshakes and FINs.
    assert!(api.bytes_to_target >= N * 1000, "{api:?}");
    assert!(api.bytes_to_client >= N * 1000, "{api:?}");
    // SYN, ACK, data, FIN at least one way; SYN-ACK, data, FIN the other.
    assert!(api.packets_to_target >= N * 3, "{api:?}");
    assert!(api.packets_to_client >= N * 3, "{api:?}");
    let dns = c["dns"];
    assert!(dns.connections >= 3, "{dns:?}");
    assert!(
        dns.packets_to_target >= 3 && dns.packets_to_client >= 3,
        "{dns:?}"
    );
    assert!(
        dns.bytes_to_target >= 3 * 32 && dns.bytes_to_client >= 3 * 32,
        "{dns:?}"
    );
    // Each forward counts its own flows only.
    assert_eq!(c["api6"], Default::default());
    assert_eq!(c["dns6"], Default::default());

    // Counters grow, never reset, while the table stays.
    tcp_exchange(&lab.client, addr(POD, 8080), &payload).unwrap();
    let again = counters(&lab.pod.netns, TABLE, &opts).unwrap();
    assert!(again["api"].connections > api.connections);
    assert!(again["api"].bytes_to_client > api.bytes_to_client);

    let missing = counters(&lab.pod.netns, "nothere", &opts).unwrap_err();
    assert!(matches!(missing, Error::NoTable { .. }), "{missing:?}");
    assert!(missing.to_string().contains("nothere"), "{missing}");
}
