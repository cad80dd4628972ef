//! The operator's HTTP endpoint (one port):
//!
//! - `GET /healthz`: the process serves;
//! - `GET /readyz`: a standby replica is ready; the leader once it has
//!   listed the Devices;
//! - `GET /metrics`: OpenMetrics text;
//! - `POST /v1/status`: edgelinkd's report (`--status-webhook`), with
//!   `Authorization: Bearer <token>` when `--webhook-token-file` is set.
//!   Only the leader takes reports (a standby answers 503: edgelinkd
//!   retries, and the webhook Service leads to the leader anyway).

use crate::run::metrics::Metrics;
use crate::run::reports::Reports;
use bytes::Bytes;
use edgelink_operator::report::NodeReport;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The largest report taken (a node with a few hundred attachments).
pub const MAX_REPORT: usize = 4 << 20;

pub struct App {
    pub metrics: Arc<Metrics>,
    pub reports: Arc<Reports>,
    pub leader: AtomicBool,
    pub synced: AtomicBool,
    pub token_file: Option<PathBuf>,
}

fn reply(code: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .header("content-type", "text/plain; charset=utf-8")
        .body(Full::new(body.into()))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

/// Compares in time independent of where the first difference is.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `Ok(())` when the request carries the token (or no token is set).
fn authorised(app: &App, req: &Request<Incoming>) -> Result<(), String> {
    let Some(path) = &app.token_file else {
        return Ok(());
    };
    // Read at each report: a rotated Secret is taken without a restart.
    let token =
        std::fs::read_to_string(path).map_err(|e| format!("token file {}: {e}", path.display()))?;
    let token = token.trim();
    if token.is_empty() {
        return Err(format!("token file {} is empty", path.display()));
    }
    let given = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if same(given.as_bytes(), token.as_bytes()) {
        Ok(())
    } else {
        Err("missing or wrong bearer token".into())
    }
}

async fn take_report(app: &App, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if let Err(e) = authorised(app, &req) {
        app.metrics.reports_refused.inc();
        tracing::warn!(error = %e, "status report refused");
        return reply(StatusCode::UNAUTHORIZED, format!("{e}\n"));
    }
    if !app.leader.load(Ordering::Relaxed) {
        app.metrics.reports_refused.inc();
        return reply(StatusCode::SERVICE_UNAVAILABLE, "not the leader: retry\n");
    }
    let body = match Limited::new(req.into_body(), MAX_REPORT).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            app.metrics.reports_refused.inc();
            return reply(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("report not read: {e}\n"),
            );
        }
    };
    match serde_json::from_slice::<NodeReport>(&body) {
        Ok(r) if !r.node.is_empty() => {
            app.metrics.reports.inc();
            tracing::debug!(node = %r.node, attachments = r.attachments.len(), "status report");
            app.reports.put(r);
            reply(StatusCode::NO_CONTENT, "")
        }
        Ok(_) => {
            app.metrics.reports_refused.inc();
            reply(StatusCode::BAD_REQUEST, "report has no node name\n")
        }
        Err(e) => {
            app.metrics.reports_refused.inc();
            reply(
                StatusCode::BAD_REQUEST,
                format!("report is not edgelinkd's status JSON: {e}\n"),
            )
        }
    }
}

async fn handle(
    app: Arc<App>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    Ok(match (req.method().clone(), path.as_str()) {
        (Method::GET, "/healthz") => reply(StatusCode::OK, "ok\n"),
        (Method::GET, "/readyz") => {
            if !app.leader.load(Ordering::Relaxed) {
                reply(StatusCode::OK, "ok: standby\n")
            } else if app.synced.load(Ordering::Relaxed) {
                reply(StatusCode::OK, "ok: leader\n")
            } else {
                reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "leader: Devices not listed yet\n",
                )
            }
        }
        (Method::GET, "/metrics") => Response::builder()
            .header(
                "content-type",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )
            .body(Full::new(Bytes::from(app.metrics.render())))
            .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()))),
        (Method::POST, "/v1/status") => take_report(&app, req).await,
        (_, "/v1/status") => reply(StatusCode::METHOD_NOT_ALLOWED, "POST only\n"),
        _ => reply(
            StatusCode::NOT_FOUND,
            "not found: /healthz, /readyz, /metrics, POST /v1/status\n",
        ),
    })
}

/// Bind `--listen`.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("--listen {addr}: {e}"))?;
    tracing::info!(%addr, "serving /healthz, /readyz, /metrics, /v1/status");
    Ok(listener)
}

