//! A Device left alone is reconciled from the caches with no API request:
//! a reconcile against a stand-in API server that answers and records
//! every request, first with empty caches of the operator's objects (the
//! objects are made), then with the caches holding what was made and the
//! Device holding the status written.

use crate::run::caches::Caches;
use crate::run::context::Ctx;
use crate::run::controller::reconcile;
use edgelink_operator::crd::{Device, DeviceStatus, EdgeNetwork};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::PartialObjectMeta;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::Event;
use kube::Resource;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// (method, path, body) of every request.
type Log = Arc<Mutex<Vec<(String, String, serde_json::Value)>>>;

/// Answers a GET with 404, an apply with the object applied (with a
/// resourceVersion), a status with the Device (`.1`) holding it.
#[derive(Clone)]
struct FakeApi(Log, serde_json::Value);

impl tower::Service<http::Request<kube::client::Body>> for FakeApi {
    type Response = http::Response<kube::client::Body>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let log = self.0.clone();
        let device = self.1.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let bytes = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
            log.lock().unwrap().push((
                parts.method.to_string(),
                parts.uri.path().to_string(),
                v.clone(),
            ));
            let (code, out) = if parts.method == http::Method::GET {
                (
                    404,
                    serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "reason": "NotFound", "code": 404, "message": "not found"}),
                )
            } else if parts.uri.path().ends_with("/status") {
                let mut d = device;
                d["status"] = v["status"].clone();
                (200, d)
            } else {
                v["metadata"]["resourceVersion"] = "1".into();
                v["metadata"]["uid"] = "made-uid".into();
                if v["kind"] == "StatefulSet" {
                    v["metadata"]["generation"] = 1.into();
                }
                if v["metadata"]["name"].is_null() {
                    let name = parts
                        .uri
                        .path()
                        .split('/')
                        .nth(7)
                        .unwrap_or("x")
                        .to_string();
                    v["metadata"]["name"] = name.into();
                }
                (200, v)
            };
            Ok(http::Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(kube::client::Body::from(serde_json::to_vec(&out).unwrap()))
                .unwrap())
        })
    }
}

/// A store that has listed: `objs`.
fn fill<K>(w: &mut Writer<K>, objs: Vec<K>)
where
    K: Resource + Clone,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    w.apply_watcher_event(&Event::Init);
    for o in objs {
        w.apply_watcher_event(&Event::InitApply(o));
    }
    w.apply_watcher_event(&Event::InitDone);
}

fn object<K: serde::de::DeserializeOwned>(v: &serde_json::Value) -> K {
    serde_json::from_value(v.clone()).expect("an object the fake API echoed")
}

