//! The status webhook: POST the status JSON when attachments come or go,
//! when a forward's listener or reachability or an attachment's health
//! changes (at once when the node says so through [`Source::changes`], as
//! a health transition does; else looked at each second), and at least
//! every `--status-webhook-interval` (the counters, and a heartbeat:
//! edgelink-operator takes a node that stopped reporting as unknown).
//! Only the latest state is sent; failures are retried with exponential
//! backoff (1 s to 60 s), each logged with its cause (the name did not
//! resolve, the connection was refused, the token was refused).
//!
//! The URL is `--status-webhook URL`, fixed, or the content of
//! `--status-webhook-file FILE`, read again before every POST and every
//! second while idle: the DaemonSet mounts edgelink-operator's ConfigMap
//! there, so a URL patched in while edgelinkd runs is taken within the
//! kubelet's sync of the volume, without a restart. A file that is missing
//! or empty means no webhook (yet).
//!
//! With `--status-webhook-token-file` each POST carries `Authorization:
//! Bearer <the file's content>`, read at each POST so a rotated token is
//! taken: with edgelink-operator, the pod's ServiceAccount token for the
//! audience `edgelink-operator`, which the kubelet projects and renews and
//! the operator has reviewed (it takes the report for the node of the pod
//! the token is bound to only). It runs in its own task and never blocks a
//! relay.

use crate::{Error, Source, Status};
use bytes::Bytes;
use hyper::Request;
use hyper_util::rt::TokioIo;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub(crate) struct Url {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) path: String,
}

pub(crate) fn parse(url: &str) -> Result<Url, Error> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| Error::Scheme(url.to_string()))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].to_string()),
        None => (rest, "/".to_string()),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.contains('[') => (
            h.to_string(),
            p.parse().map_err(|source| Error::Port {
                url: url.to_string(),
                source,
            })?,
        ),
        _ => (authority.to_string(), 80),
    };
    Ok(Url {
        host: host.trim_matches(['[', ']']).to_string(),
        port,
        path,
    })
}

/// Where the URL comes from.
#[derive(Debug, Clone)]
pub enum UrlSource {
    Fixed(String),
    File(PathBuf),
}

impl std::fmt::Display for UrlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UrlSource::Fixed(u) => write!(f, "--status-webhook {u}"),
            UrlSource::File(p) => write!(f, "--status-webhook-file {}", p.display()),
        }
    }
}

impl UrlSource {
    /// The URL now; `None`: none configured (the file is missing or empty).
    pub(crate) fn current(&self) -> Result<Option<String>, String> {
        let p = match self {
            UrlSource::Fixed(u) => return Ok(Some(u.clone())),
            UrlSource::File(p) => p,
        };
        match std::fs::read_to_string(p) {
            Ok(s) => Ok(Some(s.trim().to_string()).filter(|s| !s.is_empty())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("{}: {e}", p.display())),
        }
    }
}

/// What makes a POST due at once: the attachments and their health state,
/// and, per forward, its listener and reachability (not its counters).
/// A status as [`signature`] sees it.
type Signature = Vec<(String, String, String, String, String)>;

fn signature(s: &Status) -> Signature {
    s.attachments
        .iter()
        .flat_map(|a| {
            a.forwards.iter().map(move |f| {
                (
                    a.container_id.clone(),
                    a.state.clone(),
                    f.name.clone(),
                    f.listener.clone(),
                    f.reachability.state.clone(),
                )
            })
        })
        .chain(s.attachments.iter().map(|a| {
            (
                a.container_id.clone(),
                a.state.clone(),
                String::new(),
                String::new(),
                a.health
                    .as_ref()
                    .map(|h| format!("health {}", h.state))
                    .unwrap_or_default(),
            )
        }))
        .collect()
}

