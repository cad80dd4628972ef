//! Every request the operator makes of the API server, counted: by verb
//! and resource in `edgelink_operator_api_requests_total` (a tower layer
//! under kube's client, [`Counting`]), and within one reconcile or one
//! report ([`counted`]), which the metrics keep as histograms. A Device
//! left alone must cost no read per reconcile: the caches answer
//! (`run::caches`).
//!
//! kube's client hands each request to a buffer's worker task, which
//! calls this layer; the response future comes back to the caller and is
//! polled there. So the per-scope count is taken when that future is
//! first polled, inside the caller's [`counted`].

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiRequest {
    /// get, list, watch, create, patch, update, delete.
    pub verb: String,
    /// The resource's plural, with its subresource: `devices/status`.
    pub resource: String,
}

tokio::task_local! {
    static SCOPE: Cell<u64>;
}

/// Run `f`, and say how many API requests it made.
pub async fn counted<F: Future>(f: F) -> (F::Output, u64) {
    SCOPE
        .scope(Cell::new(0), async move {
            let out = f.await;
            (out, SCOPE.with(Cell::get))
        })
        .await
}

/// The verb and resource of a request to the API server, from its method,
/// path and query.
pub fn classify(method: &http::Method, uri: &http::Uri) -> ApiRequest {
    let segs: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    // /api/v1/... or /apis/<group>/<version>/...
    let rest: &[&str] = match segs.as_slice() {
        ["api", _v, rest @ ..] => rest,
        ["apis", _g, _v, rest @ ..] => rest,
        _ => &[],
    };
    // namespaces/<ns>/<resource>/... ; a bare namespaces/<ns> is the
    // namespace itself.
    let rest = match rest {
        ["namespaces", _ns, r @ ..] if !r.is_empty() => r,
        r => r,
    };
    let (resource, named) = match rest {
        [] => (uri.path().to_string(), false),
        [r] => (r.to_string(), false),
        [r, _name] => (r.to_string(), true),
        [r, _name, sub, ..] => (format!("{r}/{sub}"), true),
    };
    let watch = uri
        .query()
        .unwrap_or("")
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let verb = match *method {
        http::Method::GET if watch => "watch",
        http::Method::GET if named => "get",
        http::Method::GET => "list",
        http::Method::POST => "create",
        http::Method::PATCH => "patch",
        http::Method::PUT => "update",
        http::Method::DELETE if named => "delete",
        http::Method::DELETE => "deletecollection",
        _ => "other",
    };
    ApiRequest {
        verb: verb.into(),
        resource,
    }
}

/// The layer that counts: `ClientBuilder::with_layer(&Counting::new(f))`.
#[derive(Clone)]
pub struct Counting {
    family: Family<ApiRequest, Counter>,
}

impl Counting {
    pub fn new(family: Family<ApiRequest, Counter>) -> Counting {
        Counting { family }
    }
}

impl<S> tower::Layer<S> for Counting {
    type Service = CountingService<S>;
    fn layer(&self, inner: S) -> CountingService<S> {
        CountingService {
            inner,
            family: self.family.clone(),
        }
    }
}

#[derive(Clone)]
pub struct CountingService<S> {
    inner: S,
    family: Family<ApiRequest, Counter>,
}

impl<S, B> tower::Service<http::Request<B>> for CountingService<S>
where
    S: tower::Service<http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        self.family
            .get_or_create(&classify(req.method(), req.uri()))
            .inc();
        let fut = self.inner.call(req);
        Box::pin(async move {
            // Polled by the caller: count it in the caller's scope, if any.
            let _ = SCOPE.try_with(|c| c.set(c.get() + 1));
            fut.await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Method, Uri};

    fn c(m: Method, uri: &str) -> (String, String) {
        let r = classify(&m, &uri.parse::<Uri>().unwrap());
        (r.verb, r.resource)
    }

    fn pair(v: &str, r: &str) -> (String, String) {
        (v.into(), r.into())
    }

    #[test]
    fn requests_are_named_by_verb_and_resource() {
        assert_eq!(c(Method::GET, "/api/v1/nodes/kedge1"), pair("get", "nodes"));
        assert_eq!(
            c(Method::GET, "/api/v1/nodes?labelSelector=a%3Db"),
            pair("list", "nodes")
        );
        assert_eq!(
            c(
                Method::GET,
                "/apis/apps/v1/statefulsets?watch=true&resourceVersion=1"
            ),
            pair("watch", "statefulsets")
        );
        assert_eq!(
            c(
                Method::PATCH,
                "/apis/edgelink.io/v1alpha1/namespaces/hil/devices/d1/status"
            ),
            pair("patch", "devices/status")
        );
        assert_eq!(
            c(
                Method::PATCH,
                "/api/v1/namespaces/hil/pods/d1-0/status?fieldManager=x"
            ),
            pair("patch", "pods/status")
        );
        assert_eq!(
            c(
                Method::DELETE,
                "/apis/apps/v1/namespaces/hil/statefulsets/d1-kedge2"
            ),
            pair("delete", "statefulsets")
        );
        assert_eq!(
            c(Method::POST, "/apis/authentication.k8s.io/v1/tokenreviews"),
            pair("create", "tokenreviews")
        );
        assert_eq!(
            c(Method::GET, "/api/v1/namespaces/hil"),
            pair("get", "namespaces")
        );
        assert_eq!(c(Method::GET, "/version"), pair("list", "/version"));
    }

    /// A stand-in API server: every request gets `{}` with 404, which
    /// kube's `get_opt` reads as "not there".
    #[derive(Clone)]
    struct NotFound;

    impl tower::Service<http::Request<kube::client::Body>> for NotFound {
        type Response = http::Response<kube::client::Body>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Self::Response, Self::Error>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: http::Request<kube::client::Body>) -> Self::Future {
            let body = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,"message":"not found"}"#;
            std::future::ready(Ok(http::Response::builder()
                .status(404)
                .header("content-type", "application/json")
                .body(kube::client::Body::from(body.to_vec()))
                .unwrap()))
        }
    }

    #[tokio::test]
    async fn a_scope_counts_its_own_requests_and_the_family_counts_all() {
        use k8s_openapi::api::core::v1::Node;
        let family = Family::<ApiRequest, Counter>::default();
        let svc = tower::Layer::layer(&Counting::new(family.clone()), NotFound);
        let client = kube::Client::new(svc, "default");
        let nodes: kube::Api<Node> = kube::Api::all(client);
        let ((a, b), n) = counted(async {
            let a = nodes.get_opt("kedge1").await.unwrap();
            let b = nodes.get_opt("kedge2").await.unwrap();
            (a, b)
        })
        .await;
        assert!(a.is_none() && b.is_none());
        assert_eq!(n, 2, "two gets in the scope");
        // Outside any scope: counted by the family only.
        assert!(nodes.get_opt("kedge3").await.unwrap().is_none());
        let (_, n) = counted(async {}).await;
        assert_eq!(n, 0, "a scope that asks nothing counts nothing");
        let got = family
            .get_or_create(&ApiRequest {
                verb: "get".into(),
                resource: "nodes".into(),
            })
            .get();
        assert_eq!(got, 3);
    }
}
