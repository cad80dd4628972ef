//! Third review (issue 20), item 7: the status server under slow and unfinished requests.
//!
//! Clients in the node netns open connections to the daemon's status
//! endpoint and send a request head they never finish. Before the fix
//! hyper's defaults held every such connection (until
//! `--status-conn-timeout`) with up to ~408 KiB of buffer each. Now at most
//! `--status-max-connections` are held (a new one takes the place of the
//! oldest waiting one), a head longer than the buffer is refused, a head
//! not finished within `--status-header-timeout` closes its connection,
//! and a probe that sends its request at once is answered throughout.

use crate::lab::*;
use edgelink_tests::*;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

const CAP: usize = 8;
/// edgelink_http_limits::MAX_BUF
const MAX_BUF: u64 = 16 << 10;

fn status_addr() -> SocketAddr {
    "127.0.0.1:9310".parse().unwrap()
}

/// A daemon (no attachment) with the status cap at `CAP`, the header
/// timeout `header` and connections otherwise living 600 s.
fn lab(header: &str) -> DLab {
    DLab::with(Opts {
        flags: &[
            "--status-max-connections",
            "8",
            "--status-header-timeout",
            header,
            "--status-conn-timeout",
            "600",
        ],
        add: false,
        ..Default::default()
    })
}

/// `n` connections from the node netns to the status endpoint, each having
/// sent `head` (non-blocking: as much of it as the socket takes).
fn slow_clients(l: &DLab, n: usize, head: &[u8]) -> Vec<TcpStream> {
    let clients: Vec<TcpStream> = in_netns(&l.lab.node, || {
        (0..n)
            .map(|i| {
                TcpStream::connect_timeout(&status_addr(), Duration::from_secs(5))
                    .unwrap_or_else(|e| panic!("client {i}: {e}"))
            })
            .collect()
    });
    for s in &clients {
        s.set_nonblocking(true).unwrap();
        let mut sent = 0;
        // Bounded: each write takes something, or the socket is full or gone.
        while sent < head.len() {
            match again(|| (&*s).write(&head[sent..])) {
                Ok(0) | Err(_) => break,
                Ok(k) => sent += k,
            }
        }
    }
    clients
}

/// Whether the daemon still holds `s` open (reading what it sent, if any).
fn held(s: &TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match again(|| (&*s).read(&mut buf)) {
            Ok(0) => return false,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
            Err(_) => return false,
        }
    }
}

fn held_count(clients: &[TcpStream]) -> usize {
    clients.iter().filter(|s| held(s)).count()
}

/// A request sent at once gets an answer (200, or 503 while the first
/// reconcile is due: either is the server answering).
fn probe_answered(l: &DLab) {
    let (code, _) = l.get("/healthz");
    assert!(code == 200 || code == 503, "/healthz: {code}");
}

fn rss_kib(l: &mut DLab) -> u64 {
    let pid = l.daemon().child.id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

#[test]
fn unfinished_heads_hold_at_most_the_cap_and_a_probe_is_still_answered() {
    let l = lab("600");
    let head = b"GET /status HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    let clients = slow_clients(&l, 5 * CAP, head);
    // The daemon accepts them all; every one beyond the cap takes the
    // place of an older waiting one, which is closed.
    let mut now = usize::MAX;
    let capped = wait_until(Duration::from_secs(20), || {
        now = held_count(&clients);
        now <= CAP
    });
    assert!(
        capped,
        "{now} of {} unfinished connections held, above the cap {CAP}",
        clients.len()
    );
    // The newest are the ones held.
    assert!(
        clients[..4 * CAP].iter().all(|s| !held(s)),
        "an old waiting connection was kept instead of a newer one"
    );
    // With the cap full of waiting clients, probes are answered (each
    // takes a waiting client's place), again and again.
    for _ in 0..3 {
        probe_answered(&l);
    }
    // A second wave: the same.
    let more = slow_clients(&l, 2 * CAP, head);
    assert!(wait_until(Duration::from_secs(20), || held_count(&clients)
        + held_count(&more)
        <= CAP));
    probe_answered(&l);
}

#[test]
fn a_head_longer_than_the_buffer_is_refused_and_memory_stays_bounded() {
    let mut l = lab("600");
    probe_answered(&l);
    let before = rss_kib(&mut l);
    // 100 clients each pushing a 256 KiB head: before the fix the daemon
    // buffered all of it (~25 MiB and more with the buffers' growth).
    let mut head = b"GET /status HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    head.resize(256 << 10, b'a');
    let clients = slow_clients(&l, 100, &head);
    let mut now = usize::MAX;
    let capped = wait_until(Duration::from_secs(20), || {
        now = held_count(&clients);
        now <= CAP
    });
    assert!(capped, "{now} connections with a 256 KiB head still held");
    probe_answered(&l);
    let grown = rss_kib(&mut l).saturating_sub(before);
    // The cap's worth of buffers, a generous allowance for each held
    // connection's state and the allocator's slack.
    let bound = CAP as u64 * (MAX_BUF + (64 << 10)) / 1024 + 8 * 1024;
    assert!(
        grown <= bound,
        "edgelinkd's RSS grew by {grown} KiB (bound {bound} KiB)"
    );
    drop(clients);
}

#[test]
fn a_head_not_finished_within_the_header_timeout_is_closed() {
    let l = lab("1");
    let clients = slow_clients(&l, 3, b"GET /status HTTP/1.1\r\nHost: x\r\n");
    // One that sends nothing at all, and one kept alive after an answer.
    let silent = slow_clients(&l, 1, b"");
    let kept = slow_clients(&l, 1, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    // 1 s header timeout; 30 s of slack for a loaded machine, far below the
    // connections' 600 s.
    let mut open = 0;
    let closed = wait_until(Duration::from_secs(30), || {
        open = held_count(&clients) + held_count(&silent) + held_count(&kept);
        open == 0
    });
    assert!(
        closed,
        "{open} connections without a whole request head still open"
    );
    probe_answered(&l);
}