/// Serve until the process ends; each connection gets 30 s.
pub async fn serve(app: Arc<App>, listener: tokio::net::TcpListener) -> anyhow::Result<()> {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let app = app.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| handle(app.clone(), req));
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc);
            let _ = tokio::time::timeout(Duration::from_secs(30), conn).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The app on a loopback port, and its address.
    async fn start(token: Option<&str>) -> (Arc<App>, SocketAddr, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let token_file = token.map(|t| {
            let f = dir.path().join("token");
            std::fs::write(&f, format!("{t}\n")).unwrap();
            f
        });
        let (reports, _rx) = Reports::new();
        let app = Arc::new(App {
            metrics: Arc::new(Metrics::new()),
            reports: Arc::new(reports),
            leader: AtomicBool::new(false),
            synced: AtomicBool::new(false),
            token_file,
        });
        let l = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(serve(app.clone(), l));
        (app, addr, dir)
    }

    /// One request; the status code and the body.
    async fn call(
        addr: SocketAddr,
        method: &str,
        path: &str,
        auth: Option<&str>,
        body: &[u8],
    ) -> (u16, String) {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: {}\r\n",
            body.len()
        );
        if let Some(a) = auth {
            head.push_str(&format!("authorization: {a}\r\n"));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes()).await.unwrap();
        // The server may answer (413) before the whole body is in.
        let _ = s.write_all(body).await;
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        let text = String::from_utf8_lossy(&out).into_owned();
        let code = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
        (
            code,
            text.split_once("\r\n\r\n")
                .map(|(_, b)| b.to_string())
                .unwrap_or_default(),
        )
    }

    const REPORT: &[u8] = br#"{"node": "kedge1", "attachments": []}"#;

    #[tokio::test]
    async fn reports_need_the_token_the_lead_and_edgelinkds_json() {
        let (app, addr, _dir) = start(Some("s3cret")).await;
        assert_eq!(call(addr, "POST", "/v1/status", None, REPORT).await.0, 401);
        assert_eq!(
            call(addr, "POST", "/v1/status", Some("Bearer wrong"), REPORT)
                .await
                .0,
            401
        );
        assert_eq!(
            call(addr, "POST", "/v1/status", Some("s3cret"), REPORT)
                .await
                .0,
            401,
            "no Bearer"
        );
        let (code, body) = call(addr, "POST", "/v1/status", Some("Bearer s3cret"), REPORT).await;
        assert_eq!((code, body.as_str()), (503, "not the leader: retry\n"));
        app.leader.store(true, Ordering::Relaxed);
        let (code, body) = call(
            addr,
            "POST",
            "/v1/status",
            Some("Bearer s3cret"),
            b"not json",
        )
        .await;
        assert_eq!(code, 400);
        assert!(
            body.starts_with("report is not edgelinkd's status JSON"),
            "{body}"
        );
        let (code, body) = call(addr, "POST", "/v1/status", Some("Bearer s3cret"), b"{}").await;
        assert_eq!((code, body.as_str()), (400, "report has no node name\n"));
        let big = vec![b' '; MAX_REPORT + 1];
        assert_eq!(
            call(addr, "POST", "/v1/status", Some("Bearer s3cret"), &big)
                .await
                .0,
            413
        );
        assert!(app.reports.get("kedge1").is_none(), "nothing taken so far");
        assert_eq!(
            call(addr, "POST", "/v1/status", Some("Bearer s3cret"), REPORT)
                .await
                .0,
            204
        );
        assert!(app.reports.get("kedge1").is_some());
        assert_eq!(call(addr, "GET", "/v1/status", None, b"").await.0, 405);
        let m = app.metrics.render();
        assert!(m.contains("edgelink_operator_reports_total 1\n"), "{m}");
        assert!(
            m.contains("edgelink_operator_reports_refused_total 7\n"),
            "{m}"
        );
    }

    #[tokio::test]
    async fn readyz_is_ok_on_a_standby_and_on_a_leader_that_listed_the_devices() {
        let (app, addr, _dir) = start(None).await;
        assert_eq!(call(addr, "GET", "/healthz", None, b"").await.0, 200);
        assert_eq!(
            call(addr, "GET", "/readyz", None, b"").await,
            (200, "ok: standby\n".into())
        );
        app.leader.store(true, Ordering::Relaxed);
        assert_eq!(call(addr, "GET", "/readyz", None, b"").await.0, 503);
        app.synced.store(true, Ordering::Relaxed);
        assert_eq!(
            call(addr, "GET", "/readyz", None, b"").await,
            (200, "ok: leader\n".into())
        );
        // Without a token file anyone may report (the operator warns at start).
        assert_eq!(call(addr, "POST", "/v1/status", None, REPORT).await.0, 204);
        assert_eq!(call(addr, "GET", "/nothing", None, b"").await.0, 404);
    }
}
