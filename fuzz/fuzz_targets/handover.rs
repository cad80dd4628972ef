//! edgelinkd's hand-over frames (crates/handover): a frame body as either
//! daemon decodes it (`Message::decode`), and a whole byte stream read as
//! frames off a Unix socket (`Channel::recv`).
//!
//! Checks: a message that decodes encodes and decodes back equal; an
//! inventory whose state `State::check` accepts refers to each of its
//! descriptors exactly once (so no socket can be served twice, none is
//! left over), and a descriptor table built from it hands each out once;
//! a stream of arbitrary bytes read as frames ends in a message or an
//! error, never a panic, within the frame size limit.
#![no_main]

use edgelink_handover::{Channel, Fd, FdTable, Message};
use libfuzzer_sys::fuzz_target;
use std::io::Write;
use std::time::Duration;

fn message(data: &[u8]) {
    let Ok(m) = Message::decode(data) else {
        return;
    };
    let again = Message::decode(&m.encode()).expect("an encoded message decodes");
    assert_eq!(again, m);
    let Message::Inventory { fds, state } = &m else {
        return;
    };
    let n = *fds as usize;
    // Beyond a few thousand the check is the same, only slower.
    if n > 4096 || state.check(n).is_err() {
        return;
    }
    let all = state.fds();
    assert_eq!(all.len(), n, "{n} descriptors, {} referred to", all.len());
    let mut seen = vec![false; n];
    for Fd(i) in &all {
        let i = *i as usize;
        assert!(!seen[i], "descriptor #{i} twice in a checked state");
        seen[i] = true;
    }
    // Handed out once each, in a table of that many (files stand in for
    // sockets: the table does not look at them).
    if n <= 64 {
        let fds: Vec<std::os::fd::OwnedFd> = (0..n)
            .map(|_| std::fs::File::open("/dev/null").unwrap().into())
            .collect();
        let mut t = FdTable::new(fds);
        for f in &all {
            t.take(*f).expect("a checked index is there");
            assert!(t.take(*f).is_err(), "taken twice");
        }
        assert_eq!(t.left(), 0);
    }
}

fn stream(data: &[u8]) {
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let mut ch = Channel::new(b, Duration::from_millis(50)).unwrap();
    let mut a = a;
    // Small inputs fit the socket buffer: written whole, then closed.
    if a.write_all(data).is_err() {
        return;
    }
    drop(a);
    for _ in 0..64 {
        if ch.recv().is_err() {
            return;
        }
    }
}

fuzz_target!(|data: &[u8]| {
    message(data);
    if data.len() <= 16 * 1024 {
        stream(data);
    }
});
