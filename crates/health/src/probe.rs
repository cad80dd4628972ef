//! One probe of a device, bounded by its timeout: the socket comes from
//! [`Sockets`] (made inside the pod's namespace); the TCP, HTTP and UDP
//! exchanges are here, ICMP's and Modbus's in their own modules.

use crate::error::ProbeError;
use crate::sockets::{connect, socket, Sockets};
use edgelink_attachment::{Health, HealthKind, HealthTarget};
use socket2::{Protocol, Type};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
