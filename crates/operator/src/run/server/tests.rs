//! The endpoint in-process on a loopback port, the API server faked: which
//! reports are taken from whom (review item 12), and how slow clients are
//! bounded (review item 7).

use super::*;
use crate::run::auth::{FoundPod, Reviewer};
use edgelink_operator::sender::{Expect, NODE_NAME, POD_NAME, POD_UID};
use futures_util::future::BoxFuture;
use k8s_openapi::api::authentication::v1::TokenReviewStatus;
use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const EDGELINKD: &str = "system:serviceaccount:edgelink-system:edgelinkd";
const AUDIENCE: &str = "edgelink-operator";

/// The API server: the reviews of the tokens it knows, and the pods.
#[derive(Default)]
struct Fake {
    reviews: HashMap<String, TokenReviewStatus>,
    pods: HashMap<String, (String, String)>,
    calls: Arc<AtomicUsize>,
}

impl Reviewer for Fake {
    fn review<'a>(
        &'a self,
        token: &'a str,
        audience: &'a str,
    ) -> BoxFuture<'a, Result<TokenReviewStatus, String>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let r = match self.reviews.get(token) {
            // The API server answers for the audience asked.
            Some(r) if audience == AUDIENCE => r.clone(),
            _ => TokenReviewStatus {
                authenticated: Some(false),
                error: Some("invalid bearer token".into()),
                ..Default::default()
            },
        };
        Box::pin(async move { Ok(r) })
    }

    fn pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<FoundPod, String>> {
        let found = (namespace == "edgelink-system")
            .then(|| self.pods.get(name))
            .flatten()
            .map(|(uid, node)| (Some(uid.clone()), Some(node.clone())));
        Box::pin(async move { Ok(found) })
    }
}

fn review(user: &str, extra: &[(&str, &str)]) -> TokenReviewStatus {
    serde_json::from_value(serde_json::json!({
        "authenticated": true,
        "audiences": [AUDIENCE],
        "user": {
            "username": user,
            "extra": extra.iter().map(|(k, v)| (k.to_string(), vec![v.to_string()]))
                .collect::<std::collections::BTreeMap<_, _>>(),
        }
    }))
    .unwrap()
}

fn pod<'a>(name: &'a str, uid: &'a str) -> [(&'static str, &'a str); 2] {
    [(POD_NAME, name), (POD_UID, uid)]
}

/// The API server of these tests: edgelinkd of kedge1 (1.30 and newer:
/// the review names the node), of kedge2 (older: the pod only), a token of
/// another ServiceAccount, and a pod of edgelinkd that was replaced.
fn cluster() -> Fake {
    let mut f = Fake::default();
    let mut k1 = pod("edgelinkd-a", "uid-a").to_vec();
    k1.push((NODE_NAME, "kedge1"));
    f.reviews.insert("t-kedge1".into(), review(EDGELINKD, &k1));
    f.reviews.insert(
        "t-kedge2".into(),
        review(EDGELINKD, &pod("edgelinkd-b", "uid-b")),
    );
    f.pods
        .insert("edgelinkd-b".into(), ("uid-b".into(), "kedge2".into()));
    f.reviews.insert(
        "t-replaced".into(),
        review(EDGELINKD, &pod("edgelinkd-c", "uid-old")),
    );
    f.pods
        .insert("edgelinkd-c".into(), ("uid-new".into(), "kedge3".into()));
    let mut other = pod("app-0", "uid-x").to_vec();
    other.push((NODE_NAME, "kedge1"));
    f.reviews.insert(
        "t-app".into(),
        review("system:serviceaccount:hil:default", &other),
    );
    f
}

/// The app on a loopback port with `limits`, and its address.
async fn start_with(fake: Fake, limits: Limits) -> (Arc<App>, SocketAddr) {
    let (reports, _rx) = Reports::new(
        std::time::Duration::from_secs(3),
        std::time::Duration::from_secs(35),
    );
    let expect = Expect {
        audience: AUDIENCE.into(),
        namespace: "edgelink-system".into(),
        service_account: "edgelinkd".into(),
    };
    let app = Arc::new(App::new(
        Arc::new(Metrics::new()),
        Arc::new(reports),
        Arc::new(crate::run::grants::Holds::new(
            std::time::Duration::from_secs(3),
        )),
        Default::default(),
        Auth::new(expect, Box::new(fake)),
    ));
    let l = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(serve(app.clone(), l, limits));
    (app, addr)
}

