use super::*;

const MAC: [u8; 6] = [0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee];

#[test]
fn garp_request_and_reply_name_the_address_and_the_mac() {
    let ip = Ipv4Addr::new(172, 31, 250, 50);
    let [request, reply] = garp_frames(MAC, ip);
    #[rustfmt::skip]
    let want_request: [u8; ARP_LEN] = [
        0x00, 0x01,                         // hardware: Ethernet
        0x08, 0x00,                         // protocol: IPv4
        6, 4,                               // address lengths
        0x00, 0x01,                         // opcode: request
        0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, // sender MAC
        172, 31, 250, 50,                   // sender IP
        0, 0, 0, 0, 0, 0,                   // target MAC: unused in a request
        172, 31, 250, 50,                   // target IP = sender IP
    ];
    assert_eq!(request, want_request);
    let mut want_reply = want_request;
    want_reply[7] = 2;
    want_reply[18..24].copy_from_slice(&MAC);
    assert_eq!(reply, want_reply);
}

#[test]
fn unsolicited_na_is_an_override_advertisement_to_all_nodes() {
    let ip: Ipv6Addr = "fd99:250::50".parse().unwrap();
    let p = unsolicited_na(MAC, ip);
    #[rustfmt::skip]
    let want_header: [u8; 8] = [
        0x60, 0, 0, 0, // version 6, no traffic class or flow label
        0, 32,         // payload length
        58,            // next header: ICMPv6
        255,           // hop limit: receivers drop ND with less
    ];
    assert_eq!(p[..8], want_header);
    assert_eq!(p[8..24], ip.octets(), "source");
    assert_eq!(p[24..40], ALL_NODES.octets(), "destination ff02::1");
    assert_eq!(p[40], 136, "type: neighbour advertisement");
    assert_eq!(p[41], 0, "code");
    assert_eq!(
        p[44..48],
        [0x20, 0, 0, 0],
        "Override only, not Router or Solicited"
    );
    assert_eq!(p[48..64], ip.octets(), "target");
    assert_eq!(
        p[64..66],
        [2, 1],
        "option: target link-layer address, 8 bytes"
    );
    assert_eq!(p[66..72], MAC);
    // Computed independently (a Python one's complement sum over the same
    // pseudo-header and message).
    assert_eq!(p[42..44], [0xb9, 0xc6], "checksum");
}

/// A receiver's check: the sum over pseudo-header and message, checksum
/// included, is 0xffff.
fn resum(p: &[u8; NA_LEN]) -> u16 {
    let mut words = Vec::new();
    words.extend_from_slice(&p[8..40]); // source and destination
    words.extend_from_slice(&32u32.to_be_bytes());
    words.extend_from_slice(&[0, 0, 0, 58]);
    words.extend_from_slice(&p[40..]);
    let mut sum: u64 = words
        .chunks(2)
        .map(|w| u64::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

#[test]
fn na_checksum_verifies_for_many_addresses() {
    for (i, ip) in [
        "fd99:250::50",
        "2001:db8::1",
        "fe80::1",
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe",
        "::2",
    ]
    .iter()
    .enumerate()
    {
        let ip: Ipv6Addr = ip.parse().unwrap();
        let mac = [0x02, i as u8, 0xff, 0x00, 0xfe, 0x01];
        assert_eq!(resum(&unsolicited_na(mac, ip)), 0xffff, "{ip}");
    }
}

#[test]
fn announcing_a_non_unicast_address_is_refused_before_any_socket() {
    for ip in ["0.0.0.0", "224.0.0.1", "255.255.255.255", "::", "ff02::1"] {
        let err = announce(1, ip.parse().unwrap()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{ip}: {err}");
        assert!(err.to_string().contains("not a unicast address"), "{err}");
    }
}
