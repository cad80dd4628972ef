//! The heartbeat: `{"node": ..., "intervalMs": ...}` POSTed to the status
//! webhook's sibling path (`/v1/status` -> `/v1/heartbeat`) every
//! `--status-webhook-heartbeat`, on one kept-alive connection, with the
//! webhook's token. edgelink-operator takes a node that sends them and
//! goes silent as lost within seconds (its `--node-lost-after`), and moves
//! the node's proxies out of their Services; the full report stays on its
//! own, slower, schedule (`webhook`).
//!
//! The heartbeat also says which attachments hold their Device's virtual
//! address, and the answer grants them for a while or takes them back
//! ([`crate::grants`]); a heartbeat goes at once when what is held
//! changed by an answer (a release), so the operator can grant the
//! address elsewhere without waiting for the next tick.
//!
//! The answer also carries the node's access rules (who may connect
//! through each proxy pod: edgelink-access) when they differ from the
//! generation the heartbeat says the node has; they are kept in the state
//! directory, for the next daemon.
//!
//! An operator without the path (404) is asked again a minute later, and
//! each failure is logged once until it changes.

use crate::grants::{Answer, Grants, Mode};
use crate::webhook::{parse, token, Url, UrlSource};
use bytes::Bytes;
use hyper::Request;
use hyper_util::rt::TokioIo;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Where and how often.
#[derive(Debug, Clone)]
pub struct Settings {
    pub url: UrlSource,
    pub token_file: Option<PathBuf>,
    pub node: String,
    pub every: Duration,
    /// What the answers grant.
    pub grants: Arc<Grants>,
    /// The access rules the answers bring, and where they are kept.
    pub access: Arc<edgelink_access::Access>,
    pub state_dir: PathBuf,
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

/// One heartbeat on `sender`; the answer's status code and body.
async fn beat(
    sender: &mut Sender,
    url: &Url,
    path: &str,
    body: &[u8],
    tok: Option<String>,
) -> Result<(u16, Bytes), String> {
    sender.ready().await.map_err(|e| e.to_string())?;
    crate::sent::HEARTBEATS.add(body.len());
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
    // Read the (short) answer; the connection can take the next one then.
    use http_body_util::BodyExt;
    // At most MAX_ANSWER of it: the grants of one node's attachments.
    let limited = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER);
    let body = match tokio::time::timeout(Duration::from_secs(1), limited.collect()).await {
        Ok(Ok(b)) => b.to_bytes(),
        _ => Bytes::new(),
    };
    Ok((code, body))
}

/// The largest answer read (500 attachments' grants are ~40 KiB; their
/// access rules, with 100 client pods each, ~4 MiB); a longer one is not
/// read, as one cut short.
const MAX_ANSWER: usize = 8 << 20;

/// The access rules of an answer, when it brings them.
#[derive(serde::Deserialize)]
struct AccessAnswer {
    #[serde(default)]
    access: Option<edgelink_access::AccessRules>,
}

/// Take the access rules an answer brings (the whole set, for every
/// attachment of the node), and keep them in `state_dir`. An answer
/// without them, or one that cannot be read, changes nothing.
fn take_access(access: &edgelink_access::Access, state_dir: &std::path::Path, body: &[u8]) {
    let Ok(AccessAnswer {
        access: Some(rules),
    }) = serde_json::from_slice(body)
    else {
        return;
    };
    let generation = rules.generation.clone();
    let changed = access.replace(rules);
    tracing::info!(%generation, attachments_changed = changed.len(), "access rules from the operator");
    if let Err(e) = access.save(state_dir) {
        tracing::warn!(error = %e, "cannot keep the access rules for the next daemon");
    }
}

/// What an answer means for the grants: an operator that grants
/// addresses answers 200 with JSON that has `holdMs`; one without them
/// (204, or JSON without it) leaves the node unmanaged. A 200 that cannot
/// be read (cut short, too long, not JSON) changes nothing: the grants
/// run out, as with no answer (never unmanaged: that would hold every
/// address, wherever the operator put it).
fn take_answer(grants: &Grants, code: u16, body: &[u8], sent: tokio::time::Instant) {
    let answer = match code {
        200 => match serde_json::from_slice::<Answer>(body) {
            Ok(a) => a,
            Err(e) => {
                tracing::debug!(error = %e, "heartbeat: an answer that cannot be read: ignored");
                return;
            }
        },
        _ => Answer::default(),
    };
    grants.answered(&answer, sent);
}

/// Start the heartbeat task (nothing when `every` is zero).
pub fn start(s: Settings) {
    if s.every.is_zero() {
        return;
    }
    tokio::spawn(run(s));
}

