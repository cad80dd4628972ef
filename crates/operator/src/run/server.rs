//! The operator's HTTP endpoint (one port):
//!
//! - `GET /healthz`: the process serves;
//! - `GET /readyz`: a standby replica is ready; the leader once it has
//!   listed the Devices;
//! - `GET /metrics`: OpenMetrics text;
//! - `POST /v1/status`: edgelinkd's report (`--status-webhook`), with
//!   `Authorization: Bearer <edgelinkd's ServiceAccount token>`: the
//!   report is taken only for the node of the pod the token is bound to
//!   ([`crate::run::auth`]). Only the leader takes reports (a standby
//!   answers 503: edgelinkd retries, and the webhook Service leads to the
//!   leader anyway).
//! - `POST /v1/heartbeat`: edgelinkd is alive (`{"node": "kedge1",
//!   "intervalMs": 500}`, every half second), with the same token and the same
//!   checks; a node that sends them and goes silent for `--node-lost-after`
//!   is lost. A review is cached a minute, so a heartbeat costs the API
//!   server nothing. It also says which attachments hold their Device's
//!   virtual address (`"holding": ["hil/device01-05-kedge1-0"]`), and
//!   the answer grants or takes them back (`{"holds": [...], "releases":
//!   [...], "holdMs": 1500}`, [`crate::run::grants`]). It says which
//!   access rules edgelinkd has (`"access": "<generation>"`, `""` or
//!   absent for none), and the answer carries the node's rules
//!   (`"access": {"generation": ..., "attachments": {...}}`,
//!   `edgelink_access::wire::AccessRules`) only when theirs differ
//!   ([`edgelink_operator::access::book`]).
//!
//! Connections are bounded as edgelinkd's status server's are
//! ([`edgelink_http_limits`]), and report bodies are read a few at a time.

use crate::run::auth::Auth;
use crate::run::grants::Holds;
use crate::run::metrics::Metrics;
use crate::run::reports::Reports;
use crate::run::rules::SharedBook;
use bytes::Bytes;
use edgelink_http_limits::{Limits, Slots};
use edgelink_operator::report::NodeReport;
use edgelink_operator::sender::{self, Refused};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The largest report body taken on the wire: gzip'd (edgelinkd sends
/// them so, ~23x smaller), any node; uncompressed, ~1100 attachments.
pub const MAX_REPORT: usize = 4 << 20;
/// The largest report once decompressed: a node of ~4500 attachments of
/// 4 forwards (a report is ~3.7 KB of JSON per attachment).
pub const MAX_REPORT_JSON: usize = 16 << 20;
/// Report bodies read at a time: their buffers are what a report costs
/// (2 x (4 + 16) MiB at most; the Deployment's limit is 256 MiB).
pub const REPORTS_READ_AT_ONCE: usize = 2;

/// Connections: one per node at a time (edgelinkd opens one per report)
/// and the probes; the head of a report within 10 s, all of it within 30 s.
pub const LIMITS: Limits = Limits {
    max_connections: 256,
    header_timeout: Duration::from_secs(10),
    conn_timeout: Duration::from_secs(30),
};

pub struct App {
    pub metrics: Arc<Metrics>,
    pub reports: Arc<Reports>,
    pub holds: Arc<Holds>,
    /// The nodes' access rules.
    pub access: Arc<SharedBook>,
    pub leader: AtomicBool,
    pub synced: AtomicBool,
    pub auth: Auth,
    reading: tokio::sync::Semaphore,
}

impl App {
    pub fn new(
        metrics: Arc<Metrics>,
        reports: Arc<Reports>,
        holds: Arc<Holds>,
        access: Arc<SharedBook>,
        auth: Auth,
    ) -> App {
        App {
            metrics,
            reports,
            holds,
            access,
            leader: AtomicBool::new(false),
            synced: AtomicBool::new(false),
            auth,
            reading: tokio::sync::Semaphore::new(REPORTS_READ_AT_ONCE),
        }
    }
}

fn reply(code: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .header("content-type", "text/plain; charset=utf-8")
        .body(Full::new(body.into()))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn refuse(app: &App, e: Refused) -> Response<Full<Bytes>> {
    app.metrics.reports_refused.inc();
    tracing::warn!(error = %e, "status report refused");
    let code = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::FORBIDDEN);
    reply(code, format!("{e}\n"))
}

