//! `spec.access` of a Device: which pods may use it. The operator
//! resolves the selectors to the pods' addresses and sends them to
//! edgelinkd in the answer to its heartbeat (`crate::access`), and
//! renders a NetworkPolicy of the same peers (`crate::render::policy`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `allowedClients` entries at most.
pub const MAX_PEERS: u32 = 32;

/// Who may connect to the Device's ports.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceAccess {
    /// The pods that may connect, as the peers of a NetworkPolicy:
    /// `namespaceSelector` alone selects every pod of the namespaces it
    /// matches, `podSelector` alone the pods of the Device's namespace,
    /// both the pods podSelector matches in the namespaces
    /// namespaceSelector matches. Absent or empty: every client.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_PEERS))]
    pub allowed_clients: Vec<ClientPeer>,
}

/// One peer: at least one of the two selectors.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1))]
pub struct ClientPeer {
    /// The namespaces whose pods may connect (`{}`: every namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// The pods that may connect, of the Device's namespace unless
    /// namespaceSelector is given (`{}`: every pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
}

impl DeviceAccess {
    /// Whether the access narrows who may connect (a non-empty
    /// `allowedClients`).
    pub fn restricts(&self) -> bool {
        !self.allowed_clients.is_empty()
    }
}
