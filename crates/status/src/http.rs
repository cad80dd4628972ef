//! The read-only HTTP endpoint: /healthz and /livez (as kube-proxy has
//! them), /metrics (Prometheus text), /status (JSON). GET only. And the
//! metrics endpoint (`--metrics-addr`): the same without /status, which
//! names pods and netns paths, for a Prometheus off the node.

use crate::{metrics, now, Error, Source};
use bytes::Bytes;
use edgelink_fd_reserve::{self as fds, FdReserve};
use edgelink_handover::lot::{Item, Lot};
use edgelink_http_limits::{Limits, Slots};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::json;
use std::convert::Infallible;
use std::sync::Arc;

fn reply(code: StatusCode, ctype: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .header("content-type", ctype)
        .body(Full::new(body.into()))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

/// Healthy while reconciles keep happening: the last one is younger than
/// two intervals (plus slack for a slow pass).
fn health(d: &dyn Source, live: bool) -> Response<Full<Bytes>> {
    let h = d.health();
    let last = h.last_reconcile;
    let limit = h.interval.as_secs().saturating_mul(2).max(10) + 5;
    let stale = last == 0 || now().saturating_sub(last) > limit;
    // Draining is healthy for liveness but not for readiness.
    let ok = !stale && (live || !h.draining);
    let body = json!({"lastUpdated": last, "currentTime": now(), "draining": h.draining});
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    reply(code, "application/json", body.to_string())
}

/// Which endpoint a connection came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// `--status-addr`: everything.
    Status,
    /// `--metrics-addr`: /metrics, /healthz and /livez.
    Metrics,
}

/// One endpoint's wiring: what it reports, its bounds, and what it shares
/// with the forwards (the hand-over lot, the descriptor reserve).
pub struct Endpoint {
    pub source: Arc<dyn Source>,
    /// `--status-max-connections`, `--status-header-timeout`,
    /// `--status-conn-timeout` ([`edgelink_http_limits`]).
    pub limits: Limits,
    /// Where the status listener parks for a hand-over.
    pub lot: Arc<Lot>,
    /// Descriptors kept back for this door.
    pub fds: Arc<FdReserve>,
    /// The commit the binary was built from (`edgelink_build_info`).
    pub commit: &'static str,
}

/// `/audit?device=<namespace/name or name>&since=<1h>`: the latest audit
/// lines kept in memory, JSON lines, oldest first.
fn audit(d: &dyn Source, query: Option<&str>) -> Response<Full<Bytes>> {
    let Some(trail) = d.audit().filter(|a| a.is_on()) else {
        return reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "no audit trail: --audit off\n",
        );
    };
    let (mut device, mut since) = (None, None);
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("device", v)) => device = Some(v.replace("%2F", "/").replace("%2f", "/")),
            Some(("since", v)) => match edgelink_access::audit::since(v) {
                Ok(t) => since = Some(t),
                Err(e) => {
                    return reply(
                        StatusCode::BAD_REQUEST,
                        "text/plain",
                        format!("since: {e}\n"),
                    )
                }
            },
            _ => {
                return reply(
                    StatusCode::BAD_REQUEST,
                    "text/plain",
                    format!(
                        "{pair:?}: the parameters are device=<namespace/name> and since=<1h>\n"
                    ),
                )
            }
        }
    }
    let mut body = Vec::new();
    for r in trail.recent(device.as_deref(), since) {
        if serde_json::to_writer(&mut body, &r).is_ok() {
            body.push(b'\n');
        }
    }
    reply(StatusCode::OK, "application/x-ndjson", body)
}