async fn run(s: Settings) {
    let mut tick = tokio::time::interval(s.every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut b = Beater {
        s,
        said: None,
        conn: None,
    };
    // One extra heartbeat at most between two ticks.
    let mut again = false;
    loop {
        let extra = std::mem::take(&mut again);
        if !extra {
            tick.tick().await;
        }
        again = b.once().await && !extra;
    }
}

/// The heartbeat between ticks: its connection, and what it last logged
/// (each failure is logged once until it changes).
struct Beater {
    s: Settings,
    said: Option<String>,
    conn: Option<(String, Sender)>,
}

impl Beater {
    fn say(&mut self, what: String, warn: bool) {
        if self.said.as_deref() != Some(what.as_str()) {
            if warn {
                tracing::warn!("heartbeat: {what}");
            } else {
                tracing::info!("heartbeat: {what}");
            }
            self.said = Some(what);
        }
    }

    /// The URL now, with a connection to it; `None`: nothing to send to
    /// (no operator: the node holds its attachments' addresses).
    async fn connected(&mut self) -> Option<Url> {
        let url_text = match self.s.url.current() {
            Ok(Some(u)) => u,
            Ok(None) => {
                self.s.grants.set_mode(Mode::Unmanaged);
                self.conn = None;
                return None;
            }
            Err(_) => {
                self.conn = None;
                return None;
            }
        };
        // A URL that does not parse: the webhook task says why.
        let url = parse(&url_text).ok()?;
        let stale = self
            .conn
            .as_ref()
            .is_none_or(|(u, c)| *u != url_text || c.is_closed());
        if stale {
            match connect(&url).await {
                Ok(c) => self.conn = Some((url_text, c)),
                Err(e) => {
                    self.conn = None;
                    self.say(e, true);
                    return None;
                }
            }
        }
        Some(url)
    }

    /// One heartbeat, its answer taken; whether what the node holds
    /// changed with it (then the next goes at once).
    async fn once(&mut self) -> bool {
        let Some(url) = self.connected().await else {
            return false;
        };
        let path = heartbeat_path(&url.path);
        let tok = match token(&self.s.token_file) {
            Ok(t) => t,
            Err(e) => {
                self.say(format!("the token: {e}"), true);
                return false;
            }
        };
        let sent = tokio::time::Instant::now();
        let holding = self.s.grants.holding(sent);
        let body =
            serde_json::json!({"node": self.s.node, "intervalMs": self.s.every.as_millis() as u64,
            "holding": holding, "access": self.s.access.generation()})
            .to_string();
        let Some((_, sender)) = self.conn.as_mut() else {
            return false;
        };
        match beat(sender, &url, &path, body.as_bytes(), tok).await {
            Ok((code @ (204 | 200), answer)) => {
                self.say(format!("beating every {:?} to {path}", self.s.every), false);
                take_answer(&self.s.grants, code, &answer, sent);
                take_access(&self.s.access, &self.s.state_dir, &answer);
                // A release (or a new grant): tell the operator now.
                return self.s.grants.holding(tokio::time::Instant::now()) != holding;
            }
            Ok((404, _)) => {
                self.say(format!("{path} answered 404 (an operator without heartbeats): asking again in a minute"), true);
                self.s.grants.set_mode(Mode::Unmanaged);
                self.conn = None;
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            Ok((code, _)) => {
                // 503 from a standby operator: the next connection may reach the leader.
                self.say(format!("{path} answered {code}"), true);
                self.conn = None;
            }
            Err(e) => {
                self.say(format!("{path}: {e}"), true);
                self.conn = None;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_that_cannot_be_read_changes_no_grant_and_never_unmanages() {
        let g = Grants::default();
        let t0 = tokio::time::Instant::now();
        take_answer(&g, 200, br#"{"holds":["hil/p-0"],"holdMs":1000}"#, t0);
        assert_eq!(g.mode(), Mode::Managed);
        let later = t0 + Duration::from_millis(500);
        take_answer(&g, 200, b"", later);
        take_answer(&g, 200, br#"{"holds":["hil/p-0"],"holdMs":"#, later);
        assert_eq!(g.mode(), Mode::Managed, "not unmanaged by a broken answer");
        assert_eq!(
            g.until("hil/p-0", later),
            Some(t0 + Duration::from_millis(1000)),
            "not renewed"
        );
        // An operator without grants (204) does leave the node unmanaged.
        take_answer(&g, 204, b"", later);
        assert_eq!(g.mode(), Mode::Unmanaged);
    }

    #[test]
    fn an_answer_with_access_rules_replaces_and_keeps_them() {
        let dir = tempfile::tempdir().unwrap();
        let access = edgelink_access::Access::default();
        let slot = access.slot("lab/d-0");
        let ip = "10.0.0.9".parse().unwrap();
        // Grants only: the rules stay as they are.
        take_access(&access, dir.path(), br#"{"holds":[],"holdMs":1000}"#);
        take_access(&access, dir.path(), br#"{"access": "#);
        assert_eq!(access.generation(), "");
        let answer = br#"{"holds":[],"access":{"generation":"g1","attachments":
            {"lab/d-0":{"device":"lab/d","allowed":[{"address":"10.0.0.1","pod":"ci/a"}]}}}}"#;
        take_access(&access, dir.path(), answer);
        assert_eq!(access.generation(), "g1");
        assert_eq!(
            slot.verdict(ip),
            edgelink_access::Verdict::Refused(edgelink_access::Refusal::Policy)
        );
        let kept = edgelink_access::Access::default();
        kept.load(dir.path()).unwrap();
        assert_eq!(kept.generation(), "g1");
    }

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