/// The bearer token of the request ("" when there is none).
fn bearer(req: &Request<Incoming>) -> &str {
    req.headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or("")
}

/// A node's audit lines, one JSON line each on stdout, with `node` added:
/// the cluster's whole trail in one log (docs/operator.md, "The audit
/// trail"). Only lines of kind `audit` are written.
fn write_audit(node: &str, lines: Vec<serde_json::Map<String, serde_json::Value>>) {
    use std::io::Write;
    if lines.is_empty() {
        return;
    }
    let out = audit_text(node, lines);
    let stdout = std::io::stdout();
    let mut lock = stdout.lock();
    let _ = lock.write_all(&out).and_then(|()| lock.flush());
}

/// [`write_audit`]'s text.
pub(crate) fn audit_text(
    node: &str,
    lines: Vec<serde_json::Map<String, serde_json::Value>>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(lines.len() * 320);
    for mut l in lines {
        if l.get("kind").and_then(|k| k.as_str()) != Some("audit") {
            continue;
        }
        l.insert("node".into(), node.into());
        if serde_json::to_writer(&mut out, &l).is_ok() {
            out.push(b'\n');
        }
    }
    out
}

async fn take_report(app: &App, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let sender = match app.auth.node_of(bearer(&req)).await {
        Ok(node) => node,
        Err(e) => return refuse(app, e),
    };
    if !app.leader.load(Ordering::Relaxed) {
        app.metrics.reports_refused.inc();
        return reply(StatusCode::SERVICE_UNAVAILABLE, "not the leader: retry\n");
    }
    let Ok(_permit) = app.reading.acquire().await else {
        return reply(StatusCode::SERVICE_UNAVAILABLE, "stopping\n");
    };
    let gzip = match body_encoding(&req) {
        Ok(g) => g,
        Err(e) => {
            app.metrics.reports_refused.inc();
            return reply(StatusCode::UNSUPPORTED_MEDIA_TYPE, e);
        }
    };
    let body = match Limited::new(req.into_body(), MAX_REPORT).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            app.metrics.reports_refused.inc();
            return reply(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("report not read: {e} (over {MAX_REPORT} bytes: edgelinkd gzips its reports, an older one sends them whole)\n"),
            );
        }
    };
    let body = match gzip {
        false => body,
        true => match gunzip(&body, MAX_REPORT_JSON) {
            Ok(b) => Bytes::from(b),
            Err((code, e)) => {
                app.metrics.reports_refused.inc();
                return reply(code, e);
            }
        },
    };
    match serde_json::from_slice::<NodeReport>(&body) {
        Ok(mut r) if !r.node.is_empty() => {
            if let Err(e) = sender::check_node(&r.node, &sender) {
                return refuse(app, e);
            }
            write_audit(&r.node, std::mem::take(&mut r.audit));
            app.metrics.reports.inc();
            tracing::debug!(node = %r.node, attachments = r.attachments.len(), "status report");
            let asked = app.reports.put(r);
            app.metrics.report_triggers.inc_by(asked as u64);
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

/// Whether the body is gzip'd (`Content-Encoding: gzip`); any other coding
/// than gzip or identity is refused, by name.
fn body_encoding(req: &Request<Incoming>) -> Result<bool, String> {
    let Some(v) = req.headers().get(hyper::header::CONTENT_ENCODING) else {
        return Ok(false);
    };
    match v.to_str().map(|s| s.trim().to_ascii_lowercase()) {
        Ok(s) if s == "gzip" => Ok(true),
        Ok(s) if s == "identity" || s.is_empty() => Ok(false),
        _ => Err(format!(
            "Content-Encoding {v:?} is not taken: send gzip or identity\n"
        )),
    }
}

/// `body` gunzip'd, at most `max` bytes of it: more is refused (413), not
/// read (a small body that inflates without end costs `max`).
fn gunzip(body: &[u8], max: usize) -> Result<Vec<u8>, (StatusCode, String)> {
    use std::io::Read;
    let mut out = Vec::new();
    let mut d = flate2::read::GzDecoder::new(body).take(max as u64 + 1);
    if let Err(e) = d.read_to_end(&mut out) {
        return Err((
            StatusCode::BAD_REQUEST,
            format!("report is not valid gzip: {e}\n"),
        ));
    }
    if out.len() > max {
        return Err((
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("report is more than {max} bytes once decompressed\n"),
        ));
    }
    Ok(out)
}

/// A heartbeat's body.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Heartbeat {
    node: String,
    #[serde(default)]
    interval_ms: u64,
    /// The attachments (`namespace/pod`) that hold their Device's virtual
    /// address (an edgelinkd before them sends none).
    #[serde(default)]
    holding: Vec<String>,
    /// The generation of the access rules edgelinkd has (`""` or absent:
    /// none).
    #[serde(default)]
    access: Option<String>,
}

/// A heartbeat's answer: the grants, and the node's access rules when
/// edgelinkd's are not these.
#[derive(serde::Serialize)]
struct BeatAnswer<'a> {
    #[serde(flatten)]
    grants: &'a edgelink_operator::vip::book::Answer,
    #[serde(skip_serializing_if = "Option::is_none")]
    access: Option<&'a edgelink_access::wire::AccessRules>,
}

