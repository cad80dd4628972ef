//! Who sent a status report: the decision over the API server's review of
//! the bearer token a report carries (a TokenReview), without any I/O.
//!
//! edgelinkd sends the token of its pod's ServiceAccount, projected for
//! the audience `edgelink-operator` (the API server refuses it, the
//! operator takes nothing else). A report is taken when the review says
//! the token is valid for that audience, belongs to edgelinkd's
//! ServiceAccount and is bound to a pod; the node it speaks for must be
//! that pod's node. The node comes from the review itself
//! (`authentication.kubernetes.io/node-name`, Kubernetes 1.30 and newer)
//! or, before that, from the bound pod (its name and UID are in the review
//! since 1.14; the caller looks its `spec.nodeName` up).

use k8s_openapi::api::authentication::v1::TokenReviewStatus;

/// Keys of a reviewed ServiceAccount token's user extra.
pub const NODE_NAME: &str = "authentication.kubernetes.io/node-name";
pub const POD_NAME: &str = "authentication.kubernetes.io/pod-name";
pub const POD_UID: &str = "authentication.kubernetes.io/pod-uid";

/// What the operator expects of a report's token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expect {
    /// The audience edgelinkd's token is projected for.
    pub audience: String,
    /// edgelinkd's ServiceAccount: its namespace and name.
    pub namespace: String,
    pub service_account: String,
}

/// The sender of a reviewed token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sender {
    /// The review names the pod's node.
    Node(String),
    /// The review names the pod only (before Kubernetes 1.30): its node is
    /// the pod's `spec.nodeName`, if the pod still has this UID.
    Pod {
        namespace: String,
        name: String,
        uid: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("no bearer token")]
    NoToken,
    #[error("token not accepted by the API server: {0}")]
    Unauthenticated(String),
    #[error("the token is not for the audience {0:?}")]
    Audience(String),
    #[error("{user:?} is not edgelinkd's ServiceAccount ({expected:?})")]
    NotEdgelinkd { user: String, expected: String },
    #[error("the token of {0:?} is not bound to a pod")]
    Unbound(String),
    #[error("the sender's pod {0} is gone or was replaced")]
    PodGone(String),
    #[error("a report for node {report:?} sent by edgelinkd of node {sender:?}")]
    OtherNode { report: String, sender: String },
    #[error("the token cannot be reviewed now: {0}")]
    Unavailable(String),
}

impl Refused {
    /// The HTTP status of the refusal: 401 for no valid token, 403 for a
    /// valid token that may not send this report, 503 to be retried.
    pub fn status(&self) -> u16 {
        match self {
            Refused::NoToken | Refused::Unauthenticated(_) | Refused::Audience(_) => 401,
            Refused::Unavailable(_) => 503,
            _ => 403,
        }
    }
}

impl Expect {
    /// The username of edgelinkd's ServiceAccount in a review.
    pub fn username(&self) -> String {
        format!(
            "system:serviceaccount:{}:{}",
            self.namespace, self.service_account
        )
    }
}

/// The one value of `key` in the review's user extra.
fn extra<'a>(status: &'a TokenReviewStatus, key: &str) -> Option<&'a str> {
    let values = status.user.as_ref()?.extra.as_ref()?.get(key)?;
    match values.as_slice() {
        [one] if !one.is_empty() => Some(one),
        _ => None,
    }
}

/// Who sent the token `status` reviews, if it may send reports at all.
pub fn sender(expect: &Expect, status: &TokenReviewStatus) -> Result<Sender, Refused> {
    if status.authenticated != Some(true) {
        let why = status.error.clone().unwrap_or_else(|| "not valid".into());
        return Err(Refused::Unauthenticated(why));
    }
    // An authenticator that ignores audiences returns none: not enough
    // (the token could be one for the API server, or for anyone else).
    let audiences = status.audiences.as_deref().unwrap_or_default();
    if !audiences.contains(&expect.audience) {
        return Err(Refused::Audience(expect.audience.clone()));
    }
    let user = status
        .user
        .as_ref()
        .and_then(|u| u.username.clone())
        .unwrap_or_default();
    let expected = expect.username();
    if user != expected {
        return Err(Refused::NotEdgelinkd { user, expected });
    }
    if let Some(node) = extra(status, NODE_NAME) {
        return Ok(Sender::Node(node.to_string()));
    }
    match (extra(status, POD_NAME), extra(status, POD_UID)) {
        (Some(name), Some(uid)) => Ok(Sender::Pod {
            namespace: expect.namespace.clone(),
            name: name.to_string(),
            uid: uid.to_string(),
        }),
        _ => Err(Refused::Unbound(user)),
    }
}

/// A report for `report_node` from edgelinkd of `sender_node`.
pub fn check_node(report_node: &str, sender_node: &str) -> Result<(), Refused> {
    if report_node == sender_node {
        Ok(())
    } else {
        Err(Refused::OtherNode {
            report: report_node.to_string(),
            sender: sender_node.to_string(),
        })
    }
}

/// The node of the bound pod: its `spec.nodeName`, when the pod found
/// (`uid`, `node`) is the one the token was bound to.
pub fn pod_node(
    pod: &str,
    uid: &str,
    found: Option<(Option<&str>, Option<&str>)>,
) -> Result<String, Refused> {
    match found {
        Some((Some(u), Some(node))) if u == uid && !node.is_empty() => Ok(node.to_string()),
        _ => Err(Refused::PodGone(pod.to_string())),
    }
}

