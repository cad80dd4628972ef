//! One probe of a device, bounded by its timeout: the socket comes from
//! [`Sockets`] (made inside the pod's namespace), the exchange is here.

use edgelink_attachment::{Health, HealthKind, HealthTarget};
use socket2::{Domain, Protocol, Socket, Type};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Makes sockets where the probes must start from (the pod's netns).
pub trait Sockets: Send + Sync {
    fn socket(
        &self,
        domain: Domain,
        ty: Type,
        protocol: Protocol,
    ) -> Pin<Box<dyn Future<Output = io::Result<Socket>> + Send + 'static>>;
}

/// Why a probe failed, naming the target and the step.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{kind} {target}: no answer within {ms} ms")]
    Timeout {
        kind: HealthKind,
        target: HealthTarget,
        ms: u64,
    },
    #[error("socket for {target} in the pod's netns: {source}")]
    Socket {
        target: HealthTarget,
        source: io::Error,
    },
    #[error("connect {target}: {source}")]
    Connect {
        target: SocketAddr,
        source: io::Error,
    },
    /// Sending or receiving after the connect.
    #[error("{kind} {target}: {source}")]
    Io {
        kind: HealthKind,
        target: HealthTarget,
        source: io::Error,
    },
    #[error("http {target}{path}: status {got}, expected {want}")]
    Status {
        target: SocketAddr,
        path: String,
        got: u16,
        want: String,
    },
    /// An answer that is not what the protocol says.
    #[error("{kind} {target}: {what}")]
    Malformed {
        kind: HealthKind,
        target: HealthTarget,
        what: String,
    },
    #[error("modbus {target}: exception {code} ({name}) from unit {unit}")]
    Exception {
        target: SocketAddr,
        unit: u8,
        code: u8,
        name: &'static str,
    },
}

/// Run the probe `spec` asks for once, within its timeout; `seq` tells
/// its answers from an earlier one's (ICMP sequence, Modbus transaction
/// id). Returns how long it took.
pub async fn probe(spec: &Health, sockets: &dyn Sockets, seq: u16) -> Result<Duration, ProbeError> {
    let ms = spec.timeout_ms;
    let start = Instant::now();
    let run = async {
        match (spec.kind, spec.target) {
            (HealthKind::Icmp, t) => crate::icmp::echo(sockets, t.ip(), seq).await,
            (_, HealthTarget::Host(_)) => Err(ProbeError::Malformed {
                kind: spec.kind,
                target: spec.target,
                what: "the target has no port".into(),
            }),
            (HealthKind::Tcp, HealthTarget::Addr(a)) => connect(sockets, a).await.map(drop),
            (HealthKind::Http, HealthTarget::Addr(a)) => http(spec, sockets, a).await,
            (HealthKind::Udp, HealthTarget::Addr(a)) => udp(spec, sockets, a).await,
            (HealthKind::Modbus, HealthTarget::Addr(a)) => {
                let (unit, register) = (spec.unit_id.unwrap_or(1), spec.register.unwrap_or(0));
                let s = connect(sockets, a).await?;
                crate::modbus::read(s, a, unit, register, seq).await
            }
        }
    };
    match tokio::time::timeout(Duration::from_millis(ms), run).await {
        Ok(r) => r.map(|()| start.elapsed()),
        Err(_) => Err(ProbeError::Timeout {
            kind: spec.kind,
            target: spec.target,
            ms,
        }),
    }
}

pub(crate) async fn socket(
    sockets: &dyn Sockets,
    target: HealthTarget,
    ty: Type,
    protocol: Protocol,
) -> Result<Socket, ProbeError> {
    let domain = match target.ip() {
        std::net::IpAddr::V4(_) => Domain::IPV4,
        std::net::IpAddr::V6(_) => Domain::IPV6,
    };
    let s = sockets.socket(domain, ty, protocol).await;
    s.and_then(|s| s.set_nonblocking(true).map(|()| s))
        .map_err(|source| ProbeError::Socket { target, source })
}