pub(crate) fn token(file: &Option<PathBuf>) -> Result<Option<String>, Error> {
    let Some(f) = file else { return Ok(None) };
    let t = std::fs::read_to_string(f).map_err(|source| Error::Read {
        path: f.clone(),
        source,
    })?;
    let t = t.trim();
    if t.is_empty() {
        return Err(Error::Empty(f.clone()));
    }
    Ok(Some(t.to_string()))
}

/// Bytes of a refusing answer read to quote it.
const SAID_MAX: usize = 1024;

/// A POST that failed: why, as a user would look for it, and the answer's
/// code if there was one.
struct Failed {
    why: String,
    code: Option<u16>,
}

impl From<String> for Failed {
    fn from(why: String) -> Failed {
        Failed { why, code: None }
    }
}

/// `json` gzip'd (the fast level: a report of 500 attachments of 4
/// forwards, 1.83 MB of JSON, goes out as 0.08 MB).
fn gzip(json: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(
        Vec::with_capacity(json.len() / 8),
        flate2::Compression::fast(),
    );
    // Writing into a Vec fails only when memory does.
    let _ = e.write_all(json);
    e.finish().unwrap_or_default()
}

/// POST `body` to `url` (`Content-Encoding: gzip` when `gzipped`); the
/// error says which step failed and why, as a user would look for it.
async fn post(
    url: &Url,
    body: Vec<u8>,
    gzipped: bool,
    token: Option<String>,
) -> Result<(), Failed> {
    const WAIT: Duration = Duration::from_secs(5);
    let host = url.host.as_str();
    let addrs = match tokio::time::timeout(WAIT, tokio::net::lookup_host((host, url.port))).await {
        Err(_) => return Err(format!("cannot resolve {host}: no answer within {WAIT:?}").into()),
        Ok(Err(e)) => {
            return Err(format!(
                "cannot resolve {host}: {e} (where the node has no cluster DNS, put the Service's ClusterIP in the URL)"
            )
            .into())
        }
        Ok(Ok(a)) => a.collect::<Vec<_>>(),
    };
    let addr = *addrs
        .first()
        .ok_or_else(|| format!("{host} resolves to no address"))?;
    let stream = match tokio::time::timeout(WAIT, tokio::net::TcpStream::connect(addr)).await {
        Err(_) => return Err(format!("no answer from {addr} within {WAIT:?}").into()),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            return Err(format!("{addr} refused the connection (nothing listens there)").into())
        }
        Ok(Err(e)) => return Err(format!("cannot connect to {addr}: {e}").into()),
        Ok(Ok(s)) => s,
    };
    let fail = |e: &dyn std::fmt::Display| format!("{addr}: {e}");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| fail(&e))?;
    tokio::spawn(conn);
    let mut req = Request::post(&url.path)
        .header("host", format!("{}:{}", url.host, url.port))
        .header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    if gzipped {
        req = req.header("content-encoding", "gzip");
    }
    let req = req
        .body(http_body_util::Full::new(Bytes::from(body)))
        .map_err(|e| fail(&e))?;
    let resp = tokio::time::timeout(Duration::from_secs(10), sender.send_request(req))
        .await
        .map_err(|_| format!("{addr} took the request but did not answer within 10 s"))?
        .map_err(|e| fail(&e))?;
    let code = resp.status().as_u16();
    if (200..300).contains(&code) {
        return Ok(());
    }
    Err(refusal(addr, resp, WAIT).await)
}

/// A refusing answer: its code and its first bytes at most (what the
/// operator says, not whatever a misdirected URL streams back), read for
/// `wait` at most.
async fn refusal(
    addr: std::net::SocketAddr,
    resp: hyper::Response<hyper::body::Incoming>,
    wait: Duration,
) -> Failed {
    use http_body_util::BodyExt;
    let code = resp.status().as_u16();
    let mut body = resp.into_body();
    let mut head = Vec::new();
    let read = async {
        while head.len() < SAID_MAX {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        head.extend_from_slice(&data);
                    }
                }
                _ => break,
            }
        }
    };
    let _ = tokio::time::timeout(wait, read).await;
    let said: String = String::from_utf8_lossy(&head)
        .trim()
        .chars()
        .take(200)
        .collect();
    let why = match code {
        401 | 403 => " (the token was refused)",
        _ => "",
    };
    Failed {
        why: format!("{addr} answered {code}{why}: {said:?}"),
        code: Some(code),
    }
}

