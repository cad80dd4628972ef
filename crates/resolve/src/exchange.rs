//! One question (a name and A or AAAA) asked of the configured nameservers:
//! UDP with a per-try timeout, rotating over the servers for `attempts`
//! rounds, TCP when an answer comes back truncated; and what the answer
//! says (addresses after the CNAME chain, their TTL, or a negative answer).
//!
//! It owns no socket factory and no cache: sockets come from
//! [`DnsSockets`], caching is the resolver's.

use crate::{DnsSockets, ResolvConf};
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Longest CNAME chain followed within one answer.
const MAX_CNAME_HOPS: usize = 16;
/// A negative answer's TTL when it carries no SOA.
const DEFAULT_NEGATIVE_TTL: u32 = 5;

/// What a server said about one question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Addresses of the asked type, and the least TTL along the chain.
    Addrs { addrs: Vec<IpAddr>, ttl: u32 },
    /// NXDOMAIN; the negative TTL (SOA) or a default.
    NxDomain { ttl: u32 },
    /// The name exists without records of this type.
    NoData { ttl: u32 },
}

/// Why no server answered the question.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Every try timed out.
    Timeout,
    /// The last server that answered answered badly (SERVFAIL, REFUSED,
    /// a TCP answer to another question...).
    Bad { server: SocketAddr, reason: String },
    /// The last failure was a socket error (and none answered badly).
    Io {
        server: SocketAddr,
        source: io::Error,
    },
}

/// Why one try at one server failed.
enum TryError {
    Timeout,
    Bad(String),
    Io(io::Error),
}

impl From<io::Error> for TryError {
    fn from(e: io::Error) -> TryError {
        TryError::Io(e)
    }
}

/// Ask `qname` (absolute) of type `qtype`, as glibc does: each server in
/// turn, `attempts` rounds; the first NOERROR or NXDOMAIN answer counts.
pub(crate) async fn ask(
    conf: &ResolvConf,
    sockets: &dyn DnsSockets,
    qname: &Name,
    qtype: RecordType,
) -> Result<Answer, Failure> {
    let mut bad: Option<Failure> = None;
    let mut io_err: Option<Failure> = None;
    for _round in 0..conf.attempts.max(1) {
        for &server in &conf.nameservers {
            match ask_server(conf.timeout, sockets, server, qname, qtype).await {
                Ok(msg) => return Ok(interpret(&msg, qname, qtype)),
                Err(TryError::Timeout) => {}
                Err(TryError::Bad(reason)) => bad = Some(Failure::Bad { server, reason }),
                Err(TryError::Io(source)) => io_err = Some(Failure::Io { server, source }),
            }
        }
    }
    Err(bad.or(io_err).unwrap_or(Failure::Timeout))
}

/// One try at one server: UDP, then TCP if the answer was truncated.
async fn ask_server(
    timeout: Duration,
    sockets: &dyn DnsSockets,
    server: SocketAddr,
    qname: &Name,
    qtype: RecordType,
) -> Result<Message, TryError> {
    let mut query = Message::query();
    query.metadata.recursion_desired = true;
    query.add_query(Query::query(qname.clone(), qtype));
    let id = query.metadata.id;
    let wire = query
        .to_vec()
        .map_err(|e| TryError::Bad(format!("cannot encode the query: {e}")))?;
    let udp = tokio::time::timeout(timeout, udp_try(sockets, server, &wire, id, qname, qtype))
        .await
        .map_err(|_| TryError::Timeout)??;
    let msg = if udp.metadata.truncation {
        tokio::time::timeout(timeout, tcp_try(sockets, server, &wire, id, qname, qtype))
            .await
            .map_err(|_| TryError::Timeout)??
    } else {
        udp
    };
    match msg.metadata.response_code {
        ResponseCode::NoError | ResponseCode::NXDomain => Ok(msg),
        other => Err(TryError::Bad(format!("it answered {other}"))),
    }
}

/// Whether `msg` answers our question: same id, a response, the same name
/// (case-insensitively) and type.
fn answers(msg: &Message, id: u16, qname: &Name, qtype: RecordType) -> bool {
    msg.metadata.id == id
        && msg.metadata.message_type == MessageType::Response
        && msg.metadata.op_code == OpCode::Query
        && msg.queries.len() == 1
        && msg.queries[0].name() == qname
        && msg.queries[0].query_type() == qtype
}

async fn udp_try(
    sockets: &dyn DnsSockets,
    server: SocketAddr,
    wire: &[u8],
    id: u16,
    qname: &Name,
    qtype: RecordType,
) -> Result<Message, TryError> {
    let std_sock = sockets.udp(server).await?;
    std_sock.set_nonblocking(true)?;
    let sock = tokio::net::UdpSocket::from_std(std_sock)?;
    // Connected: the kernel drops datagrams from anyone but the server.
    sock.connect(server).await?;
    sock.send(wire).await?;
    let mut buf = vec![0u8; 4096];
    loop {
        let n = sock.recv(&mut buf).await?;
        // Garbage, or an answer to another id or question (a late
        // answer, a spoofing attempt): wait on for ours.
        let Ok(msg) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        if answers(&msg, id, qname, qtype) {
            return Ok(msg);
        }
    }
}

