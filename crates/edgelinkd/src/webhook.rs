//! `--status-webhook URL`: POST the status JSON whenever attachments or
//! forward states change, so something outside the cluster can see them.
//! Only the latest state is sent; failures are retried with exponential
//! backoff (1 s to 60 s). It runs in its own task and never blocks a relay.

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

async fn post(url: &Url, body: Vec<u8>) -> anyhow::Result<u16> {
    let stream = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::TcpStream::connect((url.host.as_str(), url.port)),
    )
    .await??;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = Request::post(&url.path)
        .header("host", format!("{}:{}", url.host, url.port))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(Bytes::from(body)))?;
    let resp = tokio::time::timeout(Duration::from_secs(10), sender.send_request(req)).await??;
    Ok(resp.status().as_u16())
}

pub fn start(d: Arc<Daemon>, url: String) -> anyhow::Result<()> {
    let target = parse(&url)?;
    let mut changes = d.changes.subscribe();
    tokio::spawn(async move {
        let mut backoff = Duration::from_secs(1);
        loop {
            changes.borrow_and_update();
            let body = serde_json::to_vec(&d.status()).unwrap_or_default();
            match post(&target, body).await {
                Ok(code) if (200..300).contains(&code) => {
                    backoff = Duration::from_secs(1);
                    if changes.changed().await.is_err() {
                        return;
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