async fn start() -> (Arc<App>, SocketAddr) {
    start_with(cluster(), LIMITS).await
}

/// One request; the status code and the body.
async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    auth: Option<&str>,
    body: &[u8],
) -> (u16, String) {
    call_with(addr, method, path, auth, &[], body).await
}

/// [`call`] with more headers.
async fn call_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    auth: Option<&str>,
    headers: &[(&str, &str)],
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
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
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

fn report(node: &str) -> Vec<u8> {
    format!(r#"{{"node": "{node}", "attachments": []}}"#).into_bytes()
}

async fn post(addr: SocketAddr, token: Option<&str>, body: &[u8]) -> (u16, String) {
    let auth = token.map(|t| format!("Bearer {t}"));
    call(addr, "POST", "/v1/status", auth.as_deref(), body).await
}

#[tokio::test]
async fn reports_need_edgelinkds_token_the_lead_and_edgelinkds_json() {
    let (app, addr) = start().await;
    let r = report("kedge1");
    assert_eq!(call(addr, "POST", "/v1/status", None, &r).await.0, 401);
    assert_eq!(post(addr, Some("wrong"), &r).await.0, 401);
    assert_eq!(
        call(addr, "POST", "/v1/status", Some("t-kedge1"), &r)
            .await
            .0,
        401,
        "no Bearer"
    );
    let (code, body) = post(addr, Some("t-app"), &r).await;
    assert_eq!(code, 403, "another ServiceAccount's token: {body}");
    let (code, body) = post(addr, Some("t-kedge1"), &r).await;
    assert_eq!((code, body.as_str()), (503, "not the leader: retry\n"));
    app.leader.store(true, Ordering::Relaxed);
    let (code, body) = post(addr, Some("t-kedge1"), b"not json").await;
    assert_eq!(code, 400);
    assert!(
        body.starts_with("report is not edgelinkd's status JSON"),
        "{body}"
    );
    let (code, body) = post(addr, Some("t-kedge1"), b"{}").await;
    assert_eq!((code, body.as_str()), (400, "report has no node name\n"));
    let big = vec![b' '; MAX_REPORT + 1];
    assert_eq!(post(addr, Some("t-kedge1"), &big).await.0, 413);
    assert!(app.reports.get("kedge1").is_none(), "nothing taken so far");
    assert_eq!(post(addr, Some("t-kedge1"), &r).await.0, 204);
    assert!(app.reports.get("kedge1").is_some());
    assert_eq!(call(addr, "GET", "/v1/status", None, b"").await.0, 405);
    let m = app.metrics.render();
    assert!(m.contains("edgelink_operator_reports_total 1\n"), "{m}");
    assert!(
        m.contains("edgelink_operator_reports_refused_total 8\n"),
        "{m}"
    );
}

fn gzip(b: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

#[tokio::test]
async fn gzip_reports_are_taken_up_to_their_decompressed_bound_and_other_codings_refused() {
    let (app, addr) = start().await;
    app.leader.store(true, Ordering::Relaxed);
    let send = |enc: &'static str, body: Vec<u8>| async move {
        let auth = "Bearer t-kedge1";
        call_with(
            addr,
            "POST",
            "/v1/status",
            Some(auth),
            &[("content-encoding", enc)],
            &body,
        )
        .await
    };
    // A report of ~500 attachments is more than MAX_REPORT whole, far
    // less gzip'd: taken.
    let mut big = report("kedge1");
    big.truncate(big.len() - 1);
    big.extend_from_slice(br#", "pad": ""#);
    big.extend(std::iter::repeat_n(b'x', MAX_REPORT + 1));
    big.extend_from_slice(br#""}"#);
    let (code, body) = send("gzip", gzip(&big)).await;
    assert_eq!(code, 204, "{body}");
    assert!(app.reports.get("kedge1").is_some());
    // Whole, the same report is refused, and says why.
    let (code, body) = send("identity", big).await;
    assert_eq!(code, 413, "{body}");
    assert!(body.contains("gzips its reports"), "{body}");
    // A small body that inflates past the bound: refused once the bound
    // is read.
    let bomb = gzip(&vec![b' '; MAX_REPORT_JSON + 1]);
    assert!(bomb.len() < MAX_REPORT / 16, "{}", bomb.len());
    let (code, body) = send("gzip", bomb).await;
    assert_eq!(code, 413, "{body}");
    assert!(body.contains("once decompressed"), "{body}");
    let (code, body) = send("gzip", b"not gzip".to_vec()).await;
    assert_eq!(code, 400, "{body}");
    assert!(body.starts_with("report is not valid gzip"), "{body}");
    let (code, body) = send("br", gzip(&report("kedge1"))).await;
    assert_eq!(code, 415, "{body}");
    assert!(body.contains(r#""br" is not taken"#), "{body}");
}

#[tokio::test]
async fn a_node_cannot_report_for_another_node() {
    let (app, addr) = start().await;
    app.leader.store(true, Ordering::Relaxed);
    // edgelinkd of kedge1 (the review names the node).
    let (code, body) = post(addr, Some("t-kedge1"), &report("kedge2")).await;
    assert_eq!(
        (code, body.as_str()),
        (
            403,
            "a report for node \"kedge2\" sent by edgelinkd of node \"kedge1\"\n"
        )
    );
    assert!(app.reports.get("kedge2").is_none());
    // edgelinkd of kedge2 (before 1.30: the node of its pod).
    assert_eq!(post(addr, Some("t-kedge2"), &report("kedge1")).await.0, 403);
    assert!(app.reports.get("kedge1").is_none());
    assert_eq!(post(addr, Some("t-kedge2"), &report("kedge2")).await.0, 204);
    assert_eq!(post(addr, Some("t-kedge1"), &report("kedge1")).await.0, 204);
    assert!(app.reports.get("kedge1").is_some() && app.reports.get("kedge2").is_some());
    // The token of a pod since replaced (same name, another UID).
    let (code, body) = post(addr, Some("t-replaced"), &report("kedge3")).await;
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("gone or was replaced"), "{body}");
}

#[tokio::test]
async fn heartbeats_are_checked_as_reports_are_and_keep_a_node_heard() {
    use edgelink_operator::nodes::Heard;
    let (app, addr) = start().await;
    let hb = |node: &str| format!(r#"{{"node": "{node}", "intervalMs": 1000}}"#).into_bytes();
    let beat = |token: Option<&'static str>, body: Vec<u8>| async move {
        let auth = token.map(|t| format!("Bearer {t}"));
        call(addr, "POST", "/v1/heartbeat", auth.as_deref(), &body).await
    };
    assert_eq!(beat(None, hb("kedge1")).await.0, 401);
    assert_eq!(beat(Some("t-kedge1"), hb("kedge1")).await.0, 503, "standby");
    app.leader.store(true, Ordering::Relaxed);
    assert_eq!(
        beat(Some("t-kedge1"), hb("kedge2")).await.0,
        403,
        "another node's"
    );
    let (code, body) = beat(Some("t-kedge1"), b"{}".to_vec()).await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(app.reports.heard_state("kedge1"), Heard::Never);
    let (code, body) = beat(Some("t-kedge1"), hb("kedge1")).await;
    assert_eq!((code, body.as_str()), (200, r#"{"holdMs":3000}"#));
    assert_eq!(app.reports.heard_state("kedge1"), Heard::Alive);
    assert_eq!(call(addr, "GET", "/v1/heartbeat", None, b"").await.0, 405);
    let m = app.metrics.render();
    assert!(m.contains("edgelink_operator_heartbeats_total 1\n"), "{m}");
}

#[tokio::test]
async fn a_heartbeat_is_granted_its_own_nodes_virtual_addresses_only() {
    let (app, addr) = start().await;
    app.leader.store(true, Ordering::Relaxed);
    app.holds.leading();
    let pods = vec![
        ("kedge1".to_string(), "hil/d-kedge1-0".to_string()),
        ("kedge2".to_string(), "hil/d-kedge2-0".to_string()),
    ];
    app.holds
        .lock()
        .place("hil/d", pods.clone(), Some("hil/d-kedge2-0".into()));
    let beat = |body: &'static str| async move {
        call(
            addr,
            "POST",
            "/v1/heartbeat",
            Some("Bearer t-kedge1"),
            body.as_bytes(),
        )
        .await
    };
    // kedge1 claims kedge2's pod: nothing for it; its own is told to let go.
    let (code, body) = beat(
        r#"{"node": "kedge1", "intervalMs": 500, "holding": ["hil/d-kedge2-0", "hil/d-kedge1-0"]}"#,
    )
    .await;
    assert_eq!(
        (code, body.as_str()),
        (200, r#"{"releases":["hil/d-kedge1-0"],"holdMs":3000}"#)
    );
    app.holds
        .lock()
        .place("hil/d", pods, Some("hil/d-kedge1-0".into()));
    // Just after taking the lead, only a pod that holds already is granted.
    let (_, body) = beat(r#"{"node": "kedge1", "intervalMs": 500}"#).await;
    assert_eq!(body, r#"{"holdMs":3000}"#);
    let (_, body) =
        beat(r#"{"node": "kedge1", "intervalMs": 500, "holding": ["hil/d-kedge1-0"]}"#).await;
    assert_eq!(body, r#"{"holds":["hil/d-kedge1-0"],"holdMs":3000}"#);
}

#[tokio::test]
async fn a_heartbeat_gets_its_nodes_access_rules_only_when_its_generation_differs() {
    use edgelink_access::wire::{AccessRules, AttachmentAccess, Client};
    let (app, addr) = start().await;
    app.leader.store(true, Ordering::Relaxed);
    app.holds.leading();
    let beat = |body: String| async move {
        call(
            addr,
            "POST",
            "/v1/heartbeat",
            Some("Bearer t-kedge1"),
            body.as_bytes(),
        )
        .await
    };
    // Before the rules were made: no "access" (edgelinkd keeps its own).
    let (code, body) = beat(r#"{"node": "kedge1", "intervalMs": 500}"#.into()).await;
    assert_eq!((code, body.as_str()), (200, r#"{"holdMs":3000}"#));
    let attachments = std::collections::BTreeMap::from([(
        "hil/device01-01-0".to_string(),
        AttachmentAccess {
            device: "hil/device01-01".into(),
            allowed: Some(vec![Client {
                address: "10.244.1.5".parse().unwrap(),
                pod: "ci/runner-1".into(),
            }]),
            lease: None,
        },
    )]);
    let (rules, _) = edgelink_operator::access::fit(attachments, 1 << 20);
    app.access
        .lock()
        .unwrap()
        .set(std::collections::BTreeMap::from([(
            "kedge1".to_string(),
            rules.clone(),
        )]));
    for have in [
        r#""#,
        r#", "access": """#,
        r#", "access": "0000000000000000""#,
    ] {
        let (code, body) = beat(format!(r#"{{"node": "kedge1", "intervalMs": 500{have}}}"#)).await;
        assert_eq!(code, 200);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["holdMs"], 3000);
        let got: AccessRules = serde_json::from_value(v["access"].clone()).unwrap();
        assert_eq!(got, rules, "{have}");
    }
    let (_, body) = beat(format!(
        r#"{{"node": "kedge1", "intervalMs": 500, "access": "{}"}}"#,
        rules.generation
    ))
    .await;
    assert_eq!(body, r#"{"holdMs":3000}"#, "the same generation: left out");
}

#[tokio::test]
async fn a_reviewed_token_is_kept_a_while() {
    let fake = cluster();
    let calls = fake.calls.clone();
    let (app, addr) = start_with(fake, LIMITS).await;
    app.leader.store(true, Ordering::Relaxed);
    for _ in 0..3 {
        assert_eq!(post(addr, Some("t-kedge1"), &report("kedge1")).await.0, 204);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one review for 3 reports");
    // A refused token is reviewed again (nothing kept), and the kept review
    // of kedge1's token does not make kedge2's reports its own.
    for _ in 0..2 {
        assert_eq!(post(addr, Some("wrong"), &report("kedge1")).await.0, 401);
    }
    assert_eq!(post(addr, Some("t-kedge1"), &report("kedge2")).await.0, 403);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn readyz_is_ok_on_a_standby_and_on_a_leader_that_listed_the_devices() {
    let (app, addr) = start().await;
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
    assert_eq!(call(addr, "GET", "/nothing", None, b"").await.0, 404);
}

/// Whether the server still holds `s` open (reading what it sent).
async fn held(s: &mut tokio::net::TcpStream) -> bool {
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(Duration::from_millis(1), s.read(&mut buf)).await {
            Err(_) => return true,
            Ok(Ok(0)) | Ok(Err(_)) => return false,
            Ok(Ok(_)) => continue,
        }
    }
}

async fn held_count(clients: &mut [tokio::net::TcpStream]) -> usize {
    let mut n = 0;
    for s in clients {
        n += usize::from(held(s).await);
    }
    n
}

#[tokio::test]
async fn unfinished_heads_are_capped_and_closed_and_probes_answered() {
    const CAP: usize = 4;
    let limits = Limits {
        max_connections: CAP,
        header_timeout: Duration::from_secs(1),
        conn_timeout: Duration::from_secs(600),
    };
    let (_app, addr) = start_with(cluster(), limits).await;
    let mut clients = Vec::new();
    for _ in 0..10 * CAP {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"POST /v1/status HTTP/1.1\r\nhost: x\r\nx-slow: ")
            .await
            .unwrap();
        clients.push(s);
    }
    // At most the cap is held (bounded wait: the server accepts them all).
    let mut now = usize::MAX;
    for _ in 0..200 {
        now = held_count(&mut clients).await;
        if now <= CAP {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(now <= CAP, "{now} unfinished connections held, cap {CAP}");
    // A probe is answered with the cap full of waiting clients.
    assert_eq!(call(addr, "GET", "/healthz", None, b"").await.0, 200);
    // A head longer than the buffer is refused at once.
    let mut big = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut head = b"GET /healthz HTTP/1.1\r\nx-big: ".to_vec();
    head.resize(edgelink_http_limits::MAX_BUF * 4, b'a');
    let _ = big.write_all(&head).await;
    // Bounded: before the fix it was buffered until the connection's end.
    let mut answer = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(10), big.read_to_end(&mut answer)).await;
    assert!(ended.is_ok(), "a 64 KiB request head is still being read");
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
        "{answer}"
    );
    // The header timeout (1 s) closes the rest; 30 s of slack.
    for _ in 0..600 {
        now = held_count(&mut clients).await;
        if now == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(now, 0, "unfinished connections outlived the header timeout");
}

#[test]
fn a_reports_audit_lines_are_written_one_per_line_with_the_node() {
    let report: NodeReport = serde_json::from_str(
        r#"{"node": "kedge1", "attachments": [], "audit": [
            {"time": "2026-11-27T06:00:00.000Z", "kind": "audit", "device": "hil/device01-01",
             "client": "ci/runner-a", "ended": "closed"},
            {"kind": "something else"},
            {"time": "2026-11-27T06:00:01.000Z", "kind": "audit", "device": "hil/device01-01",
             "client": "10.244.2.7", "ended": "refused-by-policy"}]}"#,
    )
    .unwrap();
    let text = String::from_utf8(audit_text("kedge1", report.audit)).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "only audit lines: {text}");
    assert_eq!(lines[0]["node"], "kedge1");
    assert_eq!(lines[0]["client"], "ci/runner-a");
    assert_eq!(lines[1]["ended"], "refused-by-policy");
    // A report without them (an older edgelinkd) has none.
    let old: NodeReport = serde_json::from_str(r#"{"node": "kedge1"}"#).unwrap();
    assert!(old.audit.is_empty());
}