async fn tcp_try(
    sockets: &dyn DnsSockets,
    server: SocketAddr,
    wire: &[u8],
    id: u16,
    qname: &Name,
    qtype: RecordType,
) -> Result<Message, TryError> {
    let sock = sockets.tcp(server).await?;
    sock.set_nonblocking(true)?;
    let sock = tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(sock));
    let mut stream = sock.connect(server).await?;
    let len = u16::try_from(wire.len())
        .map_err(|_| TryError::Bad("the query does not fit a TCP frame".into()))?;
    let mut framed = Vec::with_capacity(wire.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(wire);
    stream.write_all(&framed).await?;
    let n = stream.read_u16().await?;
    let mut buf = vec![0u8; usize::from(n)];
    stream.read_exact(&mut buf).await?;
    let msg = Message::from_vec(&buf)
        .map_err(|e| TryError::Bad(format!("undecodable TCP answer: {e}")))?;
    if !answers(&msg, id, qname, qtype) {
        return Err(TryError::Bad(
            "its TCP answer is for another id or question".into(),
        ));
    }
    Ok(msg)
}

/// What a NOERROR or NXDOMAIN answer says about `qname`/`qtype`: the
/// CNAME chain is followed within the answer section.
pub(crate) fn interpret(msg: &Message, qname: &Name, qtype: RecordType) -> Answer {
    let negative_ttl = msg
        .authorities
        .iter()
        .find_map(|r| match &r.data {
            RData::SOA(soa) => Some(r.ttl.min(soa.minimum)),
            _ => None,
        })
        .unwrap_or(DEFAULT_NEGATIVE_TTL);
    if msg.metadata.response_code == ResponseCode::NXDomain {
        return Answer::NxDomain { ttl: negative_ttl };
    }
    let mut cur = qname.clone();
    let mut ttl = u32::MAX;
    for _ in 0..=MAX_CNAME_HOPS {
        let mut addrs = Vec::new();
        let mut addr_ttl = u32::MAX;
        for r in msg.answers.iter().filter(|r| r.name == cur) {
            let ip = match (&r.data, qtype) {
                (RData::A(a), RecordType::A) => IpAddr::V4(a.0),
                (RData::AAAA(a), RecordType::AAAA) => IpAddr::V6(a.0),
                _ => continue,
            };
            if !addrs.contains(&ip) {
                addrs.push(ip);
            }
            addr_ttl = addr_ttl.min(r.ttl);
        }
        if !addrs.is_empty() {
            return Answer::Addrs {
                addrs,
                ttl: ttl.min(addr_ttl),
            };
        }
        let next = msg
            .answers
            .iter()
            .filter(|r| r.name == cur)
            .find_map(|r| match &r.data {
                RData::CNAME(target) => Some((target.0.clone(), r.ttl)),
                _ => None,
            });
        match next {
            Some((target, t)) => {
                ttl = ttl.min(t);
                cur = target;
            }
            None => break,
        }
    }
    Answer::NoData { ttl: negative_ttl }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::rr::rdata::{A, AAAA, CNAME, SOA};
    use hickory_proto::rr::Record;

    fn name(s: &str) -> Name {
        Name::from_ascii(s).unwrap()
    }

    fn response(q: &str, qtype: RecordType) -> Message {
        let mut m = Message::response(7, OpCode::Query);
        m.add_query(Query::query(name(q), qtype));
        m
    }

    #[test]
    fn follows_a_cname_chain_and_takes_the_least_ttl() {
        let mut m = response("web.lab.", RecordType::A);
        m.add_answer(Record::from_rdata(
            name("web.lab."),
            300,
            RData::CNAME(CNAME(name("Edge.Lab."))),
        ));
        m.add_answer(Record::from_rdata(
            name("edge.lab."),
            60,
            RData::CNAME(CNAME(name("real.lab."))),
        ));
        m.add_answer(Record::from_rdata(
            name("real.lab."),
            120,
            RData::A(A("192.0.2.7".parse().unwrap())),
        ));
        m.add_answer(Record::from_rdata(
            name("real.lab."),
            90,
            RData::A(A("192.0.2.8".parse().unwrap())),
        ));
        // A record for another name is no answer to ours.
        m.add_answer(Record::from_rdata(
            name("other.lab."),
            1,
            RData::A(A("192.0.2.9".parse().unwrap())),
        ));
        assert_eq!(
            interpret(&m, &name("web.lab."), RecordType::A),
            Answer::Addrs {
                addrs: vec!["192.0.2.7".parse().unwrap(), "192.0.2.8".parse().unwrap()],
                ttl: 60
            }
        );
        // The AAAA question of the same answer: no data.
        assert!(matches!(
            interpret(&m, &name("web.lab."), RecordType::AAAA),
            Answer::NoData { .. }
        ));
    }

    #[test]
    fn cname_loop_ends() {
        let mut m = response("a.lab.", RecordType::AAAA);
        m.add_answer(Record::from_rdata(
            name("a.lab."),
            5,
            RData::CNAME(CNAME(name("b.lab."))),
        ));
        m.add_answer(Record::from_rdata(
            name("b.lab."),
            5,
            RData::CNAME(CNAME(name("a.lab."))),
        ));
        m.add_answer(Record::from_rdata(
            name("c.lab."),
            5,
            RData::AAAA(AAAA("2001:db8::1".parse().unwrap())),
        ));
        assert_eq!(
            interpret(&m, &name("a.lab."), RecordType::AAAA),
            Answer::NoData {
                ttl: DEFAULT_NEGATIVE_TTL
            }
        );
    }

    #[test]
    fn negative_ttl_from_the_soa() {
        let mut m = response("gone.lab.", RecordType::A);
        m.metadata.response_code = ResponseCode::NXDomain;
        m.add_authority(Record::from_rdata(
            name("lab."),
            30,
            RData::SOA(SOA::new(name("ns.lab."), name("h.lab."), 1, 1, 1, 1, 3)),
        ));
        assert_eq!(
            interpret(&m, &name("gone.lab."), RecordType::A),
            Answer::NxDomain { ttl: 3 }
        );
    }
}
