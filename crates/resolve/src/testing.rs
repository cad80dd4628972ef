//! A small DNS server for tests (this crate's, and the scenario tests'
//! through the `testing` feature): A and AAAA records and CNAMEs set at
//! run time, NXDOMAIN for anything else, a count of queries per name, and
//! switches to go silent, answer SERVFAIL or truncate every UDP answer.
//!
//! Test code only: std threads and sockets, no tokio; it never resolves
//! anything itself. Its threads poll a stop flag (short read timeouts), so
//! dropping it stops them within a fraction of a second.

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME, SOA};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the threads look at the stop flag.
const POLL: Duration = Duration::from_millis(100);
/// The SOA minimum (negative TTL) of NXDOMAIN and no-data answers.
const NEGATIVE_TTL: u32 = 1;

#[derive(Default)]
struct State {
    addrs: HashMap<String, (Vec<IpAddr>, u32)>,
    cnames: HashMap<String, (String, u32)>,
    queries: HashMap<String, usize>,
    tcp_queries: usize,
    silent: bool,
    servfail: bool,
    truncate_udp: bool,
    decoy: bool,
}

/// A DNS server on UDP and TCP of one address; stopped on drop.
pub struct DnsServer {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl DnsServer {
    /// Serve UDP+TCP on `addr` (port 0: one free port for both) in the
    /// calling thread's network namespace.
    pub fn start(addr: SocketAddr) -> DnsServer {
        let (udp, tcp) = bind_pair(addr);
        DnsServer::serve(udp, tcp)
    }

    /// Serve UDP+TCP on `addr`, the sockets created inside the netns at
    /// path `netns` (e.g. "/var/run/netns/x") by a short-lived helper
    /// thread; served from std threads.
    pub fn start_in(netns: &str, addr: SocketAddr) -> DnsServer {
        let file = std::fs::File::open(netns).unwrap_or_else(|e| panic!("open {netns}: {e}"));
        let (udp, tcp) = std::thread::scope(|s| {
            s.spawn(|| {
                // The helper thread ends right after: the test's threads
                // never change namespace.
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                    .unwrap_or_else(|e| panic!("enter {netns}: {e}"));
                bind_pair(addr)
            })
            .join()
            .expect("the socket thread panicked")
        });
        DnsServer::serve(udp, tcp)
    }

    fn serve(udp: UdpSocket, tcp: TcpListener) -> DnsServer {
        let addr = udp.local_addr().expect("local address");
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        udp.set_read_timeout(Some(POLL)).expect("read timeout");
        tcp.set_nonblocking(true).expect("nonblocking listener");
        let threads = vec![
            {
                let (state, stop) = (state.clone(), stop.clone());
                std::thread::spawn(move || serve_udp(udp, &state, &stop))
            },
            {
                let (state, stop) = (state.clone(), stop.clone());
                std::thread::spawn(move || serve_tcp(tcp, &state, &stop))
            },
        ];
        DnsServer {
            addr,
            state,
            stop,
            threads,
        }
    }

    /// Where it listens (UDP and TCP).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Replace the records of `name` (A/AAAA; `&[]`: the name exists with
    /// no address). Drops a CNAME of that name.
    pub fn set(&self, name: &str, addrs: &[IpAddr], ttl: u32) {
        let mut st = self.lock();
        st.cnames.remove(&key(name));
        st.addrs.insert(key(name), (addrs.to_vec(), ttl));
    }

    /// Make `name` a CNAME of `target`.
    pub fn set_cname(&self, name: &str, target: &str, ttl: u32) {
        let mut st = self.lock();
        st.addrs.remove(&key(name));
        st.cnames.insert(key(name), (key(target), ttl));
    }

    /// Remove `name`: NXDOMAIN from now on.
    pub fn remove(&self, name: &str) {
        let mut st = self.lock();
        st.addrs.remove(&key(name));
        st.cnames.remove(&key(name));
    }

    /// How many queries for `name` arrived (UDP and TCP, any type).
    pub fn queries(&self, name: &str) -> usize {
        self.lock().queries.get(&key(name)).copied().unwrap_or(0)
    }

    /// How many queries arrived over TCP.
    pub fn tcp_queries(&self) -> usize {
        self.lock().tcp_queries
    }

    /// Answer nothing at all (queries are still counted).
    pub fn set_silent(&self, on: bool) {
        self.lock().silent = on;
    }

    /// Answer SERVFAIL to everything.
    pub fn set_servfail(&self, on: bool) {
        self.lock().servfail = on;
    }

    /// Answer every UDP query with an empty truncated (TC) answer.
    pub fn set_truncate_udp(&self, on: bool) {
        self.lock().truncate_udp = on;
    }