async fn handle(
    ep: Arc<Endpoint>,
    scope: Scope,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return Ok(reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "read-only: GET only\n",
        ));
    }
    Ok(match req.uri().path() {
        "/healthz" => health(&*ep.source, false),
        "/livez" => health(&*ep.source, true),
        "/status" if scope == Scope::Metrics => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not served on the metrics address: /status is on --status-addr\n",
        ),
        "/status" => {
            let body = serde_json::to_vec_pretty(&ep.source.status()).unwrap_or_default();
            reply(StatusCode::OK, "application/json", body)
        }
        "/audit" if scope == Scope::Status => audit(&*ep.source, req.uri().query()),
        "/metrics" => reply(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics::render(&*ep.source, ep.commit),
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try /status, /audit, /metrics, /healthz, /livez\n",
        ),
    })
}

/// Serve until the process ends, or a hand-over takes the listener (the
/// status endpoint's; the metrics endpoint's is not handed over: the new
/// daemon binds its own beside it, [`bind_shared`]).
pub async fn serve(listener: tokio::net::TcpListener, ep: Arc<Endpoint>, scope: Scope) {
    let lot = ep.lot.clone();
    // Only what is handed over is waited for by a hand-over: the metrics
    // listener stays with this process (its task never parks).
    let guard = (scope == Scope::Status).then(|| lot.guard());
    let park = lot.token();
    let limits = ep.limits;
    let slots = Slots::new(limits.max_connections);
    loop {
        let accepted = tokio::select! {
            biased;
            () = park.cancelled(), if scope == Scope::Status => {
                match listener.into_std() {
                    Ok(l) => lot.park(Item::Status(l)),
                    Err(e) => tracing::warn!(error = %e, "cannot hand the status listener over"),
                }
                drop(guard);
                return;
            }
            r = listener.accept() => r,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => match accept_with_reserve(&listener, &ep.fds, e).await {
                Some(s) => s,
                None => continue,
            },
        };
        // At the cap with every connection being answered: closed at once.
        let Some(slot) = slots.admit() else {
            tracing::debug!("status endpoint: every connection busy, one refused");
            continue;
        };
        let ep = ep.clone();
        tokio::spawn(edgelink_http_limits::serve(
            stream,
            limits,
            slot,
            move |req| handle(ep.clone(), scope, req),
        ));
    }
}

/// A listener on `addr` with SO_REUSEPORT: a daemon taking over binds the
/// metrics address while the one handing over still serves it (both
/// answer alike), and the old one's goes when it exits.
pub fn bind_shared(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM.nonblocking().cloexec(),
        None,
    )?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.bind(&addr.into())?;
    s.listen(128)?;
    tokio::net::TcpListener::from_std(s.into())
}

/// After a failed accept: at the open-file limit, accept with the fds
/// kept for the daemon's own doors ([`edgelink_fd_reserve`]). The connection needs
/// no more, so the reserve is taken back at once (the forwards accept
/// nothing until it is whole again). Only a connection waiting now
/// (EMFILE comes before the queue is looked at): the reserve is never held
/// waiting.
async fn accept_with_reserve(
    listener: &tokio::net::TcpListener,
    reserve: &Arc<FdReserve>,
    e: std::io::Error,
) -> Option<tokio::net::TcpStream> {
    let lease = fds::exhausted(&e).then(|| reserve.lease()).flatten();
    let retried = match lease {
        Some(_) => fds::accept_now(listener.accept())
            .await
            .and_then(Result::ok),
        None => None,
    };
    drop(lease);
    if retried.is_none() {
        tracing::warn!(error = %e, "status endpoint: accept failed");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    retried.map(|(s, _)| s)
}

/// GET `path` from a daemon (for `edgelinkd status` and the webhook's kin).
pub async fn get(addr: std::net::SocketAddr, path: &str) -> Result<(u16, String), Error> {
    use http_body_util::BodyExt;
    let stream = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        tokio::net::TcpStream::connect(addr),
    )
    .await
    .map_err(|_| Error::Timeout(addr))?
    .map_err(|source| Error::Connect { addr, source })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = Request::builder()
        .uri(path)
        .header("host", addr.to_string())
        .body(http_body_util::Empty::<Bytes>::new())?;
    let resp = sender.send_request(req).await?;
    let code = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((code, String::from_utf8_lossy(&body).into_owned()))
}