#[tokio::test]
async fn a_device_left_alone_is_reconciled_without_an_api_request() {
    let log: Log = Arc::default();
    let mut d: Device =
        serde_norway::from_str(include_str!("../../../../cni-conf/device01-01.yaml")).unwrap();
    d.metadata.uid = Some("5f1c-uid".into());
    d.metadata.generation = Some(1);
    let echo = serde_json::to_value(&d).unwrap();
    let metrics = Arc::new(crate::run::metrics::Metrics::new());
    let counting = crate::run::requests::Counting::new(metrics.api_requests.clone());
    let api = tower::Layer::layer(&counting, FakeApi(log.clone(), echo));
    let client = kube::Client::new(api, "default");
    let net: EdgeNetwork = serde_norway::from_str(include_str!(
        "../../../../cni-conf/edgenetwork-plant-floor.yaml"
    ))
    .unwrap();
    let node: PartialObjectMeta<Node> = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "kedge1"}
    }))
    .unwrap();
    let (caches, mut w) = Caches::new();
    fill(&mut w.networks, vec![net]);
    fill(&mut w.nodes, vec![node]);
    fill(&mut w.services, vec![]);
    fill(&mut w.nads, vec![]);
    fill(&mut w.statefulsets, vec![]);
    fill(&mut w.pods, vec![]);
    let (reports, _triggers) =
        crate::run::reports::Reports::new(Duration::from_secs(3), Duration::from_secs(30));
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        settings: Default::default(),
        reports: Arc::new(reports),
        holds: Arc::new(crate::run::grants::Holds::new(Duration::from_secs(3))),
        metrics,
        resync: Duration::from_secs(30),
        status_refresh: Duration::from_secs(30),
        written: Default::default(),
        concurrency: 16,
        stale_after: Duration::from_secs(30),
        started: Instant::now() - Duration::from_secs(3600),
        fresh_for: Duration::from_secs(6),
        cluster_domain: "cluster.local".into(),
        recorder: kube::runtime::events::Recorder::new(
            client,
            kube::runtime::events::Reporter {
                controller: "edgelink-operator".into(),
                instance: None,
            },
        ),
        devices: Default::default(),
        access: Default::default(),
        caches,
    });

    // First: nothing made yet. The names are looked up (the caches hold
    // only what the operator made; somebody else's object may hold one),
    // the objects applied, the status written.
    reconcile(Arc::new(d.clone()), ctx.clone()).await.unwrap();
    let first = std::mem::take(&mut *log.lock().unwrap());
    let verbs: Vec<String> = first.iter().map(|(m, p, _)| format!("{m} {p}")).collect();
    assert_eq!(
        first.iter().filter(|(m, _, _)| m == "GET").count(),
        3,
        "the NAD, StatefulSet and Service names looked up: {verbs:#?}"
    );
    assert_eq!(
        first.iter().filter(|(m, _, _)| m == "PATCH").count(),
        4,
        "three objects applied and the status: {verbs:#?}"
    );

    // Then the watches bring what was made, and the Device its status.
    let made = |kind: &str| -> Vec<serde_json::Value> {
        first
            .iter()
            .filter(|(m, _, v)| m == "PATCH" && v["kind"] == kind)
            .map(|(_, _, v)| {
                // as the watch brings it: what the fake API answered
                let mut v = v.clone();
                v["metadata"]["resourceVersion"] = "1".into();
                if kind == "StatefulSet" {
                    v["metadata"]["generation"] = 1.into();
                }
                v
            })
            .collect()
    };
    fill(
        &mut w.nads,
        made("NetworkAttachmentDefinition")
            .iter()
            .map(object)
            .collect(),
    );
    fill(
        &mut w.statefulsets,
        made("StatefulSet").iter().map(object).collect(),
    );
    fill(
        &mut w.services,
        made("Service").iter().map(object).collect(),
    );
    let status = first
        .iter()
        .find(|(_, p, _)| p.ends_with("/status"))
        .map(|(_, _, v)| v["status"].clone())
        .expect("a status written");
    d.status = Some(serde_json::from_value::<DeviceStatus>(status).unwrap());

    reconcile(Arc::new(d.clone()), ctx.clone()).await.unwrap();
    let second = std::mem::take(&mut *log.lock().unwrap());
    assert!(
        second.is_empty(),
        "a Device left alone asked the API: {:#?}",
        second
            .iter()
            .map(|(m, p, _)| format!("{m} {p}"))
            .collect::<Vec<_>>()
    );
    let text = ctx.metrics.render();
    assert!(
        text.contains("edgelink_operator_reconcile_api_requests_count 2"),
        "two reconciles counted:\n{text}"
    );
    assert!(
        text.contains("edgelink_operator_reconcile_api_requests_sum 8.0"),
        "eight requests, all in the first (3 looked up, 3 applied, the status, the first Event):\n{text}"
    );

    // The StatefulSet's status moves (a new resourceVersion, the same
    // generation): nothing to apply.
    let mut sts = made("StatefulSet");
    sts[0]["metadata"]["resourceVersion"] = "2".into();
    fill(&mut w.statefulsets, sts.iter().map(object).collect());
    reconcile(Arc::new(d.clone()), ctx.clone()).await.unwrap();
    assert!(
        log.lock().unwrap().is_empty(),
        "a status update is not an edit"
    );

    // Somebody edits its spec (a new generation): applied again, alone.
    sts[0]["metadata"]["resourceVersion"] = "3".into();
    sts[0]["metadata"]["generation"] = 2.into();
    fill(&mut w.statefulsets, sts.iter().map(object).collect());
    reconcile(Arc::new(d), ctx).await.unwrap();
    let third = std::mem::take(&mut *log.lock().unwrap());
    let paths: Vec<String> = third.iter().map(|(m, p, _)| format!("{m} {p}")).collect();
    assert!(
        paths.len() == 1 && paths[0].starts_with("PATCH") && paths[0].contains("/statefulsets/"),
        "only the edited StatefulSet applied again: {paths:#?}"
    );
}