/// Where and how often to post.
#[derive(Debug, Clone)]
pub struct Settings {
    pub url: UrlSource,
    /// `--status-webhook-token-file`.
    pub token_file: Option<PathBuf>,
    /// `--status-webhook-interval`: the heartbeat (zero: changes only).
    pub interval: Duration,
}

/// Whether the settings can be used: a URL given now must be usable, and
/// the token file readable.
pub fn check(settings: &Settings) -> Result<(), Error> {
    if let Ok(Some(url)) = settings.url.current() {
        parse(&url)?;
    }
    token(&settings.token_file)?;
    Ok(())
}

/// Start the webhook task, once [`check`]ed.
pub fn start(d: Arc<dyn Source>, settings: Settings) -> Result<(), Error> {
    check(&settings)?;
    tokio::spawn(run(d, settings));
    Ok(())
}

/// Wait up to `wait`, or until the URL differs from `url`; true if it did.
async fn url_changes(source: &UrlSource, url: &str, wait: Duration) -> bool {
    let end = tokio::time::Instant::now() + wait;
    while tokio::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_secs(1).min(end - tokio::time::Instant::now())).await;
        if source.current().ok().flatten().as_deref() != Some(url) {
            return true;
        }
    }
    false
}

async fn run(d: Arc<dyn Source>, settings: Settings) {
    let Settings {
        url: source,
        token_file,
        interval: every,
    } = settings;
    let mut changes = d.changes();
    let mut backoff = Duration::from_secs(1);
    let mut last: Option<String> = None;
    // The URL that refused a gzip'd report, posted whole until then (an
    // operator upgraded meanwhile takes gzip again).
    let mut whole_to: Option<(String, tokio::time::Instant)> = None;
    // Why nothing is posted, as last logged (said once, not every second).
    let mut idle: Option<String> = None;
    loop {
        let url = match source.current() {
            Ok(Some(u)) => u,
            other => {
                let why = match other {
                    Err(e) => format!("cannot read the URL: {e}"),
                    _ => format!("{source} names no URL"),
                };
                if idle.as_deref() != Some(why.as_str()) {
                    tracing::info!("status webhook: {why}: not posting");
                    idle = Some(why);
                }
                last = None;
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        idle = None;
        if last.as_deref() != Some(url.as_str()) {
            tracing::info!(%url, "status webhook: posting to this URL");
            last = Some(url.clone());
            backoff = Duration::from_secs(1);
        }
        let target = match parse(&url) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "status webhook failed: the URL is not usable; waiting for another");
                while !url_changes(&source, &url, Duration::from_secs(3600)).await {}
                continue;
            }
        };
        changes.borrow_and_update();
        let (sent, json) = report(&*d);
        let gzipped = whole_to
            .as_ref()
            .is_none_or(|(u, until)| *u != url || tokio::time::Instant::now() >= *until);
        let body = if gzipped { gzip(&json) } else { json };
        crate::sent::REPORTS.add(body.len());
        let outcome = match token(&token_file) {
            Ok(t) => post(&target, body, gzipped, t).await,
            Err(e) => Err(format!("the token: {e}").into()),
        };
        if let Err(e) = outcome {
            // An operator before gzip'd reports: 400 (not its JSON) or 415.
            if gzipped && matches!(e.code, Some(400 | 415)) {
                let again = gzip_again_after(every);
                tracing::info!(%url, answer = %e.why, again_in = %humantime::format_duration(again),
                    "status webhook: the receiver does not take gzip'd reports: posting them whole");
                whole_to = Some((url.clone(), tokio::time::Instant::now() + again));
                continue;
            }
            let e = e.why;
            tracing::warn!(%url, error = %e, retry_in = %humantime::format_duration(backoff), "status webhook failed");
            url_changes(&source, &url, backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(60));
            continue;
        }
        backoff = Duration::from_secs(1);
        if !news(&*d, &mut changes, &source, &url, sent, every).await {
            return;
        }
    }
}

