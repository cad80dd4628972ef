//! The heartbeat: `{"node": ..., "intervalMs": ...}` POSTed to the status
//! webhook's sibling path (`/v1/status` -> `/v1/heartbeat`) every
//! `--status-webhook-heartbeat`, on one kept-alive connection, with the
//! webhook's token. edgelink-operator takes a node that sends them and
//! goes silent as lost within seconds (its `--node-lost-after`), and moves
//! the node's proxies out of their Services; the full report stays on its
//! own, slower, schedule (`webhook`).
//!
//! An operator without the path (404) is asked again a minute later, and
//! each failure is logged once until it changes.

use crate::webhook::{parse, token, Url, UrlSource};
use bytes::Bytes;
use hyper::Request;
use hyper_util::rt::TokioIo;
use std::path::PathBuf;
use std::time::Duration;

/// Where and how often.
#[derive(Debug, Clone)]
pub struct Settings {
    pub url: UrlSource,
    pub token_file: Option<PathBuf>,
    pub node: String,
    pub every: Duration,
}

/// The heartbeat's path beside the status webhook's: its last segment
/// replaced (`/v1/status` -> `/v1/heartbeat`).
pub fn heartbeat_path(status_path: &str) -> String {
    match status_path.rsplit_once('/') {
        Some((dir, _)) => format!("{dir}/heartbeat"),
        None => "/heartbeat".into(),
    }
}

type Sender = hyper::client::conn::http1::SendRequest<http_body_util::Full<Bytes>>;

async fn connect(url: &Url) -> Result<Sender, String> {
    const WAIT: Duration = Duration::from_secs(2);
    let host = url.host.as_str();
    let addr = tokio::time::timeout(WAIT, tokio::net::lookup_host((host, url.port)))
        .await
        .map_err(|_| format!("cannot resolve {host}: no answer within {WAIT:?}"))?
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host} resolves to no address"))?;
    let stream = tokio::time::timeout(WAIT, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| format!("no answer from {addr} within {WAIT:?}"))?
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("{addr}: {e}"))?;
    tokio::spawn(conn);
    Ok(sender)
}

/// One heartbeat on `sender`; the answer's status code.
async fn beat(
    sender: &mut Sender,
    url: &Url,
    path: &str,
    body: &[u8],
    tok: Option<String>,
) -> Result<u16, String> {
    sender.ready().await.map_err(|e| e.to_string())?;
    let mut req = Request::post(path)
        .header("host", format!("{}:{}", url.host, url.port))
        .header("content-type", "application/json");
    if let Some(t) = tok {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req
        .body(http_body_util::Full::new(Bytes::copy_from_slice(body)))
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(Duration::from_secs(2), sender.send_request(req))
        .await
        .map_err(|_| "no answer within 2 s".to_string())?
        .map_err(|e| e.to_string())?;
    let code = resp.status().as_u16();
    // Read the (short) answer so the connection can take the next one.
    use http_body_util::BodyExt;
    let _ = tokio::time::timeout(Duration::from_secs(1), resp.into_body().collect()).await;
    Ok(code)
}

/// Start the heartbeat task (nothing when `every` is zero).
pub fn start(s: Settings) {
    if s.every.is_zero() {
        return;
    }
    tokio::spawn(run(s));
}

async fn run(s: Settings) {
    let body =
        serde_json::json!({"node": s.node, "intervalMs": s.every.as_millis() as u64}).to_string();
    let mut said: Option<String> = None;
    let mut say = |what: String, warn: bool| {
        if said.as_deref() != Some(what.as_str()) {
            if warn {
                tracing::warn!("heartbeat: {what}");
            } else {
                tracing::info!("heartbeat: {what}");
            }
            said = Some(what);
        }
    };
    let mut tick = tokio::time::interval(s.every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut conn: Option<(String, Sender)> = None;
    loop {
        tick.tick().await;
        let Ok(Some(url_text)) = s.url.current() else {
            conn = None;
            continue;
        };
        let Ok(url) = parse(&url_text) else {
            continue; // the webhook task says why
        };
        let path = heartbeat_path(&url.path);
        if conn
            .as_ref()
            .is_none_or(|(u, c)| *u != url_text || c.is_closed())
        {
            conn = match connect(&url).await {
                Ok(c) => Some((url_text.clone(), c)),
                Err(e) => {
                    say(e, true);
                    continue;
                }
            };
        }
        let Some((_, sender)) = conn.as_mut() else {
            continue;
        };
        let tok = match token(&s.token_file) {
            Ok(t) => t,
            Err(e) => {
                say(format!("the token: {e}"), true);
                continue;
            }
        };
        match beat(sender, &url, &path, body.as_bytes(), tok).await {
            Ok(204 | 200) => say(format!("beating every {:?} to {path}", s.every), false),
            Ok(404) => {
                say(format!("{path} answered 404 (an operator without heartbeats): asking again in a minute"), true);
                conn = None;
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            Ok(code) => {
                // 503 from a standby operator: the next connection may reach the leader.
                say(format!("{path} answered {code}"), true);
                conn = None;
            }
            Err(e) => {
                say(format!("{path}: {e}"), true);
                conn = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heartbeat_lives_beside_the_status_path() {
        assert_eq!(heartbeat_path("/v1/status"), "/v1/heartbeat");
        assert_eq!(heartbeat_path("/"), "/heartbeat");
        assert_eq!(
            heartbeat_path("/edgelink/v1/status"),
            "/edgelink/v1/heartbeat"
        );
    }
}
