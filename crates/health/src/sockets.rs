//! Where a probe's sockets come from ([`Sockets`]: the pod's netns), and
//! the TCP connection most probes start with.

use crate::error::ProbeError;
use edgelink_attachment::HealthTarget;
use socket2::{Domain, Protocol, Socket, Type};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
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
