//! Traffic through the DNAT: it reaches the device, comes back, and is
//! counted.

use crate::lab::*;
use crate::{full_plan, TABLE};
use edgelink_kernel_path::{counters, ensure, Error, KernelForward, Protocol};
use socket2::{Domain, Socket, Type};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

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

/// A client that connects again and again from one source port meets the
/// device on that port each time, and the device, which closed first and
/// holds the last connection's TIME_WAIT, takes each new SYN at once. With
/// a random masquerade port each connection met the device on another
/// port, and there the TIME_WAIT of some other connection, whose
/// timestamps are not this one's: the device dropped the SYN (PAWS) and
/// the client sent it again a second later (4× fewer connections/s,
/// round after round, in `make bench`'s sustained measure).
#[test]
fn a_client_reconnecting_from_one_port_meets_the_device_on_that_port() {
    let Some(nft) = nft_or_skip("a_client_reconnecting_from_one_port") else {
        return;
    };
    const CLOSING: u16 = 7010;
    const CLIENT_PORT: u16 = 40123;
    let lab = Lab::new();
    let mut plan = full_plan();
    plan.forwards.push(KernelForward {
        name: "closing".into(),
        protocol: Protocol::Tcp,
        port: 8090,
        target: addr(DEVICE, CLOSING),
    });
    ensure(&lab.pod.netns, &plan, &options(nft)).unwrap();

    // The device answers one request and closes first (as an HTTP server
    // with `Connection: close` does): it keeps the TIME_WAIT.
    let listener = lab
        .device
        .run(|| TcpListener::bind(addr(DEVICE, CLOSING)).expect("bind"));
    let server = std::thread::spawn(move || {
        let mut peers = Vec::new();
        for _ in 0..3 {
            let (mut conn, peer) = listener.accept().expect("accept");
            conn.set_read_timeout(Some(WAIT)).unwrap();
            let mut buf = [0u8; 64];
            let n = conn.read(&mut buf).expect("the request");
            conn.write_all(&buf[..n]).expect("the answer");
            peers.push(peer);
        }
        peers
    });
    for i in 0..3 {
        lab.client
            .run(|| -> io::Result<()> {
                let mut s = reconnect_from(addr(CLIENT, CLIENT_PORT), addr(POD, 8090))?;
                s.set_read_timeout(Some(WAIT))?;
                s.write_all(b"request")?;
                let mut back = Vec::new();
                s.read_to_end(&mut back)?; // to the device's FIN
                assert_eq!(back, b"request");
                Ok(())
            })
            .unwrap_or_else(|e| panic!("connection {i}: {e}"));
    }
    let peers = server.join().expect("the device's server");
    let net1 = addr(POD_NET1, CLIENT_PORT);
    assert_eq!(peers, [net1; 3], "the masquerade changed the source port");
    let netstat = lab.device.exec(&["cat", "/proc/net/netstat"]);
    assert_eq!(
        tcp_ext(&String::from_utf8_lossy(&netstat.stdout), "PAWSTimewait"),
        Some(0),
        "the device dropped a SYN into its TIME_WAIT"
    );
}

/// A TcpExt counter of /proc/net/netstat (a line of names, then one of
/// values).
fn tcp_ext(netstat: &str, name: &str) -> Option<u64> {
    let mut lines = netstat.lines().filter(|l| l.starts_with("TcpExt:"));
    let (names, values) = (lines.next()?, lines.next()?);
    let i = names.split_whitespace().position(|n| n == name)?;
    values.split_whitespace().nth(i)?.parse().ok()
}

/// A connection from `from` to `to`. The last one from `from` sent its FIN
/// second and waits in LAST_ACK for the device's ACK; until that comes,
/// connect(2) refuses the same four-tuple (EADDRNOTAVAIL): tried again,
/// for a second at most.
fn reconnect_from(from: SocketAddr, to: SocketAddr) -> io::Result<TcpStream> {
    let mut tries = 0;
    loop {
        let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
        s.set_reuse_address(true)?;
        let r = s
            .bind(&from.into())
            .and_then(|()| s.connect_timeout(&to.into(), WAIT));
        match r {
            Ok(()) => return Ok(s.into()),
            Err(e)
                if tries < 50
                    && matches!(
                        e.kind(),
                        io::ErrorKind::AddrNotAvailable | io::ErrorKind::AddrInUse
                    ) =>
            {
                tries += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e),
        }
    }
}
