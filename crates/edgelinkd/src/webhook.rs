//! `--status-webhook URL`: POST the status JSON when attachments come or
//! go, when a forward's listener or reachability changes (looked at each
//! second), and at least every `--status-webhook-interval` (the counters,
//! and a heartbeat: edgelink-operator takes a node that stopped reporting
//! as unknown). Only the latest state is sent; failures are retried with
//! exponential backoff (1 s to 60 s). With `--status-webhook-token-file`
//! each POST carries `Authorization: Bearer <the file's content>`, read
//! at each POST so a rotated token is taken: with edgelink-operator, the
//! pod's ServiceAccount token for the audience `edgelink-operator`, which
//! the kubelet projects and renews and the operator has reviewed (it
//! takes the report for the node of the pod the token is bound to only).
//! It runs in its own task and never blocks a relay.

use crate::daemon::Daemon;
use bytes::Bytes;
use hyper::Request;
use hyper_util::rt::TokioIo;
use std::sync::Arc;
use std::time::Duration;

struct Url {
    host: String,
    port: u16,
    path: String,
}

fn parse(url: &str) -> anyhow::Result<Url> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow::anyhow!("{url}: only http:// is supported"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].to_string()),
        None => (rest, "/".to_string()),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.contains('[') => (h.to_string(), p.parse()?),
        _ => (authority.to_string(), 80),
    };
    Ok(Url {
        host: host.trim_matches(['[', ']']).to_string(),
        port,
        path,
    })
}

/// What makes a POST due at once: the attachments and, per forward, its
/// listener and reachability (not its counters).
fn signature(s: &crate::model::Status) -> Vec<(String, String, String, String, String)> {
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
                String::new(),
            )
        }))
        .collect()
}

fn token(file: &Option<std::path::PathBuf>) -> anyhow::Result<Option<String>> {
    let Some(f) = file else { return Ok(None) };
    let t = std::fs::read_to_string(f).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?;
    let t = t.trim();
    anyhow::ensure!(!t.is_empty(), "{}: is empty", f.display());
    Ok(Some(t.to_string()))
}

async fn post(url: &Url, body: Vec<u8>, token: Option<String>) -> anyhow::Result<u16> {
    let stream = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::TcpStream::connect((url.host.as_str(), url.port)),
    )
    .await??;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let mut req = Request::post(&url.path)
        .header("host", format!("{}:{}", url.host, url.port))
        .header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req.body(http_body_util::Full::new(Bytes::from(body)))?;
    let resp = tokio::time::timeout(Duration::from_secs(10), sender.send_request(req)).await??;
    Ok(resp.status().as_u16())
}

pub fn start(d: Arc<Daemon>, url: String) -> anyhow::Result<()> {
    let target = parse(&url)?;
    let token_file = d.args.status_webhook_token_file.clone();
    token(&token_file)?;
    let every = d.args.status_webhook_interval;
    let mut changes = d.changes.subscribe();
    tokio::spawn(async move {
        let mut backoff = Duration::from_secs(1);
        loop {
            changes.borrow_and_update();
            let status = d.status();
            let sent = signature(&status);
            let body = serde_json::to_vec(&status).unwrap_or_default();
            let outcome = match token(&token_file) {
                Ok(t) => post(&target, body, t).await,
                Err(e) => Err(e),
            };
            match outcome {
                Ok(code) if (200..300).contains(&code) => {
                    backoff = Duration::from_secs(1);
                    let due = tokio::time::Instant::now() + every;
                    // Until something is worth telling, or the heartbeat.
                    loop {
                        tokio::select! {
                            r = changes.changed() => {
                                if r.is_err() {
                                    return;
                                }
                                break;
                            }
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        }
                        if (!every.is_zero() && tokio::time::Instant::now() >= due)
                            || signature(&d.status()) != sent
                        {
                            break;
                        }
                    }
                }
                outcome => {
                    tracing::warn!(?outcome, url = %url, retry_in = ?backoff, "status webhook failed");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(60));
                }
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse;

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
}