/// A TCP connection to `a` from the pod.
pub(crate) async fn connect(sockets: &dyn Sockets, a: SocketAddr) -> Result<TcpStream, ProbeError> {
    let s = socket(sockets, HealthTarget::Addr(a), Type::STREAM, Protocol::TCP).await?;
    let s = tokio::net::TcpSocket::from_std_stream(s.into());
    s.connect(a)
        .await
        .map_err(|source| ProbeError::Connect { target: a, source })
}

/// Bytes of an HTTP answer read at most to find its status line.
const STATUS_LINE_MAX: usize = 1024;

async fn http(spec: &Health, sockets: &dyn Sockets, a: SocketAddr) -> Result<(), ProbeError> {
    let path = spec.path.as_deref().unwrap_or("/");
    let io = |source| ProbeError::Io {
        kind: HealthKind::Http,
        target: HealthTarget::Addr(a),
        source,
    };
    let mut s = connect(sockets, a).await?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {a}\r\nUser-Agent: edgelinkd-health\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.map_err(io)?;
    let mut head = Vec::new();
    let mut buf = [0u8; 512];
    while !head.windows(2).any(|w| w == b"\r\n") && head.len() < STATUS_LINE_MAX {
        match s.read(&mut buf).await.map_err(io)? {
            0 => break,
            n => head.extend_from_slice(&buf[..n]),
        }
    }
    let got = status_code(&head).ok_or_else(|| ProbeError::Malformed {
        kind: HealthKind::Http,
        target: HealthTarget::Addr(a),
        what: format!(
            "no HTTP status line in the answer: {:?}",
            String::from_utf8_lossy(&head[..head.len().min(80)])
        ),
    })?;
    let (ok, want) = match spec.expect_status {
        Some(w) => (got == w, w.to_string()),
        None => ((200..400).contains(&got), "2xx or 3xx".into()),
    };
    if ok {
        return Ok(());
    }
    Err(ProbeError::Status {
        target: a,
        path: path.into(),
        got,
        want,
    })
}

/// `HTTP/1.1 200 OK` → 200.
fn status_code(head: &[u8]) -> Option<u16> {
    let line = head.split(|&b| b == b'\r').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut words = line.split(' ');
    if !words.next()?.starts_with("HTTP/") {
        return None;
    }
    let code = words.next()?;
    (code.len() == 3).then(|| code.parse().ok()).flatten()
}

async fn udp(spec: &Health, sockets: &dyn Sockets, a: SocketAddr) -> Result<(), ProbeError> {
    let target = HealthTarget::Addr(a);
    let s = socket(sockets, target, Type::DGRAM, Protocol::UDP).await?;
    let io = |source| ProbeError::Io {
        kind: HealthKind::Udp,
        target,
        source,
    };
    let s = tokio::net::UdpSocket::from_std(s.into()).map_err(io)?;
    s.connect(a)
        .await
        .map_err(|source| ProbeError::Connect { target: a, source })?;
    s.send(spec.payload.as_deref().unwrap_or("").as_bytes())
        .await
        .map_err(io)?;
    // Any datagram from the target is an answer (an ICMP port
    // unreachable comes back as a refused receive).
    let mut buf = [0u8; 2048];
    s.recv(&mut buf).await.map_err(io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::status_code;

    #[test]
    fn status_lines_are_read() {
        assert_eq!(status_code(b"HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(
            status_code(b"HTTP/1.0 503 Service Unavailable\r\nx"),
            Some(503)
        );
        assert_eq!(status_code(b"HTTP/1.1 204\r\n"), Some(204));
        assert_eq!(status_code(b"SSH-2.0-OpenSSH\r\n"), None);
        assert_eq!(status_code(b"HTTP/1.1 2000 x\r\n"), None);
        assert_eq!(status_code(b""), None);
    }
}