/// The expiry (`exp`, Unix seconds) a JWT claims, unverified: only to
/// keep a reviewed token no longer than it is valid.
pub fn jwt_expiry(token: &str) -> Option<u64> {
    use base64::Engine;
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()?
        .get("exp")?
        .as_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expect() -> Expect {
        Expect {
            audience: "edgelink-operator".into(),
            namespace: "edgelink-system".into(),
            service_account: "edgelinkd".into(),
        }
    }

    /// A review as the API server returns it for edgelinkd's token.
    fn review(user: &str, audiences: &[&str], extra: &[(&str, &str)]) -> TokenReviewStatus {
        serde_json::from_value(serde_json::json!({
            "authenticated": true,
            "audiences": audiences,
            "user": {
                "username": user,
                "groups": ["system:serviceaccounts", "system:authenticated"],
                "extra": extra.iter().map(|(k, v)| (k.to_string(), vec![v.to_string()]))
                    .collect::<std::collections::BTreeMap<_, _>>(),
            }
        }))
        .unwrap()
    }

    const EDGELINKD: &str = "system:serviceaccount:edgelink-system:edgelinkd";
    const AUD: &[&str] = &["edgelink-operator"];

    #[test]
    fn edgelinkds_token_names_its_node_or_its_pod() {
        let r = review(
            EDGELINKD,
            AUD,
            &[
                (POD_NAME, "edgelinkd-x"),
                (POD_UID, "u1"),
                (NODE_NAME, "kedge1"),
            ],
        );
        assert_eq!(sender(&expect(), &r), Ok(Sender::Node("kedge1".into())));
        // Before 1.30: the pod only.
        let r = review(
            EDGELINKD,
            AUD,
            &[(POD_NAME, "edgelinkd-x"), (POD_UID, "u1")],
        );
        assert_eq!(
            sender(&expect(), &r),
            Ok(Sender::Pod {
                namespace: "edgelink-system".into(),
                name: "edgelinkd-x".into(),
                uid: "u1".into()
            })
        );
        assert_eq!(
            pod_node("edgelinkd-x", "u1", Some((Some("u1"), Some("kedge1")))),
            Ok("kedge1".into())
        );
        for found in [
            None,
            Some((Some("u2"), Some("kedge1"))),
            Some((Some("u1"), None)),
        ] {
            assert_eq!(
                pod_node("edgelinkd-x", "u1", found),
                Err(Refused::PodGone("edgelinkd-x".into())),
                "{found:?}"
            );
        }
    }

    #[test]
    fn other_tokens_are_refused_with_the_right_status() {
        let e = expect();
        let mut bad = review(EDGELINKD, AUD, &[(NODE_NAME, "kedge1")]);
        bad.authenticated = Some(false);
        bad.error = Some("token has expired".into());
        let cases = [
            (bad, 401, "token has expired"),
            // A token for the API server (or for anyone else).
            (
                review(EDGELINKD, &[], &[(NODE_NAME, "kedge1")]),
                401,
                "audience",
            ),
            (
                review(
                    EDGELINKD,
                    &["https://kubernetes.default.svc"],
                    &[(NODE_NAME, "kedge1")],
                ),
                401,
                "audience",
            ),
            // Another ServiceAccount, of the same name elsewhere, or a user.
            (
                review(
                    "system:serviceaccount:hil:edgelinkd",
                    AUD,
                    &[(NODE_NAME, "kedge1")],
                ),
                403,
                "is not edgelinkd's",
            ),
            (
                review("alice", AUD, &[(NODE_NAME, "kedge1")]),
                403,
                "is not edgelinkd's",
            ),
            // A token of edgelinkd's account not bound to a pod (a
            // TokenRequest by someone allowed to make one, or a legacy
            // Secret's token).
            (review(EDGELINKD, AUD, &[]), 403, "not bound to a pod"),
            (
                review(EDGELINKD, AUD, &[(POD_NAME, "x")]),
                403,
                "not bound to a pod",
            ),
        ];
        for (r, code, text) in cases {
            let err = sender(&e, &r).expect_err(text);
            assert_eq!(err.status(), code, "{err}");
            assert!(err.to_string().contains(text), "{err}");
        }
    }

    #[test]
    fn a_report_for_another_node_is_forbidden() {
        assert_eq!(check_node("kedge1", "kedge1"), Ok(()));
        let err = check_node("kedge2", "kedge1").unwrap_err();
        assert_eq!(err.status(), 403);
        assert_eq!(
            err.to_string(),
            "a report for node \"kedge2\" sent by edgelinkd of node \"kedge1\""
        );
    }

    #[test]
    fn the_expiry_of_a_jwt_is_read() {
        use base64::Engine;
        let enc = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let t = format!(
            "{}.{}.sig",
            enc(r#"{"alg":"RS256"}"#),
            enc(r#"{"aud":["edgelink-operator"],"exp":1764000000}"#)
        );
        assert_eq!(jwt_expiry(&t), Some(1764000000));
        assert_eq!(jwt_expiry("opaque"), None);
        assert_eq!(jwt_expiry("a.%%%.c"), None);
    }
}
