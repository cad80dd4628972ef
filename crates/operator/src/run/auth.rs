//! The node a report's bearer token speaks for: a TokenReview by the API
//! server (the decision in [`edgelink_operator::sender`]), the bound pod's
//! node looked up when the review does not name it, and the result kept
//! for a minute at most (never past the token's expiry) by the token's
//! SHA-256, so that each node's reports do not cost a review each.

use edgelink_operator::sender::{self, Expect, Refused, Sender};
use futures_util::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use k8s_openapi::api::core::v1::Pod;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a review is kept at most.
pub const CACHE_FOR: Duration = Duration::from_secs(60);
/// Reviews kept at most (two tokens per node while the kubelet rotates).
const CACHE_MAX: usize = 4096;
/// Reviews in flight at most: a flood of made-up tokens costs the API
/// server this many requests at a time.
const REVIEWS_IN_FLIGHT: usize = 4;

/// A pod's (UID, spec.nodeName); `None` when it does not exist.
pub type FoundPod = Option<(Option<String>, Option<String>)>;

/// The API calls a review needs (a fake in tests).
pub trait Reviewer: Send + Sync {
    /// A TokenReview of `token` for `audience`.
    fn review<'a>(
        &'a self,
        token: &'a str,
        audience: &'a str,
    ) -> BoxFuture<'a, Result<TokenReviewStatus, String>>;
    /// The pod `namespace/name`.
    fn pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<FoundPod, String>>;
}

/// The API server.
pub struct Kube(pub kube::Client);

impl Reviewer for Kube {
    fn review<'a>(
        &'a self,
        token: &'a str,
        audience: &'a str,
    ) -> BoxFuture<'a, Result<TokenReviewStatus, String>> {
        Box::pin(async move {
            let tr = TokenReview {
                spec: TokenReviewSpec {
                    token: Some(token.to_string()),
                    audiences: Some(vec![audience.to_string()]),
                },
                ..Default::default()
            };
            let api = kube::Api::<TokenReview>::all(self.0.clone());
            let done = api
                .create(&kube::api::PostParams::default(), &tr)
                .await
                .map_err(|e| format!("TokenReview (RBAC: create tokenreviews): {e}"))?;
            Ok(done.status.unwrap_or_default())
        })
    }

    fn pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<FoundPod, String>> {
        Box::pin(async move {
            let api = kube::Api::<Pod>::namespaced(self.0.clone(), namespace);
            let pod = api
                .get_opt(name)
                .await
                .map_err(|e| format!("pod {namespace}/{name}: {e}"))?;
            Ok(pod.map(|p| (p.metadata.uid, p.spec.and_then(|s| s.node_name))))
        })
    }
}

pub struct Auth {
    pub expect: Expect,
    reviewer: Box<dyn Reviewer>,
    /// Per token hash: its node, and until when that holds.
    cache: Mutex<HashMap<[u8; 32], (String, Instant)>>,
    in_flight: tokio::sync::Semaphore,
}

/// How long a review of `token` may be kept from now.
fn keep_for(token: &str) -> Duration {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    match sender::jwt_expiry(token) {
        Some(exp) => Duration::from_secs(exp.saturating_sub(now)).min(CACHE_FOR),
        None => CACHE_FOR,
    }
}

impl Auth {
    pub fn new(expect: Expect, reviewer: Box<dyn Reviewer>) -> Auth {
        Auth {
            expect,
            reviewer,
            cache: Mutex::new(HashMap::new()),
            in_flight: tokio::sync::Semaphore::new(REVIEWS_IN_FLIGHT),
        }
    }

    fn cached(&self, key: &[u8; 32]) -> Option<String> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .get(key)
            .filter(|(_, until)| *until > Instant::now())
            .map(|(node, _)| node.clone())
    }

    fn keep(&self, key: [u8; 32], node: &str, token: &str) {
        let until = Instant::now() + keep_for(token);
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CACHE_MAX {
            let now = Instant::now();
            cache.retain(|_, (_, u)| *u > now);
            if cache.len() >= CACHE_MAX {
                cache.clear();
            }
        }
        cache.insert(key, (node.to_string(), until));
    }

    /// The node whose edgelinkd holds `token`.
    pub async fn node_of(&self, token: &str) -> Result<String, Refused> {
        if token.is_empty() {
            return Err(Refused::NoToken);
        }
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(node) = self.cached(&key) {
            return Ok(node);
        }
        let _permit = self
            .in_flight
            .acquire()
            .await
            .map_err(|e| Refused::Unavailable(e.to_string()))?;
        let status = self
            .reviewer
            .review(token, &self.expect.audience)
            .await
            .map_err(Refused::Unavailable)?;
        let node = match sender::sender(&self.expect, &status)? {
            Sender::Node(node) => node,
            Sender::Pod {
                namespace,
                name,
                uid,
            } => {
                let found = self
                    .reviewer
                    .pod(&namespace, &name)
                    .await
                    .map_err(Refused::Unavailable)?;
                let found = found.as_ref().map(|(u, n)| (u.as_deref(), n.as_deref()));
                sender::pod_node(&format!("{namespace}/{name}"), &uid, found)?
            }
        };
        self.keep(key, &node, token);
        Ok(node)
    }
}