/// The report's JSON now, and the signature of its status (what makes
/// the next one news). The audit lines since the last report ride along:
/// the operator writes them to its log, one place for the whole
/// cluster's. A report that fails loses them there (not in edgelinkd's
/// own log or files).
fn report(d: &dyn Source) -> (Signature, Vec<u8>) {
    let status = d.status();
    let sent = signature(&status);
    let audit = d
        .audit()
        .map(|a| a.take_unsent(AUDIT_PER_REPORT))
        .unwrap_or_default();
    let json = serde_json::to_vec(&Report {
        status: &status,
        audit,
    })
    .unwrap_or_default();
    (sent, json)
}

/// A report: the status, and the audit lines not sent yet.
#[derive(serde::Serialize)]
struct Report<'a> {
    #[serde(flatten)]
    status: &'a Status,
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "records")]
    audit: Vec<Arc<edgelink_access::Record>>,
}

/// The lines as a JSON array (serde's `Arc` takes its `rc` feature).
fn records<S: serde::Serializer>(
    lines: &[Arc<edgelink_access::Record>],
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_seq(lines.iter().map(|r| &**r))
}

/// Audit lines per report at most (~300 bytes each, before gzip); older
/// ones beyond it are dropped from the webhook (counted) and stay in
/// edgelinkd's log and files.
const AUDIT_PER_REPORT: usize = 5000;

/// How long a receiver that refused a gzip'd report gets them whole before
/// gzip is tried again: ten heartbeats (100 s by default), or ten minutes
/// without heartbeats. One refused report each time, posted whole at once.
fn gzip_again_after(every: Duration) -> Duration {
    if every.is_zero() {
        Duration::from_secs(600)
    } else {
        every * 10
    }
}

/// Wait until something is worth telling (a change, `every` since the
/// last POST, a new URL); false once the node is gone.
async fn news(
    d: &dyn Source,
    changes: &mut tokio::sync::watch::Receiver<u64>,
    source: &UrlSource,
    url: &str,
    sent: Signature,
    every: Duration,
) -> bool {
    let due = tokio::time::Instant::now() + every;
    loop {
        tokio::select! {
            r = changes.changed() => return r.is_ok(),
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        if (!every.is_zero() && tokio::time::Instant::now() >= due)
            || signature(&d.status()) != sent
            || source.current().ok().flatten().as_deref() != Some(url)
        {
            return true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{parse, UrlSource};

    #[test]
    fn parses_http_urls() {
        let u = parse("http://10.0.0.5:8080/hook").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("10.0.0.5", 8080, "/hook")
        );
        let u = parse("http://collector").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("collector", 80, "/")
        );
        assert!(parse("https://x").is_err());
    }

    #[test]
    fn a_url_file_is_read_again_and_missing_or_empty_means_none() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("url");
        let s = UrlSource::File(f.clone());
        assert_eq!(s.current(), Ok(None));
        std::fs::write(&f, "\n").unwrap();
        assert_eq!(s.current(), Ok(None));
        std::fs::write(&f, "http://10.0.0.5:8080/v1/status\n").unwrap();
        assert_eq!(
            s.current(),
            Ok(Some("http://10.0.0.5:8080/v1/status".into()))
        );
        std::fs::write(&f, "http://10.0.0.6:8080/v1/status").unwrap();
        assert_eq!(
            s.current(),
            Ok(Some("http://10.0.0.6:8080/v1/status".into()))
        );
    }
}
