//! Unit tests of the batched syscalls: round trips with PKTINFO, GSO,
//! long datagrams and their spill pages.

use super::*;
use std::net::UdpSocket;
use std::os::fd::AsFd;

/// `recv_from` on a socket with SO_RCVTIMEO, again after an EINTR (a
/// stop and continue of the test process makes one, signal(7)).
pub(crate) fn recv_from(rx: &UdpSocket, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
    loop {
        match rx.recv_from(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

#[test]
fn batches_round_trip_with_pktinfo() {
    let rx = UdpSocket::bind("0.0.0.0:0").unwrap();
    nix::sys::socket::setsockopt(&rx, nix::sys::socket::sockopt::Ipv4PacketInfo, &true).unwrap();
    let port = rx.local_addr().unwrap().port();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let to: SockAddr = SocketAddr::from(([127, 0, 0, 3], port)).into();
    let payloads: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 100 + i as usize]).collect();
    let slices: Vec<IoSlice<'_>> = payloads.iter().map(|p| IoSlice::new(p)).collect();
    assert_eq!(
        send_batch(tx.as_fd(), &slices, Some(&to), None, false).unwrap(),
        5
    );

    let mut batch = RecvBatch::new(8);
    let mut got = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while got < 5 && std::time::Instant::now() < deadline {
        match recv_batch(rx.as_fd(), &mut batch, 8) {
            Ok(n) => {
                for i in 0..n {
                    assert_eq!(batch.datagram(i), &payloads[got][..]);
                    let m = batch.meta(i);
                    assert_eq!(m.peer, Some(tx.local_addr().unwrap()));
                    assert_eq!(m.local, Some(Local::V4(Ipv4Addr::new(127, 0, 0, 3))));
                    assert!(m.ifindex.is_some_and(|i| i > 0));
                    assert!(!m.truncated);
                    got += 1;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(std::time::Duration::from_millis(1))
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(got, 5);

    // Answer from the address it was sent to.
    let answer = [IoSlice::new(b"pong")];
    let back: SockAddr = tx.local_addr().unwrap().into();
    let from = batch.meta(0).local;
    assert_eq!(
        send_batch(rx.as_fd(), &answer, Some(&back), from, false).unwrap(),
        1
    );
    tx.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 16];
    let (n, src) = recv_from(&tx, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"pong");
    assert_eq!(src, SocketAddr::from(([127, 0, 0, 3], port)));
}

/// Datagrams from `tx` queued on `rx` (non-blocking), received in one
/// batch of `capacity`.
fn receive_batch(rx: &UdpSocket, batch: &mut RecvBatch, want: usize) -> usize {
    rx.set_nonblocking(true).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match recv_batch(rx.as_fd(), batch, want) {
            Ok(n) => return n,
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(1))
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn flags_truncated_datagrams_without_a_spill_mapping() {
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    tx.send_to(&[1u8; SLOT_SIZE + 1], rx.local_addr().unwrap())
        .unwrap();
    let mut batch = RecvBatch::new(2);
    batch.spill = None;
    assert_eq!(receive_batch(&rx, &mut batch, 2), 1);
    assert!(batch.meta(0).truncated);
}

/// Review item 16: datagrams over 2 KiB, several in one batch, come
/// out whole; short ones touch no spill page, and the pages long ones
/// took are given back.
#[test]
fn long_datagrams_are_received_whole_and_their_pages_given_back() {
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    nix::sys::socket::setsockopt(&rx, nix::sys::socket::sockopt::RcvBuf, &(4 << 20)).unwrap();
    let to = rx.local_addr().unwrap();
    let mut batch = RecvBatch::new(16);

    let short: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i; 1400]).collect();
    for d in &short {
        tx.send_to(d, to).unwrap();
    }
    assert_eq!(receive_batch(&rx, &mut batch, 16), 8);
    for (i, d) in short.iter().enumerate() {
        assert_eq!(batch.datagram(i), &d[..]);
    }
    let spill = batch.spill.as_ref().expect("a spill mapping");
    assert_eq!(
        spill.resident_pages(),
        0,
        "a short datagram touched a spill page"
    );

    let sizes = [SLOT_SIZE, SLOT_SIZE + 1, 100, 9000, 65507, 4096, 30000, 7];
    let long: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| (0..n).map(|j| (j * 31 + i * 7 + j / 251) as u8).collect())
        .collect();
    for d in &long {
        tx.send_to(d, to).unwrap();
    }
    let got = receive_batch(&rx, &mut batch, 16);
    assert_eq!(got, long.len(), "all in one batch");
    for (i, d) in long.iter().enumerate() {
        assert!(!batch.meta(i).truncated, "datagram {i}");
        assert_eq!(batch.datagram(i).len(), d.len(), "datagram {i}");
        assert!(batch.datagram(i) == &d[..], "datagram {i} differs");
    }
    let resident = batch.spill.as_ref().unwrap().resident_pages();
    assert!(resident > 0);
    batch.release();
    let after = batch.spill.as_ref().unwrap().resident_pages();
    eprintln!("spill pages resident: {resident} after the long datagrams, {after} after release");
    assert_eq!(after, 0);
}

/// Receive `n` datagrams from `rx` (blocking socket with a timeout).
fn receive(rx: &UdpSocket, n: usize) -> Vec<(Vec<u8>, SocketAddr)> {
    rx.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut buf = vec![0u8; 65536];
    (0..n)
        .map(|i| {
            let (len, from) =
                recv_from(rx, &mut buf).unwrap_or_else(|e| panic!("datagram {i} of {n}: {e}"));
            (buf[..len].to_vec(), from)
        })
        .collect()
}

/// Sizes that exercise the grouping: runs of one size, a shorter last
/// one, a longer one right after, empty datagrams, a run longer than
/// fits one 64 KiB message.
fn mixed_payloads() -> Vec<Vec<u8>> {
    let mut sizes = vec![1000; 5];
    sizes.extend([300, 1000, 1000, 1400, 0, 0, 7]);
    sizes.extend(vec![1400; 50]);
    sizes.push(10);
    (0..sizes.len())
        .map(|i| (0..sizes[i]).map(|j| (i * 7 + j) as u8).collect())
        .collect()
}

#[test]
fn gso_keeps_every_datagram_and_its_boundaries() {
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    tx.connect(rx.local_addr().unwrap()).unwrap();
    let payloads = mixed_payloads();
    let slices: Vec<IoSlice<'_>> = payloads.iter().map(|p| IoSlice::new(p)).collect();
    let mut sent = 0;
    while sent < slices.len() {
        sent += send_batch(tx.as_fd(), &slices[sent..], None, None, true).unwrap();
    }
    assert_eq!(sent, payloads.len());
    let got = receive(&rx, payloads.len());
    for (i, ((data, from), want)) in got.iter().zip(&payloads).enumerate() {
        assert_eq!(data, want, "datagram {i}");
        assert_eq!(*from, tx.local_addr().unwrap());
    }
}

#[test]
fn gso_with_pktinfo_answers_from_the_given_address() {
    let rx = UdpSocket::bind("0.0.0.0:0").unwrap();
    let port = rx.local_addr().unwrap().port();
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    let to: SockAddr = client.local_addr().unwrap().into();
    let payloads: Vec<Vec<u8>> = (0..20u8).map(|i| vec![i; 1200]).collect();
    let slices: Vec<IoSlice<'_>> = payloads.iter().map(|p| IoSlice::new(p)).collect();
    let from = Some(Local::V4(Ipv4Addr::new(127, 0, 0, 5)));
    assert_eq!(
        send_batch(rx.as_fd(), &slices, Some(&to), from, true).unwrap(),
        20
    );
    for (i, (data, src)) in receive(&client, 20).into_iter().enumerate() {
        assert_eq!(data, payloads[i]);
        assert_eq!(src, SocketAddr::from(([127, 0, 0, 5], port)));
    }
}

#[test]
fn a_refused_gso_send_is_recognised() {
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    tx.connect(rx.local_addr().unwrap()).unwrap();
    crate::sockopt::refuse_gso(&tx);
    let payloads: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i; 500]).collect();
    let slices: Vec<IoSlice<'_>> = payloads.iter().map(|p| IoSlice::new(p)).collect();
    let e = send_batch(tx.as_fd(), &slices, None, None, true).unwrap_err();
    assert!(gso_refused(&e), "{e}");
    // Without GSO the same datagrams go.
    assert_eq!(
        send_batch(tx.as_fd(), &slices, None, None, false).unwrap(),
        4
    );
    assert_eq!(receive(&rx, 4).len(), 4);
}

#[test]
fn a_datagram_queued_before_pktinfo_was_on_has_no_interface() {
    // The kernel then reports ifindex 0 and address 0.0.0.0: unknown,
    // not an interface.
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    tx.send_to(b"early", rx.local_addr().unwrap()).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    nix::sys::socket::setsockopt(&rx, nix::sys::socket::sockopt::Ipv4PacketInfo, &true).unwrap();
    tx.send_to(b"late", rx.local_addr().unwrap()).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let mut batch = RecvBatch::new(4);
    assert_eq!(recv_batch(rx.as_fd(), &mut batch, 4).unwrap(), 2);
    assert_eq!(batch.datagram(0), b"early");
    assert_eq!((batch.meta(0).ifindex, batch.meta(0).local), (None, None));
    assert_eq!(batch.datagram(1), b"late");
    assert!(batch.meta(1).ifindex.is_some_and(|i| i > 0));
}