    /// Before each UDP answer, send two that must be ignored: one with
    /// another id, one for another question.
    pub fn set_decoy(&self, on: bool) {
        self.lock().decoy = on;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// A name as the server keys it: lower case, no trailing dot.
fn key(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// A UDP socket and a TCP listener on the same address (with port 0, one
/// free port for both: retried a few times if TCP's is taken).
fn bind_pair(addr: SocketAddr) -> (UdpSocket, TcpListener) {
    let mut last = None;
    for _ in 0..20 {
        let udp = UdpSocket::bind(addr).unwrap_or_else(|e| panic!("bind udp {addr}: {e}"));
        let at = udp.local_addr().expect("local address");
        match TcpListener::bind(at) {
            Ok(tcp) => return (udp, tcp),
            Err(e) if addr.port() == 0 => last = Some(e),
            Err(e) => panic!("bind tcp {at}: {e}"),
        }
    }
    panic!("no port free for both UDP and TCP: {last:?}")
}

fn serve_udp(sock: UdpSocket, state: &Mutex<State>, stop: &AtomicBool) {
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::SeqCst) {
        let Ok((n, from)) = sock.recv_from(&mut buf) else {
            continue;
        };
        let Some(reply) = answer(&buf[..n], state, false) else {
            continue;
        };
        if lock(state).decoy {
            for d in decoys(&reply) {
                let _ = sock.send_to(&d, from);
            }
        }
        let _ = sock.send_to(&reply, from);
    }
}

fn serve_tcp(listener: TcpListener, state: &Mutex<State>, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((conn, _)) => serve_conn(conn, state, stop),
            Err(_) => std::thread::sleep(POLL / 4),
        }
    }
}

/// Queries on one TCP connection until it closes, goes quiet for a few
/// polls, or the server stops.
fn serve_conn(mut conn: TcpStream, state: &Mutex<State>, stop: &AtomicBool) {
    if conn.set_nonblocking(false).is_err() || conn.set_read_timeout(Some(POLL)).is_err() {
        return;
    }
    let mut idle = 0;
    while !stop.load(Ordering::SeqCst) && idle < 20 {
        let mut len = [0u8; 2];
        if conn.read_exact(&mut len).is_err() {
            idle += 1;
            continue;
        }
        let mut msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
        if conn.read_exact(&mut msg).is_err() {
            return;
        }
        let Some(reply) = answer(&msg, state, true) else {
            continue;
        };
        let Ok(n) = u16::try_from(reply.len()) else {
            return;
        };
        let mut framed = n.to_be_bytes().to_vec();
        framed.extend_from_slice(&reply);
        if conn.write_all(&framed).is_err() {
            return;
        }
    }
}

/// The wire answer to one wire query; None to stay silent.
fn answer(query: &[u8], state: &Mutex<State>, tcp: bool) -> Option<Vec<u8>> {
    let q = Message::from_vec(query).ok()?;
    if q.metadata.message_type != MessageType::Query {
        return None;
    }
    let question = q.queries.first()?.clone();
    let qname = key(&question.name().to_ascii());
    let mut st = lock(state);
    *st.queries.entry(qname.clone()).or_default() += 1;
    if tcp {
        st.tcp_queries += 1;
    }
    if st.silent {
        return None;
    }
    let mut m = Message::response(q.metadata.id, OpCode::Query);
    m.metadata.recursion_desired = q.metadata.recursion_desired;
    m.metadata.recursion_available = true;
    m.add_query(question.clone());
    if st.servfail {
        m.metadata.response_code = ResponseCode::ServFail;
        return m.to_vec().ok();
    }
    if st.truncate_udp && !tcp {
        m.metadata.truncation = true;
        return m.to_vec().ok();
    }
    let name = |s: &str| Name::from_ascii(format!("{s}.")).ok();
    let mut cur = qname;
    let mut known = false;
    for _ in 0..8 {
        if let Some((target, ttl)) = st.cnames.get(&cur) {
            known = true;
            m.add_answer(Record::from_rdata(
                name(&cur)?,
                *ttl,
                RData::CNAME(CNAME(name(target)?)),
            ));
            cur = target.clone();
            continue;
        }
        if let Some((addrs, ttl)) = st.addrs.get(&cur) {
            known = true;
            for ip in addrs {
                let data = match (ip, question.query_type()) {
                    (IpAddr::V4(v4), RecordType::A) => RData::A(A(*v4)),
                    (IpAddr::V6(v6), RecordType::AAAA) => RData::AAAA(AAAA(*v6)),
                    _ => continue,
                };
                m.add_answer(Record::from_rdata(name(&cur)?, *ttl, data));
            }
        } else {
            known = false;
        }
        break;
    }
    if !known {
        m.metadata.response_code = ResponseCode::NXDomain;
    }
    if m.answers
        .iter()
        .all(|r| r.record_type() == RecordType::CNAME)
    {
        let zone = Name::root();
        m.add_authority(Record::from_rdata(
            zone.clone(),
            NEGATIVE_TTL,
            RData::SOA(SOA::new(zone.clone(), zone, 1, 60, 60, 60, NEGATIVE_TTL)),
        ));
    }
    m.to_vec().ok()
}

/// Two wrong answers made from the right one: another id (with another
/// address), and the same id for another name.
fn decoys(reply: &[u8]) -> Vec<Vec<u8>> {
    let Ok(right) = Message::from_vec(reply) else {
        return Vec::new();
    };
    let mut other_id = right.clone();
    other_id.metadata.id = right.metadata.id.wrapping_add(1);
    for r in &mut other_id.answers {
        if let RData::A(a) = &mut r.data {
            a.0 = std::net::Ipv4Addr::new(192, 0, 2, 254);
        }
    }
    let mut other_name = other_id.clone();
    other_name.metadata.id = right.metadata.id;
    if let Some(q) = other_name.queries.first_mut() {
        if let Ok(n) = Name::from_ascii("decoy.invalid.") {
            q.set_name(n);
        }
    }
    [other_id, other_name]
        .iter()
        .filter_map(|m| m.to_vec().ok())
        .collect()
}