/// The largest heartbeat taken (a node of 500 attachments that all hold
/// an address: ~40 KiB).
const MAX_HEARTBEAT: usize = 64 * 1024;

async fn take_heartbeat(app: &App, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let sender = match app.auth.node_of(bearer(&req)).await {
        Ok(node) => node,
        Err(e) => return refuse(app, e),
    };
    if !app.leader.load(Ordering::Relaxed) {
        return reply(StatusCode::SERVICE_UNAVAILABLE, "not the leader: retry\n");
    }
    let body = match Limited::new(req.into_body(), MAX_HEARTBEAT).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return reply(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("heartbeat not read: {e}\n"),
            )
        }
    };
    match serde_json::from_slice::<Heartbeat>(&body) {
        Ok(h) if !h.node.is_empty() => {
            if let Err(e) = sender::check_node(&h.node, &sender) {
                return refuse(app, e);
            }
            app.metrics.heartbeats.inc();
            let every = Duration::from_millis(h.interval_ms.clamp(100, 60_000));
            app.reports.heard(&h.node, Some(every));
            let answer = app.holds.beat(&h.node, &h.holding);
            for device in &answer.moved {
                if let Some((ns, name)) = device.split_once('/') {
                    app.reports.reconcile(ns, name);
                }
            }
            let rules = crate::run::rules::answer(&app.access, &h.node, h.access.as_deref());
            let body = serde_json::to_vec(&BeatAnswer {
                grants: &answer,
                access: rules.as_deref(),
            })
            .unwrap_or_default();
            Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body)))
                .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
        }
        Ok(_) => reply(StatusCode::BAD_REQUEST, "heartbeat has no node name\n"),
        Err(e) => reply(
            StatusCode::BAD_REQUEST,
            format!("heartbeat is not {{\"node\": ..., \"intervalMs\": ...}}: {e}\n"),
        ),
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
        (Method::POST, "/v1/status") => {
            let (r, n) = crate::run::requests::counted(take_report(&app, req)).await;
            app.metrics.report_requests.observe(n as f64);
            r
        }
        (_, "/v1/status") => reply(StatusCode::METHOD_NOT_ALLOWED, "POST only\n"),
        (Method::POST, "/v1/heartbeat") => {
            let (r, n) = crate::run::requests::counted(take_heartbeat(&app, req)).await;
            app.metrics.report_requests.observe(n as f64);
            r
        }
        (_, "/v1/heartbeat") => reply(StatusCode::METHOD_NOT_ALLOWED, "POST only\n"),
        _ => reply(
            StatusCode::NOT_FOUND,
            "not found: /healthz, /readyz, /metrics, POST /v1/status, POST /v1/heartbeat\n",
        ),
    })
}

/// Bind `--listen`.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("--listen {addr}: {e}"))?;
    tracing::info!(%addr, "serving /healthz, /readyz, /metrics, /v1/status, /v1/heartbeat");
    Ok(listener)
}

/// Serve until the process ends.
pub async fn serve(
    app: Arc<App>,
    listener: tokio::net::TcpListener,
    limits: Limits,
) -> anyhow::Result<()> {
    let slots = Slots::new(limits.max_connections);
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // At the cap with every connection being answered: closed at once.
        let Some(slot) = slots.admit() else {
            continue;
        };
        let app = app.clone();
        tokio::spawn(edgelink_http_limits::serve(
            stream,
            limits,
            slot,
            move |req| handle(app.clone(), req),
        ));
    }
}

#[cfg(test)]
mod tests;
